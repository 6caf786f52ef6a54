"""Leading-order finite-width theory (Roberts, Yaida & Hanin, ch. 4-5; docs/theory.md section 9).

Single input, equal widths n. The pre-activations of layer l+1 are h_i = sqrt(G) z_i with a layer
metric G that fluctuates: E[G^(l)] = K^(l) + K1^(l)/n, Var G^(l) = V^(l)/n (+ O(1/n^2)), excess kurtosis
3 V/(n K^2). With <f>_K = E f(sqrt(K) z),

    K^(l+1)  = sigma_w2 <psi^2>_K + sigma_b2
    V^(l+1)  = sigma_w2^2 k (<psi^4>_K - <psi^2>_K^2) + chi_par^2 V^(l),   chi_par = sigma_w2 d<psi^2>_K/dK
    K1^(l+1) = chi_par K1^(l) + (sigma_w2/2) V^(l) d^2<psi^2>_K/dK^2

from K^(1) = sigma_w2 q0 + sigma_b2, V^(1) = K1^(1) = 0 (k = 1 without pooling). The coefficients are SymPy
expressions in K, closed forms or unevaluated Gaussian integrals; derivatives of integrals use the
scale identity d/dq E f(sqrt(q) M) = E[(x f')(sqrt(q) M)]/(2q). Residual blocks are not covered here
(the node is not conditionally Gaussian given the previous layer): see :mod:`symfield.theory.gram`.
"""
from __future__ import annotations

from symfield.core.errors import Unsupported
from dataclasses import dataclass, field
from functools import lru_cache

import mpmath
import numpy as np
import sympy as sp

from symfield.core import validate as check
from symfield.core.dataset import ToXarray
from symfield.numeric.evaluate import GUARD_DIGITS, to_mpf
from symfield.symbolic import gaussian as G
from symfield.symbolic.activation import Activation, activation, is_monotone
from symfield.symbolic.derivatives import d as derivative
from symfield.symbolic.pool import max_expect1
from symfield.numeric.maps import maps
from symfield.symbolic.kernel import kernel

_F = "finite_width"
q = G.q
sigma_w2, sigma_b2 = sp.symbols("sigma_w2 sigma_b2", nonnegative=True)


@dataclass(frozen=True)
class Coefficients:
    """The recursion's ingredients as SymPy expressions in K = ``q``, ``sigma_w2``, ``sigma_b2``."""
    psi2: sp.Expr       # <psi^2>_K
    psi4: sp.Expr       # <psi^4>_K
    dpsi2: sp.Expr      # d<psi^2>_K/dK
    d2psi2: sp.Expr     # d^2<psi^2>_K/dK^2
    K_map: sp.Expr      # sigma_w2 <psi^2>_K + sigma_b2
    chi_par: sp.Expr    # sigma_w2 d<psi^2>_K/dK
    V_source: sp.Expr   # sigma_w2^2 k (<psi^4>_K - <psi^2>_K^2)
    K1_source: sp.Expr  # (sigma_w2/2) d^2<psi^2>_K/dK^2   (multiplies V^(l))
    k: int
    methods: dict = field(compare=False)

    @property
    def closed_form(self) -> bool:
        return not any(e.has(sp.Integral) for e in (self.psi2, self.psi4, self.dpsi2, self.d2psi2))


@dataclass(frozen=True)
class FiniteWidth(ToXarray):
    """Per-layer K, V, K1 (row i = layer i + 1; row 0 is the linear layer 1) and the coefficients.

    ``to_xarray()``: ``K``, ``V``, ``K1`` and ``V_over_K2`` over ``layer`` (mpmath/exact values also as
    ``<name>_mp`` text)."""
    K: np.ndarray
    V: np.ndarray
    K1: np.ndarray
    coefficients: Coefficients
    layers: np.ndarray
    params: dict = field(default_factory=dict)

    def G(self, n):
        """E[h^2] to first order in 1/n: K + K1/n."""
        return self.K + self.K1 / n

    def kurtosis(self, n):
        """Excess kurtosis of a pre-activation to first order in 1/n: 3 V/(n K^2)."""
        return 3 * self.V / (n * self.K**2)

    @property
    def V_over_K2(self):
        return self.V / self.K**2

    def dataset_parts(self) -> dict:
        """The arguments of :func:`symfield.core.dataset.build` for :meth:`to_xarray`."""
        data = {"K": self.K, "V": self.V, "K1": self.K1, "V_over_K2": self.V_over_K2}
        if self.params.get("exact"):     # SymPy numbers: as mpmath numbers at 30 digits
            with mpmath.workdps(30):
                data = {k: np.array([mpmath.mpf(sp.Float(x, 35)) for x in a], dtype=object) for k, a in data.items()}
        dps = self.params.get("dps") or (30 if self.params.get("exact") else None)
        return dict(data=data, coords={"layer": np.asarray(self.layers)}, params=dict(self.params), dps=dps,
                    var_attrs={"K": {"long_name": "infinite-width variance K (E h^2 = K + K1/n)"},
                               "V": {"long_name": "four-point vertex V = lim n Var(G)"},
                               "V_over_K2": {"long_name": "V/K^2 (excess kurtosis x n/3)"}})


