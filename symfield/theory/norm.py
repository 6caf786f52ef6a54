"""Normalisation layers in the mean-field maps: LayerNorm and BatchNorm (docs/theory.md section 12).

Blocks are ``[norm] -> phi -> [norm] -> W . + b`` (layer 1 linear); ``norm_at="before"`` normalises the
pre-activation h, ``"after"`` normalises phi(h). All numbers come from the maps engine (V, C, mean, dpsi2,
dC, D of :mod:`symfield.numeric.maps`), except the BatchNorm sphere moments of a non-homogeneous phi at
finite batch, which are integrals over a sphere (2-D quadrature below).

LayerNorm (over the n units of one sample, infinite width), e.g. before phi:

    q' = sigma_w2 V(1) + sigma_b2,   q12' = sigma_w2 C(1, 1, c) + sigma_b2,   chi1 = sigma_w2 E[psi'^2](1)/q

BatchNorm (over a batch of B equicorrelated samples): before phi, BN(h) is uniform on a sphere of radius
sqrt(B) whatever (q, c), and the maps are sphere moments G_d, G_od of phi with the rate lambda_B; after
phi, q' = sigma_w2 + sigma_b2 and q12' = sigma_b2 - sigma_w2/(B-1). All the formulas: docs/theory.md
sections 12.1-12.3.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import mpmath
import numpy as np
import sympy as sp

from symfield.core import validate as check
from symfield.core.errors import InvalidValue, Unsupported
from symfield.numeric.evaluate import GUARD_DIGITS, to_mpf
from symfield.numeric.maps import maps
from symfield.numeric.orthant import phi_power_mean
from symfield.symbolic.activation import Activation
from symfield.symbolic.formula import X
from symfield.symbolic.kernel import kernel

NORMS = (None, "layer", "batch")
PLACES = ("before", "after")
THETA_NODES = 48          # Gauss-Legendre nodes per angular panel (float64, phi with kinks)
RADIAL_NODES = 60         # Gauss-Jacobi nodes in rho^2 (float64)
ZERO_TOL = 1e-13          # |c' - c| below this is a fixed point (float64 c-map)


@dataclass(frozen=True)
class Norm:
    """A validated normalisation: kind "layer" or "batch", place "before" or "after", batch B (None: B -> inf)."""
    kind: str
    at: str = "before"
    batch: int | None = None

    @property
    def label(self) -> str:
        b = "" if self.kind != "batch" else f", B={'inf' if self.batch is None else self.batch}"
        return f"{self.kind}norm {self.at} phi{b}"


def options(func: str, norm, norm_at="before", batch=None) -> Norm | None:
    """The validated (norm, norm_at, batch) of public function ``func``; None for no normalisation.
    Each bad value is one error naming the parameter, the value and what is allowed."""
    if norm is not None and not isinstance(norm, str):
        check.fail(func, "norm", "None, 'layer' or 'batch'", norm, TypeError)
    if norm not in NORMS:
        check.fail(func, "norm", "None, 'layer' or 'batch' (group norm is not supported)", norm)
    if not isinstance(norm_at, str):
        check.fail(func, "norm_at", "'before' or 'after' (the activation)", norm_at, TypeError)
    if norm_at not in PLACES:
        check.fail(func, "norm_at", "'before' or 'after' (the activation)", norm_at)
    if batch is not None:
        if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)):
            check.fail(func, "batch", "None (B -> infinity) or an integer batch size >= 2", batch, TypeError)
        if batch < 2:
            check.fail(func, "batch", "None (B -> infinity) or an integer batch size >= 2 (BatchNorm of one "
                       "sample is 0/0)", batch)
        if norm != "batch":
            check.fail(func, "batch", f"None unless norm='batch' (norm={norm!r} has no batch)", batch)
        batch = int(batch)
    if norm is None:
        if norm_at != "before":
            check.fail(func, "norm_at", "'before' (its default) unless norm is 'layer' or 'batch'", norm_at)
        return None
    return Norm(norm, norm_at, batch)


# ---------------------------------------------------------------- number helpers (float64 arrays or mpmath)
def _one(dps):
    return 1.0 if dps is None else mpmath.mpf(1)


def _sqrt(v, dps):
    if dps is None:
        return np.sqrt(v)
    f = np.frompyfunc(mpmath.sqrt, 1, 1)
    return f(v) if isinstance(v, np.ndarray) else mpmath.sqrt(v)


def _each(fn, dps, *args):
    """fn over broadcast arguments: vectorised engine calls in float64, element-wise in mpmath."""
    if dps is None:
        return fn(*(np.asarray(a, float) for a in args))
    if any(isinstance(a, np.ndarray) for a in args):
        return np.frompyfunc(fn, len(args), 1)(*args)
    return fn(*args)


# ---------------------------------------------------------------- LayerNorm
def ln_q(K, at, sw, sb, q, dps=None):
    """q' under LayerNorm: sigma_w2 V(1) + sigma_b2 (before) or sigma_w2 + sigma_b2 (after)."""
    M = maps(K, dps)
    with mpmath.workdps((dps or 15) + GUARD_DIGITS):
        if at == "before":
            return sw * M.V(_one(dps)) + sb + 0 * q
        return sw + sb + 0 * q


