"""The neutrality line: c*(sigma_w2, sigma_b2) = 1/2, i.e. gamma* = 1 (docs/theory.md section 6).

For each sigma_b2 the line is the root in q of the residual of the c-map at c = 1/2 with sigma_w2 eliminated
by the q* equation (:func:`neutral_residual`), located in float64 and, at dps, refined by a few secant steps
in mpmath; activations whose normalised map never reaches 1/2 have no line (:func:`no_neutrality`).
"""
from __future__ import annotations

import math
from typing import Any

import mpmath
import numpy as np
import sympy as sp
from numpy.typing import ArrayLike, NDArray

from symfield.core import validate as check
from symfield.core.errors import InvalidValue, PrecisionError
from symfield.numeric.context import objects
from symfield.numeric.evaluate import NUMPY_MODULES, to_mpf, vectorised
from symfield.numeric.maps import maps
from symfield.numeric.vroot import vroot
from symfield.symbolic.activation import Activation
from symfield.symbolic.kernel import kernel
from symfield.symbolic.limits import limit_kernel
from symfield.core import caches

from symfield.theory import norm as nm
from symfield.theory.cstar import c_star_f64
from symfield.theory.qstar import Q_MAX


# ---------------------------------------------------------------- neutrality
def neutral_residual(N, q, sb):
    """(sigma_w2(q), h(q)) on the q* equation sigma_w2(q) = (q - sigma_b2)/V(q), with
    h(q) = (sigma_w2(q) C(q, q, q/2) + sigma_b2)/q - 1/2: zero where 1/2 is a fixed point of the c-map."""
    return _residual(N.V(q), N.C_eq(q, 0.5), q, sb)


def _residual(v, c, q, sb):
    """(sigma_w2, h) of :func:`neutral_residual` from V(q) = v and C(q, q, q/2) = c."""
    sw = (q - sb) / v
    return sw, (sw * c + sb) / q - 0.5


H_SURE = 1e-9     # h above this from the floor of C: no root at this step, whatever the rounding


def _c_half_floor(N, q, v):
    """A lower bound on C(q, q, q/2) from 1-D maps only: C(q, q, c q) = sum_n a_n c^n with a_n >= 0 (Mehler's
    expansion, any psi and pool at equal norms), so C(1/2) >= a_0 = E[psi]^2, and C is convex in c with
    C(1) = V(q), dC/dc(1) = q E[psi'^2](q), so C(1/2) >= V - q E[psi'^2]/2. Where it puts h above 0 the
    costly C (a max-pool's 4-D integral: 0.05-0.3 s) is not needed to know the step does not cross."""
    q1 = np.array([q])
    convex = v - 0.5 * q * float(N.dpsi2(q1)[0])
    if N.K.mean.has(sp.Integral):     # E[psi] by quadrature (its rule costs more than it saves): the tangent only
        return convex
    return max(float(N.mean(q1)[0]) ** 2, convex)


def no_neutrality(K, N):
    """True when h of :func:`neutral_residual` is provably > 0 for every q > sigma_b2 (no line at any
    sigma_b2): for psi positively homogeneous of degree 1, V = q V(1) and C(q, q, q/2) = q C(1, 1, 1/2),
    so h(q) = rho - 1/2 + (sigma_b2/q)(1 - rho) with rho = C(1, 1, 1/2)/V(1), which stays > 0 iff rho >= 1/2."""
    if not K.degree_one:
        return False
    rho = float(N.C_eq(np.array([1.0]), 0.5)[0] / N.V(np.array([1.0]))[0])
    return rho >= 0.5


def _deviation(K, LK):
    """sup_x |phi(x) - phi_inf(x)| (on 40001 points of [-80, 80], x 1.05), or inf where it still grows
    at |x| = 1e6 (phi - phi_inf unbounded)."""
    f = vectorised(K.act.single.expr - LK.act.single.expr, NUMPY_MODULES)
    with np.errstate(all="ignore"):
        inner = np.abs(np.broadcast_to(f(np.linspace(-80.0, 80.0, 40001)), (40001,)))
        outer = np.abs(np.broadcast_to(f(np.array([-1e6, 1e6])), (2,)))
    R = max(float(inner.max()), float(outer.max()))
    return 1.05 * R if np.isfinite(R) and outer.max() <= 1.05 * inner.max() else math.inf


_CUTOFF: dict = caches.memo()


def _neutral_cutoff(K):
    """A q above which h of :func:`neutral_residual` is > 0 for every sigma_b2, from the q -> inf limit
    (symfield.symbolic.limits), else inf. With psi = psi_inf + r, |r| <= R (:func:`_deviation`),
    Cauchy-Schwarz gives |C(q, q, q c)/q - C_inf(c)| <= e(q) = 2 R sqrt(V_inf/q) + R^2/q (and the same
    for V), so rho(q) = C(q, q, q/2)/V(q) >= (C_inf(1/2) - e)/(V_inf + e) for all q >= Q; and
    h = rho - 1/2 + (sigma_b2/q)(1 - rho) >= rho - 1/2 (rho <= 1). The first Q = 2^k where that bound
    exceeds 1/2 is the cutoff: no neutrality root lies above it."""
    if K in _CUTOFF:
        return _CUTOFF[K]
    out, LK = math.inf, limit_kernel(K)
    if LK is not None:
        R, M = _deviation(K, LK), maps(LK)
        vi, ci = float(M.V(1.0)), float(M.C_eq(np.array([1.0]), 0.5)[0])
        for k in range(0, 60):
            e = 2 * R * math.sqrt(vi / 2.0 ** k) + R * R / 2.0 ** k
            if (ci - e) / (vi + e) > 0.5:
                out = 2.0 ** k
                break
    _CUTOFF[K] = out
    return out


