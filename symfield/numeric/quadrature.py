"""Deterministic, error-controlled quadrature of Gaussian expectations (numpy + mpmath only).

    expect1(f, q, mean=0, kinks=(), dps=None)       = E[f(x)],       x ~ N(mean, q)
    expect2(f, g, q1, q2, q12, kinks=(), dps=None)  = E[f(u) g(v)],  (u, v) ~ N(0, [[q1, q12], [q12, q2]])

Composite Gauss-Legendre on panels in standard units, split at a Gaussian grid, an activation grid and
the kinks; expect2 integrates v given u. float64 estimates its error by null rules (no extra
evaluations) and returns a value only within 1e-10 of E|integrand| (else QuadratureError); mpmath
compares three degrees per panel and halves the panels at most twice. At dps, a pair with |corr| <= 0.9
is first summed as Mehler's series sum_k corr^k a_k b_k of Hermite coefficients from one 1-D rule per
factor (:func:`_e2_mehler`: tail bounded by Cauchy-Schwarz), the 2-D rule where that is not certified. Measured worst relative errors:
4.4e-15 (1-D) and 4.9e-16 (2-D) against exact values.

Max-pools (max_expect1, max_expect2: the h_k integral of docs/theory.md section 4) use the same plan;
non-monotone phi go to :mod:`symfield.numeric.pool.levelsets`. The rules in detail: docs/numerics.md
sections 4 and 5.
"""
from __future__ import annotations

from symfield.core.errors import PrecisionError
import math
from fractions import Fraction
from functools import lru_cache
from operator import mul as _mul

import mpmath
import numpy as np
from mpmath.libmp import to_fixed
from mpmath.libmp.libelefun import exp_fixed, ln2_fixed

from symfield.core.errors import QuadratureError

__all__ = ["expect1", "expect2", "expect1_vec", "expect2_vec", "expect1_many", "QuadratureError"]

R = 40.0                 # the activation grid covers [-R, R]
GUARD = 10               # extra working digits in mp mode
MAX_REFINE = 2           # panel halvings before ArithmeticError (mp mode)
F64 = (12.0, 1.0, 0.5)   # float64 (L, gw, h)
_T, _W = np.polynomial.legendre.leggauss(12)
# rows m = 8..11 of the coefficient map F(t_i) -> (2/sqrt(2 pi)) c_m (the null rules of the error estimate)
_NULL = (2 * (np.arange(12) + 0.5)[:, None] * np.polynomial.legendre.legvander(_T, 11).T * _W)[8:] / math.sqrt(2 * math.pi)
_W = _W / math.sqrt(2 * math.pi)
_CHUNK = 1 << 20         # inner nodes per vectorised pass
F64_RTOL = 1e-10         # float64 rules: error estimate <= F64_RTOL * E|integrand| or QuadratureError


# ---------------------------------------------------------------- breakpoints (float or mpf)
def _multiples(H, a, b):
    """k*H for the integers k with a <= k*H <= b."""
    return [k * H for k in range(math.ceil(a / H), math.floor(b / H) + 1)] if a <= b else []


def _act_points(mean, s, P, kinks):
    """x-points of a row N(mean, s^2): the kinks and, if finer than the Gaussian grid, the activation grid."""
    L, gw, h = P[:3]
    pts = list(kinks)
    if gw * s > h:
        pts += _multiples(h, max(mean - L * s, -R), min(mean + L * s, R))
    return pts


def _cover(mean, s, P):
    """The z-interval where the activation grid of _act_points lies (it is finer than the Gaussian
    grid there), else None: mpmath rules drop the Gaussian grid inside it (no doubled panels)."""
    L, gw, h = P[:3]
    if gw * s <= h:
        return None
    return (max(mean - L * s, -R) - mean) / s, (min(mean + L * s, R) - mean) / s


def _zbreaks(mean, s, P, pts, tol, cover=None):
    """Sorted z-breakpoints on [-L, L]: Gaussian grid (outside `cover`), x-points inside, ends (closer
    than tol merged)."""
    L, gw = P[0], P[1]
    J = int(L / gw - 0.5)  # no end panel narrower than gw/2
    zs = {j * gw for j in range(-J, J + 1) if cover is None or not cover[0] < j * gw < cover[1]} | {-L, L}
    zs |= {z for z in ((x - mean) / s for x in pts) if -L < z < L}
    zs = sorted(zs)
    out = [zs[0]]
    for z in zs[1:]:
        if z - out[-1] > tol:
            out.append(z)
    out[-1] = zs[-1]  # the end stays exact
    return out


def _outer_points(s1, cp, sc, P, kinks):
    """x-points of the outer (u) rule of expect2: f's, plus those of G(u) = E[g(v)|u] mapped by 1/cp."""
    L, gw, h = P[:3]
    pts = _act_points(0 * s1, s1, P, kinks)
    span = gw * abs(cp) * s1          # outer Gaussian spacing in v units
    H = max(h, gw * sc)
    if H < span:
        pts += [w / cp for w in _multiples(H, -min(R + L * sc, span * L / gw), min(R + L * sc, span * L / gw))]
    for k in kinks:
        pts.append(k / cp)
        if sc > 0 and gw * sc < span:
            pts += [(k + j * gw * sc) / cp for j in range(-int(L / gw), int(L / gw) + 1) if j]
    return pts


def _cond(q1, q2, q12):
    """(c', s_c) of v | u, with q1 q2 - q12^2 evaluated exactly."""
    if isinstance(q1, float):
        sc2 = float((Fraction(q1) * Fraction(q2) - Fraction(q12) ** 2) / Fraction(q1))
        return q12 / q1, math.sqrt(max(sc2, 0.0))
    with mpmath.workprec(2 * mpmath.mp.prec + 20):
        sc2 = (q1 * q2 - q12 * q12) / q1
    return q12 / q1, (mpmath.sqrt(sc2) if sc2 > 0 else mpmath.mpf(0))


# ---------------------------------------------------------------- float64
def _ev(f, x):
    """A vectorised f on an array of any shape (passed flat; scalar results broadcast)."""
    y = np.asarray(f(x.ravel()), dtype=float)
    return np.broadcast_to(y, (x.size,)).reshape(x.shape) if y.ndim == 0 else y.reshape(x.shape)


# paired with _rule_mp: float64 integrates whole rows in padded arrays, mpmath panel by panel (docs/numerics.md section 7)
def _rule_f64(mean, s, pts):
    """Nodes z and weights (density included) of N(0, 1) on the panels, and the panel half-widths hw."""
    z = np.asarray(_zbreaks(mean, s, F64, pts, 1e-12))
    hw = 0.5 * np.diff(z)[:, None]
    z = (z[:-1, None] + hw * (1 + _T)).ravel()
    return z, (hw * _W).ravel() * np.exp(-0.5 * z * z), hw.ravel()


