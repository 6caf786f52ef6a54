"""Fixed points of the mean-field maps, by bracketing root finding (never by iterating the map).

    q* solves g(q) = sigma_w2 V(q) + sigma_b2 - q = 0,

the root the layer recursion reaches from q^(1) = sigma_w2 + sigma_b2 (input norm 1): the first
root above q^(1) where g(q^(1)) > 0, the largest below it where g(q^(1)) < 0 (:func:`_q_star_brackets`;
gelu at (2.05, 0.05) has roots 0.1307 and 3.81 and reaches 0.1307 from q^(1) = 2.1). q* = 0 when
sigma_b2 = 0 and g < 0 from q^(1) down to Q_MIN; q* = inf when g > 0 from q^(1) up to Q_MAX (the
variance grows without bound, e.g. ReLU with sigma_w2 > 2). :func:`fixed_points` lists every root
with its stability. The edge of chaos, c* and the neutrality line: docs/theory.md
section 5; the phases: section 6.

One algorithm per quantity, run in a number context ``N`` (as mpmath runs one algorithm in
different contexts):

* :class:`_Float64`: float64, vectorised over 1-D numpy arrays; V, E[psi'^2] and C from
  :class:`_Maps`, the roots of many brackets at once by :func:`symfield.numeric.vroot.vroot`;
* :class:`_Mp`: mpmath at ``dps`` digits on 1-D object arrays (dps + 10 working digits, results
  rounded to dps, inputs read as the decimals they print as); the maps by
  :func:`symfield.numeric.evaluate.evaluate`, each root by anderson on its bracket to 10^(-2 dps),
  certified by its residual |f(x)| <= 10^-dps max(1, |x|) (ArithmeticError otherwise).

q* (:func:`_q_star_points`) and the edge of chaos (:func:`_eoc_points`) are written once on N:
the same brackets, grown the same way, in both number types. c* and the neutrality line are
located in float64 only (the scan of the c-map from c^(1) and the q -> 0 descent are float64 by
design); at dps that float64 root is refined and certified by the one shared step
:meth:`_Mp.refine` (anderson on [x0, x0 (1 + 1e-9)], certified by its residual and by staying
next to x0), on the same map formulas as float64 (:func:`_c_residual`, :func:`_neutral_residual`).
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
from symfield.core.errors import InvalidValue, PrecisionError, Unsupported
from symfield.numeric.context import objects
from symfield.numeric.evaluate import NUMPY_MODULES, evaluate, to_mpf, vectorised
from symfield.numeric.maps import maps
from symfield.numeric.vroot import vroot
from symfield.symbolic.activation import Activation
from symfield.symbolic.gaussian import q as Q
from symfield.symbolic.gaussian import q1 as Q1
from symfield.symbolic.gaussian import q2 as Q2
from symfield.symbolic.gaussian import q12 as Q12
from symfield.symbolic.kernel import kernel
from symfield.symbolic.limits import limit_kernel
from symfield.core import caches

Q_MIN, Q_MAX = 1e-12, 1e12


def _limit_q(K, qs):
    """Where to evaluate q-dependent quantities when q* is 0 or inf (scalar or array): q = 1 for
    positively homogeneous psi (they do not depend on q), else q = 1e-8 (q* = 0) or 1e8 (q* = inf)."""
    if K.degree_one:
        return np.ones_like(qs) if np.ndim(qs) else 1.0
    return np.where(np.asarray(qs) == 0, 1e-8, 1e8) if np.ndim(qs) else (1e-8 if qs == 0 else 1e8)


def _at_infinity(K, qs):
    """(maps of the q -> inf limit kernel or None, mask of the rows with q* = inf it serves): where psi grows
    linearly but is not homogeneous, the normalised maps at q* = inf are exactly those of its limit
    (symfield.symbolic.limits), evaluated at q = 1."""
    at_inf = np.asarray(qs) == math.inf
    if not at_inf.any() or K.degree_one:
        return None, np.zeros(np.shape(qs), bool)
    LK = limit_kernel(K)
    if LK is None:
        return None, np.zeros(np.shape(qs), bool)
    return maps(LK), at_inf


def dpsi2_at_fixed_point(K, qs, dps=None):
    """E[psi'^2] at the fixed points qs (array of float64 or mpmath numbers), the limits included:
    q* = inf: the limit kernel's E[psi_inf'^2] (docs/theory.md section 6: exact for linearly growing
    phi, and q-independent for positively homogeneous psi); q* = 0: E[psi'^2](0+). ValueError where
    q* = inf and phi does not grow linearly (no limit map: chi1 has no finite limit)."""
    qs = np.asarray(qs, dtype=object if dps is not None else float)
    out = np.empty(qs.shape, dtype=object if dps is not None else float)
    inf, zero = qs == math.inf, qs == 0
    finite = ~inf & ~zero
    if finite.any():
        out[finite] = evaluate(K.dpsi2, (Q,), (qs[finite],), K.kinks, dps)
    if zero.any():
        tiny = 1e-40 if dps is None else mpmath.mpf(10) ** (-2 * dps - 10)
        out[zero] = evaluate(K.dpsi2, (Q,), (tiny,), K.kinks, dps)
    if inf.any():
        LK = K if K.degree_one else limit_kernel(K)
        if LK is None:
            raise InvalidValue(f"{K.act.name}: q* is infinite and phi does not grow linearly, so E[psi'^2](q) "
                             "has no finite limit as q -> inf and chi1 at q* is undefined; pass q=...")
        out[inf] = evaluate(LK.dpsi2, (Q,), (1.0,), LK.kinks, dps)
    return out if out.ndim else out[()]


# ---------------------------------------------------------------- q*
SCAN_PER_DECADE = 16   # geometric scan of g(q) for sign changes: ratio 10^(1/16) = 1.155 between points


def _scan_grid(lo, hi):
    """Geometric grid from lo to hi (either order), SCAN_PER_DECADE points per decade, ends included."""
    n = max(2, int(math.ceil(abs(math.log10(hi / lo)) * SCAN_PER_DECADE)) + 1)
    return np.geomspace(lo, hi, n)


def _g_float(F, sw, sb, q):
    return sw * F.V(np.asarray(q, float)) + sb - q


def _q_star_brackets(K, sw, sb, q1):
    """float64 brackets of the fixed point the recursion reaches from q^(1) (1-D float arrays;
    q^(1) = sigma_w2 q0 + sigma_b2): (kind, lo, hi) with kind 0 (q* = 0), 1 (q* = lo exactly),
    2 (a root in [lo, hi]), 3 (q* = inf) or -1 (undefined: q^(1) or g not finite; q* is NaN). With g(q) = sigma_w2 V(q) + sigma_b2 - q:

    * g(q^(1)) > 0: q increases to the first root above q^(1) (inf if g > 0 up to Q_MAX);
    * g(q^(1)) < 0: q decreases to the largest root below q^(1); for sigma_b2 > 0 there is one in
      [sigma_b2, q^(1)] (g(sigma_b2) = sigma_w2 V(sigma_b2) >= 0); for sigma_b2 = 0 none above
      Q_MIN means q* = 0.

    The roots are located by a geometric scan (SCAN_PER_DECADE points per decade) walking from q^(1)
    in the direction the recursion moves (where V increases with q, as for every built-in, the
    recursion is monotone between roots, so this is the root it reaches); a pair of roots closer
    than one scan step is not resolved."""
    F = maps(K)
    n = sw.size
    kind, lo, hi = np.full(n, 2), np.full(n, math.nan), np.full(n, math.nan)
    kind[~(q1 > 0)] = 0
    with np.errstate(invalid="ignore", over="ignore"):
        g1 = _g_float(F, sw, sb, np.where(np.isfinite(q1), q1, 1.0))
    bad = (q1 > 0) & ~(np.isfinite(q1) & np.isfinite(g1))
    kind[bad] = -1
    live = np.nonzero((q1 > 0) & ~bad)[0]
    g1 = g1[live]
    exact = g1 == 0
    kind[live[exact]], lo[live[exact]] = 1, q1[live[exact]]
    live, g1 = live[~exact], g1[~exact]
    up = g1 > 0
    end = np.where(up, Q_MAX, np.maximum(sb[live], Q_MIN))
    past = np.where(up, end <= q1[live], end >= q1[live])   # nothing to scan between q^(1) and the end
    j = live[past]
    kind[j] = np.where(up[past], 3, np.where(sb[j] == 0, 0, 2))
    lo[j], hi[j] = np.where(kind[j] == 2, sb[j], math.nan), np.where(kind[j] == 2, q1[j], math.nan)
    live, up, end = live[~past], up[~past], end[~past]
    step = 10.0 ** (1 / SCAN_PER_DECADE)
    prev = q1[live].copy()
    while live.size:
        cur = np.where(up, np.minimum(prev * step, end), np.maximum(prev / step, end))
        with np.errstate(invalid="ignore", over="ignore"):
            g = _g_float(F, sw[live], sb[live], cur)
        stuck = ~np.isfinite(g) | (cur == prev)        # overflow, or no progress: undefined, not a loop
        kind[live[stuck]] = -1
        g = np.where(stuck, 0.0, g)
        crossed = np.where(up, g <= 0, g >= 0) & ~stuck
        hit = crossed & (g == 0)
        kind[live[hit]], lo[live[hit]] = 1, cur[hit]
        br = crossed & ~hit
        lo[live[br]], hi[live[br]] = np.minimum(prev[br], cur[br]), np.maximum(prev[br], cur[br])
        done = crossed | (cur == end) | stuck
        ended = done & ~crossed & ~stuck
        kind[live[ended]] = np.where(up[ended], 3, 0)
        live, up, end, prev = live[~done], up[~done], end[~done], cur[~done]
    return kind, lo, hi


def _q_star_points(N, sw, sb, q1=None):
    """q* for 1-D arrays sw, sb of N's numbers: the fixed point of g(q) = sw V(q) + sb - q that the
    layer recursion reaches from q^(1) (default sw + sb: input norm q0 = 1), located in float64 by
    :func:`_q_star_brackets` and solved in N's numbers on that bracket; 0 or inf where the
    recursion goes there."""
    fw, fb = np.array([float(v) for v in sw]), np.array([float(v) for v in sb])
    kind, lo, hi = _q_star_brackets(N.K, fw, fb, fw + fb if q1 is None else np.asarray(q1, float))
    out = N.ctx.full(sw.size, math.nan)
    out[kind == 0] = N.ctx.zero
    out[kind == 3] = N.ctx.inf
    for j in np.nonzero(kind == 1)[0]:
        out[j] = sw[j] + sb[j] if q1 is None and lo[j] == fw[j] + fb[j] else N.ctx.num([lo[j]])[0]
    idx = np.nonzero(kind == 2)[0]
    if idx.size:
        a, b = N.ctx.num(lo[idx]), N.ctx.num(hi[idx])
        fa = sw[idx] * N.V(a) + sb[idx] - a
        fb_ = sw[idx] * N.V(b) + sb[idx] - b
        out[idx] = N.ctx.roots(lambda x, j: sw[idx[j]] * N.V(x) + sb[idx[j]] - x, a, b, fa, fb_, "q_star")
    return out


@dataclass(frozen=True)
class FixedPoints:
    """Every fixed point of the variance map q -> sigma_w2 V(q) + sigma_b2 found on (Q_MIN, Q_MAX),
    with its stability, and the one the recursion reaches from q^(1).

    ``roots`` ascending; ``slopes`` sigma_w2 V'(q) at each (``stable`` where < 1: nearby q move
    towards it); ``q1`` = sigma_w2 q0 + sigma_b2, the first layer's variance; ``q_star`` the attractor
    reached from q1 (0 or inf included); ``basin`` the open interval of q^(1) values that reach it
    (bounded by the neighbouring unstable roots); ``note`` a one-line description."""
    sigma_w2: float
    sigma_b2: float
    q0: float
    q1: float
    q_star: float
    roots: tuple
    slopes: tuple
    basin: tuple
    note: str

    @property
    def stable(self) -> tuple:
        return tuple(bool(s < 1) for s in self.slopes)


def fixed_points(act: str | Activation, sigma_w2: float, sigma_b2: float, q0: float = 1.0) -> FixedPoints:
    """All fixed points of the variance map, their stability and the one reached from q0.

    g(q) = sigma_w2 V(q) + sigma_b2 - q is scanned geometrically on (Q_MIN, Q_MAX) for sign changes
    (SCAN_PER_DECADE points per decade) and each root is solved by bisection in float64; the slope
    sigma_w2 V'(q) at a root says whether it attracts (< 1) or repels (> 1). gelu at (2.05, 0.05) has
    a stable root at 0.1307 and an unstable one at 3.81: q^(1) = 2.1 lies in the stable root's basin.

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation` (pools included).
    sigma_w2, sigma_b2 : float
        Weight and bias variances (>= 0).
    q0 : float
        Input norm ``|x|^2/n0`` (> 0): q^(1) = sigma_w2 q0 + sigma_b2.

    Returns
    -------
    FixedPoints
        ``roots``, ``slopes``, ``stable``, ``q1``, ``q_star`` (reached from q1), ``basin``, ``note``.

    Examples
    --------
    >>> fp = sf.fixed_points("gelu", 2.05, 0.05)
    >>> [round(r, 4) for r in fp.roots], fp.stable, round(fp.q_star, 4)
    ([0.1307, 3.8147], (True, False), 0.1307)
    """
    K = kernel(act)
    sw = float(check.real("fixed_points", "sigma_w2", sigma_w2, lo=0))
    sb = float(check.real("fixed_points", "sigma_b2", sigma_b2, lo=0))
    q0 = float(check.real("fixed_points", "q0", q0, lo=0, lo_open=True))
    F = maps(K)
    grid = _scan_grid(Q_MIN, Q_MAX)
    g = _g_float(F, np.full(grid.size, sw), sb, grid)
    roots = []
    for k in np.nonzero(np.sign(g[:-1]) * np.sign(g[1:]) <= 0)[0]:
        if g[k] == 0:
            if not roots or roots[-1] != grid[k]:
                roots.append(float(grid[k]))
            continue
        if g[k + 1] == 0:
            continue
        r = vroot(lambda x, j: _g_float(F, np.full(x.size, sw), sb, x), np.array([grid[k]]),
                  np.array([grid[k + 1]]), np.array([g[k]]), np.array([g[k + 1]]))[0]
        roots.append(float(r))
    slopes = tuple(q_slope(K, sw, r) for r in roots)
    q1 = sw * q0 + sb
    qs = float(_q_star_points(F, np.array([sw]), np.array([sb]), q1=np.array([q1]))[0])
    unstable = [r for r, s in zip(roots, slopes) if s > 1]
    below = max([r for r in unstable if r < q1], default=0.0)
    above = min([r for r in unstable if r > q1], default=math.inf)
    basin = (below, above)
    stab = ["stable" if s < 1 else ("marginal" if s == 1 else "unstable") for s in slopes]
    listed = ", ".join(f"{r:.6g} ({t}, slope {s:.4g})" for r, s, t in zip(roots, slopes, stab)) or "none"
    note = f"fixed points on ({Q_MIN:g}, {Q_MAX:g}): {listed}; from q^(1) = {q1:.6g} the recursion reaches q* = {qs:.6g}"
    return FixedPoints(sw, sb, q0, q1, qs, tuple(roots), slopes, basin, note)


def q_star(act: str | Activation, sigma_w2: ArrayLike, sigma_b2: ArrayLike,
           dps: int | None = None) -> float | NDArray[Any] | mpmath.mpf:
    """The variance fixed point q* (float64 arrays broadcast; dps=N gives mpmath numbers).

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation` (pools included).
    sigma_w2, sigma_b2 : array_like
        Weight and bias variances (>= 0); arrays broadcast.
    dps : int, optional
        None for float64; N for mpmath numbers correct to N digits.

    Returns
    -------
    float, ndarray or mpmath.mpf
        q* = sigma_w2 V(q*) + sigma_b2 (0 or inf where the recursion goes there).

    Examples
    --------
    >>> round(sf.q_star("tanh", 1.5, 0.05), 10)
    0.4180372005
    """
    return _on_grid("q_star", act, sigma_w2, sigma_b2, dps, lambda N, sw, sb: N.ctx.run(partial(_q_star_points, N), sw, sb))


def _on_grid(func, act, sigma_w2, sigma_b2, dps, solve):
    """Validate and broadcast (sigma_w2, sigma_b2); solve(N, sw, sb) on the flat grid in the number
    context N of dps (float64 array, or object array of mpf). Scalars in, scalar out."""
    K = kernel(act)
    dps = check.dps(func, dps)
    sw = check.real(func, "sigma_w2", sigma_w2, lo=0)
    sb = check.real(func, "sigma_b2", sigma_b2, lo=0)
    sw, sb = np.broadcast_arrays(sw, sb)
    out = solve(maps(K, dps), sw.ravel(), sb.ravel()).reshape(sw.shape)
    if dps is None:
        return out if out.ndim else float(out)
    return out if out.ndim else out.item()


@dataclass(frozen=True)
class EOC:
    """A point of the edge-of-chaos curve: chi1(q*) = 1 with q* = sigma_w2 V(q*) + sigma_b2.

    ``q_slope`` = sigma_w2 V'(q*) (float64), the slope of the variance map there: above 1 this q* is
    an UNSTABLE fixed point, which the recursion from q^(1) does not reach (e.g. x erf(x) at small
    sigma_b2: the network's q runs away although chi1(q*) = 1); ``stable`` says which.

    Positively homogeneous psi of degree 1 (:func:`_eoc_homogeneous`): the EOC is the vertical line
    sigma_w2 = 1/E[psi'^2], ``q_star`` is inf for sigma_b2 > 0, ``q_slope`` is q_growth =
    sigma_w2 V(q)/q there, and ``note`` says so (empty for every other psi)."""
    sigma_b2: float
    sigma_w2: float
    q_star: float
    q_slope: float = math.nan
    note: str = ""

    @property
    def stable(self) -> bool:
        return bool(self.q_slope <= 1)


def eoc_point(K, sigma_b2, dps=None):
    """(sigma_w2, q*) of the edge of chaos of kernel K at one sigma_b2 >= 0 (floats, or mpmath at
    dps). Eliminate sigma_w2 (docs/theory.md section 5): solve h(q) = V(q)/dpsi2(q) + sigma_b2 - q
    = 0 (:func:`_eoc_points`), then sigma_w2 = 1/dpsi2(q*). sigma_b2 = 0 with psi(0) = 0: q* = 0
    and sigma_w2 = 1/dpsi2(0+) exactly. Positively homogeneous psi: the vertical line
    sigma_w2 = 1/dpsi2 (:func:`_eoc_homogeneous`). ValueError or ArithmeticError where there is no EOC."""
    sb = sigma_b2
    _refuse_jumps(K)
    if K.degree_one:
        return _eoc_homogeneous(K, sb, dps)[:2]
    if sb == 0 and K.zero_at_zero:  # q* = 0 is then a fixed point of the variance map
        return _eoc_at_zero(K, dps)
    N = maps(K, dps)
    sw, qs = N.ctx.run(partial(_eoc_points, N), [sb])
    if math.isnan(sw[0]):
        if qs[0] == 0:
            raise PrecisionError(f"eoc: h(q) <= 0 at q = {Q_MIN:g}; no bracket for the edge of chaos of {K.act.name}.")
        raise InvalidValue(f"{K.act.name} has no edge of chaos at sigma_b2 = {N.ctx.show(sb)} (q* beyond {Q_MAX:g}).")
    return (float(sw[0]), float(qs[0])) if dps is None else (sw[0], qs[0])


def _refuse_jumps(K):
    """ValueError when E[psi'^2] is infinite (psi jumps: psi' has a Dirac delta), since then
    chi1 = sigma_w2 E[psi'^2] is infinite for every sigma_w2 > 0 and there is no edge of chaos."""
    import sympy as sp
    if K.dpsi2 == sp.oo:
        raise InvalidValue(f"{K.act.name} jumps, so E[psi'^2] is infinite: chi1 = sigma_w2 E[psi'^2] is infinite "
                         f"for every sigma_w2 > 0 (every network with sigma_w2 > 0 is chaotic); there is no edge of chaos.")


def _eoc_homogeneous(K, sb, dps):
    """EOC of a positively homogeneous psi of degree 1 (docs/theory.md section 5): V(q) = v q and
    E[psi'^2] = d do not depend on q, so chi1 = sigma_w2 d = 1 on the vertical line sigma_w2 = 1/d at
    every sigma_b2 (exact for closed-form d: relu 2, relu+max2 4/3). There the variance map is
    q' = r q + sigma_b2 with r = v/d (q_growth, section 2): q* = inf if r > 1, or r = 1 and
    sigma_b2 > 0 (q grows by sigma_b2 per layer); r = 1, sigma_b2 = 0: every q is a fixed point and
    q* = 0 is reported (as :func:`q_star`); r < 1: the root of :func:`_q_star_points`.
    Returns (sigma_w2, q*, r, note); r is float64."""
    import sympy as sp
    name = K.act.name
    if K.dpsi2.has(sp.Integral):
        d = float(evaluate(K.dpsi2, (Q,), (1.0,), K.kinks))
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
            sw = 1 / evaluate(K.dpsi2, (Q,), (1,), K.kinks, dps + 10)
        with mpmath.workdps(dps):
            sw = +sw
    else:
        with mpmath.workdps(dps):
            sw = mpmath.mpf(str(sp.N(1 / exact, dps + 5)))
    r = 1.0 if K.chi1_constant else float(evaluate(K.V, (Q,), (1.0,), K.kinks)) / d
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
        qs = (lambda N: N.ctx.run(partial(_q_star_points, N), [sw], [sb]))(maps(K, dps))[0]
        qs = float(qs) if dps is None else qs
        note += f", where q_growth = sigma_w2 V(q)/q = {r:.6g} < 1 and q* = sigma_b2/(1 - q_growth) is finite."
    return sw, qs, r, note


def _eoc_at_zero(K, dps):
    """(sigma_w2, q*) = (1/dpsi2(0+), 0): the EOC at sigma_b2 = 0 when psi(0) = 0."""
    import sympy as sp
    if not K.dpsi2.has(sp.Integral):   # exact limit of the closed form
        d0 = sp.limit(K.dpsi2, Q, 0, "+")
        if not d0.is_positive:
            raise InvalidValue(f"{K.act.name} has E[psi'^2] -> 0 as q -> 0: no edge of chaos at sigma_b2 = 0.")
        if dps is None:
            return float(1 / d0), 0.0
        with mpmath.workdps(dps):
            return mpmath.mpf(str(sp.N(1 / d0, dps + 5))), mpmath.mpf(0)
    # integral form: E[psi'^2](q) = E[psi'^2](0+) + O(q); q far below the working precision
    tiny = 1e-40 if dps is None else mpmath.mpf(10) ** (-2 * dps - 10)
    d0 = evaluate(K.dpsi2, (Q,), (tiny,), K.kinks, dps)
    if not d0 > 0:
        raise InvalidValue(f"{K.act.name} has E[psi'^2] -> 0 as q -> 0: no edge of chaos at sigma_b2 = 0.")
    return (1 / float(d0), 0.0) if dps is None else (1 / d0, mpmath.mpf(0))


def _eoc_points(N, sb):
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


def q_slope(K, sigma_w2, q) -> float:
    """sigma_w2 V'(q) in float64 at a fixed point q >= 0 of kernel K: below 1 the fixed point attracts,
    above 1 it repels (q = 0, where psi(0) = 0: V'(0+) = E[psi'^2](0+))."""
    if float(q) > 0:
        return float(sigma_w2) * float(evaluate(K.dV, (Q,), (float(q),), K.kinks))
    return float(sigma_w2) * float(evaluate(K.dpsi2, (Q,), (1e-40,), K.kinks))


def eoc(act: str | Activation, sigma_b2: float, dps: int | None = None) -> EOC:
    """Edge of chaos at ``sigma_b2``: result with .sigma_w2 and .q_star (bracketing root finder).
    Positively homogeneous psi (relu family): sigma_w2 = 1/E[psi'^2] at every sigma_b2, q* = inf
    for sigma_b2 > 0, explained in .note (:func:`_eoc_homogeneous`).

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation` (pools included).
    sigma_b2 : float
        Bias variance (>= 0).
    dps : int, optional
        None for float64; N for mpmath numbers correct to N digits.

    Returns
    -------
    EOC
        ``sigma_w2``, ``q_star``, ``q_slope`` (= sigma_w2 V'(q*); ``stable`` if <= 1) and ``note``.

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
    note = ""
    _refuse_jumps(K)
    if K.degree_one:             # q_slope = sigma_w2 V'(q) = q_growth, the same at every q
        sw, qs, slope, note = _eoc_homogeneous(K, sb, dps)
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
    _refuse_jumps(K)
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


def eoc_curve(act: str | Activation, sigma_b2: ArrayLike, dps: int | None = None) -> NDArray[Any]:
    """sigma_w2 on the edge of chaos for each sigma_b2 (array in, array out); for positively
    homogeneous psi the vertical line sigma_w2 = 1/E[psi'^2] (:func:`_eoc_homogeneous`).

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation` (pools included).
    sigma_b2 : array_like
        Bias variances (>= 0).
    dps : int, optional
        None for float64; N for mpmath numbers correct to N digits.

    Returns
    -------
    ndarray
        sigma_w2 at each sigma_b2 (float64, or mpmath numbers in an object array).

    Examples
    --------
    >>> sf.eoc_curve("relu", [0.0, 0.1])
    array([2., 2.])
    """
    K = kernel(act)
    dps = check.dps("eoc_curve", dps)
    sb = check.real("eoc_curve", "sigma_b2", sigma_b2, lo=0)
    _refuse_jumps(K)
    if K.degree_one:
        sw = _eoc_homogeneous(K, 0.0, dps)[0]
        out = np.empty(sb.shape, dtype=float if dps is None else object)
        out[...] = sw
        return out
    if dps is None and (sb > 0).all():
        sw, qs = (lambda N: N.ctx.run(partial(_eoc_points, N), sb.ravel()))(maps(K))
        if not np.isnan(sw).any():
            return sw.reshape(sb.shape)
    out = np.empty(sb.shape, dtype=float if dps is None else object)
    for idx in np.ndindex(sb.shape):   # sigma_b2 = 0, dps, or points that raise a clear error
        out[idx] = eoc_point(K, float(sb[idx]), dps)[0]
    return out


# ---------------------------------------------------------------- c*
G_TOL = 1e-13  # |f(c) - c| below this counts as a fixed point (the maps' float64 accuracy)
SCAN = 64  # grid points scanned for the first sign change of the c-map on the way from c^(1)


NEAR_END = 10.0 ** -np.arange(1, 11)  # extra scan points end - (end - c) * 1e-j next to c = +-1


def _c_star_f64(K, sw, sb, qs=None):
    """float64 c* for 1-D arrays: the stable fixed point of g(c) = f(c) - c reached from
    c1 = sigma_b2/(sigma_w2 + sigma_b2), f(c) = (sigma_w2 C(q*, q*, c q*) + sigma_b2)/q*: the
    first root of g in the direction f moves c1, located by a scan (SCAN equal steps, then
    points approaching +-1 geometrically, where the root sits when chi1 is just above 1) and
    refined by vroot. q* = 0 or inf: the normalised map c' = C(q, q, c q)/V(q) in that limit
    (sigma_b2 negligible against q; exact for positively homogeneous psi). Returns (c*, q*)."""
    M = maps(K)
    sw, sb = np.asarray(sw, float), np.asarray(sb, float)
    qs = _q_star_points(maps(K), sw, sb) if qs is None else qs
    finite = (qs > 0) & (qs < math.inf)
    L, at_inf = _at_infinity(K, qs)
    qe = np.where(finite, qs, np.where(at_inf, 1.0, _limit_q(K, qs)))
    c1 = np.where(sw + sb > 0, sb / np.where(sw + sb > 0, sw + sb, 1.0), 0.0)
    to_zero = np.nonzero((qs == 0) & (sw > 0))[0] if _descent_cheap(K, M) else np.zeros(0, int)
    frozen = np.zeros(sw.shape, bool)
    if to_zero.size:       # start the limit map where the recursion has brought c (c freezes: c* is there)
        c1 = c1.copy()
        c1[to_zero], frozen[to_zero] = _descend(M, sw[to_zero])
    vq = np.ones(qe.shape)
    rest = ~finite & ~at_inf
    vq[rest] = M.V(qe[rest])
    if at_inf.any():
        vq[at_inf] = L.V(1.0)

    def g(c, j):
        f, li = finite[j], at_inf[j]
        val = np.empty(j.shape)
        if (~li).any():
            val[~li] = M.C_eq(qe[j[~li]], c[~li])
        if li.any():
            val[li] = L.C_eq(qe[j[li]], c[li])
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(f, (sw[j] * val + sb[j]) / qe[j], val / vq[j]) - c

    n = sw.size
    alln = np.arange(n)
    out = np.full(n, np.nan)
    g1 = g(c1, alln)
    done = (np.abs(g1) <= G_TOL) | (sw == 0) | np.isnan(qs) | frozen
    out[done] = np.where(np.isnan(qs[done]), np.nan, c1[done])
    end = np.where(g1 > 0, 1.0, -1.0)
    fracs = np.concatenate([np.arange(1, SCAN) / SCAN, 1 - NEAR_END / SCAN])
    prev_c, prev_g = c1.copy(), g1.copy()
    lo, hi, glo, ghi = (np.full(n, np.nan) for _ in range(4))
    bracketed = np.zeros(n, bool)
    for i, t in enumerate(fracs):
        idx = np.nonzero(~done & ~bracketed)[0]
        if idx.size == 0:
            break
        c = c1[idx] + (end[idx] - c1[idx]) * t
        gc = g(c, idx)
        hit = (np.abs(gc) <= G_TOL) & (i < SCAN - 1)
        out[idx[hit]] = c[hit]
        done[idx[hit]] = True
        cross = ~hit & ((gc > 0) != (prev_g[idx] > 0))
        if i >= SCAN - 1:  # near +-1 a crossing must stand out of the maps' rounding (G_TOL)
            cross &= np.abs(gc) > G_TOL
        j = idx[cross]
        lo[j], hi[j], glo[j], ghi[j] = prev_c[j], c[cross], prev_g[j], gc[cross]
        bracketed[j] = True
        prev_c[idx], prev_g[idx] = c, gc
    rest = ~done & ~bracketed  # no crossing before +-1: the recursion runs to the boundary
    out[rest] = end[rest]
    j = np.nonzero(bracketed)[0]
    if j.size:
        out[j] = vroot(lambda x, k: g(x, j[k]), lo[j], hi[j], glo[j], ghi[j])
    return out, qs


Q_DESCENT, MAX_DESCENT = 1e-8, 5000   # q* = 0: follow the recursion down to q = Q_DESCENT (layer cap)


def _descent_cheap(K, M):
    """The q* = 0 descent runs where C costs microseconds at every q (the engine's ``fast_C``: a closed form,
    or a table whose panels build in seconds). Homogeneous psi keep the limit map, exact at q = 1; max-pools
    and kinked integral-form phi (ELU) keep the limit map from c^(1) (their tables build in minutes)."""
    return not K.degree_one and M.fast_C


def _descend(M, sw):
    """q* = 0 (sigma_b2 = 0): run the recursion q' = sw V(q), c' = C(q, q, c q)/V(q) from layer 1
    (q = sw, c = 0) down to q <= Q_DESCENT. If there the c-map is the identity to leading order (its
    displacement C/V - c shrinks with q: psi'(0) != 0, e.g. gelu, silu, mish, elu), c stops moving as
    q -> 0 and c* is where it freezes: the recursion goes on until |dc| <= 1e-15 ("frozen"). Otherwise
    (e.g. x erf(x) ~ x^2, C/V -> (1 + 2c^2)/3) the q -> 0 limit map has genuine fixed points and c* is
    its root reached from the returned c. Returns (c, frozen)."""
    q, c = sw.astype(float).copy(), np.zeros(sw.shape)
    live = q[(q > Q_DESCENT) & (q < Q_MAX)]
    if live.size:
        M.cover(Q_DESCENT / 16, float(live.max()))
    for _ in range(MAX_DESCENT):
        i = np.nonzero((q > Q_DESCENT) & (q < Q_MAX))[0]
        if i.size == 0:
            break
        v = M.V(q[i])
        c[i], q[i] = np.clip(M.C_eq(q[i], c[i]) / v, -1.0, 1.0), sw[i] * v
    frozen = np.zeros(sw.shape, bool)
    small = np.nonzero((q <= Q_DESCENT) & (q > 0))[0]
    if small.size:
        ci = c[small]        # displacement of the limit map at two fixed small q (not at the last q,
        qi = np.full(ci.shape, Q_DESCENT)   # which can be far below where C/V keeps its relative digits)
        d1 = M.C_eq(qi, ci) / M.V(qi) - ci
        d2 = M.C_eq(qi / 16, ci) / M.V(qi / 16) - ci
        frozen[small] = np.abs(d2) <= 0.5 * np.abs(d1) + G_TOL   # drift ~ q^a, a >= 1/4
        i = np.nonzero(frozen)[0]
        for _ in range(MAX_DESCENT):
            i = i[q[i] > 1e-280]
            if i.size == 0:
                break
            v = M.V(q[i])
            cn = np.clip(M.C_eq(q[i], c[i]) / v, -1.0, 1.0)
            moved = np.abs(cn - c[i]) > 1e-15
            c[i], q[i] = cn, sw[i] * v
            i = i[moved]
    return c, frozen




def _c_residual(N, q, sw, sb, c):
    """f(c) - c for the c-map f(c) = (sigma_w2 C(q, q, c q) + sigma_b2)/q at the variance q."""
    return (sw * N.C_eq(q, c) + sb) / q - c


def _c_star_refined(N, sw, sb, c0, q0):
    """c* to dps digits: the float64 root c0 (q* = q0) refined on the mp c-map by :meth:`_Mp.refine`
    (within 1e-9 of c0); c1 and +-1 are exact."""
    with mpmath.workdps(N.dps + 10):
        swm, sbm = to_mpf(sw), to_mpf(sb)
        c1 = sbm / (swm + sbm) if swm + sbm > 0 else mpmath.mpf(0)
        if abs(c0) == 1:
            return mpmath.mpf(c0)
        if c0 == float(c1):
            return +c1
        if not 0 < q0 < math.inf:
            raise Unsupported("c_star(dps=...) with q* = 0 or inf (a limit map) is float64 only.")
        qs = N.ctx.run(partial(_q_star_points, N), [sw], [sb])[0]
        root = N.ctx.refine(lambda c: _c_residual(N, qs, swm, sbm, c), c0, 1e-9, "c_star",
                        lambda r: f"c_star: the mpmath root {mpmath.nstr(r, 12)} left the float64 "
                                  f"bracket around {c0!r}; cannot certify c* at dps={N.dps}")
    with mpmath.workdps(N.dps):
        return +root


GAP_REFINE = 1e-3   # 1 - c* below this is refined on the distance map (float64 c* keeps only ~1e-16 of it)


def _gap_star(K, sw, sb, cs, qs):
    """1 - c* to float64 relative accuracy (where c* is near 1) for 1-D arrays: the nonzero root of the
    distance map's fixed-point equation sigma_w2 D(q*, q*, d)/d = 1 (no bias term, no cancellation:
    docs/theory.md section 7), d* = 2 q* (1 - c*), bracketed around the float64 c*. Elsewhere 1 - c*."""
    gap = 1.0 - np.asarray(cs, float)
    sel = np.nonzero((gap > 0) & (gap < GAP_REFINE) & (qs > 0) & (qs < math.inf))[0]
    M = maps(K)
    if sel.size == 0 or not M.D_exact:
        return gap
    fn = M.D
    q, w = qs[sel], sw[sel]

    def h(dv, k):
        qq = q[k]
        return w[k] * fn(qq, qq, qq - dv / 2, dv) / dv - 1.0

    d0 = 2 * q * gap[sel]
    lo, hi = d0 / 16, np.minimum(16 * d0, 2 * q)
    k = np.arange(sel.size)
    hlo, hhi = h(lo, k), h(hi, k)
    ok = np.nonzero((hlo > 0) & (hhi < 0))[0]
    if ok.size:
        root = vroot(lambda x, j: h(x, ok[j]), lo[ok], hi[ok], hlo[ok], hhi[ok])
        gap[sel[ok]] = root / (2 * q[ok])
    return gap


def _c_star_solve(N, sw, sb):
    """c* on flat arrays: float64 by :func:`_c_star_f64`; at dps each point refined."""
    cs, qs = _c_star_f64(N.K, sw, sb)
    if N.dps is None:
        return cs
    return objects([_c_star_refined(N, *p) for p in zip(sw.tolist(), sb.tolist(), cs.tolist(), qs.tolist())])


def c_star(act: str | Activation, sigma_w2: ArrayLike, sigma_b2: ArrayLike,
           dps: int | None = None) -> float | NDArray[Any] | mpmath.mpf:
    """Stable correlation fixed point c* reached from c^(1) (float64 arrays; dps=N: mpmath).

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation` (pools included).
    sigma_w2, sigma_b2 : array_like
        Weight and bias variances (>= 0); arrays broadcast.
    dps : int, optional
        None for float64; N for mpmath numbers correct to N digits.

    Returns
    -------
    float, ndarray or mpmath.mpf
        c* in [-1, 1]; c* = 1 in the ordered phase.

    Examples
    --------
    >>> round(sf.c_star("tanh", 2.5, 0.05), 10)
    0.4468042323
    """
    return _on_grid("c_star", act, sigma_w2, sigma_b2, dps, _c_star_solve)


# ---------------------------------------------------------------- neutrality
def _neutral_residual(N, q, sb):
    """(sigma_w2(q), h(q)) on the q* equation sigma_w2(q) = (q - sigma_b2)/V(q), with
    h(q) = (sigma_w2(q) C(q, q, q/2) + sigma_b2)/q - 1/2: zero where 1/2 is a fixed point of the c-map."""
    sw = (q - sb) / N.V(q)
    return sw, (sw * N.C_eq(q, 0.5) + sb) / q - 0.5


def _no_neutrality(K, N):
    """True when h of :func:`_neutral_residual` is provably > 0 for every q > sigma_b2 (no line at any
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
    """A q above which h of :func:`_neutral_residual` is > 0 for every sigma_b2, from the q -> inf limit
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
    (c* = 1/2 known): on the q* equation, q > sigma_b2, solve h(q) = 0 of :func:`_neutral_residual`;
    h -> 1/2 > 0 as q -> sigma_b2+. The bracket grows q by 2 until h < 0 (NaN where sigma_w2(q)
    passes sigma_w2_max or q passes Q_MAX first). Then 1/2 must be the stable c* reached from c1
    (checked; NaN otherwise). Returns (sigma_w2, q*)."""
    N = maps(K)
    sb = np.asarray(sigma_b2, float)
    if _no_neutrality(K, N):
        return np.full(sb.shape, np.nan), np.full(sb.shape, np.nan)

    cutoff = _neutral_cutoff(K)

    def parts(qv, j):
        return _neutral_residual(N, qv, sb[j])

    n = sb.size
    lo = sb * (1 + 1e-9)
    hlo = parts(lo, np.arange(n))[1]
    hi, hhi = lo.copy(), hlo.copy()
    live = hhi > 0
    failed = ~live
    while live.any():
        j = np.nonzero(live)[0]
        lo[j], hlo[j] = hi[j], hhi[j]
        hi[j] *= 2
        sw, hhi[j] = parts(hi[j], j)
        out_of_range = (sw > sigma_w2_max) | (hi[j] > min(Q_MAX, cutoff)) | ~np.isfinite(hhi[j])
        failed[j[out_of_range]] = True
        live[j] = ~out_of_range & (hhi[j] > 0)
    qs = np.full(n, np.nan)
    j = np.nonzero(~failed)[0]
    if j.size:
        qs[j] = vroot(lambda x, k: parts(x, j[k])[1], lo[j], hi[j], hlo[j], hhi[j])
    sw = np.where(np.isnan(qs), np.nan, (qs - sb) / N.V(np.where(np.isnan(qs), 1.0, qs)))
    ok = ~np.isnan(sw)
    if ok.any():  # 1/2 must be the fixed point the recursion reaches from c1
        cs = _c_star_f64(K, sw[ok], sb[ok], qs[ok])[0]
        bad = np.abs(cs - 0.5) > 1e-6
        sw[np.nonzero(ok)[0][bad]] = np.nan
    return sw, qs


def _neutral_slope(K, sb, q0):
    """dh/dq at the float64 root q0 (central difference on the float64 maps, ~1e-9 relative)."""
    N, dq = maps(K), 1e-5 * q0
    h = _neutral_residual(N, np.array([q0 - dq, q0 + dq]), np.array([sb, sb]))[1]
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
        sw, h = (v[0] for v in _neutral_residual(N, objects([x]), sbm))
        d, err = mpmath.mpf(_neutral_slope(N.K, sb, q0)), mpmath.mpf(SLOPE_ERR)
        tiny = mpmath.mpf(10) ** -(N.dps + 2)
        for _ in range(NEUTRAL_STEPS):
            if h == 0 or not d or not mpmath.isfinite(d):
                break
            x1 = x - h / d
            sw1, h1 = (v[0] for v in _neutral_residual(N, objects([x1]), sbm))
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
               sigma_w2_max: float = 50.0) -> float | NDArray[Any] | mpmath.mpf:
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


PHASES = ("ordered-deep-prejudice", "edge-of-chaos", "chaotic-deep-prejudice", "prejudice", "neutrality")


@dataclass(frozen=True)
class Phase:
    """The phase of one initialisation (Table 1 of Bassi et al.) and the fields that decided it;
    ``note`` describes the cases Table 1 does not cover (docs/theory.md section 6) and lists every
    fixed point of the variance map where it has several."""
    label: str
    q_star: float
    c_star: float
    gamma_star: float
    slope: float
    note: str = ""


def phase_fields(K, sigma_w2, sigma_b2, eoc_tol):
    """(codes into PHASES, q*, c*, gamma*, slope) of kernel K for 1-D float64 arrays sigma_w2,
    sigma_b2 (docs/theory.md section 6; the rules of :func:`phase`)."""
    sw, sb, tol = sigma_w2, sigma_b2, eoc_tol
    cs, qs = _c_star_f64(K, sw, sb)
    finite = (qs > 0) & (qs < math.inf)
    L, at_inf = _at_infinity(K, qs)
    qe = np.where(finite, qs, _limit_q(K, qs))
    slope = np.empty(qs.shape)
    slope[~at_inf] = sw[~at_inf] * maps(K).dpsi2(qe[~at_inf])
    if at_inf.any():
        slope[at_inf] = sw[at_inf] * L.dpsi2(np.ones(int(at_inf.sum())))
    gap = _gap_star(K, sw, sb, cs, qs)          # 1 - c*, from the distance map where c* is near 1
    with np.errstate(divide="ignore", invalid="ignore"):
        gamma = np.where(cs >= 1, math.inf, (1 - gap) / gap)
    blind = sw == 0                             # every input gives the same pre-activations: c* = 1
    cs, gamma, slope = np.where(blind, 1.0, cs), np.where(blind, math.inf, gamma), np.where(blind, 0.0, slope)
    codes = np.where(cs >= 1, np.where(np.abs(slope - 1) <= tol, 1, np.where(slope < 1, 0, 2)),
                     np.where(cs > 0.5, 3, 4))
    return codes, qs, cs, gamma, slope


def _phase_note(K, sw, sb, qs, cs, slope):
    """The one-line note of :class:`Phase` (empty where Table 1 applies as it stands)."""
    if sw == 0:
        return ("sigma_w2 = 0: every input gives the same pre-activations (all 0 at sigma_b2 = 0), so c* = 1 "
                "and chi1 = 0: ordered-deep-prejudice by convention at sigma_b2 = 0 too")
    parts = []
    if qs == 0 and cs < 1:
        parts.append(f"q* = 0: the signal vanishes with depth (chi1 = {slope:.4g} at q -> 0) while c stops at an "
                     f"input-dependent limit below 1 (c* = {cs:.6g} from q0 = 1, qab0 = 0): the change of c per layer "
                     f"shrinks with q; Table 1 has no row for c* < 1 without chi1 > 1, and the label "
                     f"follows c* alone")
    if 0 < qs < math.inf or qs == math.inf:
        fp = fixed_points(K.act, sw, sb)
        if len(fp.roots) > 1:
            parts.append(fp.note)
    return "; ".join(parts)


def phase(act: str | Activation, sigma_w2: float, sigma_b2: float, eoc_tol: float = 1e-6,
          full: bool = False) -> str | Phase:
    """One of PHASES. c* = 1 (gamma* = inf): ordered / edge-of-chaos / chaotic by the slope
    chi1 (< 1, abs(chi1 - 1) <= eoc_tol, > 1); c* in (1/2, 1): prejudice; c* <= 1/2: neutrality.
    chi1 is taken at q* (at q = 1 for positively homogeneous psi when q* is 0 or inf, where it
    does not depend on q). ``full=True`` returns a :class:`Phase` with q*, c*, gamma*, slope and a
    note. Degenerate corners (docs/theory.md section 6): sigma_w2 = 0 is ordered-deep-prejudice (c* = 1,
    chi1 = 0, (0, 0) included); where q* = 0 with c* < 1 (tanh at sigma_b2 = 0, sigma_w2 <= 1) the label
    follows c* alone, as chi1 < 1 has no row with c* < 1 in Table 1.

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation` (pools included).
    sigma_w2, sigma_b2 : float
        Weight and bias variances (>= 0).
    eoc_tol : float
        Half-width of the edge-of-chaos band in chi1.
    full : bool
        Return the :class:`Phase` record instead of its label.

    Returns
    -------
    str or Phase
        'ordered-deep-prejudice', 'edge-of-chaos', 'chaotic-deep-prejudice', 'prejudice' or 'neutrality'.

    Examples
    --------
    >>> sf.phase("tanh", 1.5, 0.05), sf.phase("tanh", 2.5, 0.05)
    ('ordered-deep-prejudice', 'neutrality')
    """
    K = kernel(act)
    sw = float(check.real("phase", "sigma_w2", sigma_w2, lo=0))
    sb = float(check.real("phase", "sigma_b2", sigma_b2, lo=0))
    tol = float(check.real("phase", "eoc_tol", eoc_tol, lo=0))
    codes, qs, cs, gamma, slope = (v[0] for v in phase_fields(K, np.array([sw]), np.array([sb]), tol))
    label = PHASES[int(codes)]
    if not full:
        return label
    return Phase(label, float(qs), float(cs), float(gamma), float(slope),
                 _phase_note(K, sw, sb, float(qs), float(cs), float(slope)))


def _depth_scale(func, act, sigma_w2, sigma_b2, slope_of):
    K = kernel(act)
    sw = check.real(func, "sigma_w2", sigma_w2, lo=0, lo_open=True)
    sb = check.real(func, "sigma_b2", sigma_b2, lo=0)
    sw, sb = np.broadcast_arrays(sw, sb)
    out = np.empty(sw.shape)
    c_all, q_all = (v.reshape(sw.shape) for v in _c_star_f64(K, sw.ravel(), sb.ravel()))
    for idx in np.ndindex(sw.shape):
        cs, qs = float(c_all[idx]), float(q_all[idx])
        if not 0 < qs < math.inf:
            out[idx] = math.nan  # no finite variance fixed point: the depth scale is not defined
            continue
        chi = float(sw[idx]) * slope_of(K, qs, cs)
        out[idx] = math.inf if chi >= 1 else -1 / math.log(chi)
    return out if out.ndim else float(out)


def xi_q(act: str | Activation, sigma_w2: ArrayLike, sigma_b2: ArrayLike) -> float | NDArray[np.float64]:
    """Depth scale of q: 1/xi_q = -ln[sigma_w2 E(phi'^2 + phi phi'')(q*)] = -ln[sigma_w2 V'(q*)]
    (Schoenholz et al. 2017); inf where the slope reaches 1, NaN where q* is 0 or inf.

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation` (pools included).
    sigma_w2, sigma_b2 : array_like
        Weight and bias variances (>= 0); arrays broadcast.

    Returns
    -------
    float or ndarray
        xi_q in layers (float64).

    Examples
    --------
    >>> round(sf.xi_q("tanh", 1.5, 0.05), 8)
    1.68282839
    """
    return _depth_scale("xi_q", act, sigma_w2, sigma_b2,
                        lambda K, qs, cs: float(evaluate(K.dV, (Q,), (qs,), K.kinks)))


def xi_c(act: str | Activation, sigma_w2: ArrayLike, sigma_b2: ArrayLike) -> float | NDArray[np.float64]:
    """Depth scale of c: 1/xi_c = -ln[sigma_w2 E phi'(u) phi'(v)] at (q*, c*); diverges at the EOC.

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation` (pools included).
    sigma_w2, sigma_b2 : array_like
        Weight and bias variances (>= 0); arrays broadcast.

    Returns
    -------
    float or ndarray
        xi_c in layers (float64).

    Examples
    --------
    >>> round(sf.xi_c("tanh", 2.5, 0.05), 8)
    11.79559752
    """
    return _depth_scale("xi_c", act, sigma_w2, sigma_b2,
                        lambda K, qs, cs: float(evaluate(K.dC, (Q1, Q2, Q12), (qs, qs, cs * qs), K.kinks)))