def neutrality_line(K, sigma_b2, sigma_w2_max=50.0):
    """float64 neutrality line of kernel K for a 1-D array sigma_b2 > 0, by eliminating sigma_w2
    (c* = 1/2 known): on the q* equation, q > sigma_b2, solve h(q) = 0 of :func:`neutral_residual`;
    h -> 1/2 > 0 as q -> sigma_b2+. The bracket steps q over the powers of 2 above sigma_b2 until h < 0
    (NaN where sigma_w2(q) passes sigma_w2_max or q passes Q_MAX or the cutoff first, or the root's
    sigma_w2 is above sigma_w2_max). The steps are shared by every sigma_b2: h(q) = rho(q) - 1/2 +
    (sigma_b2/q)(1 - rho(q)) with rho = C(q, q, q/2)/V(q), so one rho per power of 2 brackets all of them
    (a map evaluation per step, not per step and sigma_b2). Then 1/2 must be the stable c* reached from
    c1 (checked; NaN otherwise). Returns (sigma_w2, q*)."""
    N = maps(K)
    sb = np.asarray(sigma_b2, float)
    if no_neutrality(K, N):
        return np.full(sb.shape, np.nan), np.full(sb.shape, np.nan)

    def parts(qv, j):
        return neutral_residual(N, qv, sb[j])

    n = sb.size
    base = sb * (1 + 1e-9)
    top = min(Q_MAX, _neutral_cutoff(K))
    lo, hi, hlo, hhi = base.copy(), np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    failed = ~(np.isfinite(base) & (base > 0))
    live = ~failed
    e = math.floor(math.log2(base[live].min())) if live.any() else 0
    while live.any():
        e += 1
        qe = 2.0 ** e
        if qe > top:
            failed[live] = True
            break
        j = np.nonzero(live & (base < qe))[0]
        if not j.size:
            continue
        v = float(N.V(np.array([qe]))[0])
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            sw, h = _residual(v, _c_half_floor(N, qe, v), qe, sb[j])
        exact = not np.all(h > H_SURE)      # the floor does not decide every row: C itself
        if exact:
            with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
                sw, h = _residual(v, float(N.C_eq(np.array([qe]), 0.5)[0]), qe, sb[j])
        out = ((sw > sigma_w2_max) & (h > 0)) | ~np.isfinite(h)
        failed[j[out]] = True
        live[j[out]] = False
        cross, climb = ~out & (h <= 0), ~out & (h > 0)
        hi[j[cross]], hhi[j[cross]] = qe, h[cross]
        live[j[cross]] = False
        lo[j[climb]], hlo[j[climb]] = qe, (h[climb] if exact else np.nan)   # NaN: > 0, evaluated if bracketed
    first = np.nonzero(~failed & np.isnan(hlo))[0]       # h at the low end: sigma_b2+ or a step the floor decided
    if first.size:
        hlo[first] = parts(lo[first], first)[1]
        failed[first[~(hlo[first] > 0)]] = True
    qs = np.full(n, np.nan)
    j = np.nonzero(~failed)[0]
    if j.size:
        qs[j] = vroot(lambda x, k: parts(x, j[k])[1], lo[j], hi[j], hlo[j], hhi[j])
    sw = np.where(np.isnan(qs), np.nan, (qs - sb) / N.V(np.where(np.isnan(qs), 1.0, qs)))
    sw[sw > sigma_w2_max] = np.nan      # bracketed past sigma_w2_max: the root itself may still lie beyond it
    ok = ~np.isnan(sw)
    if ok.any():  # 1/2 must be the fixed point the recursion reaches from c1
        cs = c_star_f64(K, sw[ok], sb[ok], qs[ok])[0]
        bad = np.abs(cs - 0.5) > 1e-6
        sw[np.nonzero(ok)[0][bad]] = np.nan
    return sw, qs


def _neutral_slope(K, sb, q0):
    """dh/dq at the float64 root q0 (central difference on the float64 maps, ~1e-9 relative)."""
    N, dq = maps(K), 1e-5 * q0
    h = neutral_residual(N, np.array([q0 - dq, q0 + dq]), np.array([sb, sb]))[1]
    return float(h[1] - h[0]) / (2 * dq)


NEUTRAL_STEPS = 8   # at most this many full-precision secant steps from the float64 root
SLOPE_ERR = 1e-7    # bound on the relative error of the float64 slope


