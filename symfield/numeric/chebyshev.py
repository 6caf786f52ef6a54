"""Piecewise Chebyshev interpolants: nodes, coefficients from node values, evaluation, certification.

The one Chebyshev fitter of symfield, shared by the 1-D tables (:mod:`symfield.numeric.table1d`) and
the 2-D (q, theta) tables (:mod:`symfield.numeric.tables`). On a panel [a, b], y = (2t - a - b)/(b - a)
and the interpolant through the first-kind nodes y_j = cos(pi (j + 1/2)/n) is

    p(y) = sum_(k<n) c_k T_k(y),   c_k = (2 - [k = 0])/n sum_j f(y_j) cos(pi k (j + 1/2)/n)   (DCT-II);

a tensor interpolant applies this along each axis. Certification uses values the fit has not seen
(the second-kind points between the nodes) and the size of the last coefficients; :func:`refine`
bisects a panel whose held-out error exceeds the tolerance (docs/numerics.md section 3).
"""
from __future__ import annotations

import numpy as np

_CHEB = np.polynomial.chebyshev


# ----------------------------------------------------------------------------- nodes
def nodes(n):
    """First-kind Chebyshev points cos(pi (k + 1/2)/n), k = 0..n-1 (descending)."""
    return np.cos(np.pi * (np.arange(n) + 0.5) / n)


