"""The edge of chaos: chi1(q*) = 1 together with the q* equation (docs/theory.md section 5).

Eliminating sigma_w2: h(q) = V(q)/E[psi'^2](q) + sigma_b2 - q = 0, then sigma_w2 = 1/E[psi'^2](q*), bracketed and
solved in the engine's number context (:func:`eoc_points`); sigma_b2 = 0 with psi(0) = 0 gives q* = 0 and
sigma_w2 = 1/E[psi'^2](0+); positively homogeneous psi have the vertical line sigma_w2 = 1/E[psi'^2]
(:func:`eoc_homogeneous`). Where that q* is unstable, :func:`eoc_depth` gives the depth-L edge of chaos.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Any

import mpmath
import numpy as np
from numpy.typing import ArrayLike, NDArray

from symfield.core import validate as check
from symfield.core.errors import InvalidValue, PrecisionError
from symfield.numeric.evaluate import to_mpf
from symfield.numeric.maps import maps
from symfield.numeric.vroot import vroot
from symfield.symbolic.activation import Activation
from symfield.symbolic.gaussian import q as Q
from symfield.symbolic.kernel import kernel
from symfield.symbolic.kernel_type import limit_at_0

from symfield.theory import norm as nm
from symfield.theory.qstar import Q_MAX, Q_MIN, closed_dpsi2_at_zero, dpsi2_at_zero, q_slope, q_star_points


@dataclass(frozen=True)
class EOC:
    """A point of the edge-of-chaos curve: chi1(q*) = 1 with q* = sigma_w2 V(q*) + sigma_b2.

    ``q_slope`` = sigma_w2 V'(q*) (float64), the slope of the variance map there: above 1 this q* is
    an UNSTABLE fixed point, which the recursion from q^(1) does not reach (e.g. x erf(x) at small
    sigma_b2: the network's q runs away although chi1(q*) = 1); ``stable`` says which.

    Positively homogeneous psi of degree 1 (docs/theory.md section 5): the EOC is the vertical line
    sigma_w2 = 1/E[psi'^2], ``q_star`` is inf for sigma_b2 > 0, ``q_slope`` is q_growth =
    sigma_w2 V(q)/q there, and ``note`` says so (empty for every other psi).

    Under LayerNorm before phi the edge of chaos is the ray sigma_b2/sigma_w2 = ``ratio`` =
    E[psi'^2](1) - V(1) (NaN without a normalisation); ``q_star`` is then the variance entering the norm."""
    sigma_b2: float
    sigma_w2: float
    q_star: float
    q_slope: float = math.nan
    note: str = ""
    ratio: float = math.nan

    @property
    def stable(self) -> bool:
        return bool(self.q_slope <= 1)


def eoc_point(K, sigma_b2, dps=None):
    """(sigma_w2, q*) of the edge of chaos of kernel K at one sigma_b2 >= 0 (floats, or mpmath at
    dps). Eliminate sigma_w2 (docs/theory.md section 5): solve h(q) = V(q)/dpsi2(q) + sigma_b2 - q
    = 0 (:func:`eoc_points`), then sigma_w2 = 1/dpsi2(q*). sigma_b2 = 0 with psi(0) = 0: q* = 0
    and sigma_w2 = 1/dpsi2(0+) exactly. Positively homogeneous psi: the vertical line
    sigma_w2 = 1/dpsi2 (:func:`eoc_homogeneous`). ValueError or ArithmeticError where there is no EOC."""
    sb = sigma_b2
    refuse_jumps(K)
    if K.degree_one:
        return eoc_homogeneous(K, sb, dps)[:2]
    if sb == 0 and K.zero_at_zero:  # q* = 0 is then a fixed point of the variance map
        return _eoc_at_zero(K, dps)
    N = maps(K, dps)
    sw, qs = N.ctx.run(partial(eoc_points, N), [sb])
    if math.isnan(sw[0]):
        if qs[0] == 0:
            raise PrecisionError(f"eoc: h(q) <= 0 at q = {Q_MIN:g}; no bracket for the edge of chaos of {K.act.name}.")
        raise InvalidValue(f"{K.act.name} has no edge of chaos at sigma_b2 = {N.ctx.show(sb)} (q* beyond {Q_MAX:g}).")
    return (float(sw[0]), float(qs[0])) if dps is None else (sw[0], qs[0])


def eoc_line(K, sb):
    """(sigma_w2, q*) of the EOC at every sigma_b2 of a 1-D float64 array, NaN where there is none (where
    :func:`eoc_point` raises): the general case in one vectorised root find (:func:`eoc_points`), the rest
    (positively homogeneous psi, sigma_b2 = 0 with psi(0) = 0) point by point."""
    sb = np.asarray(sb, float)
    sw, qs = np.full(sb.shape, math.nan), np.full(sb.shape, math.nan)
    try:
        refuse_jumps(K)
    except ValueError:
        return sw, qs
    general = np.full(sb.shape, not K.degree_one) & ~((sb == 0) & K.zero_at_zero)
    for i in np.nonzero(~general)[0]:
        try:
            sw[i], qs[i] = eoc_point(K, float(sb[i]))
        except (ValueError, ArithmeticError):
            pass
    j = np.nonzero(general)[0]
    if j.size:
        w, q = eoc_points(maps(K), sb[j])
        sw[j], qs[j] = w, np.where(np.isnan(w), math.nan, q)
    return sw, qs


def refuse_jumps(K):
    """ValueError when E[psi'^2] is infinite (psi jumps: psi' has a Dirac delta), since then
    chi1 = sigma_w2 E[psi'^2] is infinite for every sigma_w2 > 0 and there is no edge of chaos."""
    import sympy as sp
    if K.dpsi2 == sp.oo:
        raise InvalidValue(f"{K.act.name} jumps, so E[psi'^2] is infinite: chi1 = sigma_w2 E[psi'^2] is infinite "
                         f"for every sigma_w2 > 0 (every network with sigma_w2 > 0 is chaotic); there is no edge of chaos.")


def eoc_homogeneous(K, sb, dps):
    """EOC of a positively homogeneous psi of degree 1 (docs/theory.md section 5): V(q) = v q and
    E[psi'^2] = d do not depend on q, so chi1 = sigma_w2 d = 1 on the vertical line sigma_w2 = 1/d at
    every sigma_b2 (exact for closed-form d: relu 2, relu+max2 4/3). There the variance map is
    q' = r q + sigma_b2 with r = v/d (q_growth, section 2): q* = inf if r > 1, or r = 1 and
    sigma_b2 > 0 (q grows by sigma_b2 per layer); r = 1, sigma_b2 = 0: every q is a fixed point and
    q* = 0 is reported (as :func:`q_star`); r < 1: the root of :func:`q_star_points`.
    Returns (sigma_w2, q*, r, note); r is float64."""
    import sympy as sp
    name = K.act.name
    if K.dpsi2.has(sp.Integral):
        d = float(maps(K).dpsi2(1.0))
        exact = None
    else:
        exact = sp.simplify(K.dpsi2.subs(Q, 1))
        d = float(exact)
    if not d > 0:
        raise InvalidValue(f"{name} has E[psi'^2] = 0: chi1 = 0 for every sigma_w2, so there is no edge of chaos.")
    if dps is None:
        sw = 1 / d if exact is None else float(1 / exact)
    elif exact is None:
        with mpmath.workdps(dps + 10):
            sw = 1 / maps(K, dps + 10).dpsi2(mpmath.mpf(1))
        with mpmath.workdps(dps):
            sw = +sw
    else:
        with mpmath.workdps(dps):
            sw = mpmath.mpf(str(sp.N(1 / exact, dps + 5)))
    r = 1.0 if K.chi1_constant else float(maps(K).V(1.0)) / d
    r = 1.0 if abs(r - 1) <= 1e-12 else r
    zero, inf = (0.0, math.inf) if dps is None else (mpmath.mpf(0), mpmath.inf)
    note = (f"{name} is positively homogeneous: chi1 = sigma_w2 E[psi'^2] does not depend on q; the EOC is "
            f"the vertical line sigma_w2 = 1/E[psi'^2] = {float(sw):.10g}")
    if r == 1:
        qs = inf if sb > 0 else zero
        note += (", where q* is infinite for sigma_b2 > 0 (q' = q + sigma_b2: q grows by sigma_b2 per layer); "
                 "at sigma_b2 = 0 every q is a fixed point (q* = 0 reported).")
    elif r > 1:
        qs = inf
        note += (f", where q* is infinite at every sigma_b2: q_growth = sigma_w2 V(q)/q = {r:.6g} > 1 there (q grows "
                 f"geometrically; the variance criterion q_growth = 1 is at sigma_w2 = {float(sw) / r:.6g}).")
    else:
        qs = (lambda N: N.ctx.run(partial(q_star_points, N), [sw], [sb]))(maps(K, dps))[0]
        qs = float(qs) if dps is None else qs
        note += f", where q_growth = sigma_w2 V(q)/q = {r:.6g} < 1 and q* = sigma_b2/(1 - q_growth) is finite."
    return sw, qs, r, note


def _eoc_at_zero(K, dps):
    """(sigma_w2, q*) = (1/dpsi2(0+), 0): the EOC at sigma_b2 = 0 when psi(0) = 0 (exact where a closed form
    has the limit: :func:`symfield.theory.qstar.closed_dpsi2_at_zero`)."""
    import sympy as sp
    src = closed_dpsi2_at_zero(K)
    if src is not None:   # exact limit of the closed form
        d0 = limit_at_0(src.dpsi2)
        if not d0.is_positive:
            raise InvalidValue(f"{K.act.name} has E[psi'^2] -> 0 as q -> 0: no edge of chaos at sigma_b2 = 0.")
        if dps is None:
            return float(1 / d0), 0.0
        with mpmath.workdps(dps):
            return mpmath.mpf(str(sp.N(1 / d0, dps + 5))), mpmath.mpf(0)
    # integral form: E[psi'^2](q) = E[psi'^2](0+) + O(q); q far below the working precision
    d0 = dpsi2_at_zero(K) if dps is None else maps(K, dps).dpsi2(mpmath.mpf(10) ** (-2 * dps - 10))
    if not d0 > 0:
        raise InvalidValue(f"{K.act.name} has E[psi'^2] -> 0 as q -> 0: no edge of chaos at sigma_b2 = 0.")
    return (1 / float(d0), 0.0) if dps is None else (1 / d0, mpmath.mpf(0))


def eoc_points(N, sb):
    """EOC for a 1-D array sb > 0 of N's numbers: roots of h(q) = V(q)/E[psi'^2](q) + sigma_b2 - q
    (h > 0 at q = Q_MIN; the bracket [Q_MIN, 1] grows by 4 up to Q_MAX), sigma_w2 = 1/E[psi'^2](q*).
    Returns (sigma_w2, q*); NaN with q* = 0 (no bracket at Q_MIN) or inf (none below Q_MAX)."""
    def h(qv, j):
        return N.V(qv) / N.dpsi2(qv) + sb[j] - qv

    n = sb.size
    lo = N.ctx.full(n, Q_MIN)
    hlo = h(lo, np.arange(n))
    qs = N.ctx.full(n, math.nan)
    qs[hlo <= 0] = N.ctx.zero
    hi, hhi = N.ctx.full(n, 1.0), N.ctx.full(n, math.nan)
    live = hlo > 0
    hhi[live] = h(hi[live], np.nonzero(live)[0])
    grow = live & (hhi > 0)
    while grow.any():
        j = np.nonzero(grow)[0]
        hi[j] *= 4
        hhi[j] = h(hi[j], j)
        over = hi[j] > Q_MAX
        qs[j[over & (hhi[j] > 0)]] = N.ctx.inf
        grow[j] = (hhi[j] > 0) & ~over
    j = np.nonzero(live & (hhi <= 0))[0]
    if j.size:
        qs[j] = N.ctx.roots(lambda x, k: h(x, j[k]), lo[j], hi[j], hlo[j], hhi[j], "eoc")
    ok = (qs > 0) & (qs < N.ctx.inf)
    sw = N.ctx.full(n, math.nan)
    sw[ok] = 1.0 / N.dpsi2(qs[ok])
    return sw, qs


def eoc(act: str | Activation, sigma_b2: float, dps: int | None = None, norm: str | None = None,
        norm_at: str = "before", batch: int | None = None) -> EOC:
    """Edge of chaos at ``sigma_b2``: result with .sigma_w2 and .q_star (bracketing root finder).
    Positively homogeneous psi (relu family): sigma_w2 = 1/E[psi'^2] at every sigma_b2, q* = inf
    for sigma_b2 > 0, explained in .note.

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation` (pools included).
    sigma_b2 : float
        Bias variance (>= 0).
    dps : int, optional
        None for float64; N for mpmath numbers correct to N digits.
    norm : {None, 'layer', 'batch'}
        Normalisation (docs/theory.md section 12). LayerNorm before phi: the ray sigma_b2/sigma_w2 =
        E[psi'^2](1) - V(1) (``.ratio``); after phi: the root of sigma_w2 E[psi'^2](q) = Var psi(q) at
        q = sigma_w2 + sigma_b2. BatchNorm has no edge of chaos (lambda_B >= 1 whatever the weights): an error.
    norm_at : {'before', 'after'}
        Normalise the pre-activation h ("before") or phi(h) ("after").
    batch : int, optional
        BatchNorm batch size (only with norm='batch').

    Returns
    -------
    EOC
        ``sigma_w2``, ``q_star``, ``q_slope`` (= sigma_w2 V'(q*); ``stable`` if <= 1), ``note`` and ``ratio``.

    Examples
    --------
    >>> round(sf.eoc("tanh", 0.05).sigma_w2, 10)
    1.7609546396
    >>> sf.eoc("relu", 0.0).sigma_w2
    2.0
    """
    K = kernel(act)
    dps = check.dps("eoc", dps)
    sb = float(check.real("eoc", "sigma_b2", sigma_b2, lo=0))
    opts = nm.options("eoc", norm, norm_at, batch)
    refuse_jumps(K)
    if opts is not None:
        return _normed_eoc(K, opts, sb, dps)
    note = ""
    if K.degree_one:             # q_slope = sigma_w2 V'(q) = q_growth, the same at every q
        sw, qs, slope, note = eoc_homogeneous(K, sb, dps)
    else:
        sw, qs = eoc_point(K, sb, dps)
        slope = q_slope(K, sw, qs)
    if not slope <= 1 and not note:
        note = (f"q* = {float(qs):.6g} is an unstable fixed point (q_slope = sigma_w2 V'(q*) = {slope:.6g} > 1): "
                "no network reaches it, so this sigma_w2 does not put a deep network at the edge of chaos; "
                "sf.eoc_depth(act, sigma_b2, depth) gives the sigma_w2 at which the product of chi1 over the "
                "layers is 1.")
    if dps is not None:
        with mpmath.workdps(dps):
            sb = to_mpf(sb)
    return EOC(sigma_b2=sb, sigma_w2=sw, q_star=qs, q_slope=slope, note=note)


def _normed_eoc(K, opts, sb, dps):
    """The edge of chaos under a normalisation (:func:`eoc`)."""
    one = 1.0 if dps is None else mpmath.mpf(1)
    sbn = sb if dps is None else to_mpf(sb)
    if opts.kind == "batch":
        rate = nm.bn_rate(K, opts.at, opts.batch, dps)[0] if opts.at == "before" else math.nan
        raise InvalidValue(f"eoc: {K.act.name} under {opts.label} has no edge of chaos: the batch Gram matrix is at "
                           f"its fixed point (c* < 1) after one layer whatever the weights"
                           + (f", and the gradient rate lambda_B = {float(rate):.10g} per layer does not depend on "
                              f"sigma_w2 or sigma_b2 (sf.batchnorm)." if opts.at == "before" else "."))
    if opts.at == "after":
        sw = nm.ln_after_eoc(K, sbn, dps)
        ratio = sbn / sw if sw else math.nan
        return EOC(sigma_b2=sbn, sigma_w2=sw, q_star=sw + sbn, q_slope=0.0, ratio=ratio,
                   note=f"LayerNorm after phi: q* = sigma_w2 + sigma_b2, chi1 = sigma_w2 E[psi'^2](q*)/Var psi(q*) = 1.")
    r = nm.ln_ratio(K, dps)
    if not r >= 0 or (r == 0 and sb > 0):
        raise InvalidValue(f"eoc: {K.act.name} under LayerNorm before phi has no edge of chaos at sigma_b2 = {sb:g}: "
                           f"the ray sigma_b2/sigma_w2 = E[psi'^2](1) - V(1) = {float(r):.10g} "
                           + ("< 0 (chi1 < 1 everywhere: ordered)." if r < 0 else "= 0 is the axis sigma_b2 = 0."))
    if r == 0:
        sw = math.nan * one
        note = "LayerNorm before phi: E[psi'^2](1) = V(1), so every sigma_w2 at sigma_b2 = 0 is on the edge of chaos."
    else:
        sw = sbn / r
        note = (f"LayerNorm before phi: the edge of chaos is the ray sigma_b2/sigma_w2 = E[psi'^2](1) - V(1) = "
                f"{float(r):.12g}; chaotic below it (chi1 = E[psi'^2]/V(1) = "
                f"{float(maps(K).dpsi2(1.0) / maps(K).V(1.0)):.10g} at sigma_b2 = 0), ordered above.")
    q_in = sw * maps(K, dps).V(one) + sbn
    q_in = float(q_in) if dps is None else q_in
    return EOC(sigma_b2=sbn, sigma_w2=sw, q_star=q_in, q_slope=0.0, note=note, ratio=r)


@dataclass(frozen=True)
class DepthEOC:
    """The depth-L edge of chaos: the sigma_w2 at which prod_{l=1}^{L} chi1(q^(l)) = 1 along the
    variance recursion from q0 (``chi_product`` the product reached, 1 to the root's accuracy);
    ``sensitivity`` = d ln(prod chi1)/d ln(sigma_w2) there (a 1 % error in sigma_w2 changes the
    product by about ``sensitivity`` %); ``q_last`` = q^(L)."""
    sigma_b2: float
    sigma_w2: float
    depth: int
    q0: float
    chi_product: float
    sensitivity: float
    q_last: float


def _log_chi_product(K, sw, sb, depth, q0):
    """sum_{l=1}^{L} ln(sigma_w2 E[psi'^2](q^(l))), q^(1) = sigma_w2 q0 + sigma_b2, q^(l+1) =
    sigma_w2 V(q^(l)) + sigma_b2, for a 1-D array sw (float64; q capped at Q_MAX, where the limit map
    holds); also returns q^(L)."""
    F = maps(K)
    q = sw * q0 + sb
    total = np.zeros(sw.shape)
    for layer in range(depth):
        if layer:
            q = np.minimum(sw * F.V(q) + sb, Q_MAX)
        with np.errstate(divide="ignore"):
            total += np.log(sw * F.dpsi2(np.maximum(q, Q_MIN)))
    return total, q


def eoc_depth(act: str | Activation, sigma_b2: float, depth: int, q0: float = 1.0) -> DepthEOC:
    """Depth-L edge of chaos: sigma_w2 with prod_{l=1}^{L} chi1(q^(l)) = 1 along the recursion from q0.

    The usable gain where the edge of chaos of :func:`eoc` is an unstable fixed point that no network
    reaches (gelu, silu at small sigma_b2): the input-output Jacobian's mean squared singular value
    prod chi1 is then 1 at depth L exactly. The root of ln(prod chi1) in sigma_w2 is bracketed on a
    geometric scan of (1e-3, 1e3) and solved by bisection in float64.

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation` (pools included).
    sigma_b2 : float
        Bias variance (>= 0).
    depth : int
        Number of layers L (>= 1).
    q0 : float
        Input norm ``|x|^2/n0`` (> 0).

    Returns
    -------
    DepthEOC
        ``sigma_w2``, ``chi_product``, ``sensitivity``, ``q_last``.

    Examples
    --------
    >>> round(sf.eoc_depth("relu", 0.1, 10).sigma_w2, 12)
    2.0
    """
    K = kernel(act)
    sb = float(check.real("eoc_depth", "sigma_b2", sigma_b2, lo=0))
    L = check.integer("eoc_depth", "depth", depth, lo=1)
    q0 = float(check.real("eoc_depth", "q0", q0, lo=0, lo_open=True))
    refuse_jumps(K)
    grid = np.geomspace(1e-3, 1e3, 6 * 16 + 1)
    f, _ = _log_chi_product(K, grid, sb, L, q0)
    cross = np.nonzero((f[:-1] < 0) & (f[1:] >= 0))[0]
    if not cross.size:
        raise InvalidValue(f"eoc_depth: {K.act.name} at sigma_b2 = {sb:g}, depth {L}: the product of chi1 over the "
                         f"layers does not cross 1 for sigma_w2 in (1e-3, 1e3) (it runs from {math.exp(f[0]):.3g} "
                         f"to {math.exp(min(f[-1], 700)):.3g}).")
    k = cross[0]
    sw = float(vroot(lambda x, j: _log_chi_product(K, x, sb, L, q0)[0], grid[k:k + 1], grid[k + 1:k + 2],
                     f[k:k + 1], f[k + 1:k + 2])[0])
    h = 1e-5
    (fm, val, fp_), ql = _log_chi_product(K, sw * np.array([1 - h, 1, 1 + h]), sb, L, q0)
    return DepthEOC(sb, sw, L, q0, float(math.exp(val)), float((fp_ - fm) / (2 * h)), float(ql[1]))


@dataclass(frozen=True)
class EOCCurve:
    """The edge of chaos along sigma_b2 (:func:`eoc_curve` with ``full=True``): sigma_w2 and the variance
    fixed point q* there, per sigma_b2 (NaN where a point has no edge of chaos)."""
    sigma_b2: NDArray[Any]
    sigma_w2: NDArray[Any]
    q_star: NDArray[Any]


def eoc_curve(act: str | Activation, sigma_b2: ArrayLike, dps: int | None = None, norm: str | None = None,
              norm_at: str = "before", batch: int | None = None, full: bool = False) -> NDArray[Any] | EOCCurve:
    """sigma_w2 on the edge of chaos for each sigma_b2 (array in, array out); for positively
    homogeneous psi the vertical line sigma_w2 = 1/E[psi'^2] (docs/theory.md section 5).

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation` (pools included).
    sigma_b2 : array_like
        Bias variances (>= 0).
    dps : int, optional
        None for float64; N for mpmath numbers correct to N digits.
    norm, norm_at, batch : optional
        Normalisation (docs/theory.md section 12): the LayerNorm ray or curve, NaN where there is no
        edge of chaos (every point under BatchNorm).
    full : bool
        Return an :class:`EOCCurve` with q* beside sigma_w2 (as ``symfield eoc-curve`` prints).

    Returns
    -------
    ndarray or EOCCurve
        sigma_w2 at each sigma_b2 (float64, or mpmath numbers in an object array).

    Examples
    --------
    >>> sf.eoc_curve("relu", [0.0, 0.1])
    array([2., 2.])
    >>> c = sf.eoc_curve("erf", [0.1], full=True); round(float(c.sigma_w2[0]), 6), round(float(c.q_star[0]), 6)
    (1.552118, 0.726359)
    """
    K = kernel(act)
    dps = check.dps("eoc_curve", dps)
    sb = check.real("eoc_curve", "sigma_b2", sigma_b2, lo=0)
    if not isinstance(full, bool):
        check.fail("eoc_curve", "full", "True or False", full)
    opts = nm.options("eoc_curve", norm, norm_at, batch)
    refuse_jumps(K)
    sw = np.full(sb.shape, math.nan, dtype=float if dps is None else object)
    qs = sw.copy()
    if opts is not None:
        for idx in np.ndindex(sb.shape):
            try:
                e = _normed_eoc(K, opts, float(sb[idx]), dps)
                sw[idx], qs[idx] = e.sigma_w2, e.q_star
            except (ValueError, ArithmeticError):
                pass
    elif K.degree_one:
        for idx in np.ndindex(sb.shape):
            sw[idx], qs[idx] = eoc_homogeneous(K, float(sb[idx]), dps)[:2]
    else:
        solved = False
        if dps is None and (sb > 0).all():
            w, q = (lambda N: N.ctx.run(partial(eoc_points, N), sb.ravel()))(maps(K))
            if not np.isnan(w).any():
                sw[...], qs[...], solved = w.reshape(sb.shape), q.reshape(sb.shape), True
        if not solved:
            for idx in np.ndindex(sb.shape):   # sigma_b2 = 0, dps, or points that raise a clear error
                sw[idx], qs[idx] = eoc_point(K, float(sb[idx]), dps)[:2]
    return EOCCurve(np.asarray(sb), sw, qs) if full else sw