def centred(K, q1, q2, q12, dps=None, d=None):
    """c_hat = (C - m_a m_b)/(s_a s_b) of LayerNorm after phi; at equal norms from the distance map,
    1 - c_hat = D(q, q, q12, d)/(2 Var psi), free of cancellation as c -> 1. Returns (c_hat, 1 - c_hat)."""
    M = maps(K, dps)
    if d is None:
        d = q1 + q2 - 2 * q12

    def one(a, b, c, dd):
        if a == b:
            var = M.V(a) - M.mean(a) ** 2
            gap = M.D(a, b, c, dd) / (2 * var)
            return 1 - gap, gap
        sa, sb_ = (M.V(v) - M.mean(v) ** 2 for v in (a, b))
        ch = (M.C(a, b, c) - M.mean(a) * M.mean(b)) / _sqrt(sa * sb_, dps)
        return ch, 1 - ch

    with mpmath.workdps((dps or 15) + GUARD_DIGITS):
        if dps is None:
            a, b, c, dd = np.broadcast_arrays(*(np.asarray(v, float) for v in (q1, q2, q12, d)))
            shape = a.shape
            a, b, c, dd = a.ravel(), b.ravel(), c.ravel(), dd.ravel()
            out = np.empty((2,) + a.shape)
            eq = a == b
            if eq.any():
                u, inv = np.unique(a[eq], return_inverse=True)      # a grid of c's shares few q's
                var = (M.V(u) - M.mean(u) ** 2)[inv]
                out[1][eq] = M.D(a[eq], b[eq], c[eq], dd[eq]) / (2 * var)
                out[0][eq] = 1 - out[1][eq]
            ne = ~eq
            if ne.any():
                sa, sb_ = (M.V(v) - M.mean(v) ** 2 for v in (a[ne], b[ne]))
                out[0][ne] = (M.C(a[ne], b[ne], c[ne]) - M.mean(a[ne]) * M.mean(b[ne])) / np.sqrt(sa * sb_)
                out[1][ne] = 1 - out[0][ne]
            return out[0].reshape(shape), out[1].reshape(shape)
        res = _each(one, dps, q1, q2, q12, d)
        if isinstance(res, np.ndarray):
            return np.frompyfunc(lambda t: t[0], 1, 1)(res), np.frompyfunc(lambda t: t[1], 1, 1)(res)
        return res


def ln_qab(K, at, sw, sb, q1, q2, q12, dps=None):
    """q12' under LayerNorm (docs/theory.md sections 12.1 and 12.2)."""
    M = maps(K, dps)
    with mpmath.workdps((dps or 15) + GUARD_DIGITS):
        if at == "before":
            c = q12 / _sqrt(q1 * q2, dps)
            one = _one(dps)
            return sw * _each(lambda v: M.C(one, one, v), dps, c) + sb
        return sw * centred(K, q1, q2, q12, dps)[0] + sb


def ln_chi1(K, at, sw, sb, q=None, dps=None):
    """chi1 = d c'/d c at c = 1 (= the per-layer factor of the squared gradient) under LayerNorm, at the
    variance q entering the norm (default: its fixed point q*)."""
    M = maps(K, dps)
    with mpmath.workdps((dps or 15) + GUARD_DIGITS):
        one = _one(dps)
        if at == "before":
            qv = sw * M.V(one) + sb if q is None else q
            return sw * M.dpsi2(one) / qv
        qv = sw + sb if q is None else q
        return sw * _each(lambda v: M.dpsi2(v) / (M.V(v) - M.mean(v) ** 2), dps, qv)


def ln_ratio(K, dps=None):
    """sigma_b2/sigma_w2 on the edge of chaos of LayerNorm before phi: E[psi'^2](1) - V(1)."""
    M = maps(K, dps)
    with mpmath.workdps((dps or 15) + GUARD_DIGITS):
        one = _one(dps)
        r = M.dpsi2(one) - M.V(one)
    if dps is None:
        return float(r)
    with mpmath.workdps(dps):
        return +r


def ln_after_eoc(K, sb, dps=None):
    """sigma_w2 with chi1 = sigma_w2 E[psi'^2](q)/Var psi(q) = 1 at q = sigma_w2 + sigma_b2 (LayerNorm after phi)."""
    M = maps(K, dps)

    def g(sw):
        qv = sw + sb
        return sw * M.dpsi2(qv) - (M.V(qv) - M.mean(qv) ** 2)

    grid = np.geomspace(1e-4, 1e4, 8 * 8 + 1)
    vals = [float(g(s if dps is None else to_mpf(s))) for s in grid]
    k = next((i for i in range(len(grid) - 1) if (vals[i] <= 0) != (vals[i + 1] <= 0)), None)
    if k is None:
        raise InvalidValue(f"{K.act.name} under LayerNorm after phi has no edge of chaos at sigma_b2 = {float(sb):g}: "
                           f"chi1 - 1 keeps one sign for sigma_w2 in (1e-4, 1e4).")
    if dps is None:
        from scipy.optimize import brentq
        return brentq(lambda s: float(g(s)), grid[k], grid[k + 1], xtol=1e-15, rtol=1e-15)
    with mpmath.workdps(dps + GUARD_DIGITS):
        root = mpmath.findroot(g, (to_mpf(grid[k]), to_mpf(grid[k + 1])), solver="anderson")
    with mpmath.workdps(dps):
        return +root


# ---------------------------------------------------------------- BatchNorm: moments on the sphere
def _bn_rho(B, dps):
    r = -1.0 / (B - 1)
    return r if dps is None else mpmath.mpf(-1) / (B - 1)