def second_kind(n, ends=True, symmetric=False):
    """Second-kind points cos(pi k/n), k = 0..n (ends=False: k = 1..n-1), descending; symmetric=True
    makes them exactly antisymmetric, x_(n-k) = -x_k (and x_(n/2) = 0), e.g. for parity splits."""
    x = np.cos(np.pi * np.arange(n + 1) / n)
    if symmetric:
        m = (n + 1) // 2
        x[n - m + 1:] = -x[m - 1::-1]
        if n % 2 == 0:
            x[n // 2] = 0.0
    return x if ends else x[1:-1]


def to_panel(a, b, y):
    """The point of [a, b] at coordinate y in [-1, 1]."""
    return 0.5 * (a + b) + 0.5 * (b - a) * y


# ----------------------------------------------------------------------------- coefficients
def coefficients(values, axis=-1):
    """Chebyshev coefficients c_k of the interpolant through the first-kind nodes (:func:`nodes`,
    descending order) along ``axis``: the DCT-II above."""
    from scipy.fft import dct
    n = values.shape[axis]
    a = dct(values, type=2, axis=axis) / n
    idx = [slice(None)] * a.ndim
    idx[axis] = 0
    a[tuple(idx)] *= 0.5
    return a


def coefficients2d(values):
    """Tensor coefficients c_ij of sum c_ij T_i(x) T_j(y) from values[i, j] = f(x_i, y_j) at first-kind
    nodes (a single row: the 1-D coefficients along y, shape (1, n))."""
    if values.shape[0] == 1:
        return coefficients(values, axis=1)
    return coefficients(coefficients(values, axis=1), axis=0)


def cos_coefficients(values, axis=-1):
    """A_m = (1/2 pi) int_0^(2 pi) f(cos a) e^(-i m a) da, m = 0..K, from the K + 1 values f(x_k) at the
    second-kind points x_k = cos(pi k/K) (:func:`second_kind`): the trapezoid rule in a, i.e.
    DCT-I / 2K (A_0 = c_0, A_m = c_m/2 for the Chebyshev coefficients c_m of the interpolant)."""
    from scipy.fft import dct
    return dct(values, type=1, axis=axis) / (2 * (values.shape[axis] - 1))


def tail(coef, axis=-1, m=3):
    """max |c_k| over the last m coefficients along ``axis`` (the resolution indicator)."""
    return float(np.abs(np.take(coef, range(coef.shape[axis] - m, coef.shape[axis]), axis=axis)).max())


# ----------------------------------------------------------------------------- evaluation
def chebval(y, c):
    """sum_k c_k T_k(y) at an array y."""
    return _CHEB.chebval(y, c)


def chebval2d(coef, x, y):
    """sum_ij coef[i, j] T_i(x) T_j(y) at arrays x, y (a single row: sum_j coef[0, j] T_j(y))."""
    if coef.shape[0] == 1:
        return _CHEB.chebval(y, coef[0])
    return _CHEB.chebval2d(x, y, coef)


def clenshaw(c, y):
    """sum_k c[i, k] T_k(y_i): each point y_i with its own coefficient row c[i] (Clenshaw's recurrence)."""
    y2, cols = 2 * y, c.T.copy()       # the same operations in the same order, fewer temporaries
    b1, b2 = np.zeros(y.shape), np.zeros(y.shape)
    for j in range(c.shape[1] - 1, 0, -1):
        t = y2 * b1
        t -= b2
        t += cols[j]
        b1, b2 = t, b1
    return y * b1 - b2 + cols[0]


def basis(y, n):
    """(T_0(y), ..., T_(n-1)(y)) by the three-term recurrence T_(k+1) = 2 y T_k - T_(k-1); for an array y
    the last axis is k (shape y.shape + (n,))."""
    y = np.asarray(y, dtype=float)
    t = [np.ones_like(y), y]
    for _ in range(2, n):
        t.append(2.0 * y * t[-1] - t[-2])
    return np.stack(t[:n], axis=-1)


def _tree(terms):
    """A balanced sum of expression strings (short dependency chains)."""
    while len(terms) > 1:
        terms = [f"({terms[i]} + {terms[i + 1]})" if i + 1 < len(terms) else terms[i] for i in range(0, len(terms), 2)]
    return terms[0]


def compiled_source(n):
    """numba source of ``_cheb1(c, o, y)`` = sum_(k<n) c[o + k] T_k(y) and ``_cheb2(c, o, x, y)`` =
    sum_(i,j<n) c[o + n i + j] T_i(x) T_j(y), unrolled: T_k by the three-term recurrence, then
    independent products summed as balanced trees (the CPU overlaps them; Clenshaw is one serial chain,
    ~1.7x slower per table lookup). The same sums as the Clenshaw loops of
    symfield.numeric.kernels.table_maps, which codegen replaces by this text in compiled modules.
    Expects ``njit`` and ``OPTS`` in the module it is pasted into."""
    def tvals(v):
        out = [f"    {v}0 = 1.0", f"    {v}1 = {v}", f"    {v}2_ = 2.0 * {v}"]
        out += [f"    {v}{k} = {v}2_ * {v}{k - 1} - {v}{k - 2}" for k in range(2, n)]
        return out
    one = ["@njit(inline=\"always\", **OPTS)", "def _cheb1(c, o, y):", f'    """sum_(k<{n}) c[o + k] T_k(y)."""']
    one += tvals("y") + [f"    d = c[o:o + {n}]", "    return " + _tree([f"d[{k}] * y{k}" for k in range(n)])]
    two = ["@njit(inline=\"always\", **OPTS)", "def _cheb2(c, o, x, y):", f'    """sum_(i,j<{n}) c[o + {n} i + j] T_i(x) T_j(y)."""']
    two += tvals("x") + tvals("y") + [f"    d = c[o:o + {n * n}]"]
    for i in range(n):
        two.append(f"    r{i} = " + _tree([f"d[{n * i + j}] * y{j}" for j in range(n)]))
    two.append("    return " + _tree([f"x{i} * r{i}" for i in range(n)]))
    return "\n".join(one) + "\n\n\n" + "\n".join(two) + "\n"


# ----------------------------------------------------------------------------- certification
def max_error(got, ref, scale):
    """The certified quantity: max |got - ref|/scale over held-out points (scale broadcast)."""
    return float(np.max(np.abs(got - ref) / scale))


def fit_panel(f, a, b, n):
    """Fit f on [a, b] at n first-kind nodes and check it at the n - 1 interior second-kind points:
    (coefficients, held-out error relative to max |f| there). f: a vectorised callable."""
    c = coefficients(np.asarray(f(to_panel(a, b, nodes(n))), dtype=float))
    yh = second_kind(n, ends=False)
    ref = np.asarray(f(to_panel(a, b, yh)), dtype=float)
    return c, max_error(chebval(yh, c), ref, max(np.max(np.abs(ref)), 1e-300))


def refine(f, a, b, n, tol, max_depth, depth=0):
    """Piecewise fit of f on [a, b]: [(a_i, b_i, coef_i, err_i)] in order, each panel bisected while its
    held-out error exceeds tol (at most max_depth times)."""
    c, err = fit_panel(f, a, b, n)
    if err > tol and depth < max_depth:
        m = 0.5 * (a + b)
        return refine(f, a, m, n, tol, max_depth, depth + 1) + refine(f, m, b, n, tol, max_depth, depth + 1)
    return [(a, b, c, err)]
