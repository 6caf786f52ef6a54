"""The spectrum of the input-output Jacobian at infinite width (docs/theory.md section 11).

    J = dz^(L)/dx = W_L D_{L-1} W_{L-1} ... D_1 W_1,     D_l = diag(phi'(z^(l))),

The squared singular values of J have, as the width n -> oo, the law of the free product of the
layers, with S-transform

    S_{JJ^T}(w) = prod_{l=1}^{L} S_W(w) prod_{l=1}^{L-1} S_{D_l^2}(w),
    S_W(w) = 1/(sigma_w2 (1 + w))  (Gaussian),   1/sigma_w2  (orthogonal),

S_{D_l^2} from the moments d_k(q) = E[phi'(z)^(2k)], z ~ N(0, q^(l)). Moments by power series (computed
normalised, m_k = m_1^k mu_k, so they stay finite where m_1 leaves the float64 range; :func:`small_q`
series at small q); the density by Newton continuation from far above the real axis; atoms at 0 and,
for orthogonal weights, by Belinschi's rule (:func:`free_atoms`).
"""
from __future__ import annotations

from symfield.core.errors import InvalidValue, PrecisionError
import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal

import mpmath
import numpy as np
import sympy as sp
from numpy.typing import ArrayLike

from symfield.core import timelimit
from symfield.core import validate as check
from symfield.core.dataset import ToXarray, flags
from symfield.numeric.evaluate import GUARD_DIGITS, NUMPY_MODULES, to_mpf
from symfield.symbolic import gaussian as G
from symfield.symbolic.activation import Activation, activation, mp_function
from symfield.symbolic.formula import X as x
from symfield.symbolic.kernel import kernel
from symfield.theory.maps import V, q_map
from symfield.numeric.maps import maps

_F = "jacobian_spectrum"
WEIGHTS = ("gaussian", "orthogonal")
N_MOMENTS = 6
NODES = 160                 # quadrature nodes of the law of phi'(z)^2 per layer (density only)
CONDITION_QUANTILE = 0.05   # .condition = sqrt(x_{1-p}/x_p): ratio of singular-value quantiles
DENSITY_RTOL = 5e-3         # density checks: mass = 1 and mean = m_1 to this relative tolerance
ATOM_FLOOR = 1e-12          # atoms of smaller mass are not reported
TINY = np.finfo(float).tiny  # the smallest normal float64: moments below it have lost digits
LAW_FLOOR = 1e-200          # the law of phi'^2 at a smaller q is taken at this q (its q -> 0 limit)
SMALL_Q_CAP = 1e-2          # the small-q series is used only below this (and below its own limit)
SMALL_Q_ORDER = 16          # one-sided Taylor order of phi at 0
SMALL_Q_SECONDS = 30.0      # time budget of the expansion of one activation
STATUS = {0: "ok", 1: "the density solver did not converge at some x (pdf NaN there)",
          2: "the density fails its checks (mass 1, mean m_1) beyond DENSITY_RTOL",
          3: "an atom at 0 of mass >= CONDITION_QUANTILE: the condition number is infinite",
          4: "a moment is outside the float64 range (overflow to inf, underflow to 0) or not finite",
          5: "the layer maps could not be evaluated at this point (see error)"}
STATUS_NAMES = ("ok", "density_not_converged", "density_checks_failed", "atom_at_0_condition_infinite",
                "moment_out_of_float64_range", "evaluation_failed")   # CF flag_meanings of STATUS


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


@lru_cache(maxsize=256)
def dphi2_expectation(act: Activation, k: int):
    """SymPy expression E[phi'(u)^(2k)] in q (a closed form where the expectation machinery finds one,
    else the defining Gaussian integral)."""
    d1 = sp.diff(act.expr, x)
    if d1.has(sp.DiracDelta):
        raise InvalidValue(f"The 'act' parameter of {_F} must be an activation without jumps (phi' has a point "
                         f"mass, E[phi'^2] = oo). Got {act.name!r} instead.")
    return G.expect1(d1 ** k, d1 ** k).value


def dphi2_expectations(act: Activation, n: int):
    """E[phi'(u)^(2k)] in q, k = 1..n (:func:`dphi2_expectation`)."""
    return tuple(dphi2_expectation(act, k) for k in range(1, n + 1))


def _regular(a, k, q, dps=None):
    """E[f(sqrt(q) z)], f = phi^2 (k = 0) or phi'^(2k), by the package's maps (closed form or quadrature)."""
    if k == 0:
        return V(a, q, dps)
    return maps(kernel(a), dps).expect(dphi2_expectation(a, k), (G.q,), (q,))


