"""Initial guessing bias (IGB): drift ratio gamma and the class-fraction distributions (docs/theory.md s. 10).

Bridge theorem: q_aa = sigma_mu2 + sigma_y2, q_ab = sigma_mu2, so::

    gamma = sigma_mu2/sigma_y2 = q_ab/(q_aa - q_ab),   c = gamma/(1 + gamma).

Binary output: G0 = Phi(sqrt(gamma) Z), Z ~ N(0,1), Phi the standard normal CDF.
"""
from __future__ import annotations

from symfield.core.errors import InvalidValue
import numpy as np

from symfield.core import validate
from symfield.numeric.orthant import phi_power_mean


def _gamma(func, gamma, *, allow_inf=False, positive=False):
    """Validate gamma >= 0 (> 0 if positive); +inf passes only when allow_inf."""
    arr = np.asarray(gamma) if allow_inf and not isinstance(gamma, (str, bool)) else None
    if arr is not None and arr.dtype.kind == "f" and np.any(np.isposinf(arr)):
        out = validate.real(func, "gamma", np.where(np.isposinf(arr), 1.0, arr), lo=0, lo_open=positive)
        return np.where(np.isposinf(arr), np.inf, out)
    return validate.real(func, "gamma", gamma, lo=0, lo_open=positive)


def _out(x):
    return x[()] if isinstance(x, np.ndarray) and x.ndim == 0 else x


def gamma_from_c(c):
    """gamma = c/(1 - c) for c in [0, 1]; c = 1 gives inf."""
    c = validate.real("gamma_from_c", "c", c, lo=0, hi=1)
    with np.errstate(divide="ignore"):
        return _out(np.where(c == 1, np.inf, c / (1 - c)))


def c_from_gamma(gamma):
    """c = gamma/(1 + gamma) for gamma in [0, inf]; inf gives 1."""
    g = _gamma("c_from_gamma", gamma, allow_inf=True)
    with np.errstate(invalid="ignore"):
        return _out(np.where(np.isinf(g), 1.0, g / (1 + g)))


def _q_pair(func, q_aa, q_ab):
    q_aa = validate.real(func, "q_aa", q_aa, lo=0, lo_open=True)
    q_ab = validate.real(func, "q_ab", q_ab, lo=0)
    bad = np.broadcast_to(q_ab > q_aa * (1 + 4e-16), np.broadcast(q_aa, q_ab).shape)
    if np.any(bad):
        qb = np.broadcast_to(q_ab, bad.shape)
        validate.fail(func, "q_ab", "<= q_aa (sigma_mu2 = q_ab, sigma_y2 = q_aa - q_ab >= 0)",
                      qb if qb.ndim == 0 else qb[bad])
    return q_aa, np.minimum(q_ab, q_aa)


def gamma_from_q(q_aa, q_ab):
    """gamma = q_ab/(q_aa - q_ab) (inf when q_ab = q_aa), requires 0 <= q_ab <= q_aa, q_aa > 0."""
    q_aa, q_ab = _q_pair("gamma_from_q", q_aa, q_ab)
    with np.errstate(divide="ignore"):
        return _out(np.where(q_ab == q_aa, np.inf, q_ab / (q_aa - q_ab)))


def sigmas_from_q(q_aa, q_ab):
    """(sigma_mu2, sigma_y2) = (q_ab, q_aa - q_ab)."""
    q_aa, q_ab = _q_pair("sigmas_from_q", q_aa, q_ab)
    return _out(q_ab * np.ones_like(q_aa)), _out(q_aa - q_ab)


def g0_pdf(g, gamma):
    """Density of G0 on [0, 1]: p(g) = gamma^(-1/2) exp[(1 - 1/gamma) erfinv(2g-1)^2]
    = gamma^(-1/2) exp[(1 - 1/gamma) t^2/2] with t = ndtri(g). At g in {0, 1} the limit:
    0 (gamma < 1), 1 (gamma = 1), inf (gamma > 1). gamma = 0 (point mass at 1/2) raises."""
    from scipy import special
    g = validate.real("g0_pdf", "g", g, lo=0, hi=1)
    gamma = _gamma("g0_pdf", gamma)
    if np.any(gamma == 0):
        raise InvalidValue("The 'gamma' parameter of g0_pdf must be a finite float > 0. Got 0.0 instead "
                         "(gamma = 0 makes G0 a point mass at 1/2, which has no density).")
    k = 1 - 1 / gamma
    t = special.ndtri(g)
    with np.errstate(over="ignore", invalid="ignore"):
        expo = np.where(k == 0, 0.0, k * t * t / 2)
        return _out(np.exp(expo) / np.sqrt(gamma))