def _panel_error(hw, F):
    """Error estimate of the 12-point Gauss rule, summed over panels: F (..., panels, 12) holds the
    integrand n(z) f at the nodes, hw (..., panels) the half-widths (docs/numerics.md section 4)."""
    c = np.abs(F @ _NULL.T)
    prev, tail = c[..., 0] + c[..., 1], c[..., 2] + c[..., 3]
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(tail > 0, np.minimum(1.0, tail / prev), 0.0)
    return np.sum(np.abs(hw) * tail * (r * r) ** 2, axis=-1)


def _name(f, name):
    """The integrand's name for messages: `name`, else f's own (a lambda or closure: 'f')."""
    own = getattr(f, "__name__", "")
    return name or (own if own.isidentifier() and own != "call" else "f")


def _accept(value, err, scale, what):
    """value if err <= F64_RTOL * scale (all finite), else QuadratureError."""
    if math.isfinite(value) and math.isfinite(err) and err <= F64_RTOL * scale:
        return value
    raise QuadratureError(f"{what}: the float64 quadrature cannot resolve the integrand (value {value:.6g}, error "
                          f"estimate {err:.3g} > {F64_RTOL:g} x E|integrand| = {F64_RTOL * scale:.3g}); a pole, "
                          f"spike or unlisted kink near the real line? Use dps=N (mpmath) or a smoother activation.")