# ---------------------------------------------------------------- symbolic coefficients
def _pool_moment(act: Activation, m: int):
    """(E[psi(u)^m], method) with u ~ N(0, q I_k)."""
    phi = act.expr
    if act.pool is None or act.k == 1:
        e = G.expect1(phi ** (m // 2), phi ** (m - m // 2))
        return e.value, e.method
    if act.pool == "max":
        if not is_monotone(phi):
            raise Unsupported(f"finite_width supports max-pools of monotone non-decreasing phi only "
                                      f"(psi = phi(max_j u_j)); {act.single.name} is not monotone.")
        return max_expect1(phi ** (m // 2), act.k, phi ** (m - m // 2))
    # avg-pool: moments of the mean of k i.i.d. phi(u_j) from the raw moments m1..m4 of phi
    k = sp.Integer(act.k)
    raw = {j: G.expect1(phi ** (j - j // 2), phi ** (j // 2)).value for j in (1, 2, 3, 4)}  # E[phi^j]
    m1, m2, m3, m4 = raw[1], raw[2], raw[3], raw[4]
    if m == 2:
        return (m2 + (k - 1) * m1**2) / k, "avg-pool moments"
    val = (k * m4 + 4 * k * (k - 1) * m3 * m1 + 3 * k * (k - 1) * m2**2 + 6 * k * (k - 1) * (k - 2) * m2 * m1**2
           + k * (k - 1) * (k - 2) * (k - 3) * m1**4) / k**4
    return val, "avg-pool moments"


def _dq(expr):
    """d expr/dq (symfield.symbolic.derivatives: integrals by the scale identity); small closed forms simplified."""
    out = derivative(expr, q)
    if out.has(sp.Integral):
        return out
    return sp.simplify(out) if sp.count_ops(out) < 200 else out


@lru_cache(maxsize=64)
def coefficients(act) -> Coefficients:
    """Symbolic coefficients of the finite-width recursion for ``act`` (cached)."""
    act = activation(act) if not isinstance(act, Activation) else act
    k = act.k if act.pool is not None else 1
    psi2, m2how = _pool_moment(act, 2)
    psi4, m4how = _pool_moment(act, 4)
    d1 = _dq(psi2)
    d2 = _dq(d1)
    return Coefficients(
        psi2=psi2, psi4=psi4, dpsi2=d1, d2psi2=d2,
        K_map=sigma_w2 * psi2 + sigma_b2, chi_par=sigma_w2 * d1,
        V_source=sigma_w2**2 * k * (psi4 - psi2**2), K1_source=sigma_w2 / 2 * d2, k=k,
        methods={"psi2": m2how, "psi4": m4how, "derivatives": "sympy.diff" if not psi2.has(sp.Integral)
                 else "scale identity d/dq E f(sqrt(q) M) = E[x f'(x)]/(2q) (quadrature)"})


# ---------------------------------------------------------------- the recursion (one text, three number systems)
def _recurse(K, sw, sb, depth, coef, k):
    """The recursion, written once for float64, mpmath and SymPy numbers.

    K: list starting with K^(1) (extended here when shorter than depth); coef(i) returns
    (<psi^2>, d<psi^2>/dK, <psi^4> - <psi^2>^2, d^2<psi^2>/dK^2) at K[i]."""
    V, K1 = [0 * K[0]], [0 * K[0]]
    for i in range(depth - 1):
        m2, dm2, var, d2m2 = coef(i)
        if len(K) == i + 1:
            K.append(sw * m2 + sb)
        chi = sw * dm2
        V.append(sw**2 * k * var + chi**2 * V[i])
        K1.append(chi * K1[i] + sw / 2 * d2m2 * V[i])
    return K, V, K1


def finite_width(act: str | Activation, sigma_w2: float, sigma_b2: float, depth: int, q0: float = 1.0, *,
                 exact: bool = False, dps: int | None = None) -> FiniteWidth:
    """K^(l), V^(l), K1^(l) for l = 1..depth (module docstring for the recursion).

    ``exact=True`` runs the recursion in SymPy numbers (floats read as the decimals they print as,
    0.1 -> 1/10; needs closed-form coefficients), e.g. relu at sigma_w2 = 2, sigma_b2 = 0 gives
    V/K^2 = 5 (l - 1) as Rationals; ``dps=N`` uses mpmath at N digits; default float64.

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation` (pools included).
    sigma_w2, sigma_b2 : float
        Weight and bias variances (>= 0).
    depth : int
        Number of layers (>= 1); row 0 is the linear layer 1.
    q0 : float
        Input norm x.x/n0 (> 0).
    exact : bool
        Run in SymPy numbers.
    dps : int, optional
        mpmath digits; None for float64.

    Returns
    -------
    FiniteWidth
        Arrays ``K``, ``V``, ``K1``, ``layers`` (object arrays in the exact/mpmath modes) and the
        symbolic ``coefficients``.

    Examples
    --------
    >>> sf.finite_width("relu", 2.0, 0.0, depth=4, exact=True).V
    array([0, 20, 40, 60], dtype=object)
    """
    depth = check.integer(_F, "depth", depth, lo=1)
    for name, v in (("sigma_w2", sigma_w2), ("sigma_b2", sigma_b2)):
        if check.real(_F, name, v, lo=0).ndim:
            check.fail(_F, name, "a scalar (a finite float >= 0)", v, TypeError)
    q0 = check.input_gram(_F, "q0", q0, pair=False)
    dps = check.dps(_F, dps)
    if not isinstance(exact, bool):
        check.fail(_F, "exact", "True or False", exact, TypeError)
    act = activation(act) if not isinstance(act, Activation) else act
    co = coefficients(act)
    exprs = (co.psi2, co.dpsi2, co.psi4 - co.psi2**2, co.d2psi2)
    params = dict(act=act.name, sigma_w2=sigma_w2, sigma_b2=sigma_b2, depth=depth, q0=q0, exact=exact, dps=dps)
    layers = np.arange(1, depth + 1)
    if exact:
        if not co.closed_form:
            raise Unsupported(f"finite_width(exact=True) needs closed-form coefficients; {act.name} has "
                                      f"Gaussian integrals without a closed form. Use dps= or the float64 default.")
        sw, sb, q0e = (_exact(v) for v in (sigma_w2, sigma_b2, q0))
        K = [sw * q0e + sb]
        K, V, K1 = _recurse(K, sw, sb, depth, lambda i: [e.subs(q, K[i]) for e in exprs], co.k)
        K, V, K1 = (np.array(arr, dtype=object) for arr in (K, V, K1))
        return FiniteWidth(K, V, K1, co, layers, params)
    if dps is not None:
        with mpmath.workdps(dps + GUARD_DIGITS):
            sw, sb, q0m = (to_mpf(v) for v in (sigma_w2, sigma_b2, q0))
            K = [sw * q0m + sb]
            K, V, K1 = _recurse(K, sw, sb, depth, lambda i: [maps(kernel(act), dps + GUARD_DIGITS).expect(e, (q,), (K[i],))
                                                              for e in exprs], co.k)
        with mpmath.workdps(dps):
            K, V, K1 = (np.array([+v for v in arr], dtype=object) for arr in (K, V, K1))
        return FiniteWidth(K, V, K1, co, layers, params)
    sw, sb = float(sigma_w2), float(sigma_b2)
    K = layer_variances(act, sw, sb, depth, q0, _F)    # K first (the only nonlinear recursion), then the rest vectorised
    # the same recursion, the coefficients tabulated at K^(1..depth-1) by one vectorised evaluation each
    tab = [maps(kernel(act)).expect(e, (q,), (K[:-1],)) for e in exprs]
    _, V, K1 = _recurse(list(K), sw, sb, depth, lambda i: [t[i] for t in tab], co.k)
    return FiniteWidth(K, np.array(V, dtype=float), np.array(K1, dtype=float), co, layers, params)


def layer_variances(act: Activation, sigma_w2: float, sigma_b2: float, depth: int, q0: float, func: str = _F):
    """K^(1..depth) in float64, K^(l+1) = sigma_w2 <psi^2>_K + sigma_b2, K^(1) = sigma_w2 q0 + sigma_b2; a
    ValueError of ``func`` naming sigma_w2 where a variance leaves float64's normal range (the maps would be
    evaluated at 0: sigma_w2 = 1e-300 gave a ZeroDivisionError)."""
    co, M = coefficients(act), maps(kernel(act))
    K = [sigma_w2 * float(q0) + sigma_b2]
    tiny = np.finfo(float).tiny
    for _ in range(depth):
        if not K[-1] >= tiny:
            check.variances_in_range(func, "sigma_w2", sigma_w2, K)
        if len(K) == depth:
            return np.array(K)
        K.append(sigma_w2 * float(M.expect(co.psi2, (q,), (K[-1],))) + sigma_b2)
    return np.array(K)


def _exact(v):
    if isinstance(v, (float, np.floating)):
        return sp.Rational(repr(float(v)))
    return sp.sympify(v)