@lru_cache(maxsize=256)
def sphere_moments(K, B, dps=None):
    """E over x = sqrt(B) u (u uniform on the unit sphere of 1^perp in R^B) of
    (G_d, G_od, E d1^2, E d1 d2, E d1^2 x1^2, E d1 x1 d2 x2) with d = phi'(x), and the method used.
    B = None: x_a i.i.d. N(0, 1). Positively homogeneous phi of degree 1: Gaussian kernels at unit
    variance and correlation -1/(B-1) (exact: every moment has degree <= 2 in x)."""
    M = maps(K, dps)
    one = _one(dps)
    if B is None:
        m = M.mean(one)
        return (M.V(one), m * m, M.dpsi2(one), None, None, None), "engine (B -> infinity: i.i.d. N(0, 1))"
    if K.act.pool is not None and K.act.k > 1:
        raise Unsupported(f"BatchNorm at finite batch needs a single-node activation; {K.act.name} pools "
                          f"{K.act.k} nodes. Use batch=None (B -> infinity) or norm='layer'.")
    if K.degree_one:
        r = _bn_rho(B, dps)
        C, dC = M.C(one, one, r), M.dC(one, one, r)
        return (M.V(one), C, M.dpsi2(one), dC, M.V(one), C), \
            "closed form (degree-one phi: Gaussian kernels at correlation -1/(B-1))"
    if B == 2:
        return _two_points(K, dps), "exact (B = 2: x = +-(1, -1))"
    if dps is None:
        return _sphere_f64(K, B), f"quadrature on the sphere (Gauss-Jacobi {RADIAL_NODES} in rho^2 x periodic trapezoid in theta)"
    return _sphere_mp(K, B, dps), f"quadrature on the sphere at dps={dps} (Gauss-Legendre in v = sqrt(1 - rho^2))"


@lru_cache(maxsize=64)
def _fns(K, module):
    phi, dphi = K.act.expr, sp.diff(K.act.expr, X)
    mods = "mpmath" if module == "mpmath" else ["scipy", "numpy"]
    return sp.lambdify(X, phi, modules=mods), sp.lambdify(X, dphi, modules=mods)


def _integrand(f, df, x1, x2):
    p1, p2, d1, d2 = f(x1), f(x2), df(x1), df(x2)
    return (p1 * p1, p1 * p2, d1 * d1, d1 * d2, d1 * d1 * x1 * x1, d1 * x1 * d2 * x2)


def _two_points(K, dps):
    f, df = _fns(K, "numpy" if dps is None else "mpmath")
    one = _one(dps)
    a, b = _integrand(f, df, one, -one), _integrand(f, df, -one, one)
    return tuple((u + v) / 2 for u, v in zip(a, b))


def _breaks(K, rad, thetas):
    """Angles in [0, 2 pi) where rad cos(theta - t) crosses a kink of phi, for each t in thetas."""
    out = [0.0, 2 * math.pi]
    for kink in K.kinks:
        if abs(kink) < rad:
            a = math.acos(kink / rad)
            for t in thetas:
                out += [(t + a) % (2 * math.pi), (t - a) % (2 * math.pi)]
    return sorted(set(out))


# paired with _sphere_mp: Gauss-Jacobi in float64, a polynomial weight in v for any dps (docs/numerics.md section 7)
def _sphere_f64(K, B):
    """float64: rho^2 = T ~ Beta(1, (B-3)/2) by Gauss-Jacobi (B >= 4; B = 3: T = 1), theta uniform by the
    periodic trapezoid rule (doubled until two rules agree to 1e-14; smooth phi) or Gauss-Legendre panels
    split at the kinks; x = sqrt(B-1) rho (cos theta, cos(theta - alpha)), cos alpha = -1/(B-1)."""
    from scipy.special import roots_jacobi
    f, df = _fns(K, "numpy")
    R, alpha = math.sqrt(B - 1), math.acos(-1.0 / (B - 1))
    if B == 3:
        T, wT = np.array([1.0]), np.array([1.0])
    else:
        s, w = roots_jacobi(RADIAL_NODES, (B - 5) / 2, 0.0)
        T, wT = (1 + s) / 2, w / w.sum()
    rad = R * np.sqrt(T)
    if not K.kinks:
        n, prev = 64, None
        while True:
            th = 2 * math.pi * np.arange(n) / n
            vals = _integrand(f, df, rad[:, None] * np.cos(th), rad[:, None] * np.cos(th - alpha))
            out = np.array([wT @ np.broadcast_to(v, (rad.size, n)).mean(axis=1) for v in vals])
            if prev is not None and np.all(np.abs(out - prev) <= 1e-14 * (1 + np.abs(out))) or n >= 1 << 14:
                return tuple(float(v) for v in out)
            n, prev = 2 * n, out
    gx, gw = np.polynomial.legendre.leggauss(THETA_NODES)
    total = np.zeros(6)
    for r, wt in zip(rad, wT):
        br = _breaks(K, r, (0.0, alpha))
        th = np.concatenate([(b - a) / 2 * gx + (a + b) / 2 for a, b in zip(br[:-1], br[1:])])
        wth = np.concatenate([(b - a) / 2 * gw for a, b in zip(br[:-1], br[1:])]) / (2 * math.pi)
        vals = _integrand(f, df, r * np.cos(th), r * np.cos(th - alpha))
        total += wt * np.array([np.dot(wth, np.broadcast_to(v, th.shape)) for v in vals])
    return tuple(float(v) for v in total)