def _inner_f64(g, mu, sc, kinks):
    """G_i = E[g(mu_i + sc Z)], E|g| and the error estimate of G_i, for an array of means mu_i:
    padded per-row breakpoints (zero-width panels)."""
    L, gw, h = F64
    J = int(L / gw - 0.5)
    zg = np.concatenate([np.arange(-J, J + 1) * gw, [-L, L]])
    kk = np.asarray(kinks, dtype=float)
    K = 0
    if gw * sc > h:
        k0 = np.ceil(np.maximum(mu - L * sc, -R) / h)
        K = int(max(0.0, (np.floor(np.minimum(mu + L * sc, R) / h) - k0).max() + 1))
    G, A, E = np.empty(mu.size), np.empty(mu.size), np.empty(mu.size)
    rows = max(1, _CHUNK // ((zg.size + K + kk.size) * _T.size))
    for i in range(0, mu.size, rows):
        m = mu[i:i + rows, None]
        cols = [np.broadcast_to(zg, (m.shape[0], zg.size)), (kk[None, :] - m) / sc]
        if K:
            cols.append(((k0[i:i + rows, None] + np.arange(K)) * h - m) / sc)
        zb = np.sort(np.clip(np.concatenate(cols, axis=1), -L, L), axis=1)
        hw = 0.5 * np.diff(zb, axis=1)
        z = zb[:, :-1, None] + hw[..., None] * (1 + _T)
        F = np.exp(-0.5 * z * z) * _ev(g, m[..., None] + sc * z)
        G[i:i + rows] = np.sum(hw * (F @ _W), axis=1)
        A[i:i + rows] = np.sum(hw * (np.abs(F) @ _W), axis=1)
        E[i:i + rows] = _panel_error(hw, F)
    return G, A, E


# ---------------------------------------------------------------- mpmath
@lru_cache(maxsize=64)
def _gl(d, prec):
    """(node, weight/sqrt(2 pi)) of mpmath's degree-d Gauss-Legendre rule on [-1, 1]."""
    with mpmath.workprec(prec):
        c = 1 / mpmath.sqrt(2 * mpmath.pi)
        return tuple((t, w * c) for t, w in mpmath.calculus.quadrature.GaussLegendre(mpmath.mp).calc_nodes(d, prec))


def _rule_mp(zb, d, scale, cache):
    """Nodes scale*z and weights of N(0, 1) on the panels zb; panels are memoised in `cache`."""
    zs, ws = [], []
    for a, b in zip(zb[:-1], zb[1:]):
        r = cache.get((a, b))
        if r is None:
            hw, mid = (b - a) / 2, (a + b) / 2
            tw = [(mid + hw * t, w) for t, w in _gl(d, mpmath.mp.prec)]
            r = [scale * z for z, _ in tw], [hw * w * mpmath.exp(-z * z / 2) for z, w in tw]
            if len(cache) < 4096:
                cache[a, b] = r
        zs += r[0]
        ws += r[1]
    return zs, ws


def _plan(N):
    """(L, gw, h, d) for N digits: the largest degree d >= 4 whose tanh-sized panel p is <= 4."""
    D, L = N + 4, mpmath.sqrt(2 * (N + 6) * mpmath.log(10)) + 1

    def width(d):  # n = 3*2^(d-1) nodes give ~rho^-2n = 10^-D for poles at +-i pi/2
        rho = mpmath.mpf(10) ** (mpmath.mpf(D) / (3 * 2 ** d))
        return 2 * mpmath.pi / (rho - 1 / rho)
    d = 4
    while width(d + 1) <= 4:
        d += 1
    p = min(width(d), mpmath.mpf(4))
    return (L, p, p, d)


def controlled(level, N, what):
    """Run level(P, degree, want_abs) -> (value, E|integrand|) at degrees d-2, d-1, d; refine or raise."""
    P, eps = _plan(N), mpmath.mpf(10) ** -N
    for _ in range(MAX_REFINE + 1):
        (v0, A), (v1, _), (v2, _) = (level(P, P[3] - k, k == 2) for k in (2, 1, 0))
        S = max(abs(v2), min(1, A))
        e1, e2 = abs(v2 - v1), abs(v2 - v0)
        est = e1
        if 0 < e1 < S and 0 < e2 < S:
            D1, D2 = mpmath.log10(e1 / S), mpmath.log10(e2 / S)
            est = S * mpmath.mpf(10) ** max(D1 * D1 / D2, 2 * D1, -(N + GUARD))
        if est <= eps * S:
            return v2
        P = (P[0], P[1] / 2, P[2] / 2, P[3])
    raise PrecisionError(f"{what}: quadrature error estimate {mpmath.nstr(est, 3)} exceeds the required "
                          f"{mpmath.nstr(eps * S, 3)} (dps={N}) after {MAX_REFINE} panel halvings")


def _e1_mp(f, q, mean, kinks, N):
    s, mean, tol = mpmath.sqrt(q), mpmath.mpf(mean), mpmath.mpf(10) ** -(N + GUARD)

    def level(P, d, want_abs):
        zs, ws = _rule_mp(_zbreaks(mean, s, P, _act_points(mean, s, P, kinks), tol, _cover(mean, s, P)), d, s, {})
        vals = [f(mean + x) for x in zs]
        return mpmath.fdot(ws, vals), (mpmath.fdot(ws, map(abs, vals)) if want_abs else None)
    return controlled(level, N, "expect1")


def _e2_mp(f, g, q1, q2, q12, kinks, N):
    s1, tol = mpmath.sqrt(q1), mpmath.mpf(10) ** -(N + GUARD)
    cp, sc = _cond(q1, q2, q12)

    def level(P, d, want_abs):
        us, wo = _rule_mp(_zbreaks(0 * s1, s1, P, _outer_points(s1, cp, sc, P, kinks), tol, _cover(0 * s1, s1, P)),
                          d, s1, {})
        cache = {}  # inner panels shared by the rows (only those cut by kinks/grid points differ)
        tot, A = [], []
        for u in us:
            mu, fu = cp * u, f(u)
            if sc < 1e-300:
                G = GA = g(mu)
            else:
                xi, wi = _rule_mp(_zbreaks(mu, sc, P, _act_points(mu, sc, P, kinks), tol, _cover(mu, sc, P)),
                                  d, sc, cache)
                gv = [g(mu + x) for x in xi]
                G = mpmath.fdot(wi, gv)
                GA = mpmath.fdot(wi, map(abs, gv)) if want_abs else 0
            tot.append(fu * G)
            A.append(abs(fu * GA))
        return mpmath.fdot(wo, tot), (mpmath.fdot(wo, A) if want_abs else None)
    return controlled(level, N, "expect2")


# ---------------------------------------------------------------- mpmath, Mehler's series
MEHLER_RHO = 0.9         # expect2 at dps sums Mehler's series where |corr| <= this (else the 2-D rule)


def _terms(rho, N):
    """The n with |rho|^(n+1) <= 10^-(N + GUARD): Mehler's series summed to k = n."""
    return max(1, math.ceil((N + GUARD) * math.log(10) / -math.log(abs(float(rho)))) - 1)


def _hermite(f, s, kinks, P, d, n):
    """(a_0..a_n, E f(s Z)^2) on one 1-D rule (the plan P at degree d, Z ~ N(0, 1)):
    a_k = E[f(s Z) h_k(Z)] with h_k = He_k/sqrt(k!) orthonormal, by the recurrence
    h_(k+1) = (z h_k - sqrt(k) h_(k-1))/sqrt(k + 1) on all nodes at once, in fixed point (integers,
    the weights w f scaled by their largest)."""
    zero, tol = 0 * s, mpmath.mpf(10) ** -mpmath.mp.dps
    zs, ws = _rule_mp(_zbreaks(zero, s, P, _act_points(zero, s, P, kinks), tol, _cover(zero, s, P)), d, 1, {})
    fz = [f(s * z) for z in zs]
    fw = [w * v for w, v in zip(ws, fz)]
    big, bits = max(map(abs, fw)), mpmath.mp.prec + 20
    if not big:
        return [zero] * (n + 1), zero
    z = np.array([to_fixed(v._mpf_, bits) for v in zs], dtype=object)
    F = np.array([to_fixed((v / big)._mpf_, bits) for v in fw], dtype=object)
    root = [math.isqrt(k << 2 * bits) for k in range(n + 2)]          # sqrt(k) in fixed point
    h0, h1 = np.full(z.size, 1 << bits, dtype=object), z
    acc = [F.dot(h0), F.dot(h1)]
    for k in range(1, n):
        h0, h1 = h1, (z * h1 - root[k] * h0) // root[k + 1]
        acc.append(F.dot(h1))
    return [big * mpmath.ldexp(v, -2 * bits) for v in acc[:n + 1]], mpmath.fdot(fw, fz)


def _e2_mehler(f, g, q1, q2, q12, kinks, N):
    """E[f(u) g(v)] by Mehler's formula sum_k rho^k a_k b_k (rho = q12/sqrt(q1 q2); a_k, b_k of f at
    sqrt(q1) and g at sqrt(q2) by :func:`_hermite`: one 1-D rule each, one if f is g and q1 = q2) to k = n of
    :func:`_terms`. Cauchy-Schwarz bounds the rest by |rho|^(n+1) sqrt(E f^2 E g^2) <= 10^-(N + GUARD)
    sqrt(E f^2 E g^2); :func:`controlled` (three degrees) bounds the quadrature error relative to the value.
    None (the caller's 2-D rule) where the two cannot be certified below 10^-N |value|."""
    rho = q12 / mpmath.sqrt(q1 * q2)
    n, s1, s2, norms = _terms(rho, N), mpmath.sqrt(q1), mpmath.sqrt(q2), []

    def level(P, d, want_abs):
        a, va = _hermite(f, s1, kinks, P, d, n)
        b, vb = (a, va) if (g is f and q1 == q2) else _hermite(g, s2, kinks, P, d, n)
        norms[:] = [va * vb]
        return mpmath.fsum(rho ** k * x * y for k, (x, y) in enumerate(zip(a, b))), 0   # 0: relative to the value
    try:
        value = controlled(level, N, "expect2 (Mehler series)")
    except PrecisionError:
        return None
    tail = abs(rho) ** (n + 1) * mpmath.sqrt(abs(norms[0]))
    return value if tail <= mpmath.mpf(10) ** -(N + 2) * abs(value) else None


# ---------------------------------------------------------------- public API
def expect1(f, q, *, mean=0.0, kinks=(), dps=None, name=None):
    """E[f(x)], x ~ N(mean, q), q > 0.  dps=None: python float, f vectorised (float64 array ->
    array), QuadratureError (naming `name`, default f's name) if the error estimate exceeds
    1e-10 E|f|.  dps=N: mpf good to N digits, f maps mpf -> mpf; ArithmeticError if not reached."""
    if dps is None:
        q, mean = float(q), float(mean)
        s = math.sqrt(q)
        z, w, hw = _rule_f64(mean, s, _act_points(mean, s, F64, [float(k) for k in kinks]))
        fz = _ev(f, mean + s * z)
        err = float(_panel_error(hw, (np.exp(-0.5 * z * z) * fz).reshape(hw.size, _T.size)))
        return _accept(float(np.sum(w * fz)), err, float(np.sum(w * np.abs(fz))),
                       f"E[{_name(f, name)}(x)], x ~ N({mean:g}, {q:g})")
    with mpmath.workdps(dps + GUARD):
        return _e1_mp(f, mpmath.mpf(q), mean, [mpmath.mpf(k) for k in kinks], dps)


def expect2(f, g, q1, q2, q12, *, kinks=(), dps=None, name=None):
    """E[f(u) g(v)], (u, v) ~ N(0, [[q1, q12], [q12, q2]]), q1, q2 > 0, |q12| <= sqrt(q1 q2)
    (equality allowed).  `kinks` (argument units) are those of f and g.  Types and errors as in expect1
    (float64: error estimate <= 1e-10 E|f g|)."""
    if q12 == 0:
        a = expect1(f, q1, kinks=kinks, dps=dps, name=name and f"{name} (u factor)")
        b = expect1(g, q2, kinks=kinks, dps=dps, name=name and f"{name} (v factor)")
        if dps is None:
            return a * b
        with mpmath.workdps(dps + GUARD):
            return a * b
    if dps is not None:
        with mpmath.workdps(dps + GUARD):
            mq, mk = [mpmath.mpf(x) for x in (q1, q2, q12)], [mpmath.mpf(k) for k in kinks]
            v = _e2_mehler(f, g, *mq, mk, dps) if abs(mq[2]) <= MEHLER_RHO * mpmath.sqrt(mq[0] * mq[1]) else None
            return v if v is not None else _e2_mp(f, g, *mq, mk, dps)
    q1, q2, q12, kinks = float(q1), float(q2), float(q12), [float(k) for k in kinks]
    s1 = math.sqrt(q1)
    cp, sc = _cond(q1, q2, q12)
    z, w, hw = _rule_f64(0.0, s1, _outer_points(s1, cp, sc, F64, kinks))
    u = s1 * z
    if sc < 1e-300:
        G = _ev(g, cp * u)
        A, E = np.abs(G), 0.0
    else:
        G, A, E = _inner_f64(g, cp * u, sc, kinks)
    fu = _ev(f, u)
    err = float(_panel_error(hw, (np.exp(-0.5 * z * z) * fu * G).reshape(hw.size, _T.size)) + np.sum(w * np.abs(fu) * E))
    what = name or f"{_name(f, None)}(u) {_name(g, None)}(v)"
    return _accept(float(np.sum(w * fu * G)), err, float(np.sum(w * np.abs(fu) * A)),
                   f"E[{what}], (u, v) ~ N(0, [[{q1:g}, {q12:g}], [{q12:g}, {q2:g}]])")


def elementwise(fun, args, dps):
    b = np.broadcast_arrays(*[np.asarray(a, dtype=float if dps is None else object) for a in args])
    out = np.empty(b[0].shape, dtype=float if dps is None else object)
    for idx in np.ndindex(out.shape):
        out[idx] = fun(*[a[idx] for a in b])
    return out


def expect1_vec(f, q, mean=0.0, kinks=(), dps=None, name=None):
    """expect1 over broadcast arrays q, mean: float64 array (dps=None) or object array of mpf."""
    return elementwise(lambda a, m: expect1(f, a, mean=m, kinks=kinks, dps=dps, name=name), (q, mean), dps)


def expect2_vec(f, g, q1, q2, q12, kinks=(), dps=None, name=None):
    """expect2 over broadcast arrays q1, q2, q12 (output types as in expect1_vec). float64 without kinks: the
    rows :func:`smooth2` accepts, the rest by :func:`expect2`."""
    one = lambda a, b, c: expect2(f, g, a, b, c, kinks=kinks, dps=dps, name=name)  # noqa: E731
    if dps is not None or kinks:
        return elementwise(one, (q1, q2, q12), dps)
    a, b, c = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (q1, q2, q12)))
    out, ok = smooth2(f, g, a.ravel(), b.ravel(), c.ravel())
    for i in np.flatnonzero(~ok):
        out[i] = one(a.flat[i], b.flat[i], c.flat[i])
    return out.reshape(a.shape)