def _neutrality_refined(N, sb, q0):
    """sigma_w2 on the neutrality line to dps digits: from the float64 root q0 of h, a first step with
    the float64 slope (:func:`_neutral_slope`, relative error <= SLOPE_ERR), then secant steps on the
    mp maps. A step s whose slope had relative error e leaves an error ~ |s| e (a secant slope's e ~
    the previous step / q): stop when that is below 10^-(dps+2) q, or when |h| stops falling (the
    maps' rounding). Certified by the residual |h| <= 10^-dps max(1, q) and by staying within 1e-8 q0
    of q0 (else ArithmeticError). Each step is one evaluation of V and C at dps (3 are typical)."""
    with mpmath.workdps(N.dps + 10):
        sbm, x = to_mpf(sb), mpmath.mpf(q0)
        sw, h = (v[0] for v in neutral_residual(N, objects([x]), sbm))
        d, err = mpmath.mpf(_neutral_slope(N.K, sb, q0)), mpmath.mpf(SLOPE_ERR)
        tiny = mpmath.mpf(10) ** -(N.dps + 2)
        for _ in range(NEUTRAL_STEPS):
            if h == 0 or not d or not mpmath.isfinite(d):
                break
            x1 = x - h / d
            sw1, h1 = (v[0] for v in neutral_residual(N, objects([x1]), sbm))
            if abs(h1) >= abs(h):       # the maps' rounding floor: keep the better point
                break
            step = abs(x1 - x)
            if step > mpmath.mpf(10) ** (8 - N.dps) * abs(x):   # secant slope only above the rounding
                d = (h1 - h) / (x1 - x)
            x, sw, h, done, err = x1, sw1, h1, step * err <= tiny * abs(x1), step / abs(x1)
            if done:
                break
        if abs(x - q0) > 1e-8 * mpmath.mpf(q0) or abs(h) > mpmath.mpf(10) ** -N.dps * max(1, abs(x)):
            raise PrecisionError(f"neutrality: the mpmath root from q = {q0!r} did not converge (residual "
                                  f"{mpmath.nstr(abs(h), 3)}, at dps={N.dps}); cannot certify sigma_w2")
    with mpmath.workdps(N.dps):
        return +sw


def neutrality(act: str | Activation, sigma_b2: ArrayLike, dps: int | None = None,
               sigma_w2_max: float = 50.0, norm: str | None = None, norm_at: str = "before",
               batch: int | None = None) -> float | NDArray[Any] | mpmath.mpf:
    """sigma_w2 where c* = 1/2 (gamma* = 1) at each sigma_b2 > 0, by root finding on the
    eliminated equation of :func:`neutrality_line` (float64, arrays broadcast); dps=N refines
    the root in mpmath (secant from the float64 root, verified by its residual). Raises
    ValueError where c* stays above 1/2 for every sigma_w2 <= sigma_w2_max.

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation` (pools included).
    sigma_b2 : array_like
        Bias variances (> 0).
    dps : int, optional
        None for float64; N for mpmath numbers correct to N digits.
    sigma_w2_max : float
        Upper end of the search in sigma_w2.
    norm, norm_at, batch : optional
        Normalisation (docs/theory.md section 12; float64 only): the first sigma_w2 where the normalised
        c* (:func:`symfield.c_star` with the same options) falls to 1/2.

    Returns
    -------
    float, ndarray or mpmath.mpf
        sigma_w2 on the neutrality line.

    Examples
    --------
    >>> round(sf.neutrality("tanh", 0.05), 8)
    2.3782655
    """
    K = kernel(act)
    dps = check.dps("neutrality", dps)
    sb = check.real("neutrality", "sigma_b2", sigma_b2, lo=0, lo_open=True)
    wmax = float(check.real("neutrality", "sigma_w2_max", sigma_w2_max, lo=0, lo_open=True))
    opts = nm.options("neutrality", norm, norm_at, batch)
    if opts is not None:
        if dps is not None:
            check.fail("neutrality", "dps", "None with norm (the normalised neutrality line is float64)", dps)
        sw = np.array([nm.neutral_sigma_w2(K, opts, float(b), wmax) for b in sb.ravel()])
        return sw.reshape(sb.shape) if sb.ndim else float(sw[0])
    sw, qs = neutrality_line(K, sb.ravel(), wmax)
    if np.isnan(sw).any():
        bad = sb.ravel()[np.isnan(sw)]
        raise InvalidValue(f"{K.act.name} has no neutrality line at sigma_b2 = {', '.join(f'{v:g}' for v in bad[:5])}"
                         f"{' ...' if bad.size > 5 else ''} for sigma_w2 <= {wmax:g}: c* stays above 1/2 "
                         f"(prejudiced) there, or 1/2 is not the fixed point reached from c^(1).")
    if dps is None:
        return sw.reshape(sb.shape) if sb.ndim else float(sw[0])
    N = maps(K, dps)
    out = objects([_neutrality_refined(N, b, q0) for b, q0 in zip(sb.ravel().tolist(), qs.tolist())])
    return out.reshape(sb.shape) if sb.ndim else out[0]