def _sphere_mp(K, B, dps):
    """mpmath at dps: with 1 - T = v^2 the radial law Beta(1, (B-3)/2) becomes the polynomial weight
    (B - 3) v^(B-4) dv on [0, 1] (smooth in v), integrated by Gauss-Legendre; theta by the periodic
    trapezoid rule (smooth phi) or Gauss-Legendre panels between kinks. Both rules are doubled until the six
    moments agree to 10^-(dps + 3) (relative to 1 + |value|)."""
    from mpmath.calculus.quadrature import GaussLegendre
    f, df = _fns(K, "mpmath")
    with mpmath.workdps(dps + GUARD_DIGITS):
        R, alpha = mpmath.sqrt(B - 1), mpmath.acos(mpmath.mpf(-1) / (B - 1))
        tol = mpmath.mpf(10) ** -(dps + 3)
        rule = GaussLegendre(mpmath.mp)

        def angular(rad, n):
            if not K.kinks:
                th = [2 * mpmath.pi * j / n for j in range(n)]
                w = [mpmath.mpf(1) / n] * n
            else:
                br = [mpmath.mpf(x) for x in _breaks(K, float(rad), (0.0, float(alpha)))]
                nodes = rule.calc_nodes(max(3, int(math.log2(n)) - 2), mpmath.mp.prec)
                th, w = [], []
                for lo, hi in zip(br[:-1], br[1:]):
                    th += [(hi - lo) / 2 * x + (hi + lo) / 2 for x, _ in nodes]
                    w += [(hi - lo) / 2 * wx / (2 * mpmath.pi) for _, wx in nodes]
            tot = [mpmath.mpf(0)] * 6
            for t, wt in zip(th, w):
                vals = _integrand(f, df, rad * mpmath.cos(t), rad * mpmath.cos(t - alpha))
                tot = [a + wt * v for a, v in zip(tot, vals)]
            return tot

        def moments(level):
            n = 16 << level
            if B == 3:
                return angular(mpmath.mpf(1) * R, n)
            tot = [mpmath.mpf(0)] * 6
            for x, w in rule.calc_nodes(level + 3, mpmath.mp.prec):
                v = (x + 1) / 2                              # [-1, 1] -> [0, 1]
                wv = w / 2 * (B - 3) * v ** (B - 4)
                vals = angular(R * mpmath.sqrt(1 - v * v), n)
                tot = [a + wv * c for a, c in zip(tot, vals)]
            return tot

        prev = moments(0)
        for level in range(1, 8):
            cur = moments(level)
            if all(abs(c - p) <= tol * (1 + abs(c)) for c, p in zip(cur, prev)):
                break
            prev = cur
    return tuple(cur)


def flat_below(K) -> bool:
    """phi is constant for x < 0 (relu family with zero negative slope): a unit can then be constant over
    the whole batch (all its pre-activations <= 0), and BatchNorm after phi outputs 0 there (the eps -> 0
    limit of (y - mean)/sqrt(var + eps))."""
    h = K.homogeneity
    return h is not None and h[0] == 1 and h[1] == 0 and (K.act.pool is None or K.act.k == 1)


def dead_fraction(B, c, dps=None):
    """P(h_a <= 0 for all a = 1..B), h equicorrelated Gaussian at correlation c > -1/(B-1):
    int phi(g) Phi(-sqrt(c/(1-c)) g)^B dg, for c < 0 the same with the imaginary shift
    Phi(-i a g) = (1 - i erfi(a g/sqrt 2))/2, a = sqrt(-c/(1-c)) (real part; converges for B a^2 < 1)."""
    with mpmath.workdps((dps or 15) + 2 * GUARD_DIGITS):
        c = to_mpf(c)
        if c >= 1:
            return mpmath.mpf(1) / 2
        if c * (B - 1) <= -1 + mpmath.mpf(10) ** -12:     # h sums to 0 over the batch: never all <= 0
            return 0.0 if dps is None else mpmath.mpf(0)
        if c >= 0:
            k = mpmath.sqrt(c / (1 - c))
            fn = lambda g: mpmath.ncdf(-k * g) ** B * mpmath.npdf(g)  # noqa: E731
        else:
            a = mpmath.sqrt(-c / (1 - c))
            fn = lambda g: mpmath.re(((1 - 1j * mpmath.erfi(a * g / mpmath.sqrt(2))) / 2) ** B) * mpmath.npdf(g)  # noqa: E731
        s = 1 if c >= 0 else 1 / mpmath.sqrt(1 - B * a * a)    # the decay length of the c < 0 integrand
        p = mpmath.quad(fn, [-mpmath.inf, -4 * s, -s, 0, s, 4 * s, mpmath.inf])
    return float(p) if dps is None else p


DEAD_ATOL = 1e-13      # float64 dead fraction: two Gauss-Legendre rules must agree to this, else mpmath


def _dead_rule_negative(B, c, width):
    """dead_fraction's integral for an array of c < 0 by Gauss-Legendre panels of ``width`` on [-12 s, 12 s], and the
    integrand's modulus at the window's end. It decays like exp(-(1 - B a^2) g^2/2), a^2 = -c/(1 - c), so
    s = (1 - B a^2)^(-1/2) stretches the window to match."""
    from scipy.special import erfi
    t, w = np.polynomial.legendre.leggauss(16)
    edges = np.arange(-12.0, 12.0 + width / 2, width)
    g0 = ((edges[:-1] + edges[1:])[:, None] / 2 + width / 2 * t).ravel()
    w0 = np.tile(w * width / 2, edges.size - 1)
    a2 = (-c / (1 - c))[:, None]
    with np.errstate(all="ignore"):
        scale = 1 / np.sqrt(np.maximum(1 - B * a2, 1e-300))
        g = scale * np.append(g0, 12.0)
        f = np.real(((1 - 1j * erfi(np.sqrt(a2) * g / math.sqrt(2))) / 2) ** B)
        f = f * np.exp(-g * g / 2) / math.sqrt(2 * math.pi)
    return f[:, :-1] @ w0 * scale[:, 0], np.abs(f[:, -1])