# ---------------------------------------------------------------- float64, smooth integrands
SMOOTH_STEPS = (0.25, 0.125, 0.0625)   # nested trapezoid steps in each whitened variable
SMOOTH_REACH = 10.0                    # |z| <= 10: the Gaussian weight beyond is below 2e-22
SMOOTH_RTOL = 1e-13                    # accept where two successive steps agree to this x E|f g|


def _trapezoid(h):
    z = np.arange(-SMOOTH_REACH, SMOOTH_REACH + h / 2, h)
    return z, h * np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)


def smooth2(f, g, q1, q2, q12):
    """E[f(u) g(v)] for flat float64 arrays (q1, q2, q12) by the trapezoidal rule in the whitened variables
    u = s1 z1, v = c' u + s_c z2 (s_c from :func:`_cond`, exact), z in [-10, 10]. For an integrand without kinks,
    analytic in a strip of half-width d about the real z axis, the error of step h is ~exp(-2 pi d/h): the steps
    SMOOTH_STEPS nest, and a row is accepted (``ok``) where two successive steps agree to SMOOTH_RTOL x E|f g|
    (then the finer one is far below that) with every value finite. Rows not accepted are left to the caller's
    panel rule (an integrand with a narrow feature, a pole near the axis, fast oscillation). Returns (values, ok)."""
    n = q1.size
    out, ok = np.full(n, np.nan), np.zeros(n, dtype=bool)
    todo = np.flatnonzero((q1 > 0) & (q2 > 0) & np.isfinite(q1 + q2 + q12) & (np.abs(q12) <= np.sqrt(q1 * q2)))
    if todo.size == 0:
        return out, ok
    cs = {i: _cond(float(q1[i]), float(q2[i]), float(q12[i])) for i in todo}
    prev = None
    with np.errstate(all="ignore"):
        for level, h in enumerate(SMOOTH_STEPS):
            z, w = _trapezoid(h)
            rows = max(1, _CHUNK // z.size ** 2)
            val, mag = np.empty(todo.size), np.empty(todo.size)
            for i in range(0, todo.size, rows):
                idx = todo[i:i + rows]
                s1 = np.sqrt(q1[idx])[:, None]
                cp = np.array([cs[j][0] for j in idx])[:, None, None]
                sc = np.array([cs[j][1] for j in idx])[:, None, None]
                u = s1 * z
                fu = _ev(f, u)
                gv = _ev(g, cp * u[:, :, None] + sc * z)
                val[i:i + rows] = (fu * (gv @ w)) @ w
                mag[i:i + rows] = (np.abs(fu) * (np.abs(gv) @ w)) @ w
            if prev is not None:
                good = np.isfinite(val) & np.isfinite(prev) & np.isfinite(mag) & (np.abs(val - prev) <= SMOOTH_RTOL * mag)
                out[todo[good]], ok[todo[good]] = val[good], True
                todo, val = todo[~good], val[~good]
                if todo.size == 0:
                    break
            prev = val
    return out, ok


expect1_many = expect1_vec


# ---------------------------------------------------------------- max-pool (order statistics)
# M_k = max of k i.i.d. N(0, 1): density k n(m) N(m)^(k-1).  (S, T) = (max_j u_j/sqrt(q1),
# max_j v_j/sqrt(q2)) has CDF F(s, t; c)^k and density h_k = k F^(k-1) rho_c + k(k-1) F^(k-2) F_s F_t.
_MAXL = 9.0              # z-range [-9, 9] of max_expect2 (n(9) ~ 1e-18)
_PM = (_MAXL, 1.0, 1.0)    # (L, gw, h) of max_expect2: unit panels in z and in x (tanh-safe)
_TM, _WM = np.polynomial.legendre.leggauss(10)   # 8 points left 9e-11 in dC near c = 1 (tanh, k = 8)
_WM = _WM / math.sqrt(2 * math.pi)


def bvn_cdf(s, t, c):
    """F(s, t; c) = P(Z1 <= s, Z2 <= t), corr c, float64 arrays, via Owen's T (abs. error ~1e-16):
    F = N(s)/2 + N(t)/2 - T(s, a_s) - T(t, a_t) - [st < 0]/2, a_s = (t - c s)/(s sqrt(1 - c^2)).
    c = 1: N(min(s, t)); c = -1: max(0, N(s) + N(t) - 1)."""
    from scipy.special import ndtr, owens_t
    s, t = np.broadcast_arrays(np.asarray(s, float), np.asarray(t, float))
    s, t = np.clip(s, -40.0, 40.0), np.clip(t, -40.0, 40.0)   # +-inf: N(+-40) is 1 or 0 in float64
    if c >= 1:
        return ndtr(np.minimum(s, t))
    if c <= -1:
        return np.maximum(0.0, ndtr(s) - ndtr(-t))
    r = math.sqrt((1 - c) * (1 + c))
    s = np.where(s == 0, 1e-300, s)
    t = np.where(t == 0, 1e-300, t)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        out = 0.5 * (ndtr(s) + ndtr(t)) - owens_t(s, (t - c * s) / (s * r)) - owens_t(t, (s - c * t) / (t * r))
    return np.clip(out - 0.5 * ((s < 0) != (t < 0)), 0.0, 1.0)


def bvn_cdf_mp(s, t, c):
    """F(s, t; c) at mpmath precision: integral_{-inf}^{s} n(x) N((t - c x)/sqrt(1 - c^2)) dx."""
    s, t, c = mpmath.mpf(s), mpmath.mpf(t), mpmath.mpf(c)
    if c >= 1:
        return mpmath.ncdf(min(s, t))
    if c <= -1:
        return max(mpmath.mpf(0), mpmath.ncdf(s) - mpmath.ncdf(-t))
    r = mpmath.sqrt((1 - c) * (1 + c))
    L = mpmath.sqrt(2 * (mpmath.mp.dps + 6) * mpmath.log(10)) + 1
    if s <= -L:
        return mpmath.mpf(0)
    pts = sorted({-L, s, *[x for x in (t / c if c else None, mpmath.mpf(0)) if x is not None and -L < x < s]})
    return mpmath.quad(lambda x: mpmath.npdf(x) * mpmath.ncdf((t - c * x) / r), pts)


def max_expect1(f, q, k, *, kinks=(), dps=None):
    """E[f(sqrt(q) M_k)] = E[f(x) k N(x/sqrt(q))^(k-1)], x ~ N(0, q): expect1 with that weight
    (same rule and error targets; N is smooth, so no new breakpoints)."""
    if dps is None:
        from scipy.special import ndtr
        s = math.sqrt(float(q))
        return expect1(lambda x: _ev(f, x) * k * ndtr(x / s) ** (k - 1), q, kinks=kinks)
    with mpmath.workdps(dps + GUARD):
        s = mpmath.sqrt(mpmath.mpf(q))
        return expect1(lambda x: f(x) * k * mpmath.ncdf(x / s) ** (k - 1), q, kinks=kinks, dps=dps)


def max_expect2(f, g, q1, q2, q12, k, *, kinks=(), argmax_only=False, dps=None):
    """E[f(sqrt(q1) S) g(sqrt(q2) T)] under the density h_k (argmax_only: the first term,
    k E[f(u_1) g(v_1) F(s_1, t_1)^(k-1)] = dC for f = g = phi').  dps=None: float64, below;
    dps=N: mpf good to N digits (f, g map mpf -> mpf) or ArithmeticError, see _max2_mp.

    Coordinates (s, z): s = u/sqrt(q1) outer (expect2's outer rule), t = c s + r z, r = sqrt(1-c^2),
    so v = c' u + s_c z as in expect2.  Weight per (s, z), with the outer n(s) in the outer rule:
        k F^(k-1) n(z)  +  k(k-1) F^(k-2) r n(t) N(z) N(r s - c z)       (F = F(s, t; c)),
    every factor smooth on the unit scale in z (the F_s F_t ridge of width r in t is unit width
    in z).  Outer rule: expect2's breakpoints (Gaussian grid, kinks, smoothed kinks of E[g | u])
    with unit panels on [-9, 9]; inner panels per row: unit grid on [-9, 9], up to 40 more panels
    above 9 where the second term lives, g's kinks, g's activation grid (spacing 1) when s_c > 1;
    10-point Gauss-Legendre per panel; F by Owen's T (bvn_cdf).  Measured (tanh, k = 2 and 8, c in
    {0.5, 0.99, +-0.999999}): <= 4e-14 absolute vs 12 and 16 points, where 8 points were off by up to
    9e-11 in the argmax term near c = 1 (its F^(k-1) steepens there); 1e-12 vs the exact linear max2
    map (tests/numeric/test_pool_monotone.py).  c = 0: product of
    1-D maps; c = 1: the 1-D law; c = -1: the (min, max) law."""
    if dps is not None:
        return _max_expect2_mp(f, g, q1, q2, q12, k, kinks, argmax_only, dps)
    q1, q2, q12 = float(q1), float(q2), float(q12)
    kinks = [float(x) for x in kinks]
    s1, s2 = math.sqrt(q1), math.sqrt(q2)
    r2 = float((Fraction(q1) * Fraction(q2) - Fraction(q12) ** 2) / (Fraction(q1) * Fraction(q2)))
    r = math.sqrt(max(r2, 0.0))
    c = q12 / (s1 * s2)
    if r < 1e-150 and c > 0:
        # c = 1: S = T = M_k; the argmax term k E[f g F(s, s; 1)^(k-1)] = k E[f g N^(k-1)] is the same
        return max_expect1(lambda x: _ev(f, x) * _ev(g, x * s2 / s1), q1, k, kinks=kinks + [x * s1 / s2 for x in kinks])
    if r < 1e-150:
        return _minmax_f64(f, g, s1, s2, k, kinks, argmax_only)
    if c == 0:  # independent maxima; the argmax part factorises as (1/k) E f(M) E g(M)
        a, b = max_expect1(f, q1, k, kinks=kinks), max_expect1(g, q2, k, kinks=kinks)
        return a * b / k if argmax_only else a * b
    cp, sc = q12 / q1, s2 * r
    zo = np.asarray(_zbreaks(0.0, s1, _PM, _outer_points(s1, cp, sc, _PM, kinks), 1e-12))
    hwo = 0.5 * np.diff(zo)[:, None]
    z = (zo[:-1, None] + hwo * (1 + _TM)).ravel()
    w = (hwo * _WM).ravel() * np.exp(-0.5 * z * z)
    u = s1 * z
    zb = _max2_inner_breaks(z, u, c, r, cp, sc, s2, kinks, argmax_only)
    return float(np.sum(w * _ev(f, u) * _max2_rows_f64(g, z, u, zb, c, r, cp, sc, k, argmax_only)))


def _max2_inner_breaks(z, u, c, r, cp, sc, s2, kinks, argmax_only):
    """Per outer node z (u = s1 z), the sorted inner z-breakpoints of max_expect2: unit grid on [-L, L],
    up to 40 panels above L (second term), g's kinks and activation grid (spacing h) when s_c > h."""
    L, h = _MAXL, _PM[2]
    lo, hi = np.full(z.shape, -L), np.full(z.shape, L)
    if not argmax_only:  # upper end of the second term's support: n(t), N(r s - c z) not negligible
        hi = np.maximum(hi, np.minimum((L - c * z) / r, (r * z + L) / c if c > 0 else np.inf))
    cols = [np.broadcast_to(np.arange(-L, L + 1), (z.size, int(2 * L) + 1))]
    for side, edge in ((hi, L),):  # beyond L (second term only; N(z) keeps z > -L): <= 40 panels
        J = int(min(40, np.ceil(np.abs(side - edge).max())))
        if J:
            cols.append(edge + (side - edge)[:, None] * (np.arange(1, J + 1) / J)[None, :])
    cols += [((x - cp * u) / sc)[:, None] for x in kinks]
    vlo, vhi = np.maximum(cp * u + sc * lo, -R), np.minimum(cp * u + sc * hi, R)
    if sc > h or (s2 > h and (hi - lo).max() * sc > 2 * L * s2):
        k0 = np.ceil(vlo / h)
        K = int(max(0.0, (np.floor(vhi / h) - k0).max() + 1))
        cols.append(((k0[:, None] + np.arange(K)[None, :]) * h - cp * u[:, None]) / sc)
    return np.sort(np.clip(np.concatenate(cols, axis=1), lo[:, None], hi[:, None]), axis=1)


# paired with _max2_mp: float64 calls a vectorised BVN CDF per node, mpmath runs F along rows in fixed point (docs/numerics.md section 7)
def _max2_rows_f64(g, z, u, zb, c, r, cp, sc, k, argmax_only):
    """G(s) = int [k F^(k-1) n(z) + k(k-1) F^(k-2) r n(t) N(z) N(r s - c z)] g(c' u + s_c z) dz per outer
    node s = z (F = F(s, t; c), t = c s + r z), 8-point Gauss-Legendre on the panels zb (rows in chunks)."""
    from scipy.special import ndtr
    T, W = _TM, _WM
    G = np.empty(z.size)
    rows = max(1, _CHUNK // (zb.shape[1] * T.size))
    for i in range(0, z.size, rows):
        sl = slice(i, i + rows)
        hw = 0.5 * np.diff(zb[sl], axis=1)[..., None]
        zz = zb[sl, :-1, None] + hw * (1 + T)
        ss = z[sl, None, None]
        tt = c * ss + r * zz
        F = bvn_cdf(ss, tt, c)
        wt = k * F ** (k - 1) * np.exp(-0.5 * zz * zz)
        if not argmax_only:
            wt = wt + k * (k - 1) * F ** (k - 2) * r * np.exp(-0.5 * tt * tt) * ndtr(zz) * ndtr(r * ss - c * zz)
        G[sl] = np.einsum("ijk,ijk->i", hw * W * wt, _ev(g, cp * u[sl, None, None] + sc * zz))
    return G


def _minmax_f64(f, g, s1, s2, k, kinks, argmax_only):
    """c = -1: v_j = -(s2/s1) u_j, so (max u, max v) = s1 (B, -A) with (A, B) = (min, max) of k
    normals, density k(k-1) n(a) n(b) (N(b) - N(a))^(k-2) on a < b (argmax_only: 0 for k >= 2)."""
    if argmax_only:
        return 0.0
    zb_, wb, _ = _rule_f64(0.0, 1.0, [x / s1 for x in kinks] + [-x / s2 for x in kinks])
    T, W = np.polynomial.legendre.leggauss(12)
    out = 0.0
    from scipy.special import ndtr
    for b, wbi in zip(zb_, wb):
        pts = sorted({-_MAXL, b, *[-x / s2 for x in kinks if -_MAXL < -x / s2 < b], *[j for j in range(-9, 10) if -_MAXL < j < b]})
        a0, a1 = np.asarray(pts[:-1]), np.asarray(pts[1:])
        hw = 0.5 * (a1 - a0)[:, None]
        a = (a0[:, None] + hw * (1 + T)).ravel()
        wa = (hw * W).ravel() * np.exp(-0.5 * a * a) / math.sqrt(2 * math.pi)
        out += wbi * _ev(f, np.array([s1 * b]))[0] * np.sum(wa * _ev(g, -s2 * a) * k * (k - 1) * (ndtr(b) - ndtr(a)) ** (k - 2))
    return float(out)


# ---------------------------------------------------------------- max-pool covariance at mpmath precision
@lru_cache(maxsize=16)
def _gl_running(d, bits):
    """Degree-d Gauss-Legendre rule on [-1, 1] for running integrals: nodes t_j, weights w_i (mpf) and,
    as bits-bit fixed-point integers, the weights and A[j][i] = int_{-1}^{t_j} l_i, B[j][i] = int_{t_j}^{1} l_i
    (l_i the Lagrange basis of the nodes).  l_i = w_i sum_{m<n} (m + 1/2) P_m(t_i) P_m (exact discrete
    orthogonality) and int_{-1}^x P_m = (P_{m+1} - P_{m-1})(x)/(2m + 1), so
    A[j][i] = w_i [(1 + t_j)/2 + sum_{m=1}^{n-1} P_m(t_i) (P_{m+1} - P_{m-1})(t_j)/2]."""
    with mpmath.workprec(bits + 20):
        tw = mpmath.calculus.quadrature.GaussLegendre(mpmath.mp).calc_nodes(d, mpmath.mp.prec)
        t, w = [x for x, _ in tw], [y for _, y in tw]
        n = len(t)
        P = []
        for x in t:
            row = [mpmath.mpf(1), x]
            for m in range(1, n):
                row.append(((2 * m + 1) * x * row[m] - m * row[m - 1]) / (m + 1))
            P.append(row)
        A = [[w[i] * ((1 + t[j]) / 2 + mpmath.fsum(P[i][m] * (P[j][m + 1] - P[j][m - 1]) for m in range(1, n)) / 2)
              for i in range(n)] for j in range(n)]
        fx = lambda v: to_fixed(mpmath.mpf(v)._mpf_, bits)
        return (tuple(t), tuple(w), tuple(fx(v) for v in w), tuple(tuple(fx(v) for v in row) for row in A),
                tuple(tuple(fx(w[i] - A[j][i]) for i in range(n)) for j in range(n)))


def _breaks(lo, hi, gw, pts, tol):
    """Sorted breakpoints on [lo, hi]: multiples of gw (if given) inside, the points pts inside, the ends
    (merged within tol)."""
    zs = sorted({lo, hi} | set(_multiples(gw, lo, hi) if gw else ()) | {z for z in pts if lo < z < hi})
    out = [zs[0]]
    for z in zs[1:]:
        if z - out[-1] > tol:
            out.append(z)
    out[-1] = zs[-1]
    return out


def _grid_points(mu, sc, lo, hi, h, gw, kinks):
    """z-points of g(mu + sc z) on [lo, hi]: its kinks and, where finer than the panels, the x grid k*h (|x| <= R)."""
    pts = [(x - mu) / sc for x in kinks]
    if gw * abs(sc) > h:
        xa, xb = sorted((mu + lo * sc, mu + hi * sc))
        pts += [(x - mu) / sc for x in _multiples(h, max(xa, -R), min(xb, R))]
    return pts


class _Fixed:
    """Fixed-point numbers with ``bits`` fractional bits (the running integrals of _max2_mp)."""

    def __init__(self, bits):
        self.bits, self.one = bits, 1 << bits
        self.ln2 = ln2_fixed(bits)
        self.cut = -bits * self.ln2 - (8 << bits)   # exp below this is < 2^-bits

    def fx(self, v):
        return to_fixed(mpmath.mpf(v)._mpf_, self.bits)

    def npdf(self, x, scale):
        """scale * exp(-x^2/2), all fixed point."""
        e = -((x * x) >> (self.bits + 1))
        return (scale * exp_fixed(e, self.bits, self.ln2)) >> self.bits if e > self.cut else 0

    def integral(self, hw, row, dens):
        """hw * sum_i row_i dens_i: a (running) integral of dens over a panel of half-width hw."""
        return (hw * (sum(map(_mul, row, dens)) >> self.bits)) >> self.bits


class _Max2Rows:
    """The inner integrals of _max2_mp: geometry of (q1, q2, q12), per-level panels and, along each
    row s, the running integrals N(w) and F in z (fixed point) giving the weights of g(t)."""

    def __init__(self, q1, q2, q12, k, kinks, N, argmax_only):
        self.X = X = _Fixed(mpmath.mp.prec + 40)
        self.s1, self.s2 = mpmath.sqrt(q1), mpmath.sqrt(q2)
        with mpmath.workprec(2 * mpmath.mp.prec + 20):
            self.r = mpmath.sqrt((q1 * q2 - q12 * q12) / (q1 * q2))
        self.c, self.cp, self.sc = q12 / (self.s1 * self.s2), q12 / q1, self.s2 * self.r
        self.k, self.kinks, self.argmax_only = k, kinks, argmax_only
        self.tol = mpmath.mpf(10) ** -(N + GUARD)
        self.c0 = X.fx(1 / mpmath.sqrt(2 * mpmath.pi))
        self.rI, self.cI = X.fx(self.r), X.fx(self.c)
        self.rc0, self.ac0 = (self.c0 * self.rI) >> X.bits, (self.c0 * abs(self.cI)) >> X.bits
        self.down = self.c > 0                  # accumulate from the top (c > 0) or from the bottom
        self.sgn = -1 if self.down else 1

    def start(self, L, gw, h, d):
        """A new refinement level: panel plan (L, gw, h), Gauss-Legendre degree d."""
        self.L, self.gw, self.h = L, gw, h
        t, _, self.wI, self.A, B = _gl_running(d, self.X.bits)
        self.M = B if self.down else self.A
        self.tI = [self.X.fx(x) for x in t]
        self.gi = min(gw, h / self.sc)
        self.cache = {}

    def panel(self, a, b):
        """Nodes, hw, hw * weights, n(z), N(z) (a running integral from N(a)) of the z-panel [a, b]."""
        key = (a, b)
        if key not in self.cache:
            X, bits = self.X, self.X.bits
            aI, bI = X.fx(a), X.fx(b)
            hw, mid = (bI - aI) >> 1, (aI + bI) >> 1
            zs = [mid + ((hw * x) >> bits) for x in self.tI]
            nz = [X.npdf(z, self.c0) for z in zs]
            Na = X.fx(mpmath.ncdf(a))
            Nz = [Na + X.integral(hw, row, nz) for row in self.A]
            self.cache[key] = zs, hw, [(hw * x) >> bits for x in self.wI], nz, Nz
        return self.cache[key]

    def breaks(self, u):
        """Inner z-breakpoints of the row at outer node u, and its upper end hi."""
        L, gw, h, r, c = self.L, self.gw, self.h, self.r, self.c
        s, mu = u / self.s1, self.cp * u
        if self.down:
            hi = zw = max(L, min((L - c * s) / r, (r * s + L) / c))
        else:
            hi = L if self.argmax_only else max(L, (L - c * s) / r)
            zw = min(hi, max(L, (L - r * s) / -c))
        gk = [(x - mu) / self.sc for x in self.kinks]
        zb = _breaks(-L, zw, self.gi, gk, self.tol)
        if hi > zw:
            n = int(mpmath.ceil((hi - zw) / max(self.gi, min(gw / r, h / self.sc))))
            zb = zb[:-1] + _breaks(zw, hi, None, gk + [zw + (hi - zw) * j / n for j in range(1, n)], self.tol)
        return zb, hi

    def row(self, u):
        """(weights W_j, fixed-point t_j) of the row at outer node u: sum_j W_j g(s2 t_j) is its inner integral."""
        X, bits, k = self.X, self.X.bits, self.k
        s = u / self.s1
        csI, rsI = X.fx(self.c * s), X.fx(self.r * s)
        zb, hi = self.breaks(u)
        pans = list(zip(zb[:-1], zb[1:]))
        end = hi if self.down else -self.L
        Nw, F = X.fx(mpmath.ncdf(self.r * s - self.c * end)), (X.fx(mpmath.ncdf(s)) if self.down else 0)
        Ws, ts = [], []
        for a, b in (reversed(pans) if self.down else pans):
            zs, hw, wz, nz, Nz = self.panel(a, b)
            dens = [X.npdf(rsI - ((self.cI * z) >> bits), self.ac0) for z in zs]
            Nwj, Nw = [Nw + X.integral(hw, row, dens) for row in self.M], Nw + X.integral(hw, self.wI, dens)
            tt = [csI + ((self.rI * z) >> bits) for z in zs]
            p = [X.npdf(x, (self.rc0 * y) >> bits) for x, y in zip(tt, Nwj)]
            Fj = [F + self.sgn * X.integral(hw, row, p) for row in self.M]
            F = F + self.sgn * X.integral(hw, self.wI, p)
            for j in range(len(zs)):
                Fc = min(max(Fj[j], 0), X.one)
                Fk2 = Fc ** (k - 2) >> (bits * (k - 3)) if k >= 3 else X.one
                W = k * ((((Fk2 * Fc) >> bits) * nz[j]) >> bits)
                if not self.argmax_only:
                    W += k * (k - 1) * ((((Fk2 * p[j]) >> bits) * Nz[j]) >> bits)
                W = (W * wz[j]) >> bits
                if W:
                    Ws.append(mpmath.mpf((W, -bits)))
                    ts.append(tt[j])
        return Ws, ts


def _max2_mp(f, g, q1, q2, q12, k, kinks, N, argmax_only):
    """E[f(sqrt(q1) S) g(sqrt(q2) T)] under h_k (argmax_only: its first term), 0 < |c| < 1, N digits.

    Coordinates of max_expect2: s = u/sqrt(q1) outer, t = c s + r z inner, and w = r s - c z.  The
    weight per (s, z), n(s) in the outer rule, is
        k F^(k-1) n(z) + k(k-1) F^(k-2) N(z) p,   p = r n(t) N(w),   F = F(s, t; c)
    (F_s F_t dt = n(s) N(z) p dz).  Along a row (s fixed) the non-elementary factors are running
    integrals of Gaussians in z:  dN(w)/dz = -c n(w),  dF/dz = p  (and dN(z)/dz = n(z), row-independent,
    memoised per panel), accumulated panel by panel with the interpolatory running rule on the panel's
    own Gauss-Legendre nodes (_gl_running), started where they are known: c > 0 at the top z = hi
    (N(w(hi)) by erfc, F = N(s): p < n(L) above hi), c < 0 at z = -L (F = 0: p < n(L) below).  A node
    costs two exponentials and two dot products with a row of the running matrix, no quadrature of F.
    The weights are fixed-point integers with mp.prec + 40 bits (every factor is O(1)); f, g stay mpf.
    Panels: outer uniform of width min(gw, h/s1, max(h, gw s_c)/(|c| s2)) on [-L, L] plus the kinks of
    f and the smoothed kinks of g (expect2's); inner uniform of width min(gw, h/s_c) (s_c = s2 r, the
    scale of g in z) on [-L, hi] plus g's kinks, hi = max(L, min((L - c s)/r, (r s + L)/c)) <= sqrt(2) L
    for c > 0; for c < 0 hi = (L - c s)/r (the F_s F_t term only), with panels of width min(gw/r, h/s_c)
    beyond max(L, (L - r s)/|c|), where N(z) = N(w) = 1 and only n(t) (scale 1/r in z) and g vary.
    Error control: controlled (degrees d-2, d-1, d of _plan(N); halvings; ArithmeticError), whose scale
    S = max(|value|, min(1, E|f g|)) is <= sqrt(V(q1) V(q2)) for C and <= sqrt(dpsi2(q1) dpsi2(q2)) for dC
    (Cauchy-Schwarz, F <= sqrt(N(s) N(t))), so an accepted value is within 10^-N of the natural scale.
    The rows are :class:`_Max2Rows`.
    (Rejected: F by nested mpmath.quad, minutes; Sheppard's theta-integral for F, ~N exponentials per node.)"""
    R = _Max2Rows(q1, q2, q12, k, kinks, N, argmax_only)

    def level(P, d, want_abs):
        L, gw, h = P[:3]
        R.start(L, gw, h, d)
        go = min(gw, h / R.s1, max(h, gw * R.sc) / abs(R.c * R.s2))
        pts = _outer_points(R.s1, R.cp, R.sc, (L, gw, mpmath.inf), kinks)   # f's kinks, g's smoothed kinks
        us, wo = _rule_mp(_zbreaks(0 * R.s1, R.s1, (L, go), pts, R.tol), d, R.s1, {})
        tot, tabs = [], []
        for u, wu in zip(us, wo):
            fu = f(u)
            if fu == 0:
                continue
            Ws, ts = R.row(u)
            gs = [g(R.s2 * mpmath.mpf((x, -R.X.bits))) for x in ts]
            tot.append(wu * fu * mpmath.fdot(Ws, gs))
            if want_abs:
                tabs.append(abs(wu * fu) * mpmath.fdot(Ws, map(abs, gs)))
        return mpmath.fsum(tot), (mpmath.fsum(tabs) if want_abs else None)
    return controlled(level, N, "max_expect2")


def _max_expect2_mp(f, g, q1, q2, q12, k, kinks, argmax_only, N):
    """max_expect2 at N digits: the special cases of the float64 code, else _max2_mp."""
    with mpmath.workdps(N + GUARD):
        q1, q2, q12 = (mpmath.mpf(v) for v in (q1, q2, q12))
        kinks = [mpmath.mpf(v) for v in kinks]
        s1, s2 = mpmath.sqrt(q1), mpmath.sqrt(q2)
        with mpmath.workprec(2 * mpmath.mp.prec + 20):
            det = q1 * q2 - q12 * q12
        if det <= 0 and q12 > 0:   # c = 1: S = T = M_k, and the argmax term is the same
            return max_expect1(lambda x: f(x) * g(x * s2 / s1), q1, k, kinks=kinks + [v * s1 / s2 for v in kinks], dps=N)
        if det <= 0:
            return mpmath.mpf(0) if argmax_only else _minmax_mp(f, g, q1, q2, k, kinks, N)
        if q12 == 0:               # independent maxima; the argmax part is (1/k) E f(M) E g(M)
            a, b = max_expect1(f, q1, k, kinks=kinks, dps=N), max_expect1(g, q2, k, kinks=kinks, dps=N)
            return a * b / k if argmax_only else a * b
        return _max2_mp(f, g, q1, q2, q12, k, kinks, N, argmax_only)


def _minmax_mp(f, g, q1, q2, k, kinks, N):
    """c = -1 at N digits: E[f(s1 B) g(-s2 A)], (A, B) = (min, max) of k normals, density
    k(k-1) n(a) n(b) (N(b) - N(a))^(k-2) on a < b; outer b on [-L, L], inner a on [-L, b], uniform
    panels of width min(gw, h/s1, h/s2) and min(gw, h/s2) plus the kinks (same degrees and control)."""
    s1, s2 = mpmath.sqrt(q1), mpmath.sqrt(q2)
    tol = mpmath.mpf(10) ** -(N + GUARD)
    ak = [-x / s2 for x in kinks]                       # kinks of g(-s2 a) in a

    def level(P, d, want_abs):
        L, gw, h = P[:3]
        bs, wb = _rule_mp(_breaks(-L, L, min(gw, h / s1, h / s2), [x / s1 for x in kinks] + ak, tol), d, 1, {})
        cache, tot, tabs = {}, [], []
        for b, w in zip(bs, wb):
            fb = f(s1 * b)
            if fb == 0:
                continue
            av, wa = _rule_mp(_breaks(-L, b, min(gw, h / s2), ak, tol), d, 1, cache)
            if k == 2:
                ws = [2 * v for v in wa]
            else:
                Nb = mpmath.ncdf(b)
                ws = [v * (k * (k - 1)) * (Nb - mpmath.ncdf(a)) ** (k - 2) for a, v in zip(av, wa)]
            gs = [g(-s2 * a) for a in av]
            tot.append(w * fb * mpmath.fdot(ws, gs))
            if want_abs:
                tabs.append(abs(w * fb) * mpmath.fdot(ws, map(abs, gs)))
        return mpmath.fsum(tot), (mpmath.fsum(tabs) if want_abs else None)
    return controlled(level, N, "max_expect2 (c = -1)")