def g0_cdf(g, gamma):
    """P(G0 <= g) = Phi(ndtri(g)/sqrt(gamma)); gamma = 0 gives the step 1[g >= 1/2]."""
    from scipy import special
    g = validate.real("g0_cdf", "g", g, lo=0, hi=1)
    gamma = _gamma("g0_cdf", gamma)
    with np.errstate(divide="ignore", invalid="ignore"):
        val = special.ndtr(special.ndtri(g) / np.sqrt(gamma))
    step = (g >= 0.5).astype(float)
    return _out(np.where(gamma == 0, step, np.where(g == 0, 0.0, np.where(g == 1, 1.0, val))))


def _rng(func, seed):
    if seed is None or isinstance(seed, np.random.Generator):
        return np.random.default_rng(seed)
    return np.random.default_rng(validate.integer(func, "seed", seed, lo=0))


def g0_sample(gamma, size, seed=None):
    """size draws of G0 = Phi(sqrt(gamma) Z), from np.random.default_rng(seed)."""
    from scipy import special
    gamma = float(_gamma("g0_sample", gamma))
    size = validate.integer("g0_sample", "size", size, lo=1)
    validate.memory("g0_sample", f"size = {size} draws x 2 arrays x 8 bytes", 16 * size)
    z = _rng("g0_sample", seed).standard_normal(size)
    return special.ndtr(np.sqrt(gamma) * z)


def g0_mean(gamma):
    """E[G0] = 1/2 for every gamma (Phi(-x) = 1 - Phi(x))."""
    gamma = _gamma("g0_mean", gamma)
    return _out(np.full_like(gamma, 0.5))


def g0_var(gamma):
    """Var G0 = arcsin(gamma/(1+gamma))/(2 pi) = arcsin(c)/(2 pi).

    E[Phi(aZ)^2] = P(X1 <= aZ, X2 <= aZ) (X1, X2, Z i.i.d. N(0,1)); X_i - aZ are N(0, 1+a^2) with
    correlation rho = a^2/(1+a^2), so the orthant probability is 1/4 + arcsin(rho)/(2 pi)."""
    gamma = _gamma("g0_var", gamma, allow_inf=True)
    return _out(np.arcsin(c_from_gamma(gamma)) / (2 * np.pi))


def g0_moment(n, gamma, order=200):
    """E[G0^n] = E[Phi(a Z)^n], a = sqrt(gamma), by quadrature of the given order (>= 100): the rule of
    :func:`symfield.numeric.orthant.phi_power_mean` (Gauss-Hermite for a <= 1, a Gauss-Legendre form that follows the
    step for a > 1)."""
    n = validate.integer("g0_moment", "n", n, lo=0)
    gamma = _gamma("g0_moment", gamma)
    order = validate.integer("g0_moment", "order", order, lo=100, hi=300)
    return _out(phi_power_mean(n, np.sqrt(gamma), order))