def dead_fraction_f64(B, c):
    """:func:`dead_fraction` for a float64 array c. For 0 <= c < 1 it is E[Phi(sqrt(gamma) Z)^B] with
    gamma = c/(1 - c), the B-th moment of IGB's G0 (:func:`symfield.numeric.orthant.phi_power_mean`). For c < 0: two
    Gauss-Legendre rules (panels 1 and 1/2, the window stretched to the integrand's decay) where they agree to
    DEAD_ATOL and the integrand has decayed at the window's end; mpmath where not (c near -1/(B-1): almost no
    decay), and at c >= 1 or the degenerate end."""
    c = np.asarray(c, float)
    out = np.empty(c.shape)
    pos = (c >= 0) & (c < 1)
    out[pos] = phi_power_mean(B, np.sqrt(c[pos] / (1 - c[pos])))
    neg = (c < 0) & (c * (B - 1) > -1 + 1e-12)
    if neg.any():
        (a, _), (b, tail) = _dead_rule_negative(B, c[neg], 1.0), _dead_rule_negative(B, c[neg], 0.5)
        good = np.isfinite(b) & (np.abs(a - b) <= DEAD_ATOL) & (tail <= 1e-18)
        vals = np.where(good, b, np.nan)
        vals[~good] = [dead_fraction(B, float(v)) for v in c[neg][~good]]
        out[neg] = vals
    rest = ~pos & ~neg
    out[rest] = [dead_fraction(B, float(v)) for v in c[rest]]
    return out


def bn_gram(K, at, B, dps=None, c=None):
    """(G_d, G_od): E y_a^2 and E y_a y_b of the normalised layer output on a batch whose pre-activations
    have correlation c (needed only after phi for a phi flat below 0 at finite B: the dead units)."""
    if at == "after":
        one = _one(dps)
        if B is None:
            return one, 0 * one
        live = one
        if flat_below(K):
            if c is None:
                raise Unsupported(f"BatchNorm after {K.act.name} at finite batch depends on the batch's correlation "
                                  f"(units with every pre-activation <= 0 output 0): use qab_map or propagate.")
            if dps is None:
                cv = np.asarray(c, float)
                dead = dead_fraction_f64(B, cv) if cv.ndim else float(dead_fraction_f64(B, cv.reshape(1))[0])
            else:
                dead = _each(lambda v: dead_fraction(B, v, dps), dps, c)
            live = one - dead
        return live, -live / (B - 1)
    return sphere_moments(K, B, dps)[0][:2]


def bn_rate(K, at, B, dps=None, sw=None, sb=None):
    """lambda_B: the per-layer growth of the squared gradient under BatchNorm; (value, method). Before phi it
    does not depend on the weights. After phi only B -> infinity is given: the batch mean and standard deviation
    of phi(h) are then constants, so lambda = sigma_w2 E[phi'^2](q*)/Var phi(q*) at q* = sigma_w2 + sigma_b2."""
    if at == "after":
        if B is not None:
            raise Unsupported(f"The gradient rate under BatchNorm after phi at a finite batch (batch={B}) is not "
                              "supported: the batch standard deviation of phi(h) depends on the batch vector's "
                              "direction, so the sphere reduction of norm_at='before' does not apply. batch=None "
                              "(B -> infinity) gives sigma_w2 E[phi'^2]/Var phi; norm_at='before' gives lambda_B.")
        return ln_chi1(K, "after", sw, sb, None, dps), "engine (B -> infinity: sigma_w2 E[phi'^2](q*)/Var phi(q*))"
    mom, how = sphere_moments(K, B, dps)
    with mpmath.workdps((dps or 15) + GUARD_DIGITS):
        if B is None:
            val = mom[2] / (mom[0] - mom[1])
        elif B <= 3:
            val = math.inf if dps is None else mpmath.inf
            how += "; B <= 3: E[1/chi^2_(B-1)] is infinite"
        else:
            Gd, God, d2, d1d2, d2x2, dxdx = mom
            val = ((B - 1) * d2 + d1d2 - d2x2 + dxdx) / ((B - 3) * (Gd - God))
    if dps is None:
        return float(val), how
    with mpmath.workdps(dps):
        return +val, how


@dataclass(frozen=True)
class BatchNormResult:
    """The batch fixed point under BatchNorm: ``c_star`` (correlation of two samples' pre-activations),
    ``gamma`` = q_ab/(q_aa - q_ab), ``q_star``, ``q_ab_star``, the gradient rate ``rate`` (lambda_B, per
    layer; NaN for norm_at="after") and ``method`` (how the sphere moments were computed)."""
    c_star: float
    gamma: float
    q_star: float
    q_ab_star: float
    rate: float
    method: str
    batch: int | None
    norm_at: str