def _what(k):
    return "E[phi^2]" if k == 0 else f"E[phi'^{2 * k}]"


# ---------------------------------------------------------------- q -> 0
@dataclass(frozen=True)
class SmallQ:
    """A Gaussian expectation for q < q_lim as the series sum_m coefs[m - power] s^m, s = sqrt(q), m >= power
    (float64 to rounding there: :func:`small_q`)."""
    coefs: tuple
    power: int
    q_lim: float

    def __call__(self, q):
        s = np.sqrt(np.asarray(q, dtype=float))
        out = np.zeros_like(s)
        for c in reversed(self.coefs):          # Horner in s
            out = out * s + c
        return out * s ** self.power


def _one_sided(act):
    """Taylor coefficients 0..SMALL_Q_ORDER of t -> phi(t) and t -> phi(-t) at t = 0+ (mpmath, 50 digits)."""
    f = mp_function(act.expr)
    with mpmath.workdps(50):
        return [[mpmath.mpf(mpmath.re(c)) for c in mpmath.taylor(g, 0, SMALL_Q_ORDER, direction=1)]
                for g in (f, lambda t: f(-t))]


def _f_series(c, k):
    """Coefficients of f(t) = phi(t)^2 (k = 0) or phi'(t)^(2k) from those of phi(t), t >= 0 (phi'(-t)^2 is
    the square of d/dt phi(-t), so one rule serves both sides)."""
    n = len(c) - 1
    if k == 0:
        return series_mul(c, c, n + 1)
    d2 = series_mul(*(2 * [[(i + 1) * c[i + 1] for i in range(n)]]), n)
    out = [mpmath.mpf(1)] + [mpmath.mpf(0)] * (n - 1)
    for _ in range(k):
        out = series_mul(out, d2, n)
    return out


def _series_limit(e, m0, nz, act):
    """Largest q (<= SMALL_Q_CAP) at which the terms up to SMALL_Q_ORDER give the sum to float64: the last two
    nonzero terms each below eps/8 of the leading one (terms fall geometrically there), the nearest kink
    away from 0 at >= 40 sqrt(q); a series that ends within the order is exact up to the kink bound."""
    far = [abs(v) for v in kernel(act).kinks if v != 0]
    q_lim = min(SMALL_Q_CAP, (min(far) / 40) ** 2 if far else math.inf)
    for m in nz[1:][-2:]:
        s_lim = (mpmath.mpf(2) ** -55 * abs(e[m0] / e[m])) ** (mpmath.mpf(1) / (m - m0))
        q_lim = min(q_lim, float(s_lim ** 2))
    return q_lim


@lru_cache(maxsize=128)
def small_q(act: Activation, k: int):
    """(SmallQ or None, reason) for E[f(sqrt(q) z)], f = phi^2 (k = 0) or phi'^(2k) (k >= 1), at small q.

    One-sided Taylor series f(+-t) = sum_m f_m^(+-) t^m (phi may have a kink at 0) give
    E[f(s z)] = sum_m e_m s^m, s = sqrt(q), e_m = (f_m^+ + f_m^-)/2 E|z|^m, E|z|^m = 2^(m/2) Gamma((m+1)/2)/sqrt(pi),
    used for q < q_lim (:func:`_series_limit`) and only if it agrees with the defining expectation by
    mpmath (40 digits) to 1e-13 at q_lim and at q_lim 1e-6 (a phi not analytic on either side of 0 fails).
    It serves where q decays to ~0 and where float64 closed forms cancel (sin: 1/2 - exp(-2 q)/2)."""
    try:
        sides = timelimit.call_with_time_limit(SMALL_Q_SECONDS, _one_sided, act)
        with mpmath.workdps(50):
            f = [_f_series(c, k) for c in sides]
            e = [(f[0][m] + f[1][m]) / 2 * 2 ** (mpmath.mpf(m) / 2) * mpmath.gamma((m + 1) / mpmath.mpf(2))
                 / mpmath.sqrt(mpmath.pi) for m in range(len(f[0]))]
    except Exception as exc:       # any failure of the numeric series: no limit (the regular path is used)
        return None, f"no Taylor series of phi at 0 ({type(exc).__name__}: {exc})"
    tol = mpmath.mpf(10) ** -30 * max([abs(v) for v in e] + [mpmath.mpf(10) ** -300])
    nz = [m for m, v in enumerate(e) if abs(v) > tol]
    if not nz:
        return None, f"{_what(k)} vanishes to order {SMALL_Q_ORDER} in sqrt(q) at 0"
    m0 = nz[0]
    q_lim = _series_limit(e, m0, nz, act)
    lead = SmallQ(tuple(float(v) if abs(v) > tol else 0.0 for v in e[m0:nz[-1] + 1]), m0, q_lim)
    if not all(math.isfinite(c) for c in lead.coefs):
        return None, "its q -> 0 series has a non-finite coefficient (phi not analytic at 0?)"
    for qc in (q_lim, q_lim * 1e-6):
        try:       # mpmath: float64 closed forms such as (1 - exp(-2 q))/2 cancel at small q
            ref = float(_regular(act, k, qc, dps=40))
        except (ArithmeticError, ValueError) as exc:
            return None, f"the check of its q -> 0 series failed ({exc})"
        if not abs(float(lead(qc)) - ref) <= 1e-13 * abs(ref) + 1e-300:
            return None, f"its q -> 0 series disagrees with the quadrature at q = {qc:g} (phi not analytic at 0?)"
    return lead, ""