def gc_sample(gamma, n_classes, size, seed=None, order=64):
    """size draws of the C class fractions (shape (size, C)), Z_1..Z_C ~ N(0,1) per draw:
    G_c = E_eps prod_{c' != c} Phi(eps + sqrt(gamma)(Z_c - Z_c')), eps ~ N(0,1),
    by Gauss-Hermite quadrature over eps (order 64: sum_c G_c = 1 to ~1e-10 for C <= 10; raise
    the order for many classes, e.g. C = 100 needs ~200)."""
    from scipy import special
    gamma = float(_gamma("gc_sample", gamma))
    C = validate.integer("gc_sample", "n_classes", n_classes, lo=2)
    size = validate.integer("gc_sample", "size", size, lo=1)
    order = validate.integer("gc_sample", "order", order, lo=8, hi=300)
    x, w = np.polynomial.hermite_e.hermegauss(order)
    w = w / np.sqrt(2 * np.pi)                                     # E over eps ~ N(0,1)
    z = np.sqrt(gamma) * _rng("gc_sample", seed).standard_normal((size, C))
    out = np.empty((size, C))
    off = ~np.eye(C, dtype=bool)
    step = max(1, 4_000_000 // (order * C * C))
    for i in range(0, size, step):
        zz = z[i:i + step]
        d = zz[:, :, None] - zz[:, None, :]                       # (s, c, c')
        lp = special.log_ndtr(x[:, None, None, None] + d)      # (q, s, c, c')
        out[i:i + step] = np.tensordot(w, np.exp(np.sum(lp, axis=-1, where=off)), axes=1)
    return out


# ------------------------------------------------------------------------------------------- per-class gradients
_GL_Z, _GL_WZ = np.polynomial.legendre.leggauss(160)
_GH_E, _GH_WE = np.polynomial.hermite_e.hermegauss(120)


def _loss_factors(s2, m2):
    """E[sigmoid(-|M| + s eps)^2] (favoured) and E[sigmoid(|M| + s eps)^2] (unfavoured), M ~ N(0, m2),
    eps ~ N(0, 1): |M| = sqrt(m2) z, z on [0, 12] by Gauss-Legendre (density 2 phi(z)), eps by Gauss-Hermite."""
    from scipy import special
    z = 6 * (_GL_Z + 1)
    wz = 6 * _GL_WZ * 2 * np.exp(-z * z / 2) / np.sqrt(2 * np.pi)
    we = _GH_WE / np.sqrt(2 * np.pi)
    arg = np.sqrt(m2) * z[:, None] + np.sqrt(s2) * _GH_E[None, :]
    w = wz[:, None] * we[None, :]
    return float(np.sum(w * special.expit(-arg) ** 2)), float(np.sum(w * special.expit(arg) ** 2))


def class_gradients_theory(act, sigma_w2: float, sigma_b2: float, depth: int, dps: int | None = None,
                           residual: float | None = None, q0: float = 1.0, qab0: float = 0.0) -> dict:
    """Expected per-class squared gradient norms ||dl/dh^(l)||^2 (sum over the N nodes of layer l; the per-node
    mean of :func:`symfield.class_gradients` times the width) of a two-class softmax readout at infinite width.

    The logit difference of equicorrelated inputs is Delta_a = M + s eps_a with M ~ N(0, s^2 gamma) shared and
    s^2 = 2 (q_aa - q_ab) at the readout (q^(depth+1)). The favoured class is the one most inputs go to (sign -M);
    its samples get abs(dl/dDelta) = sigmoid(-abs(M) + s eps), the others sigmoid(abs(M) + s eps). Backward, with gradient
    independence: ||dDelta/dh^(L)||^2 = 2 sigma_w2 E[phi'^2](q^(L)), times sigma_w2 E[phi'^2](q^(l)) per layer
    (residual: times 1 + alpha^2 sigma_w2 E[phi'^2]). The loss factor and the backward norm are independent,
    so favoured/unfavoured/all are the backward norm times F, U and (F + U)/2, and the ratio U/F is the same at
    every layer. Single-node activations; ``dps`` is accepted for the maps (float64 results).

    Returns a dict of per-layer arrays ``layers``, ``favoured``, ``unfavoured``, ``all``, ``ratio`` and the
    scalars ``gamma``, ``s2``, ``F``, ``U``.
    """
    from symfield.numeric.maps import maps          # noqa: PLC0415  (theory-layer helpers, imported lazily)
    from symfield.symbolic.kernel import kernel     # noqa: PLC0415
    from symfield.theory.propagate import propagate  # noqa: PLC0415
    K = kernel(act)
    if K.act.pool is not None and K.act.k > 1:
        validate.fail("class_gradients_theory", "act", "a single-node activation (no pool)", K.act.name)
    depth = validate.integer("class_gradients_theory", "depth", depth, lo=1)
    sw = float(validate.real("class_gradients_theory", "sigma_w2", sigma_w2, lo=0, lo_open=True))
    P = propagate(act, sigma_w2, sigma_b2, depth + 1, q0=q0, qab0=qab0, residual=residual)
    q, qab, d = P.q.reshape(-1), P.qab.reshape(-1), P.d.reshape(-1)
    s2, m2 = 2 * (q[-1] - qab[-1]), 2 * qab[-1]
    s2 = d[-1] if qab[-1] > 0.5 * q[-1] else s2       # s^2 = d at equal norms, exact as c -> 1
    F, U = _loss_factors(s2, max(m2, 0.0))
    chi = sw * np.asarray(maps(K).dpsi2(q[:depth]), dtype=float)
    step = chi if residual is None else 1 + residual ** 2 * chi
    back = np.empty(depth)
    back[-1] = 2 * chi[-1]                           # ||dDelta/dh^(L)||^2 = 2 sigma_w2 E[phi'^2](q^(L))
    for layer in range(depth - 2, -1, -1):
        back[layer] = back[layer + 1] * step[layer]
    return dict(layers=np.arange(1, depth + 1), favoured=back * F, unfavoured=back * U, all=back * (F + U) / 2,
                ratio=np.full(depth, U / F), gamma=float(m2 / s2), s2=float(s2), F=F, U=U)