def bn_fixed(K, at, sw, sb, B, dps=None):
    """(q*, q_ab*, c*, gamma) of the batch Gram under BatchNorm: reached after one normalised layer, or (after
    phi, phi flat below 0) the fixed point of c -> (sigma_b2 - sigma_w2 (1 - p(c))/(B-1))/(sigma_w2 (1 - p(c))
    + sigma_b2), p the dead fraction, iterated from the inputs' c = 0."""
    c = None
    if at == "after" and B is not None and flat_below(K):
        c = sb / (sw + sb)
        for _ in range(200):
            Gd, God = bn_gram(K, at, B, dps, c)
            c_new = (sw * God + sb) / (sw * Gd + sb)
            if abs(c_new - c) <= 1e-15 * (dps and 10 ** (15 - dps) or 1):
                break
            c = c_new
    Gd, God = bn_gram(K, at, B, dps, c)
    with mpmath.workdps((dps or 15) + GUARD_DIGITS):
        qa, qab = sw * Gd + sb, sw * God + sb
        gap = sw * (Gd - God)
        return qa, qab, qab / qa, (qab / gap if gap != 0 else math.inf)


def batchnorm(act: str | Activation, sigma_w2: float, sigma_b2: float, batch: int | None = None, norm_at: str = "before",
              dps: int | None = None) -> BatchNormResult:
    """The batch fixed point and gradient rate of a BatchNorm network on an equicorrelated batch.

    BatchNorm before phi maps each unit's batch vector onto the sphere of radius sqrt(B) in the complement
    of (1, ..., 1), uniformly whatever (q, c) (docs/theory.md section 12), so the next Gram matrix is
    q* = sigma_w2 G_d + sigma_b2, q_ab* = sigma_w2 G_od + sigma_b2 after one normalised layer; after phi,
    G_d = 1 and G_od = -1/(B-1). gamma = q_ab*/(q* - q_ab*), c* = q_ab*/q*. The gradient rate
    lambda_B = E|dL/dh^(l)|^2 / E|dL/dh^(l+1)|^2 does not depend on sigma_w2, sigma_b2.

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation` (finite batch: a single-node phi).
    sigma_w2, sigma_b2 : float
        Weight and bias variances (sigma_w2 > 0, sigma_b2 >= 0).
    batch : int, optional
        Batch size B >= 2; None for B -> infinity.
    norm_at : {'before', 'after'}
        Normalise the pre-activation h or phi(h).
    dps : int, optional
        None for float64; N for mpmath numbers.

    Returns
    -------
    BatchNormResult
        ``c_star``, ``gamma``, ``q_star``, ``q_ab_star``, ``rate`` (lambda_B), ``method``.

    Examples
    --------
    >>> round(sf.batchnorm("relu", 2.0, 0.0).rate, 12)      # pi/(pi - 1)
    1.466942206924
    """
    K = kernel(act)
    opts = options("batchnorm", "batch", norm_at, batch)
    dps = check.dps("batchnorm", dps)
    sw = float(check.real("batchnorm", "sigma_w2", sigma_w2, lo=0, lo_open=True))
    sb = float(check.real("batchnorm", "sigma_b2", sigma_b2, lo=0))
    if dps is not None:
        with mpmath.workdps(dps + GUARD_DIGITS):
            sw, sb = to_mpf(sigma_w2), to_mpf(sigma_b2)
    qa, qab, c, gamma = bn_fixed(K, opts.at, sw, sb, opts.batch, dps)
    if opts.at == "before" or opts.batch is None:
        rate, how = bn_rate(K, opts.at, opts.batch, dps, sw, sb)
    else:
        rate, how = (math.nan, "closed form (after phi: sum_a y_a = 0, sum_a y_a^2 = B); the gradient rate at a "
                     "finite batch is not given (NaN)" +
                     ("; dead units by the orthant probability" if flat_below(K) else ""))
    if dps is None:
        qa, qab, c, gamma = (float(v) for v in (qa, qab, c, gamma))
    return BatchNormResult(c, gamma, qa, qab, rate, how, opts.batch, opts.at)


def require_equicorrelated(func, q1, q2):
    """BatchNorm maps are for an equicorrelated batch: refuse unequal norms (one clear error)."""
    if np.any(np.asarray(q1, dtype=object) != np.asarray(q2, dtype=object)):
        raise Unsupported(f"{func} with norm='batch' needs an equicorrelated batch (every sample with the same "
                          f"variance, q1 == q2); got q1 = {np.asarray(q1).tolist()}, q2 = {np.asarray(q2).tolist()}. BatchNorm of unequal norms is "
                          f"not supported.")



# ---------------------------------------------------------------- the c-map's fixed point (phases)
def c_next(K, opts, sw, sb, c):
    """One layer of the correlation map at the normalised fixed point of q (float64 arrays c; sw, sb scalars
    or arrays broadcasting with c)."""
    M = maps(K)
    c = np.asarray(c, float)
    sw, sb = np.asarray(sw, float), np.asarray(sb, float)
    if opts.at == "before":
        return (sw * M.C(np.ones_like(c), np.ones_like(c), c) + sb) / (sw * float(M.V(1.0)) + sb)
    qs = sw + sb
    q = np.array(np.broadcast_to(qs, np.broadcast_shapes(qs.shape, c.shape)))
    return (sw * centred(K, q, q, c * qs)[0] + sb) / qs


C_GRID = np.unique(np.concatenate([np.linspace(-1, 1, 201)[:-1], 1 - np.geomspace(1e-2, 1e-9, 15)]))


def ln_c_star(K, opts, sw, sb):
    """c* reached from the inputs' c = 0 (layer 1: c = sigma_b2/(sigma_w2 + sigma_b2)) under LayerNorm: the
    c-map is increasing, so c moves monotonically to the nearest fixed point in the direction of
    c' - c (c = 1 is always one). Scalars: :func:`ln_c_star_many` at one point."""
    return float(ln_c_star_many(K, opts, np.array([sw], float), np.array([sb], float))[0])


