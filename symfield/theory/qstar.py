"""The variance fixed point q*, by bracketing root finding (never by iterating the map; docs/theory.md section 5).

    q* solves g(q) = sigma_w2 V(q) + sigma_b2 - q = 0,

the root the layer recursion reaches from q^(1) = sigma_w2 q0 + sigma_b2: the first root above q^(1) where
g(q^(1)) > 0, the largest below it where g(q^(1)) < 0 (:func:`q_star_brackets`; gelu at (2.05, 0.05) has roots
0.1307 and 3.81 and reaches 0.1307 from q^(1) = 2.1). q* = 0 when sigma_b2 = 0 and g < 0 from q^(1) down to
Q_MIN; q* = inf when g > 0 from q^(1) up to Q_MAX. :func:`fixed_points` lists every root with its stability.
One algorithm (:func:`q_star_points`) in each number context of the maps engine (float64 or mpmath at dps).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Any

import mpmath
import numpy as np
from numpy.typing import ArrayLike, NDArray

from symfield.core import caches
from symfield.core import validate as check
from symfield.core.errors import InvalidValue
from symfield.numeric.maps import maps
from symfield.numeric.remainder import Q_SPLIT, g_split, remainder
from symfield.numeric.vroot import vroot
from symfield.symbolic.activation import Activation
from symfield.symbolic.kernel import kernel
from symfield.symbolic.kernel_type import limit_at_0
from symfield.symbolic.limits import limit_kernel, zero_limit_kernel
from symfield.theory import norm as nm

Q_MIN, Q_MAX = 1e-12, 1e12


def limit_q(K, qs):
    """Where to evaluate q-dependent quantities when q* is 0 or inf (scalar or array): q = 1 for
    positively homogeneous psi (they do not depend on q), else q = 1e-8 (q* = 0) or 1e8 (q* = inf)."""
    if K.degree_one:
        return np.ones_like(qs) if np.ndim(qs) else 1.0
    return np.where(np.asarray(qs) == 0, 1e-8, 1e8) if np.ndim(qs) else (1e-8 if qs == 0 else 1e8)


def at_infinity(K, qs):
    """(maps of the q -> inf limit kernel or None, mask of the rows with q* = inf it serves): where psi grows
    linearly but is not homogeneous, the normalised maps at q* = inf are exactly those of its limit
    (symfield.symbolic.limits), evaluated at q = 1."""
    return _limit_rows(K, np.asarray(qs) == math.inf, limit_kernel)


def at_zero(K, qs):
    """(maps of the q -> 0 limit kernel or None, mask of the rows with q* = 0 it serves): where phi(0) = 0 with
    finite slopes at 0 and the limit c-map is not the identity (a max-pool of such a phi, or a != b), the
    normalised maps at q* = 0 are exactly those of that limit (symfield.symbolic.limits.zero_limit_kernel),
    evaluated at q = 1 (no O(q^(1/2)) remainder of the maps at q = limit_q)."""
    return _limit_rows(K, np.asarray(qs) == 0, zero_limit_kernel)


def _limit_rows(K, rows, limit):
    """(maps of the kernel limit(K), rows) where there are rows and K has that limit, else (None, no rows);
    positively homogeneous psi need none (their maps at q = 1 are exact)."""
    if not rows.any() or K.degree_one:
        return None, np.zeros(rows.shape, bool)
    LK = limit(K)
    if LK is None:
        return None, np.zeros(rows.shape, bool)
    return maps(LK), rows


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
        out[finite] = maps(K, dps).dpsi2(qs[finite])
    if zero.any():
        tiny = 1e-40 if dps is None else mpmath.mpf(10) ** (-2 * dps - 10)
        out[zero] = maps(K, dps).dpsi2(tiny)
    if inf.any():
        LK = K if K.degree_one else limit_kernel(K)
        if LK is None:
            raise InvalidValue(f"{K.act.name}: q* is infinite and phi does not grow linearly, so E[psi'^2](q) "
                             "has no finite limit as q -> inf and chi1 at q* is undefined; pass q=...")
        out[inf] = maps(LK, dps).dpsi2(1.0)
    return out if out.ndim else out[()]


# ---------------------------------------------------------------- q*
SCAN_PER_DECADE = 16   # geometric scan of g(q) for sign changes: ratio 10^(1/16) = 1.155 between points


def _scan_grid(lo, hi):
    """Geometric grid from lo to hi (either order), SCAN_PER_DECADE points per decade, ends included."""
    n = max(2, int(math.ceil(abs(math.log10(hi / lo)) * SCAN_PER_DECADE)) + 1)
    return np.geomspace(lo, hi, n)


def _g_float(F, sw, sb, q):
    """g(q) = sigma_w2 V(q) + sigma_b2 - q; from q >= Q_SPLIT, for linearly growing phi, in the split form of
    symfield.numeric.remainder (no cancellation of sigma_w2 V(q) against q)."""
    q = np.asarray(q, float)
    sw, sb = np.broadcast_to(sw, q.shape), np.broadcast_to(sb, q.shape)
    big = (q >= Q_SPLIT) & np.isfinite(q)
    rem = remainder(F.K) if big.any() else None     # SymPy's limits only where the split can be needed
    big &= rem is not None
    g = np.empty(q.shape)
    if (~big).any():
        g[~big] = sw[~big] * F.V(q[~big]) + sb[~big] - q[~big]
    if big.any():
        g[big] = g_split(rem, sw[big], sb[big], q[big])
    return g


def q_star_brackets(K, sw, sb, q1):
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
        g1 = _g_float(F, sw, sb, np.where(np.isfinite(q1) & (q1 > 0), q1, 1.0))   # q^(1) = 0: q* = 0, g unused
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


Q_EVALS = 40    # V evaluations per point of a q* solve (bracket doubling and the root's iterations), about


def q_star_points(N, sw, sb, q1=None):
    """q* for 1-D arrays sw, sb of N's numbers: the fixed point of g(q) = sw V(q) + sb - q that the
    layer recursion reaches from q^(1) (default sw + sb: input norm q0 = 1), located in float64 by
    :func:`q_star_brackets` and solved in N's numbers on that bracket; 0 or inf where the
    recursion goes there."""
    fw, fb = np.array([float(v) for v in sw]), np.array([float(v) for v in sb])
    if hasattr(N, "plan"):      # the rent-or-buy rule of a 1-D table of V, told the solve's evaluations up front
        N.plan(fw.size * Q_EVALS)
    kind, lo, hi = q_star_brackets(N.K, fw, fb, fw + fb if q1 is None else np.asarray(q1, float))
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


def closed_dpsi2_at_zero(K):
    """A kernel whose E[psi'^2] is a closed form with K's limit as q -> 0+, else None: K itself, or, where K's is an
    integral, that of psi's q -> 0 limit psi_0 (a max-pool's, or a phi with different slopes at 0:
    symfield.symbolic.limits.zero_limit_kernel), E[psi'^2](0+) = E[psi_0'^2] (psi'(sqrt(q) z) -> psi_0'(z) for
    almost every z, with polynomial growth: dominated convergence)."""
    import sympy as sp
    if not K.dpsi2.has(sp.Integral):
        return K
    zero = zero_limit_kernel(K)
    return zero if zero is not None and not zero.dpsi2.has(sp.Integral) else None


_DPSI2_0: dict = caches.memo()


def dpsi2_at_zero(K) -> float:
    """E[psi'^2](0+) in float64: the exact limit of a closed form (:func:`closed_dpsi2_at_zero`), else the maps at
    q = 1e-40 (E[psi'^2](q) = E[psi'^2](0+) + O(sqrt q))."""
    if K not in _DPSI2_0:
        src = closed_dpsi2_at_zero(K)
        _DPSI2_0[K] = float(limit_at_0(src.dpsi2)) if src is not None else float(maps(K).dpsi2(1e-40))
    return _DPSI2_0[K]


def q_slope(K, sigma_w2, q):
    """sigma_w2 V'(q) in float64 at fixed points q >= 0 of kernel K (scalars, or arrays that broadcast): below 1
    the fixed point attracts, above 1 it repels (q = 0, where psi(0) = 0: V'(0+) = E[psi'^2](0+))."""
    q = np.asarray(q, float)
    pos, d = q > 0, np.empty(q.shape)
    if pos.any():
        d[pos] = maps(K).dV(q[pos])
    if (~pos).any():
        d[~pos] = dpsi2_at_zero(K)
    out = np.asarray(sigma_w2, float) * d
    return float(out) if out.ndim == 0 else out


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
    qs = float(q_star_points(F, np.array([sw]), np.array([sb]), q1=np.array([q1]))[0])
    unstable = [r for r, s in zip(roots, slopes) if s > 1]
    below = max([r for r in unstable if r < q1], default=0.0)
    above = min([r for r in unstable if r > q1], default=math.inf)
    basin = (below, above)
    stab = ["stable" if s < 1 else ("marginal" if s == 1 else "unstable") for s in slopes]
    listed = ", ".join(f"{r:.6g} ({t}, slope {s:.4g})" for r, s, t in zip(roots, slopes, stab)) or "none"
    note = f"fixed points on ({Q_MIN:g}, {Q_MAX:g}): {listed}; from q^(1) = {q1:.6g} the recursion reaches q* = {qs:.6g}"
    return FixedPoints(sw, sb, q0, q1, qs, tuple(roots), slopes, basin, note)


def q_star(act: str | Activation, sigma_w2: ArrayLike, sigma_b2: ArrayLike,
           dps: int | None = None, norm: str | None = None, norm_at: str = "before",
           batch: int | None = None) -> float | NDArray[Any] | mpmath.mpf:
    """The variance fixed point q* (float64 arrays broadcast; dps=N gives mpmath numbers).

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation` (pools included).
    sigma_w2, sigma_b2 : array_like
        Weight and bias variances (>= 0); arrays broadcast.
    dps : int, optional
        None for float64; N for mpmath numbers correct to N digits.
    norm, norm_at, batch : optional
        Normalisation (docs/theory.md section 12): q* of the pre-activations entering the norm, reached
        after one normalised layer (LayerNorm: sigma_w2 V(1) + sigma_b2 before phi, sigma_w2 + sigma_b2
        after; BatchNorm: sigma_w2 G_d + sigma_b2).

    Returns
    -------
    float, ndarray or mpmath.mpf
        q* = sigma_w2 V(q*) + sigma_b2 (0 or inf where the recursion goes there).

    Examples
    --------
    >>> round(sf.q_star("tanh", 1.5, 0.05), 10)
    0.4180372005
    """
    opts = nm.options("q_star", norm, norm_at, batch)
    if opts is not None:
        return on_grid("q_star", act, sigma_w2, sigma_b2, dps, lambda N, sw, sb: nm.q_star_normed(N, opts, sw, sb))
    return on_grid("q_star", act, sigma_w2, sigma_b2, dps, lambda N, sw, sb: N.ctx.run(partial(q_star_points, N), sw, sb))


def on_grid(func, act, sigma_w2, sigma_b2, dps, solve):
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
