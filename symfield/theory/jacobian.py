"""The spectrum of the input-output Jacobian at infinite width (docs/theory.md section 11).

    J = dz^(L)/dx = W_L D_{L-1} W_{L-1} ... D_1 W_1,     D_l = diag(phi'(z^(l))),
    z^(l) ~ N(0, q^(l)),  q^(1) = sigma_w2 q0 + sigma_b2,  q^(l+1) = sigma_w2 V(q^(l)) + sigma_b2.

The squared singular values of J (eigenvalues of J J^T) have, as the width n -> oo, the law
of the free product of the layers: with psi(z) = sum_k m_k z^k, chi = psi^(-1) and the
S-transform S(w) = chi(w) (1 + w)/w,

    S_{JJ^T}(w) = prod_{l=1}^{L} S_W(w) prod_{l=1}^{L-1} S_{D_l^2}(w),
    S_W(w) = 1/(sigma_w2 (1 + w))  (Gaussian),   1/sigma_w2  (orthogonal),

and S_{D_l^2} follows from the moments d_k(q) = E[phi'(z)^(2k)], z ~ N(0, q).

Moments: power series (reversion and products, exact in the number type given). Density:
for each x the equations psi_l(zeta_l) = w (l = 1..L-1, psi_l of the law of phi'^2 at q^(l),
discretised by Gaussian quadrature) and w/(1+w) S_W(w)^L prod_l zeta_l (1+w)/w = 1/x' are
solved by Newton in (w, zeta_l), continued from x' = x + iY, Y large, down to Y ~ 1e-10 x;
then G(x') = (1 + w)/x' and rho(x) = -Im G/pi.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal

import mpmath
import numpy as np
import sympy as sp
from numpy.typing import ArrayLike

from symfield.core import validate as check
from symfield.numeric.evaluate import GUARD_DIGITS, NUMPY_MODULES, evaluate, to_mpf
from symfield.symbolic import gaussian as G
from symfield.symbolic.activation import Activation, activation
from symfield.symbolic.formula import X as x
from symfield.symbolic.kernel import kernel
from symfield.theory.maps import q_map

_F = "jacobian_spectrum"
WEIGHTS = ("gaussian", "orthogonal")
N_MOMENTS = 6
NODES = 160                 # quadrature nodes of the law of phi'(z)^2 per layer (density only)
CONDITION_QUANTILE = 0.05   # .condition = sqrt(x_{1-p}/x_p): ratio of singular-value quantiles
DENSITY_RTOL = 5e-3         # density checks: mass = 1 and mean = m_1 to this relative tolerance
STATUS = {0: "ok", 1: "the density solver did not converge at some x (pdf NaN there)",
          2: "the density fails its checks (mass 1, mean m_1) beyond DENSITY_RTOL",
          3: "an atom at 0 of mass >= CONDITION_QUANTILE: the condition number is infinite",
          4: "a moment or variance is not finite"}


# ---------------------------------------------------------------- power series (any number type)
def series_mul(a, b, n):
    """Coefficients 0..n-1 of the product of the series a and b."""
    return [sum(a[i] * b[k - i] for i in range(k + 1) if i < len(a) and k - i < len(b)) for k in range(n)]


def series_reversion(c, n):
    """Coefficients 0..n-1 of f^(-1) for f(w) = c1 w + c2 w^2 + ... (c[0] = 0, c[1] != 0): the
    coefficient a_k of f^(-1) solves [w^k] sum_j a_j f(w)^j = 0 (k >= 2), a_1 = 1/c_1."""
    powers, p = [None], list(c[:n]) + [0 * c[1]] * (n - len(c))
    for _ in range(1, n):
        powers.append(p)
        p = series_mul(p, c, n)
    a = [0 * c[1]] * n
    a[1] = 1 / c[1]
    for k in range(2, n):
        a[k] = -sum(a[j] * powers[j][k] for j in range(1, k)) / powers[k][k]
    return a


def s_transform(moments):
    """S(w) = chi(w) (1 + w)/w as coefficients 0..len(moments)-1, from m_1, m_2, ... (m_1 != 0)."""
    n = len(moments) + 1
    chi = series_reversion([0 * moments[0]] + list(moments), n)      # chi = psi^(-1)
    over_w = chi[1:]                                                  # chi(w)/w
    return series_mul(over_w, [1 + 0 * moments[0], 1 + 0 * moments[0]], n - 1)


def moments_from_s(s):
    """m_1..m_n of the law whose S-transform has the coefficients s (n = len(s)):
    chi(w) = w S(w)/(1 + w), psi = chi^(-1)."""
    n = len(s) + 1
    one = 1 + 0 * s[0]
    geo = [(-one) ** k for k in range(n)]                             # 1/(1 + w)
    chi = [0 * s[0]] + series_mul(s, geo, n - 1)
    return series_reversion(chi, n)[1:]


def weight_s(weights, sigma_w2, n):
    """Coefficients of S_W: (1/sigma_w2) (1 + w)^(-1) (Gaussian) or 1/sigma_w2 (orthogonal)."""
    one = 1 + 0 * sigma_w2
    if weights == "orthogonal":
        return [one / sigma_w2] + [0 * one] * (n - 1)
    return [(-one) ** k / sigma_w2 for k in range(n)]


# ---------------------------------------------------------------- the layers
def _act(act):
    a = act if isinstance(act, Activation) else activation(act)
    if a.pool is not None:
        check.fail(_F, "act", "a single-node activation (pools are not supported by the Jacobian spectrum: "
                   "their layer Jacobian is not diagonal)", a.name)
    return a


@lru_cache(maxsize=64)
def dphi2_expectations(act: Activation, n: int):
    """SymPy expressions E[phi'(u)^(2k)] in q, k = 1..n (closed forms where the expectation machinery
    finds one, else the defining Gaussian integral)."""
    d1 = sp.diff(act.expr, x)
    if d1.has(sp.DiracDelta):
        raise ValueError(f"The 'act' parameter of {_F} must be an activation without jumps (phi' has a point "
                         f"mass, E[phi'^2] = oo). Got {act.name!r} instead.")
    return tuple(G.expect1(d1 ** k, d1 ** k).value for k in range(1, n + 1))


def dphi2_moments(act, q, n=N_MOMENTS, dps=None):
    """d_k(q) = E[phi'(u)^(2k)], u ~ N(0, q), k = 1..n: floats (arrays for array q) or mpf (dps)."""
    a = _act(act)
    kinks = kernel(a).kinks
    return [evaluate(e, (G.q,), (q,), kinks, dps) for e in dphi2_expectations(a, n)]


def layer_variances(act, sigma_w2, sigma_b2, depth, q0=1.0, dps=None):
    """q^(1..depth-1): the variances at the layers' nonlinearities (q^(1) = sigma_w2 q0 + sigma_b2)."""
    q = q_map("linear", q0, sigma_w2, sigma_b2, dps=dps)
    out = []
    for _ in range(depth - 1):
        out.append(q)
        q = q_map(act, q, sigma_w2, sigma_b2, dps=dps)
    return out


def jacobian_moments(act, sigma_w2, sigma_b2, depth, q0=1.0, weights="gaussian", n=N_MOMENTS, dps=None, qs=None):
    """m_1..m_n of the squared singular values of J (float64, numpy arrays over broadcast sigma grids,
    or mpf with dps): the product of the layers' S-transforms, reverted to moments."""
    if qs is None:
        qs = layer_variances(act, sigma_w2, sigma_b2, depth, q0, dps)
    sw = sigma_w2
    s = weight_s(weights, sw, n)
    s_tot = [t for t in s]
    for _ in range(depth - 1):
        s_tot = series_mul(s_tot, s, n)
    for ql in qs:
        s_tot = series_mul(s_tot, s_transform(dphi2_moments(act, ql, n, dps)), n)
    return moments_from_s(s_tot)


# ---------------------------------------------------------------- discretised laws of phi'^2
@lru_cache(maxsize=32)
def _dphi2_numpy(act: Activation):
    return sp.lambdify(x, sp.diff(act.expr, x) ** 2, modules=NUMPY_MODULES)


def dphi2_law(act, q, nodes=NODES):
    """(a_i, p_i): phi'(sqrt(q) z_i)^2 and weights of a rule for z ~ N(0, 1): Gauss-Legendre in t = Phi(z)
    on each piece between the kinks (piece masses exact; nodes spread evenly in probability)."""
    from scipy.special import ndtr, ndtri
    a = _act(act)
    f = _dphi2_numpy(a)
    s = math.sqrt(float(q))
    edges = ndtr(np.array([-np.inf] + sorted(float(k) / s for k in kernel(a).kinks) + [np.inf]))
    t, v = np.polynomial.legendre.leggauss(max(8, nodes // (len(edges) - 1)))
    z = np.concatenate([ndtri(lo + (hi - lo) * (t + 1) / 2) for lo, hi in zip(edges[:-1], edges[1:])])
    w = np.concatenate([(hi - lo) * v / 2 for lo, hi in zip(edges[:-1], edges[1:])])
    with np.errstate(all="ignore"):
        vals = np.broadcast_to(np.asarray(f(s * z), dtype=float), z.shape)
    keep = np.isfinite(z) & (w > 0)
    return vals[keep].copy(), w[keep]


def _group(qs, rtol=1e-9):
    """Distinct layer variances (within rtol) with their multiplicities."""
    groups = []
    for v in (float(t) for t in qs):
        for g in groups:
            if abs(g[0] - v) <= rtol * abs(v):
                g[1] += 1
                break
        else:
            groups.append([v, 1])
    return [g[0] for g in groups], np.array([g[1] for g in groups], dtype=float)


# ---------------------------------------------------------------- the density
@dataclass
class _Model:
    """The discretised free product: node values a (G, N), weights p (G, N), multiplicities n (G,)."""
    a: np.ndarray
    p: np.ndarray
    n: np.ndarray
    depth: int
    sigma_w2: float
    gaussian: bool

    @classmethod
    def build(cls, act, qs, sigma_w2, depth, weights, nodes=NODES):
        vals, mult = _group(qs)
        laws = [dphi2_law(act, v, nodes) for v in vals]
        width = max([len(a) for a, _ in laws] + [1])
        a = np.zeros((len(laws), width))
        p = np.zeros((len(laws), width))
        for g, (ag, pg) in enumerate(laws):
            a[g, : len(ag)], p[g, : len(pg)] = ag, pg
        return cls(a, p, mult, depth, float(sigma_w2), weights == "gaussian")

    @property
    def zero_mass(self):
        """Mass of the atom at 0 of J J^T: the largest mass of phi'^2 = 0 over the layers."""
        m = max([0.0] + [float(self.p[g][self.a[g] == 0].sum()) for g in range(len(self.n))])
        return m if m > 1e-14 else 0.0      # not float64 underflow of phi'^2 in a far tail

    def psi(self, zeta):
        """psi_g(zeta) = sum_i p_i zeta a_i/(1 - zeta a_i) and its derivative, zeta (..., G)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            r = 1.0 / (1.0 - zeta[..., None] * self.a)
        return (self.p * (r - 1.0)).sum(-1), (self.p * self.a * r * r).sum(-1)

    def log_rest(self, w):
        """log of w/(1+w) S_W(w)^L ((1+w)/w)^(L-1) and its w-derivative (zeta factors excluded)."""
        nd = float(self.n.sum())
        val = (1 - nd) * np.log(w / (1 + w)) - self.depth * np.log(self.sigma_w2)
        der = (1 - nd) / (w * (1 + w))
        if self.gaussian:
            val, der = val - self.depth * np.log(1 + w), der - self.depth / (1 + w)
        return val, der


def _real_zeta(model, w, upper):
    """Real zeta_g solving psi_g(zeta) = w (w > 0: zeta in (0, 1/max a); w < -(1 - p0): zeta > 1/min a),
    by bisection in y = log(1 - t), t = zeta max a (resp. 1/(zeta min a)); shape (len(w), G)."""
    pos = np.where(model.a > 0, model.a, np.nan)
    ref = np.nanmax(pos, axis=1) if upper else np.nanmin(pos, axis=1)
    lo, hi = np.full((len(w), len(ref)), -37.0), np.zeros((len(w), len(ref)))
    for _ in range(48):
        mid = (lo + hi) / 2
        t = 1 - np.exp(mid)
        zeta = t / ref if upper else 1 / (t * ref)
        val = model.psi(zeta)[0].real
        big = (val > w[:, None]) if upper else (val < w[:, None])   # too close to the singularity
        lo, hi = np.where(big, mid, lo), np.where(big, hi, mid)
    t = 1 - np.exp((lo + hi) / 2)
    return t / ref if upper else 1 / (t * ref)


def _log_chi(model, w, upper):
    zeta = _real_zeta(model, w, upper)
    with np.errstate(invalid="ignore", divide="ignore"):
        rest = model.log_rest(w.astype(complex))[0]
        return rest + (model.n * np.log(zeta.astype(complex))).sum(-1)


def _edge(model, upper):
    """Support edge from the real branch of chi = psi^(-1): upper = 1/max chi(w), w > 0; lower = 1/min chi(w),
    w < -(1 - p0) (0 when that branch has chi <= 0, e.g. Gaussian weights). Returns (edge, ok)."""
    p0 = model.zero_mass
    s = np.linspace(-14, 30, 221)
    w = np.exp(s) if upper else -(1 - p0) - np.exp(s)
    lc = _log_chi(model, w, upper)
    if not upper and (np.any(np.abs(lc.imag) > 1e-9) or not np.all(np.isfinite(lc))):
        return 0.0, True
    v = lc.real if upper else -lc.real
    i = int(np.nanargmax(v))
    if i in (0, len(s) - 1):                # no interior critical point
        return (float(np.exp(-lc.real[i])), i == len(s) - 1) if upper else (0.0, True)
    from scipy.optimize import minimize_scalar
    fun = lambda t: -(_log_chi(model, np.array([np.exp(t) if upper else -(1 - p0) - np.exp(t)]), upper).real[0]
                      * (1 if upper else -1))
    r = minimize_scalar(fun, bracket=(s[i - 1], s[i], s[i + 1]), tol=1e-12)
    return float(np.exp(r.fun if upper else -r.fun)), True


def _start(model, moments, xp):
    """Initial (w, zeta) at x' far from the support: w = psi(1/x') and zeta_g = chi_g(w) by their series."""
    z = 1 / xp
    w = sum(m * z ** (k + 1) for k, m in enumerate(moments))
    zeta = np.empty(xp.shape + (len(model.n),), dtype=complex)
    for g in range(len(model.n)):
        mom = [float((model.p[g] * model.a[g] ** k).sum()) for k in range(1, N_MOMENTS + 1)]
        chi = series_reversion([0.0] + mom, N_MOMENTS + 1)
        zeta[:, g] = sum(c * w ** k for k, c in enumerate(chi) if k)
    return w, zeta


def _newton(model, xp, w, zeta, iters=30, tol=1e-12):
    """Newton on F_g = psi_g(zeta_g) - w, F_0 = log rest(w) + sum_g n_g log zeta_g + log x' (arrow
    elimination of the zeta_g), steps damped to keep Im w, Im zeta < 0; only unconverged points move.
    Returns (w, zeta, residual)."""
    w, zeta, res = w.copy(), zeta.copy(), np.full(xp.shape, np.inf)
    act = np.ones(xp.shape, bool)
    for _ in range(iters):
        i = np.flatnonzero(act)
        wi, zi = w[i], zeta[i]
        with np.errstate(all="ignore"):
            ps, dps_ = model.psi(zi)
            fg = ps - wi[:, None]
            rest, drest = model.log_rest(wi)
            f0 = rest + (model.n * np.log(zi)).sum(-1) + np.log(xp[i])
            res[i] = np.abs(f0) + np.abs(fg).sum(-1) / np.maximum(np.abs(wi), 1e-300)
            act[i] = ~(res[i] < tol) & np.isfinite(res[i])
            k = model.n / (dps_ * zi)
            dw = (-f0 + (k * fg).sum(-1)) / (drest + k.sum(-1))
            dz = (dw[:, None] - fg) / dps_
        if not act.any():
            break
        t = np.ones(len(i))
        for _ in range(30):
            bad = ((wi + t * dw).imag >= 0) | np.any((zi + t[:, None] * dz).imag >= 0, axis=-1)
            if not bad.any():
                break
            t = np.where(bad, t / 2, t)
        move = act[i]
        w[i[move]], zeta[i[move]] = (wi + t * dw)[move], (zi + t[:, None] * dz)[move]
    return w, zeta, res


def _retry_from_neighbours(model, xp, w, zeta, ok, sweeps=3):
    """Points where the continuation in Im x' failed start again from a converged neighbour's solution
    (continuation along x at the final Im x'), sweeping up and down the grid."""
    for _ in range(sweeps):
        if ok.all() or not ok.any():
            break
        for order in (np.arange(len(xp)), np.arange(len(xp))[::-1]):
            for i, j in zip(order[1:], order[:-1]):
                if ok[i] or not ok[j]:
                    continue
                wi, zi, res = _newton(model, xp[i:i + 1], w[j:j + 1], zeta[j:j + 1])
                if res[0] < 1e-8:
                    w[i], zeta[i], ok[i] = wi[0], zi[0], True
    return w, zeta, ok


def solve_density(model, moments, xs, steps=45, eta=1e-10):
    """rho(x) = -Im G(x + i0)/pi at the points xs, G = (1 + w)/x', by continuation in Im x' from
    10 max(xs) down to eta x. Returns (rho, converged)."""
    y0 = 10 * float(np.max(xs))
    yf = eta * xs
    w, zeta = _start(model, moments, xs + 1j * y0)
    ok = np.ones(xs.shape, bool)
    for k in range(steps + 1):
        y = y0 * (yf / y0) ** (k / steps)
        w, zeta, res = _newton(model, xs + 1j * y, w, zeta)
        ok &= np.isfinite(res)
    ok &= res < 1e-8
    w, zeta, ok = _retry_from_neighbours(model, xs + 1j * yf, w, zeta, ok)
    rho = -((1 + w) / (xs + 1j * yf)).imag / np.pi
    return np.where(ok, np.maximum(rho, 0.0), np.nan), ok


def _grid(lo, hi, n=300, n_log=60, floor=1e-24):
    """Chebyshev-clustered points on (lo, hi) (square-root edges); for lo = 0 also log-spaced
    points from floor*hi up to the first of them (power-law densities at 0)."""
    th = np.pi * (np.arange(n) + 0.5) / n
    xs = lo + (hi - lo) * (1 - np.cos(th)) / 2
    if lo == 0:
        xs = np.concatenate([np.geomspace(floor * hi, xs[0], n_log, endpoint=False), xs])
    return xs


def _integrals(xs, rho, atom0):
    """mass, mean and second moment of atom0 delta_0 + rho: trapezoid in log x (x rho smooth there),
    the power-law tail C x^(-alpha) below the first point added in closed form."""
    u, f = np.log(xs), xs * rho
    mass = atom0 + np.trapezoid(f, u)
    if rho[0] > 0 and rho[1] > 0:
        alpha = -math.log(rho[1] / rho[0]) / (u[1] - u[0])
        if alpha < 0.98:
            mass += f[0] / (1 - alpha)
    return mass, np.trapezoid(f * xs, u), np.trapezoid(f * xs * xs, u)


def _quantile(xs, rho, atom0, p):
    """x with P(lambda <= x) = p from the density on its grid (0 when the atom at 0 holds p)."""
    if atom0 >= p:
        return 0.0
    u, f = np.log(xs), xs * rho
    cdf = atom0 + np.concatenate([[0.0], np.cumsum((f[1:] + f[:-1]) / 2 * np.diff(u))])
    cdf = cdf / cdf[-1]
    return float(np.interp(p, cdf, xs))


@dataclass
class JacobianSpectrum:
    """Law of the squared singular values of J at infinite width: moments m_1..m_6, the density ``pdf``
    on ``x`` (continuous part), ``atoms`` [(location, mass)], ``support`` edges, ``var`` = m_2 - m_1^2,
    ``condition`` = sqrt(x_{1-p}/x_p) (p = CONDITION_QUANTILE; a singular-value ratio), ``checks``
    (mass, mean, second moment of the density), ``status`` (STATUS) and the layer variances ``q``."""
    moments: list
    x: np.ndarray
    pdf: np.ndarray
    atoms: list
    support: tuple
    var: float
    condition: float
    status: int
    q: list
    checks: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)
    STATUS = STATUS

    @property
    def message(self) -> str:
        """The meaning of ``status`` (STATUS)."""
        return STATUS[self.status]


def _validate(act, sigma_w2, sigma_b2, depth, q0, weights, dps):
    a = _act(act)
    for name, v, lo_open in (("sigma_w2", sigma_w2, True), ("sigma_b2", sigma_b2, False), ("q0", q0, True)):
        arr = check.real(_F, name, v, lo=0, lo_open=lo_open)
        if arr.ndim:
            check.fail(_F, name, "a scalar", v, TypeError)
    depth = check.integer(_F, "depth", depth, lo=1, hi=10_000)
    if weights not in WEIGHTS:
        check.fail(_F, "weights", f"one of {WEIGHTS}", weights)
    return a, depth, check.dps(_F, dps)


def _density(model, m, atoms_only):
    """(x, pdf, atoms, support, checks, status) of the spectrum from the model and the moments m."""
    if atoms_only:                      # orthogonal weights, deterministic D: a single atom at m_1
        return np.empty(0), np.empty(0), [(m[0], 1.0)], (m[0], m[0]), {}, 0
    p0 = model.zero_mass
    (hi, ok_hi), (lo, _) = _edge(model, True), _edge(model, False)
    xs = _grid(lo, hi)
    rho, ok = solve_density(model, m, xs)
    tail = ~ok & (xs < xs[ok][np.argmax(xs[ok] * rho[ok] > 1e-12)]) if ok.any() else ok
    rho[tail] = 0.0                     # failed far below the first non-negligible value: zero density
    status = 0 if ok_hi and np.all(ok | tail) else 1
    mass, mean, second = _integrals(xs, np.nan_to_num(rho), p0)
    checks = dict(mass=mass, mean=mean, second_moment=second)
    if status == 0 and not (abs(mass - 1) <= DENSITY_RTOL and abs(mean / m[0] - 1) <= DENSITY_RTOL):
        status = 2
    return xs, rho, ([(0.0, p0)] if p0 > 0 else []), (lo, hi), checks, status


def jacobian_spectrum(act: str | Activation, sigma_w2: float, sigma_b2: float, depth: int, q0: float = 1.0,
                      weights: Literal["gaussian", "orthogonal"] = "gaussian", dps: int | None = None,
                      density: bool = True) -> JacobianSpectrum:
    """Spectrum of J J^T, J = dz^(L)/dx, at infinite width (docs/theory.md section 11).

    Moments m_1..m_6 from the product of S-transforms (float64, or mpf with dps=N digits, from the
    closed forms or the quadrature of E[phi'^(2k)]); density by the free multiplicative equations
    (float64; relative accuracy ~1e-4 in the bulk, mass and mean checked to DENSITY_RTOL);
    ``density=False`` skips it. The layer variances follow the recursion from q0.

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation`.
    sigma_w2, sigma_b2 : float
        Weight (> 0) and bias (>= 0) variances.
    depth : int
        Number of layers L.
    q0 : float
        Input variance.
    weights : {'gaussian', 'orthogonal'}
        Gaussian or scaled Haar-orthogonal weight matrices.
    dps : int, optional
        mpmath digits of the moments; None for float64.
    density : bool
        Also solve for the density.

    Returns
    -------
    JacobianSpectrum
        ``moments``, ``x``/``pdf``, ``atoms``, ``support``, ``var``, ``condition``, ``status``.

    Examples
    --------
    >>> sf.jacobian_spectrum("relu", 2.0, 0.0, depth=3, density=False).moments[:2]
    [2.0, 24.0]
    """
    a, depth, dps = _validate(act, sigma_w2, sigma_b2, depth, q0, weights, dps)
    qs = layer_variances(a, sigma_w2, sigma_b2, depth, q0, dps)
    if dps is not None:
        with mpmath.workdps(dps + GUARD_DIGITS):
            m = jacobian_moments(a, to_mpf(sigma_w2), sigma_b2, depth, q0, weights, dps=dps, qs=qs)
            m = [+mpmath.mpf(v) for v in m]
    else:
        m = [float(v) for v in jacobian_moments(a, float(sigma_w2), sigma_b2, depth, q0, weights, qs=qs)]
    mf = [float(v) for v in m]
    var = mf[1] - mf[0] ** 2
    params = dict(act=a.name, sigma_w2=float(sigma_w2), sigma_b2=float(sigma_b2), depth=depth, q0=float(q0),
                  weights=weights)
    if not all(math.isfinite(v) for v in mf):
        return JacobianSpectrum(m, np.empty(0), np.empty(0), [], (math.nan, math.nan), var, math.nan, 4, qs,
                                params=params)
    if not density:
        return JacobianSpectrum(m, np.empty(0), np.empty(0), [], (math.nan, math.nan), var, math.nan, 0, qs,
                                params=params)
    model = _Model.build(a, qs, sigma_w2, depth, weights)
    flat = weights == "orthogonal" and np.all(np.ptp(np.where(model.p > 0, model.a, model.a[:, :1]), axis=1) == 0)
    xs, rho, atoms, support, checks, status = _density(model, mf, flat or var <= 1e-14 * mf[0] ** 2)
    if atoms and atoms[0][1] == 1.0:
        cond = 1.0
    else:
        p0 = atoms[0][1] if atoms and atoms[0][0] == 0 else 0.0
        lo_q = _quantile(xs, np.nan_to_num(rho), p0, CONDITION_QUANTILE)
        cond = math.sqrt(_quantile(xs, np.nan_to_num(rho), p0, 1 - CONDITION_QUANTILE) / lo_q) if lo_q > 0 else math.inf
        if math.isinf(cond) and status == 0:
            status = 3
    return JacobianSpectrum(m, xs, rho, atoms, support, var, cond, status, qs, checks, params)


@dataclass
class IsometryDiagram:
    """m_1, m_2 and the spectrum's relative variance m_2/m_1^2 - 1 over a (sigma_w2, sigma_b2) grid
    (rows sigma_w2, columns sigma_b2) at depth L; ``status`` 4 where a moment is not finite."""
    sigma_w2: np.ndarray
    sigma_b2: np.ndarray
    m1: np.ndarray
    m2: np.ndarray
    rel_var: np.ndarray
    status: np.ndarray
    params: dict = field(default_factory=dict)

    @property
    def var(self) -> np.ndarray:
        """m_2 - m_1^2 on the grid."""
        return self.m2 - self.m1 ** 2


def isometry_diagram(act: str | Activation, sigma_w2: ArrayLike, sigma_b2: ArrayLike, depth: int,
                     weights: Literal["gaussian", "orthogonal"] = "gaussian", q0: float = 1.0) -> IsometryDiagram:
    """The moments m_1, m_2 of J J^T over the grid sigma_w2 x sigma_b2 (float64, vectorised: the variance
    recursion and E[phi'^2], E[phi'^4] evaluated on whole arrays).

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation`.
    sigma_w2, sigma_b2 : array_like
        Axes of the grid (weight variances > 0, bias variances >= 0).
    depth : int
        Number of layers L.
    weights : {'gaussian', 'orthogonal'}
        Gaussian or scaled Haar-orthogonal weight matrices.
    q0 : float
        Input variance.

    Returns
    -------
    IsometryDiagram
        ``m1``, ``m2``, ``rel_var``, ``status`` of shape (len(sigma_w2), len(sigma_b2)); ``var``.

    Examples
    --------
    >>> sf.isometry_diagram("tanh", [1.0, 2.0], [0.0], depth=5).m1.shape
    (2, 1)
    """
    a = _act(act)
    sw = check.real("isometry_diagram", "sigma_w2", sigma_w2, lo=0, lo_open=True).reshape(-1)
    sb = check.real("isometry_diagram", "sigma_b2", sigma_b2, lo=0).reshape(-1)
    depth = check.integer("isometry_diagram", "depth", depth, lo=1, hi=10_000)
    if weights not in WEIGHTS:
        check.fail("isometry_diagram", "weights", f"one of {WEIGHTS}", weights)
    check.real("isometry_diagram", "q0", q0, lo=0, lo_open=True)
    W, B = np.meshgrid(sw, sb, indexing="ij")
    with np.errstate(all="ignore"):
        qs = layer_variances(a, W, B, depth, q0)
        m = jacobian_moments(a, W, B, depth, q0, weights, n=2, qs=qs)
        m1, m2 = (np.asarray(v, dtype=float) * np.ones_like(W) for v in m)
        rel = m2 / m1 ** 2 - 1
    bad = ~(np.isfinite(m1) & np.isfinite(m2))
    return IsometryDiagram(sw, sb, m1, m2, rel, np.where(bad, 4, 0),
                           dict(act=a.name, depth=depth, weights=weights, q0=float(q0)))