def ln_c_star_many(K, opts, sw, sb):
    """:func:`ln_c_star` at every point of flat float64 arrays at once: the c-map on the grid C_GRID plus the
    point's own c1 in one engine call, the nearest sign change of c' - c in the direction of c1' - c1 per
    point, and one vectorised bracketed solve (:func:`symfield.numeric.vroot.vroot`) of all those brackets."""
    from symfield.numeric.vroot import vroot
    sw, sb = np.asarray(sw, float), np.asarray(sb, float)
    n = sw.size
    tot = sw + sb
    c1 = np.where(tot > 0, sb / np.where(tot > 0, tot, 1.0), 1.0)
    grid = np.sort(np.concatenate([np.broadcast_to(C_GRID, (n, C_GRID.size)), c1[:, None]], axis=1), axis=1)
    maps(K).plan(grid.size * 8)         # the evaluations ahead (grid and solve): 1-D tables pay at once
    g = c_next(K, opts, sw[:, None], sb[:, None], grid) - grid
    g[np.abs(g) <= ZERO_TOL] = 0.0
    g1 = c_next(K, opts, sw, sb, c1) - c1
    out = c1.copy()
    lo, hi, flo, fhi, who = [], [], [], [], []
    for i in range(n):
        if abs(g1[i]) <= ZERO_TOL:
            continue
        up = g1[i] > 0
        row, gr = grid[i], g[i]
        ks = np.flatnonzero(row > c1[i]) if up else np.flatnonzero(row < c1[i])[::-1]
        out[i] = 1.0 if up else -1.0
        for k in ks:                 # walk away from c1: the first zero or sign change is the nearest root
            if gr[k] == 0:
                out[i] = row[k]
                break
            j = k - 1 if up else k + 1
            if gr[j] * gr[k] < 0:
                a, b = sorted((j, k))
                lo.append(row[a]), hi.append(row[b]), flo.append(gr[a]), fhi.append(gr[b]), who.append(i)
                break
    if who:
        who = np.array(who)
        roots = vroot(lambda x, idx: c_next(K, opts, sw[who[idx]], sb[who[idx]], x) - x,
                      np.array(lo), np.array(hi), np.array(flo), np.array(fhi))
        out[who] = roots
    return np.where(out > 1 - 1e-7, 1.0, out)     # float64 noise of g next to the fixed point c = 1


def normed_phase(K, opts, sw, sb):
    """(q*, c*, gamma*, slope, note) of one initialisation under a normalisation (float64)."""
    if opts.kind == "batch":
        qa, qab, c, gamma = (float(v) for v in bn_fixed(K, opts.at, sw, sb, opts.batch))
        known = opts.at == "before" or opts.batch is None
        rate = float(bn_rate(K, opts.at, opts.batch, None, sw, sb)[0]) if known else math.nan
        note = (f"{opts.label}: the batch Gram is at its fixed point after one normalised layer (c* = {c:.6g}); "
                + (f"gradient rate lambda_B = {rate:.6g} per layer whatever the weights" if opts.at == "before" else
                   f"gradient rate {rate:.6g} per layer (B -> infinity)" if known else
                   "the gradient rate after phi at a finite batch is not given"))
        return qa, c, gamma, rate, note
    slope = float(ln_chi1(K, opts.at, sw, sb))
    qs = float(ln_q(K, opts.at, sw, sb, 1.0))
    c = ln_c_star(K, opts, sw, sb) if sw > 0 else 1.0
    gamma = math.inf if c >= 1 else c / (1 - c)
    return qs, c, gamma, slope, f"{opts.label}: chi1 = {slope:.6g}, c* from the normalised c-map"


# ---------------------------------------------------------------- the depth recursion (propagate)
def step(K, opts, sw, sb, qa, qb, qab, d, dps=None):
    """One layer l -> l+1 of (q_aa, q_bb, q_ab, d) under ``opts`` (None: the plain maps), on flat arrays
    (float64, or object arrays of mpmath numbers). d keeps 1 - c cancellation-free: LayerNorm before phi
    d' = sigma_w2 D(1, 1, c, 2(1 - c)); after phi d' = 2 sigma_w2 (1 - c_hat) with 1 - c_hat from D."""
    M = maps(K, dps)
    with mpmath.workdps((dps or 15) + GUARD_DIGITS):
        if opts is None:
            qa2, qb2 = sw * _each(M.V, dps, qa) + sb, sw * _each(M.V, dps, qb) + sb
            return qa2, qb2, sw * _each(M.C, dps, qa, qb, qab) + sb, sw * _each(M.D, dps, qa, qb, qab, d)
        if opts.kind == "batch":
            Gd, God = bn_gram(K, opts.at, opts.batch, dps, qab / qa)
            q2 = sw * Gd + sb + 0 * qa
            return q2, q2, sw * God + sb + 0 * qa, sw * 2 * (Gd - God) + 0 * qa
        if opts.at == "after":
            qn = sw + sb + 0 * qa
            ch, gap = centred(K, qa, qb, qab, dps, d)
            return qn, qn, sw * ch + sb, 2 * sw * gap
        one = _one(dps)
        root = _sqrt(qa * qb, dps)
        gap = (d - (_sqrt(qa, dps) - _sqrt(qb, dps)) ** 2) / (2 * root)       # 1 - c
        c = 1 - gap
        qn = sw * M.V(one) + sb + 0 * qa
        return (qn, qn, sw * _each(lambda v: M.C(one, one, v), dps, c) + sb,
                sw * _each(lambda v, g: M.D(one, one, v, 2 * g), dps, c, gap))