def _expect(a, k, q):
    """E[f(sqrt(q) z)] (f = phi^2 for k = 0, else phi'^(2k)) at float64 q: the regular evaluation, the small-q
    series (:func:`small_q`) below its limit, NaN at non-finite q (inf for k = 0 at q = inf)."""
    q = np.asarray(q, dtype=float)
    out = np.full(q.shape, np.inf if k == 0 else np.nan)
    out[np.isnan(q)] = np.nan
    fin = np.isfinite(q)
    lead, why = small_q(a, k) if np.any(fin & (q < SMALL_Q_CAP)) else (None, "")
    tiny = fin & (q < lead.q_lim) if lead is not None else np.zeros(q.shape, bool)
    reg = fin & ~tiny
    if np.any(q[reg] <= 0):
        raise PrecisionError(f"the variance q underflowed to 0, and the q -> 0 limit of {_what(k)} for {a.name} "
                              f"is not available: {why}")
    if reg.any():
        out[reg] = _regular(a, k, q[reg])
    if tiny.any():
        out[tiny] = lead(q[tiny])
    return out[()] if out.ndim == 0 else out


def dphi2_moments(act, q, n=N_MOMENTS, dps=None):
    """d_k(q) = E[phi'(u)^(2k)], u ~ N(0, q), k = 1..n: floats (arrays for array q; q -> 0 by its limit,
    :func:`small_q`) or mpf (dps)."""
    a = _act(act)
    if dps is None:
        return [_expect(a, k, q) for k in range(1, n + 1)]
    M = maps(kernel(a), dps)
    return [M.expect(e, (G.q,), (q,)) for e in dphi2_expectations(a, n)]


def _at(q):
    return f" (q = {float(q):.6g})" if np.ndim(q) == 0 else ""


def layer_variances(act, sigma_w2, sigma_b2, depth, q0=1.0, dps=None):
    """q^(1..depth-1): the variances at the layers' nonlinearities (q^(1) = sigma_w2 q0 + sigma_b2); in
    float64 a q that decays to ~0 follows the q -> 0 limit of V (:func:`small_q`). A failed step raises
    ArithmeticError naming the layer."""
    a = _act(act)
    q = q_map("linear", q0, sigma_w2, sigma_b2, dps=dps)
    out = []
    for layer in range(1, depth):
        out.append(q)
        try:
            q = q_map(a, q, sigma_w2, sigma_b2, dps=dps) if dps is not None else sigma_w2 * _expect(a, 0, q) + sigma_b2
        except (ArithmeticError, ValueError) as exc:
            raise PrecisionError(f"the variance map failed at layer {layer}{_at(q)}: "
                                  f"{str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}") from exc
    return out


def moment_parts(act, sigma_w2, sigma_b2, depth, q0=1.0, weights="gaussian", n=N_MOMENTS, dps=None, qs=None):
    """(m_1, [mu_1..mu_n]): m_1 = sigma_w2^L prod_l d_1(q^(l)) and the moments mu_k of J J^T/m_1, the product
    of the S-transforms of the unit-variance weights and of the layers' phi'^2/d_1 (S_{X/c} = c S_X), reverted.
    Either may leave the float64 range on its own; mu_2 - 1 is the relative variance."""
    if qs is None:
        qs = layer_variances(act, sigma_w2, sigma_b2, depth, q0, dps)
    one = 1 + 0 * sigma_w2
    s = weight_s(weights, one, n)
    s_tot, m1 = list(s), sigma_w2
    for _ in range(depth - 1):
        s_tot = series_mul(s_tot, s, n)
    for ql in qs:
        d = dphi2_moments(act, ql, n, dps)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            m1 = m1 * (sigma_w2 * d[0])
            s_tot = series_mul(s_tot, s_transform([d[k] / d[0] ** (k + 1) for k in range(n)]), n)
    return m1, moments_from_s(s_tot)


