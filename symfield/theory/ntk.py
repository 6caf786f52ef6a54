"""The neural tangent kernel (NTK) of a deep wide network at initialisation, two inputs of equal norm.

NTK parameterisation (layer 1 linear; T = E[psi(u) psi(v)] = C, Tdot = E[grad psi(u) . grad psi(v)] = dC):

    Theta^(1) = K^(1) = sigma_w2 q0 + sigma_b2                      (entrywise: aa and ab)
    Theta^(l+1) = K^(l+1) + sigma_w2 Tdot(K^(l)) Theta^(l),   K^(l+1) = sigma_w2 T(K^(l)) + sigma_b2
    residual z + alpha (W psi(z) + b):  Theta' = (1 + alpha^2 sigma_w2 Tdot) Theta + alpha^2 (sigma_w2 T + sigma_b2)
    standard (neural-tangents "standard", fan-in n):  Theta' = n T + 1 + sigma_w2 Tdot Theta,  Theta^(1) = n q0 + 1

gamma_Theta = Theta_ab/(Theta_aa - Theta_ab) is kept exact as c -> 1 by the NTK distance
d_Theta = Theta_aa + Theta_bb - 2 Theta_ab = 2 (Theta_aa - Theta_ab), with its own recursion (no difference of
nearly equal numbers; docs/theory.md section 12):

    d_Theta' = sigma_w2 D + sigma_w2 Tdot_aa d_Theta + 2 sigma_w2 dTdot Theta_ab,
    dTdot = Tdot_aa - Tdot_ab = E[|grad psi(u) - grad psi(v)|^2]/2

(residual: the last three terms times alpha^2, plus d_Theta; standard: n D in place of sigma_w2 D). D is the
engine's distance map of psi; for a single node dTdot is half the distance map of phi' (its own kernel), for
avg-pools that over k, for max-pools the plain difference (``exact`` False).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import mpmath
import numpy as np
from numpy.typing import ArrayLike
import sympy as sp

from symfield.core import validate as check
from symfield.core.errors import InvalidValue, SYMPY_GAVE_UP, Unsupported
from symfield.numeric.distance import SERIES_D, rule as distance_rule
from symfield.numeric.evaluate import GUARD_DIGITS, to_mpf
from symfield.numeric.maps import maps
from symfield.symbolic.activation import Activation
from symfield.symbolic.formula import X
from symfield.symbolic.gaussian import q1 as Q1, q2 as Q2, q12 as Q12
from symfield.symbolic.kernel import kernel
from symfield.theory.propagate import propagate

_F = "ntk"
PARAMETERIZATIONS = ("ntk", "standard")


@dataclass(frozen=True)
class NTK:
    """Per-layer NTK of two inputs of equal norm; row i is layer ``layers[i]`` (1-based).

    ``theta_aa``, ``theta_ab``, ``d_theta`` (= 2 (theta_aa - theta_ab), its own recursion), ``gamma_theta``
    (= theta_ab/(theta_aa - theta_ab) = 2 theta_ab/d_theta), the NNGP kernel ``q``, ``qab``, ``d`` beside it,
    ``shares_aa``/``shares_ab``: the share of each layer's parameters in Theta at the last layer (rows: layers
    1..depth, summing to 1), ``status`` ("ok", or why later layers are NaN/inf), ``exact`` (gamma_theta keeps
    its relative accuracy as c -> 1), ``how`` (the paths of dTdot), ``precision``.
    """
    theta_aa: np.ndarray
    theta_ab: np.ndarray
    d_theta: np.ndarray
    q: np.ndarray
    qab: np.ndarray
    d: np.ndarray
    layers: np.ndarray
    shares_aa: np.ndarray
    shares_ab: np.ndarray
    status: str
    exact: bool
    how: str
    precision: str
    params: dict = field(default_factory=dict, repr=False)

    @property
    def gamma_theta(self) -> np.ndarray:
        """gamma_Theta = Theta_ab/(Theta_aa - Theta_ab) = 2 Theta_ab / d_Theta per layer."""
        if self.precision != "float64":
            return np.array([2 * a / b if b != 0 else mpmath.inf for a, b in zip(self.theta_ab, self.d_theta)],
                            dtype=object)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return 2 * self.theta_ab / self.d_theta

    @property
    def gamma(self) -> np.ndarray:
        """The NNGP drift ratio gamma = 2 q_ab/d per layer (for comparison)."""
        if self.precision != "float64":
            return np.array([2 * a / b if b != 0 else mpmath.inf for a, b in zip(self.qab, self.d)], dtype=object)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return 2 * self.qab / self.d

    def kappa(self, m: int) -> np.ndarray:
        """Condition number of the NTK on m equicorrelated inputs: eigenvalues Theta_aa + (m-1) Theta_ab (once)
        and Theta_aa - Theta_ab (m-1 times), so kappa = 1 + m gamma_Theta."""
        m = check.integer("NTK.kappa", "m", m, lo=2)
        return 1 + m * self.gamma_theta

    def lambda_max(self, m: int) -> np.ndarray:
        """Largest NTK eigenvalue on m equicorrelated inputs: Theta_aa + (m - 1) Theta_ab."""
        m = check.integer("NTK.lambda_max", "m", m, lo=1)
        return self.theta_aa + (m - 1) * self.theta_ab

    def lr_max(self, m: int) -> np.ndarray:
        """Largest stable gradient-descent learning rate on the loss sum_i (f(x_i) - y_i)^2 / 2 over m
        equicorrelated inputs: eta < 2/lambda_max (the linearised dynamics f <- f - eta Theta (f - y))."""
        return 2 / self.lambda_max(m)


def _check(sigma_w2, sigma_b2, depth, q0, qab0, layers, residual, parameterization, width, dps):
    sw = float(check.real(_F, "sigma_w2", sigma_w2, lo=0, lo_open=True))
    sb = float(check.real(_F, "sigma_b2", sigma_b2, lo=0))
    for name, v in (("sigma_w2", sigma_w2), ("sigma_b2", sigma_b2), ("q0", q0), ("qab0", qab0)):
        if np.ndim(v) != 0:
            check.fail(_F, name, "a scalar (a finite float)", v, TypeError)
    depth = check.integer(_F, "depth", depth, lo=1)
    q0 = float(check.real(_F, "q0", q0, lo=0, lo_open=True))
    qab0 = float(check.real(_F, "qab0", qab0))
    if abs(qab0) > q0:
        check.fail(_F, "qab0", f"a covariance with |qab0| <= q0 = {q0!r}", qab0)
    if parameterization not in PARAMETERIZATIONS:
        check.fail(_F, "parameterization", f"one of {PARAMETERIZATIONS}", parameterization)
    width = float(check.real(_F, "width", width, lo=0, lo_open=True))
    alpha = None if residual is None else float(check.real(_F, "residual", residual, lo=0))
    if layers is None:
        store = np.arange(1, depth + 1)
    else:
        arr = np.asarray(layers)
        if arr.dtype.kind not in "iu" or arr.ndim > 1 or arr.size == 0 or np.any((arr < 1) | (arr > depth)):
            check.fail(_F, "layers", f"a list of layer indices in 1..depth = 1..{depth}", layers)
        store = np.unique(arr.ravel().astype(np.int64))
    return sw, sb, depth, q0, qab0, store, alpha, width, check.dps(_F, dps)


def ntk(act: str | Activation, sigma_w2: float, sigma_b2: float, depth: int, q0: float = 1.0, qab0: float = 0.0,
        layers: ArrayLike | None = None, residual: float | None = None, parameterization: Literal["ntk", "standard"] = "ntk",
        dps: int | None = None, width: float = 1.0) -> NTK:
    """The NTK Theta^(l) of two inputs (variance q0, covariance qab0) through ``depth`` layers.

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation` (pools included).
    sigma_w2 : float
        Weight variance (> 0).
    sigma_b2 : float
        Bias variance (>= 0).
    depth : int
        Layers L >= 1; layer 1 is linear, Theta^(1) = K^(1).
    q0, qab0 : float
        The inputs' variance and covariance (abs(qab0) <= q0).
    layers : array_like of int, optional
        Layers (1..depth) to return; default all.
    residual : float, optional
        alpha >= 0: blocks z + alpha (W psi(z) + b) after the first layer.
    parameterization : {'ntk', 'standard'}
        "standard": neural-tangents' standard parameterisation with fan-in ``width`` in every layer.
    dps : int, optional
        None: float64 (gamma_theta exact as c -> 1 except for max-pools); N: mpmath at N digits.
    width : float
        Fan-in n of the standard parameterisation (ignored for "ntk").

    Returns
    -------
    NTK
        ``.theta_aa``, ``.theta_ab``, ``.gamma_theta``, ``.kappa(m)``, ``.lr_max(m)``, ``.shares_aa``, ``.status``.

    Examples
    --------
    >>> r = sf.ntk("relu", 2.0, 0.0, depth=10, q0=1.0, qab0=0.5)
    >>> float(r.theta_aa[-1]), round(float(r.theta_ab[-1]), 12)
    (20.0, 7.585388712435)
    """
    sw, sb, depth, q0, qab0, store, alpha, width, dps = _check(
        sigma_w2, sigma_b2, depth, q0, qab0, layers, residual, parameterization, width, dps)
    K = kernel(act)
    if dps is None:
        q, qab, d, status = _nngp_f64(act, sw, sb, depth, q0, qab0, alpha)
        terms, how, exact = _terms_f64(K, q, qab, d)
    else:
        q, qab, d = _nngp_mp(K, sw, sb, depth, q0, qab0, alpha, dps)
        status = "ok"
        terms, how, exact = _terms_mp(K, q, qab, d, dps), f"mpmath at dps={dps} (dTdot at extra digits)", True
    cw, cb = (sw, sb) if parameterization == "ntk" else (width, 1.0)
    coef = _Coefficients(sw, cw, cb, alpha)
    first = (cw * q0 + cb, cw * qab0 + cb, cw * (2 * q0 - 2 * qab0))
    if dps is not None:
        with mpmath.workdps(dps + GUARD_DIGITS):
            coef = _Coefficients(*(to_mpf(v) if v is not None else None for v in (sw, cw, cb, alpha)))
            first = (coef.cw * to_mpf(q0) + coef.cb, coef.cw * to_mpf(qab0) + coef.cb,
                     2 * coef.cw * (to_mpf(q0) - to_mpf(qab0)))
            taa, tab, dth, shares = _theta(first, terms, coef, depth, mp=True)
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            taa, tab, dth, shares = _theta(first, terms, coef, depth, mp=False)
        if status == "ok" and not np.all(np.isfinite(taa)):
            status = f"Theta overflowed float64 after layer {int(np.argmax(~np.isfinite(taa)))} (use dps)"
    idx = store - 1
    return NTK(theta_aa=taa[idx], theta_ab=tab[idx], d_theta=dth[idx], q=q[idx], qab=qab[idx], d=d[idx],
               layers=store, shares_aa=shares[0], shares_ab=shares[1], status=status, exact=exact, how=how,
               precision="float64" if dps is None else f"mpmath(dps={dps})",
               params=dict(act=K.act.name, sigma_w2=sw, sigma_b2=sb, depth=depth, q0=q0, qab0=qab0,
                           residual=alpha, parameterization=parameterization, width=width))


@dataclass(frozen=True)
class _Coefficients:
    """Layer l -> l+1: A = [1 if residual] + g sigma_w2 Tdot, B = g (cw T + cb), g = alpha^2 or 1."""
    sw: object
    cw: object
    cb: object
    alpha: object

    @property
    def g(self):
        return 1 if self.alpha is None else self.alpha * self.alpha

    @property
    def skip(self):
        return 0 if self.alpha is None else 1


def _theta(first, terms, c, depth, mp):
    """Theta_aa, Theta_ab, d_Theta per layer (index 0 = layer 1), and the layer shares at the last layer."""
    V, D, td_aa, td_ab, dtd = terms
    n = depth
    zeros = (lambda: [mpmath.mpf(0)] * n) if mp else (lambda: np.zeros(n))
    taa, tab, dth = zeros(), zeros(), zeros()
    A_aa, A_ab, B_aa, B_ab = zeros(), zeros(), zeros(), zeros()
    taa[0], tab[0], dth[0] = first
    B_aa[0], B_ab[0] = first[0], first[1]
    g, skip = c.g, c.skip
    for i in range(n - 1):          # layer i+1 -> i+2 with the maps at layer i+1's kernel
        A_aa[i + 1] = skip + g * c.sw * td_aa[i]
        A_ab[i + 1] = skip + g * c.sw * td_ab[i]
        B_aa[i + 1] = g * (c.cw * V[i] + c.cb)
        B_ab[i + 1] = g * (c.cw * (V[i] - D[i] / 2) + c.cb)
        taa[i + 1] = A_aa[i + 1] * taa[i] + B_aa[i + 1]
        tab[i + 1] = A_ab[i + 1] * tab[i] + B_ab[i + 1]
        dth[i + 1] = A_aa[i + 1] * dth[i] + g * (c.cw * D[i] + 2 * c.sw * dtd[i] * tab[i])
    shares = []
    for A, B, T in ((A_aa, B_aa, taa), (A_ab, B_ab, tab)):
        out, prod = [None] * n, 1
        for i in range(n - 1, -1, -1):      # layer i+1's parameters: B_i times the later slopes
            out[i] = B[i] * prod / T[n - 1] if T[n - 1] != 0 else (mpmath.nan if mp else math.nan)
            prod = prod * A[i]
        shares.append(np.array(out, dtype=object if mp else float))
    if mp:
        return (np.array(taa, dtype=object), np.array(tab, dtype=object), np.array(dth, dtype=object), shares)
    return taa, tab, dth, shares


# ------------------------------------------------------------------------------------------- the NNGP kernel
def _nngp_f64(act, sw, sb, depth, q0, qab0, alpha):
    """q, q_ab, d per layer from :func:`propagate` (its compiled recursion, d by the distance map)."""
    P = propagate(act, sw, sb, depth, q0=q0, qab0=qab0, residual=alpha)
    status = "ok"
    if P.n_failed:
        code = int(np.ravel(P.status)[0])
        status = f"{P.STATUS[code]}; last finite gamma at layer {int(np.ravel(P.last_finite)[0])}"
    return P.q.reshape(depth), P.qab.reshape(depth), P.d.reshape(depth), status


def _nngp_mp(K, sw, sb, depth, q0, qab0, alpha, dps):
    """q, q_ab, d per layer in mpmath at dps digits (the engine's step: d by the distance map)."""
    first_layer, layer_step = maps(K, dps).step()
    q, qab, d = [], [], []
    with mpmath.workdps(dps + GUARD_DIGITS):
        sw_, sb_ = to_mpf(sw), to_mpf(sb)
        a2 = 0 if alpha is None else to_mpf(alpha) ** 2
        qa0, qc0 = to_mpf(q0), to_mpf(qab0)
        state = first_layer(qa0, qa0, qc0, 2 * (qa0 - qc0), sw_, sb_)
        for layer in range(depth):
            qa, _, qc, dd = state
            q.append(qa), qab.append(qc), d.append(dd)
            if layer + 1 < depth:
                state = layer_step(qa, qa, qc, dd, sw_, sb_, a2, alpha is not None, False, None)
    return (np.array(v, dtype=object) for v in (q, qab, d))


# ------------------------------------------------------------------------------------------- the maps per layer
def _derivative_kernel(K):
    """The kernel of phi' (single node), or None (a pool of k > 1 or no derivative kernel)."""
    act = K.act if K.base is None else K.base.act
    if K.act.pool is not None and K.act.k > 1 and K.act.pool == "max":
        return None
    try:
        d1 = sp.diff(act.expr, X)
        if d1.has(sp.DiracDelta):
            return None
        return kernel(Activation(f"d({act.name})/dx", d1))
    except (Unsupported, InvalidValue, *SYMPY_GAVE_UP):
        return None


_GL_T, _GL_W = np.polynomial.legendre.leggauss(8)


def _price_form(K):
    """d/dq12 of a closed-form, kink-free dC (= E[grad^2 psi(u) : grad^2 psi(v)] by Price's theorem), or None."""
    if K.kinks or K.dC.has(sp.Integral) or (K.act.pool == "max" and K.act.k > 1):
        return None
    return sp.diff(K.dC, Q12)


def _dtdot_small(K, M, dC2, qv, cv, dv):
    """dTdot = dC(q, q, q) - dC(q, q, q - d/2) = (d/2) int_0^1 dC2(q, q, q - t d/2) dt by 8-point Gauss-Legendre
    (dC2 is analytic near c = 1 for a kink-free psi; no difference of nearly equal numbers)."""
    total = np.zeros(qv.shape)
    for t, w in zip((_GL_T + 1) / 2, _GL_W / 2):
        total += w * M.expect(dC2, (Q1, Q2, Q12), (qv, qv, qv - t * dv / 2))
    return dv / 2 * total


def _terms_f64(K, q, qab, d):
    """V, D, Tdot_aa, Tdot_ab, dTdot at every layer (float64 arrays from the maps engine)."""
    M = maps(K)
    ok = np.isfinite(q) & np.isfinite(d)
    out = [np.full(q.shape, np.nan) for _ in range(5)]
    qv, cv, dv = q[ok], qab[ok], d[ok]
    out[0][ok], out[1][ok] = M.V(qv), M.D(qv, qv, cv, dv)
    out[2][ok], out[3][ok] = M.dpsi2(qv), M.dC(qv, qv, cv)
    dtd = out[2][ok] - out[3][ok]
    small = dv <= SERIES_D * np.maximum(qv, 1.0)
    dC2 = _price_form(K)
    if dC2 is not None:
        if small.any():
            dtd[small] = _dtdot_small(K, M, dC2, qv[small], cv[small], dv[small])
        out[4][ok] = dtd
        return out, "dTdot by Price's theorem, (d/2) int d(dC)/dq12 (8-point Gauss-Legendre) for d <= 1e-4, plain above", True
    Kd = _derivative_kernel(K)
    if Kd is None:
        out[4][ok] = dtd
        return out, "dTdot = dpsi2 - dC (plain difference: loses digits as c -> 1)", False
    r = distance_rule(Kd)
    k = 1 if K.act.pool is None else K.act.k
    use = np.ones(qv.shape, bool) if Kd.closed_form and r.exact else small
    if use.any():
        dtd[use] = maps(Kd).D(qv[use], qv[use], cv[use], dv[use]) / (2 * k)
    out[4][ok] = dtd
    how = f"dTdot = D[phi']/2{'' if k == 1 else f'/{k}'} ({r.method})" + ("" if use.all() else ", plain above d = 1e-4")
    return out, how, r.exact


def _terms_mp(K, q, qab, d, dps):
    """The same in mpmath: dTdot = dpsi2 - dC at dps + log10(q/d) + guard digits (no digits lost)."""
    M = maps(K, dps)
    out = [[], [], [], [], []]
    for qa, qc, dd in zip(q, qab, d):
        out[0].append(M.V(qa))
        out[1].append(M.D(qa, qa, qc, dd))
        out[2].append(M.dpsi2(qa))
        out[3].append(M.dC(qa, qa, qc))
        extra = 0 if dd <= 0 else max(0, int(mpmath.log10(max(qa, 1) / dd)))
        work = dps + 10 * (extra // 10 + 1) + GUARD_DIGITS
        Mw = maps(K, work)
        with mpmath.workdps(work):
            qa_w = to_mpf(qa)
            diff = Mw.dpsi2(qa_w) - Mw.dC(qa_w, qa_w, qa_w - to_mpf(dd) / 2)
        with mpmath.workdps(dps + GUARD_DIGITS):
            out[4].append(+diff)
    return out