def recursion(K, opts, sw, sb, qa0, qb0, qab0, d0, depth, dps=None):
    """Per-layer (q_aa, q_bb, q_ab, d), each of shape (depth, n), from layer 1 = sigma_w2 x0 + sigma_b2."""
    if opts is not None and opts.kind == "batch" and qa0 != qb0:
        raise Unsupported("propagate with norm='batch' needs an equicorrelated batch: q0 == qbb0 (BatchNorm of "
                          f"inputs with unequal norms is not supported); got q0 = {qa0!r}, qbb0 = {qb0!r}.")
    if opts is not None and opts.kind == "batch" and d0 == 0:
        raise InvalidValue("propagate with norm='batch': identical inputs (d0 = 0) have zero variance over the "
                           "batch, so BatchNorm is 0/0.")
    with mpmath.workdps((dps or 15) + GUARD_DIGITS):
        state = [sw * qa0 + sb, sw * qb0 + sb, sw * qab0 + sb, sw * d0]
        rows = [state]
        for _ in range(depth - 1):
            state = list(step(K, opts, sw, sb, *state, dps))
            rows.append(state)
    dtype = float if dps is None else object
    return [np.array([np.broadcast_to(np.asarray(r[i], dtype=dtype), sw.shape) for r in rows], dtype=dtype)
            for i in range(4)]


def phase_code(c_star, slope, tol):
    """Index into the phases' names (Table 1 rules, as sf.phase): c* = 1 by the slope, else by c* > 1/2."""
    if c_star >= 1:
        return 1 if abs(slope - 1) <= tol else 0 if slope < 1 else 2
    return 3 if c_star > 0.5 else 4


def eoc_sigma_w2(K, opts, sb):
    """sigma_w2 of the edge of chaos at sigma_b2 under ``opts`` (float64; NaN where there is none)."""
    try:
        if opts.kind == "batch":
            return math.nan
        if opts.at == "after":
            return float(ln_after_eoc(K, sb))
        r = ln_ratio(K)
        return sb / r if r > 0 else math.nan
    except (ValueError, ArithmeticError):
        return math.nan


def normed_phases(K, opts, sw, sb):
    """(q*, c*, gamma*, slope) of :func:`normed_phase` at every point of flat float64 arrays (LayerNorm: one
    vectorised c* solve, :func:`ln_c_star_many`; BatchNorm point by point)."""
    sw, sb = np.asarray(sw, float).ravel(), np.asarray(sb, float).ravel()
    if opts.kind == "batch" or sw.size == 0:
        return np.array([normed_phase(K, opts, float(w), float(b))[:4] for w, b in zip(sw, sb)]).reshape(-1, 4).T
    slope = np.asarray(ln_chi1(K, opts.at, sw, sb), float) * np.ones(sw.shape)
    qs = np.asarray(ln_q(K, opts.at, sw, sb, 1.0), float) * np.ones(sw.shape)
    c = np.ones(sw.shape)
    pos = sw > 0
    if pos.any():
        c[pos] = ln_c_star_many(K, opts, sw[pos], sb[pos])
    with np.errstate(divide="ignore"):
        gamma = np.where(c >= 1, math.inf, c / np.where(c >= 1, 1.0, 1 - c))
    return qs, c, gamma, slope


def c_star_grid(K, opts, sigma_w2, sigma_b2):
    """c* under ``opts`` at each point of broadcast float64 arrays (float for scalars)."""
    sw, sb = np.broadcast_arrays(np.asarray(sigma_w2, float), np.asarray(sigma_b2, float))
    out = normed_phases(K, opts, sw.ravel(), sb.ravel())[1]
    return float(out[0]) if sw.ndim == 0 else out.reshape(sw.shape)


def q_star_normed(N, opts, sw, sb):
    """q* (the variance entering the next block's norm) on flat arrays of the engine N's numbers: LayerNorm
    sigma_w2 V(1) + sigma_b2 (before) or sigma_w2 + sigma_b2 (after); BatchNorm sigma_w2 G_d + sigma_b2."""
    K, dps = N.K, N.dps
    if dps is not None:            # the inputs read as the decimals they print as (0.1 -> mpf('0.1'))
        with mpmath.workdps(dps + GUARD_DIGITS):
            sw, sb = N.ctx.num(sw), N.ctx.num(sb)
    if opts.kind == "layer":
        return np.asarray(ln_q(K, opts.at, sw, sb, 0 * sw, dps), dtype=float if dps is None else object)
    vals = [bn_fixed(K, opts.at, w, b, opts.batch, dps)[0] for w, b in zip(sw, sb)]
    return np.array(vals, dtype=float if dps is None else object)


def neutral_sigma_w2(K, opts, sb, wmax):
    """sigma_w2 where c* = 1/2 at sigma_b2 = sb under ``opts`` (float64): the first crossing of c*(sigma_w2)
    below 1/2 on a geometric scan of (1e-3, wmax), refined by brentq; NaN where c* stays above 1/2."""
    from scipy.optimize import brentq

    def f(w):
        return normed_phase(K, opts, float(w), sb)[1] - 0.5

    grid = np.geomspace(1e-3, wmax, 31)
    prev = f(grid[0])
    for a, b in zip(grid[:-1], grid[1:]):
        cur = f(b)
        if prev > 0 >= cur:
            return brentq(f, a, b, xtol=1e-13, rtol=1e-13)
        prev = cur
    return math.nan