def jacobian_moments(act, sigma_w2, sigma_b2, depth, q0=1.0, weights="gaussian", n=N_MOMENTS, dps=None, qs=None):
    """m_1..m_n of the squared singular values of J (float64, numpy arrays over broadcast sigma grids,
    or mpf with dps): m_k = m_1^k mu_k (:func:`moment_parts`)."""
    m1, mu = moment_parts(act, sigma_w2, sigma_b2, depth, q0, weights, n, dps, qs)
    with np.errstate(over="ignore", invalid="ignore"):
        return [m1 ** k * v for k, v in enumerate(mu, 1)]


# ---------------------------------------------------------------- discretised laws of phi'^2
@lru_cache(maxsize=32)
def _dphi2_numpy(act: Activation):
    return sp.lambdify(x, sp.diff(act.expr, x) ** 2, modules=NUMPY_MODULES)


def _law_pieces(act, q, nodes):
    """[(values, weights, mass)] per piece between the kinks: phi'(sqrt(q) z_i)^2 at Gauss-Legendre nodes in
    t = Phi(z) (nodes spread evenly in probability) and the exact piece mass. Below LAW_FLOOR the law is
    taken at LAW_FLOOR: for a phi smooth on either side of 0 it equals its q -> 0 limit there to float64."""
    from scipy.special import ndtr, ndtri
    a = _act(act)
    f = _dphi2_numpy(a)
    s = math.sqrt(max(float(q), LAW_FLOOR))
    edges = ndtr(np.array([-np.inf] + sorted(float(k) / s for k in kernel(a).kinks) + [np.inf]))
    t, v = np.polynomial.legendre.leggauss(max(8, nodes // (len(edges) - 1)))
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        z, w = ndtri(lo + (hi - lo) * (t + 1) / 2), (hi - lo) * v / 2
        with np.errstate(all="ignore"):
            vals = np.broadcast_to(np.asarray(f(s * z), dtype=float), z.shape)
        keep = np.isfinite(z) & (w > 0)
        out.append((vals[keep].copy(), w[keep], float(hi - lo)))
    return out


def _joined(pieces):
    return np.concatenate([v for v, _, _ in pieces]), np.concatenate([w for _, w, _ in pieces])


def _atoms_of(pieces) -> dict:
    out = {}
    for vals, _, mass in pieces:
        if len(vals) > 1 and np.ptp(vals) == 0 and mass > ATOM_FLOOR:
            out[float(vals[0])] = out.get(float(vals[0]), 0.0) + mass
    return out


def dphi2_law(act, q, nodes=NODES):
    """(a_i, p_i): phi'(sqrt(q) z_i)^2 and weights of a rule for z ~ N(0, 1) (:func:`_law_pieces`)."""
    return _joined(_law_pieces(act, q, nodes))


def dphi2_atoms(act, q, nodes=NODES) -> dict:
    """{value: mass}: the atoms of the law of phi'(sqrt(q) z)^2, the pieces between kinks on which phi'^2 takes
    one value at every node (relu: {0: 1/2, 1: 1/2}; leaky_relu(a): {a^2: 1/2, 1: 1/2}), with exact masses."""
    return _atoms_of(_law_pieces(act, q, nodes))


def free_atoms(laws, mult, scale=1.0) -> list:
    """[(location, mass)] of the atoms away from 0 of scale x (nu_1^(⊠ n_1) ⊠ nu_2^(⊠ n_2) ⊠ ...), nu_g = {a: mass}
    the atoms of each law. Belinschi (2003): for laws on [0, oo), mu ⊠ nu has an atom at t != 0 exactly where
    t = a b with mu{a} + nu{b} > 1, of mass mu{a} + nu{b} - 1 (at most one such pair: the masses would exceed 2).
    The atom at 0 has mass max(mu{0}, nu{0}) (:attr:`_Model.zero_mass`)."""
    cur = {1.0: 1.0}
    for law, n in zip(laws, mult):
        nz = {a: m for a, m in law.items() if a != 0}
        for _ in range(int(n)):
            cur = {t * a: mt + m - 1 for t, mt in cur.items() for a, m in nz.items() if mt + m - 1 > ATOM_FLOOR}
            if not cur:
                return []
    return sorted((scale * t, m) for t, m in cur.items())


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
    layer_atoms: list = field(default_factory=list)    # {value: mass} of each group's law

    @classmethod
    def build(cls, act, qs, sigma_w2, depth, weights, nodes=NODES):
        vals, mult = _group(qs)
        pieces = [_law_pieces(act, v, nodes) for v in vals]
        laws = [_joined(pc) for pc in pieces]
        width = max([len(a) for a, _ in laws] + [1])
        a = np.zeros((len(laws), width))
        p = np.zeros((len(laws), width))
        for g, (ag, pg) in enumerate(laws):
            a[g, : len(ag)], p[g, : len(pg)] = ag, pg
        return cls(a, p, mult, depth, float(sigma_w2), weights == "gaussian", [_atoms_of(pc) for pc in pieces])

    @property
    def atoms(self) -> list:
        """[(location, mass)] of J J^T: at 0 (:attr:`zero_mass`) and, for orthogonal weights (S_W = 1/sigma_w2,
        a point mass), away from 0 by :func:`free_atoms`; Marchenko-Pastur factors (Gaussian weights) have
        no atoms, so then none lie away from 0."""
        p0 = self.zero_mass
        away = [] if self.gaussian else free_atoms(self.layer_atoms, self.n, self.sigma_w2 ** self.depth)
        return ([(0.0, p0)] if p0 > 0 else []) + away

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


def _integrals(xs, rho, atoms):
    """mass, mean and second moment of sum_a m_a delta_a + rho: trapezoid in log x (x rho smooth there),
    the power-law tail C x^(-alpha) below the first point added in closed form."""
    mass = sum(m for _, m in atoms)
    mean, second = sum(t * m for t, m in atoms), sum(t * t * m for t, m in atoms)
    if not len(xs):
        return mass, mean, second
    u, f = np.log(xs), xs * rho
    mass += np.trapezoid(f, u)
    if rho[0] > 0 and rho[1] > 0:
        alpha = -math.log(rho[1] / rho[0]) / (u[1] - u[0])
        if alpha < 0.98:
            mass += f[0] / (1 - alpha)
    return mass, mean + np.trapezoid(f * xs, u), second + np.trapezoid(f * xs * xs, u)


def _quantile(xs, rho, atoms, p):
    """The smallest x with P(lambda <= x) >= p for sum_a m_a delta_a + rho (rho on its grid, scaled to the
    mass 1 - sum m_a; linear between the points)."""
    A = sum(m for _, m in atoms)
    if len(xs):
        u, f = np.log(xs), xs * rho
        cont = np.concatenate([[0.0], np.cumsum((f[1:] + f[:-1]) / 2 * np.diff(u))])
        cont = cont * ((1 - A) / cont[-1]) if cont[-1] > 0 else cont
    else:
        xs, cont = np.zeros(1), np.zeros(1)
    prev, f_prev = 0.0, 0.0
    for t in sorted(set(xs.tolist()) | {a for a, _ in atoms}):
        below = float(np.interp(t, xs, cont, left=0.0)) + sum(m for a, m in atoms if a < t)   # P(lambda < t)
        if below >= p:
            return prev + (p - f_prev) / (below - f_prev) * (t - prev) if below > f_prev else prev
        at = below + sum(m for a, m in atoms if a == t)
        if at >= p:
            return t
        prev, f_prev = t, at
    return prev


@dataclass
class JacobianSpectrum(ToXarray):
    """Law of the squared singular values of J at infinite width: moments m_1..m_6, the density ``pdf``
    on ``x`` (continuous part), ``atoms`` [(location, mass)], ``support`` edges, ``var`` = m_2 - m_1^2,
    ``rel_var`` = m_2/m_1^2 - 1 (from the normalised moments: finite where m_1 leaves the float64 range),
    ``condition`` = sqrt(x_{1-p}/x_p) (p = CONDITION_QUANTILE; a singular-value ratio), ``checks``
    (mass, mean, second moment of atoms plus density), ``status`` (STATUS) and the layer variances ``q``.

    ``to_xarray()``: ``pdf`` over ``x``, ``moments`` over ``moment``, ``atom_x``/``atom_mass`` over ``atom``,
    ``q`` over ``layer`` (1..L-1), scalars ``var``, ``rel_var``, ``condition``, ``support_lo``/``_hi``,
    ``check_*`` and ``status`` (CF flags)."""
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
    rel_var: float = math.nan
    STATUS = STATUS

    @property
    def message(self) -> str:
        """The meaning of ``status`` (STATUS)."""
        return STATUS[self.status]

    def dataset_parts(self) -> dict:
        """The arrays, coordinates, dims and parameters of :meth:`to_xarray` (for symfield.io.output.save)."""
        dps = self.params.get("dps")
        scalars = dict(var=self.var, rel_var=self.rel_var, condition=self.condition, support_lo=self.support[0],
                       support_hi=self.support[1], **{f"check_{k}": float(v) for k, v in self.checks.items()})
        data = {"pdf": np.asarray(self.pdf, dtype=float), "moments": np.array(self.moments, dtype=object if dps else float),
                "atom_x": np.array([a for a, _ in self.atoms], dtype=float),
                "atom_mass": np.array([m for _, m in self.atoms], dtype=float),
                "q": np.array(self.q, dtype=object if dps else float).reshape(-1),
                **{k: np.asarray(float(v)) for k, v in scalars.items()}, "status": np.asarray(self.status, dtype=np.int8)}
        dims = {"pdf": ("x",), "moments": ("moment",), "atom_x": ("atom",), "atom_mass": ("atom",), "q": ("layer",),
                **{k: () for k in scalars}, "status": ()}
        coords = {"x": np.asarray(self.x, dtype=float), "moment": np.arange(1, len(self.moments) + 1),
                  "atom": np.arange(len(self.atoms)), "layer": np.arange(1, len(self.q) + 1)}
        return dict(data=data, coords=coords, dims=dims, params=dict(self.params), dps=dps, var_attrs=_SPECTRUM_ATTRS)


def _status_attrs(long_name):
    return {"long_name": long_name, **flags(STATUS_NAMES)}


_SPECTRUM_ATTRS = {
    "x": {"long_name": "squared singular value of J (eigenvalue of J J^T)", "units": "1"},
    "pdf": {"long_name": "density of the squared singular values (continuous part)", "units": "1"},
    "moments": {"long_name": "moment m_k = lim (1/n) tr (J J^T)^k", "units": "1"},
    "atom": {"long_name": "index of the atom", "units": "1"},
    "atom_x": {"long_name": "location of the atom", "units": "1"},
    "atom_mass": {"long_name": "mass of the atom", "units": "1"},
    "layer": {"long_name": "layer index l of the nonlinearity (q^(l))", "units": "1"},
    "q": {"long_name": "pre-activation variance q^(l) at the layer's nonlinearity", "units": "1"},
    "var": {"long_name": "variance m_2 - m_1^2", "units": "1"},
    "rel_var": {"long_name": "relative variance m_2/m_1^2 - 1", "units": "1"},
    "condition": {"long_name": "condition number sqrt(x_0.95/x_0.05)", "units": "1"},
    "support_lo": {"long_name": "lower edge of the support", "units": "1"},
    "support_hi": {"long_name": "upper edge of the support", "units": "1"},
    "check_mass": {"long_name": "mass of atoms plus density (check: 1)", "units": "1"},
    "check_mean": {"long_name": "mean of atoms plus density (check: m_1)", "units": "1"},
    "check_second_moment": {"long_name": "second moment of atoms plus density (check: m_2)", "units": "1"},
    "status": _status_attrs("spectrum status (see flag_meanings)"),
}


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


def _checked(checks, m):
    """Whether mass = 1 and mean = m_1 to DENSITY_RTOL."""
    return abs(checks["mass"] - 1) <= DENSITY_RTOL and abs(checks["mean"] / m[0] - 1) <= DENSITY_RTOL


def _density(model, m, deterministic):
    """(x, pdf, atoms, support, checks, status) of the spectrum from the model and the moments m."""
    if deterministic:                   # var = 0 to rounding: a single atom at m_1
        return np.empty(0), np.empty(0), [(m[0], 1.0)], (m[0], m[0]), {}, 0
    atoms = model.atoms
    if sum(mass for _, mass in atoms) >= 1 - ATOM_FLOOR:      # purely atomic (orthogonal relu at L = 2)
        mass, mean, second = _integrals(np.empty(0), np.empty(0), atoms)
        checks = dict(mass=mass, mean=mean, second_moment=second)
        locs = [t for t, _ in atoms]
        return np.empty(0), np.empty(0), atoms, (min(locs), max(locs)), checks, 0 if _checked(checks, m) else 2
    (hi, ok_hi), (lo, _) = _edge(model, True), _edge(model, False)
    xs = _grid(lo, hi)
    rho, ok = solve_density(model, m, xs)
    tail = ~ok & (xs < xs[ok][np.argmax(xs[ok] * rho[ok] > 1e-12)]) if ok.any() else ok
    rho[tail] = 0.0                     # failed far below the first non-negligible value: zero density
    status = 0 if ok_hi and np.all(ok | tail) else 1
    mass, mean, second = _integrals(xs, np.nan_to_num(rho), atoms)
    checks = dict(mass=mass, mean=mean, second_moment=second)
    if status == 0 and not _checked(checks, m):
        status = 2
    return xs, rho, atoms, (lo, hi), checks, status


def _condition(xs, rho, atoms):
    """sqrt(x_{1-p}/x_p), p = CONDITION_QUANTILE (1 for a single atom; inf when x_p = 0)."""
    if len(atoms) == 1 and atoms[0][1] == 1.0:
        return 1.0
    lo_q = _quantile(xs, np.nan_to_num(rho), atoms, CONDITION_QUANTILE)
    return math.sqrt(_quantile(xs, np.nan_to_num(rho), atoms, 1 - CONDITION_QUANTILE) / lo_q) if lo_q > 0 else math.inf


def _first_line(exc):
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _in_range(values) -> bool:
    """Every moment finite and normal, >= TINY (a moment of a law on [0, oo) other than delta_0 is > 0: 0 or
    a subnormal value is underflow, with digits lost)."""
    return all(math.isfinite(v) and v >= TINY for v in values)


def jacobian_spectrum(act: str | Activation, sigma_w2: float, sigma_b2: float, depth: int, q0: float = 1.0,
                      weights: Literal["gaussian", "orthogonal"] = "gaussian", dps: int | None = None,
                      density: bool = True) -> JacobianSpectrum:
    """Spectrum of J J^T, J = dz^(L)/dx, at infinite width (docs/theory.md section 11).

    Moments m_1..m_6 from the product of S-transforms (float64, or mpf with dps=N digits, from the
    closed forms or the quadrature of E[phi'^(2k)]); density by the free multiplicative equations
    (float64; relative accuracy ~1e-4 in the bulk, mass and mean checked to DENSITY_RTOL);
    ``density=False`` skips it. The layer variances follow the recursion from q0 (a q that decays to ~0
    by its exact q -> 0 limit). Atoms: at 0, and away from 0 for orthogonal weights (:func:`free_atoms`).
    Moments outside the float64 range (overflow, or underflow to 0) give status 4, ``rel_var`` still finite.

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
        ``moments``, ``x``/``pdf``, ``atoms``, ``support``, ``var``, ``rel_var``, ``condition``, ``status``.

    Raises
    ------
    ArithmeticError
        When a layer map cannot be evaluated at this point (the message names the layer and the point).

    Examples
    --------
    >>> sf.jacobian_spectrum("relu", 2.0, 0.0, depth=3, density=False).moments[:2]
    [2.0, 24.0]
    """
    a, depth, dps = _validate(act, sigma_w2, sigma_b2, depth, q0, weights, dps)
    params = dict(act=a.name, sigma_w2=float(sigma_w2), sigma_b2=float(sigma_b2), depth=depth, q0=float(q0),
                  weights=weights, dps=dps)
    try:
        qs = layer_variances(a, sigma_w2, sigma_b2, depth, q0, dps)
        if dps is not None:
            with mpmath.workdps(dps + GUARD_DIGITS):
                m1, mu = moment_parts(a, to_mpf(sigma_w2), sigma_b2, depth, q0, weights, dps=dps, qs=qs)
                m = [+mpmath.mpf(m1 ** k * v) for k, v in enumerate(mu, 1)]
        else:
            m1, mu = moment_parts(a, float(sigma_w2), sigma_b2, depth, q0, weights, qs=qs)
            with np.errstate(over="ignore", invalid="ignore"):
                m = [float(m1 ** k * v) for k, v in enumerate(mu, 1)]
    except ArithmeticError as exc:
        raise PrecisionError(f"{_F}({a.name}, sigma_w2={float(sigma_w2):g}, sigma_b2={float(sigma_b2):g}, "
                              f"depth={depth}, q0={float(q0):g}): {_first_line(exc)}") from exc
    mf = [float(v) for v in m]
    with np.errstate(over="ignore", invalid="ignore"):
        var, rel_var = mf[1] - mf[0] ** 2, float(mu[1]) - 1
    none = (np.empty(0), np.empty(0), [], (math.nan, math.nan), var, math.nan)
    if not _in_range(mf):
        return JacobianSpectrum(m, *none, 4, qs, params=params, rel_var=rel_var)
    if not density:
        return JacobianSpectrum(m, *none, 0, qs, params=params, rel_var=rel_var)
    model = _Model.build(a, qs, sigma_w2, depth, weights)
    xs, rho, atoms, support, checks, status = _density(model, mf, var <= 1e-14 * mf[0] ** 2)
    cond = _condition(xs, rho, atoms)
    if math.isinf(cond) and status == 0:
        status = 3
    return JacobianSpectrum(m, xs, rho, atoms, support, var, cond, status, qs, checks, params, rel_var)


@dataclass
class IsometryDiagram(ToXarray):
    """m_1, m_2 and the spectrum's relative variance m_2/m_1^2 - 1 over a (sigma_w2, sigma_b2) grid
    (rows sigma_w2, columns sigma_b2) at depth L; ``status`` per point (STATUS: 4 where m_1 or m_2 leaves
    the float64 range, 5 where the layer maps failed, the reason in ``error``).

    ``to_xarray()``: ``m1``, ``m2``, ``var``, ``rel_var``, ``status`` (CF flags) and ``error`` over
    (sigma_w2, sigma_b2)."""
    sigma_w2: np.ndarray
    sigma_b2: np.ndarray
    m1: np.ndarray
    m2: np.ndarray
    rel_var: np.ndarray
    status: np.ndarray
    params: dict = field(default_factory=dict)
    error: np.ndarray | None = None
    STATUS = STATUS

    @property
    def var(self) -> np.ndarray:
        """m_2 - m_1^2 on the grid."""
        with np.errstate(over="ignore", invalid="ignore"):
            return self.m2 - self.m1 ** 2

    @property
    def errors(self) -> np.ndarray:
        """The reason per point ('' where none), shape of the grid."""
        return np.full(self.m1.shape, "", dtype=object) if self.error is None else self.error

    def dataset_parts(self) -> dict:
        """The arrays, coordinates, dims and parameters of :meth:`to_xarray` (for symfield.io.output.save)."""
        data = {"m1": self.m1, "m2": self.m2, "var": self.var, "rel_var": self.rel_var,
                "status": np.asarray(self.status, dtype=np.int8), "error": np.asarray(self.errors, dtype=str)}
        return dict(data=data, coords={"sigma_w2": self.sigma_w2, "sigma_b2": self.sigma_b2}, params=dict(self.params),
                    var_attrs={"m1": _SPECTRUM_ATTRS["moments"] | {"long_name": "m_1 = lim (1/n) tr J J^T"},
                               "m2": _SPECTRUM_ATTRS["moments"] | {"long_name": "m_2 = lim (1/n) tr (J J^T)^2"},
                               "var": _SPECTRUM_ATTRS["var"], "rel_var": _SPECTRUM_ATTRS["rel_var"],
                               "status": _status_attrs("point status (see flag_meanings)")})


def _iso_point(a, W, B, depth, weights, q0):
    """(m1, m2, mu2 - 1) over broadcast arrays W, B (float64, vectorised)."""
    with np.errstate(all="ignore"):
        qs = layer_variances(a, W, B, depth, q0)
        m1, mu = moment_parts(a, W, B, depth, q0, weights, n=2, qs=qs)
        m1 = np.asarray(m1, dtype=float) * np.ones_like(W)
        return m1, m1 * m1 * np.asarray(mu[1], dtype=float), np.asarray(mu[1], dtype=float) * np.ones_like(W) - 1


def isometry_diagram(act: str | Activation, sigma_w2: ArrayLike, sigma_b2: ArrayLike, depth: int,
                     weights: Literal["gaussian", "orthogonal"] = "gaussian", q0: float = 1.0) -> IsometryDiagram:
    """The moments m_1, m_2 of J J^T over the grid sigma_w2 x sigma_b2 (float64, vectorised: the variance
    recursion and E[phi'^2], E[phi'^4] evaluated on whole arrays). When a layer map fails somewhere, the
    points are computed one by one and each failed point gets status 5 and its reason in ``error``.

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
        ``m1``, ``m2``, ``rel_var``, ``status``, ``error`` of shape (len(sigma_w2), len(sigma_b2)); ``var``.

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
    error = np.full(W.shape, "", dtype=object)
    try:
        m1, m2, rel = _iso_point(a, W, B, depth, weights, q0)
    except ArithmeticError:
        m1, m2, rel = (np.full(W.shape, np.nan) for _ in range(3))
        for idx in np.ndindex(W.shape):
            try:
                m1[idx], m2[idx], rel[idx] = (float(v) for v in _iso_point(a, W[idx], B[idx], depth, weights, q0))
            except ArithmeticError as exc:
                error[idx] = _first_line(exc)
    bad = ~(np.isfinite(m1) & (m1 >= TINY) & np.isfinite(m2) & (m2 >= TINY))
    status = np.where(error != "", 5, np.where(bad, 4, 0))
    return IsometryDiagram(sw, sb, m1, m2, rel, status, dict(act=a.name, depth=depth, weights=weights, q0=float(q0)),
                           error)
