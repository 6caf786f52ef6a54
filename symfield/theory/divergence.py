"""How the drift ratio gamma^(l) = q12/(q - q12) behaves with depth (docs/theory.md section 7).

Criterion. Over the last half of the layers, fit
    exponential:  log gamma = a + r l + e/l          (rate r)
    power law:    log gamma = b + p log l + d/l      (exponent p; ReLU: gamma ~ 2 l^2/(9 pi^2) (1 + O(1/l)))
by least squares and report the law with the smaller root-mean-square residual; "finite" when
gamma converges: its last step is below 1e-8 gamma, or its steps shrink geometrically at a
constant ratio (then gamma* is the geometric extrapolation). gamma = 2 q12/d is computed from the distance d = q_aa + q_bb - 2 q_ab, which has its own map
(symfield.numeric.distance), so it keeps its digits at any size. Closed-form maps are iterated in mpmath
(``dps`` digits, default 40; the one layer step, run by the maps engine in its mpmath context), where gamma
never overflows; maps without a closed form
use the float64 recursion of :func:`symfield.propagate` (layers whose gamma overflowed float64 are left out
of the fit, and, where the distance map is only the plain difference V + V - 2C, layers with 1 - c < 1e-11).

``norm=``, ``norm_at=``, ``batch=`` run the normalised recursion of docs/theory.md section 12
(:func:`symfield.theory.norm.recursion`, in mpmath for closed-form maps, else float64 through
:func:`symfield.propagate`); gamma = 2 q12/d as above. A gamma that converges to 0 (LayerNorm after relu at
sigma_b2 = 0) is "finite" with gamma_star exactly 0 when its limit is zero to 1e3 rounding units.
"""
from __future__ import annotations

from dataclasses import dataclass

import mpmath
import numpy as np

from symfield.core import validate as check
from symfield.core.errors import PrecisionError
from symfield.numeric.evaluate import GUARD_DIGITS, to_mpf
from symfield.numeric.maps import maps
from symfield.symbolic.activation import Activation
from symfield.symbolic.kernel import kernel
from symfield.theory import norm as nm
from symfield.theory.propagate import propagate

CONVERGED = 1e-8


@dataclass(frozen=True)
class Divergence:
    kind: str                 # "exponential", "power-law" or "finite"
    rate: float | None        # exponential: gamma_(l+1)/gamma_l -> exp(rate)
    exponent: float | None    # power law: gamma_l ~ l^exponent
    gamma_star: float | None  # finite: the limit
    gamma: np.ndarray         # gamma per layer (index 0 is layer 1)
    rms: dict                 # root-mean-square residual of each fit
    precision: str            # "mpmath(dps)" or "float64"


def _gamma_mp(K, sw, sb, depth, dps):
    """gamma = 2 q12/d per layer from the mpmath recursion at dps digits (d carried by its own map, so
    gamma keeps dps digits at any size; mpmath numbers do not overflow).

    Equal norms, plain layers: q' = sigma_w2 V(q) + sigma_b2, q12' = sigma_w2 C + sigma_b2, d' = sigma_w2 D."""
    first_layer, layer_step = maps(K, dps).step()
    out = []
    with mpmath.workdps(dps):
        sw, sb = to_mpf(sw), to_mpf(sb)
        one, zero = mpmath.mpf(1), mpmath.mpf(0)
        qa, _, qab, dd = first_layer(one, one, zero, 2 * one, sw, sb)   # layer 1 (linear), q0 = 1, qab0 = 0
        for _ in range(depth):
            out.append(2 * qab / dd if dd > 0 else mpmath.inf)
            qa, _, qab, dd = layer_step(qa, qa, qab, dd, sw, sb, 0, False, False, None)
    return out


def _gamma_norm_mp(K, opts, sw, sb, depth, dps):
    """gamma = 2 q12/d per layer of the normalised recursion (:func:`symfield.theory.norm.recursion`) in mpmath
    at dps digits, from the inputs q0 = 1, q12_0 = 0 (d0 = 2)."""
    with mpmath.workdps(dps + GUARD_DIGITS):
        swa, sba = (np.array([to_mpf(v)], dtype=object) for v in (sw, sb))
        one, zero = mpmath.mpf(1), mpmath.mpf(0)
        _, _, qab, dd = nm.recursion(K, opts, swa, sba, one, one, zero, 2 * one, depth, dps)
        return [2 * a / b if b > 0 else mpmath.inf for a, b in zip(qab[:, 0], dd[:, 0])]


def _geometric_limit(gamma, unit):
    """gamma* if gamma converges: steps delta_l shrink by a CONSTANT ratio rho < 1 (a power law
    has 1 - rho ~ 1/l, halving between l = L/2 and L), extrapolated as gamma_L + delta_L rho/(1 - rho);
    else the last gamma when its last step is below CONVERGED gamma. A limit within 1e3 ``unit`` (the
    recursion's rounding unit) of 0 is 0: gamma -> 0 is reported as gamma_star = 0.0, not as rounding noise."""
    g = gamma[np.isfinite(gamma)]
    if len(g) < 20:
        return None
    d = np.diff(g)
    tail = d[len(d) // 2:]
    limit = None
    if not (np.any(tail == 0) or not (np.all(tail > 0) or np.all(tail < 0))):
        rho = tail[1:] / tail[:-1]
        r_mid, r_end = np.median(rho[: len(rho) // 4]), np.median(rho[-max(len(rho) // 4, 1):])
        if r_end < 1 and (1 - r_end) >= 0.8 * (1 - r_mid):
            limit = float(g[-1] + d[-1] * r_end / (1 - r_end))
    if limit is None and (abs(d[-1]) <= CONVERGED * abs(g[-1]) or d[-1] == 0):
        limit = float(g[-1])
    if limit is None:
        return None
    return 0.0 if abs(limit) <= 1e3 * unit * max(1.0, float(np.max(np.abs(g)))) else limit


def divergence(act: str | Activation, sigma_w2: float, sigma_b2: float, depth: int = 200,
               dps: int | None = 40, norm: str | None = None, norm_at: str = "before",
               batch: int | None = None) -> Divergence:
    """Classify gamma^(l) as "exponential" (with rate), "power-law" (with exponent) or "finite".

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation` (pools included).
    sigma_w2, sigma_b2 : float
        Weight (> 0) and bias (>= 0) variances.
    depth : int
        Layers of gamma^(l) = c^(l)/(1 - c^(l)) to compute and fit.
    dps : int or None
        mpmath digits of the recursion (None: float64).
    norm, norm_at, batch : optional
        None / "layer" / "batch", "before" / "after" phi, BatchNorm batch size (None: B -> inf): gamma of
        the normalised recursion (docs/theory.md section 12). BatchNorm before phi reaches its batch fixed
        point after one normalised layer ("finite", gamma_star = ``sf.batchnorm(...).gamma``).

    Returns
    -------
    Divergence
        ``kind``, ``rate`` (gamma_(l+1)/gamma_l -> exp(rate)), ``exponent`` (gamma_l ~ l^exponent),
        ``gamma_star``, per-layer ``gamma``, fit residuals ``rms`` and ``precision``.

    Examples
    --------
    >>> sf.divergence("relu", 2.0, 0.0, depth=30).kind
    'power-law'
    """
    K = kernel(act)
    sw = float(check.real("divergence", "sigma_w2", sigma_w2, lo=0, lo_open=True))
    sb = float(check.real("divergence", "sigma_b2", sigma_b2, lo=0))
    depth = check.integer("divergence", "depth", depth, lo=20, hi=100000)
    dps = None if dps is None else check.integer("divergence", "dps", dps, lo=15, hi=1000)
    opts = nm.options("divergence", norm, norm_at, batch)
    if K.closed_form and dps is not None:
        exact = _gamma_mp(K, sw, sb, depth, dps) if opts is None else _gamma_norm_mp(K, opts, sw, sb, depth, dps)
        gamma = np.array([float(g) if g < mpmath.mpf("1e300") else np.inf for g in exact])
        log_gamma = np.array([float(mpmath.log(g)) if g > 0 else -np.inf for g in exact])
        usable = np.ones(depth, dtype=bool)
        precision = f"mpmath({dps})"
    else:
        r = propagate(K.act, sw, sb, depth, norm=norm, norm_at=norm_at, batch=batch)
        gamma = np.asarray(r.gamma, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            log_gamma = np.log(gamma)
        usable = np.isfinite(gamma)
        if not maps(K).D_exact:   # the plain difference V + V - 2C cancels as c -> 1
            usable &= np.asarray(r.one_minus_c) > 1e-11
        precision = "float64"
    layers = np.arange(1, depth + 1)
    limit = _geometric_limit(gamma, 10.0 ** -dps if precision.startswith("mpmath") else np.finfo(float).eps)
    if limit is not None:
        return Divergence("finite", None, None, limit, gamma, {}, precision)
    sel = usable & (layers > depth // 2) & np.isfinite(log_gamma)
    if sel.sum() < 10:
        raise PrecisionError(f"divergence: only {int(sel.sum())} usable layers in the second half "
                              f"(gamma overflowed float64 or 1 - c cancelled); use a smaller depth.")
    lg, ll = log_gamma[sel], layers[sel].astype(float)
    fits = {}
    for kind, xs in (("exponential", ll), ("power-law", np.log(ll))):
        A = np.vstack([np.ones_like(xs), xs, 1 / ll]).T  # 1/l: the leading finite-depth correction
        coef, *_ = np.linalg.lstsq(A, lg, rcond=None)
        fits[kind] = (coef[1], float(np.sqrt(np.mean((A @ coef - lg) ** 2))))
    kind = min(fits, key=lambda k: fits[k][1])
    rms = {k: v[1] for k, v in fits.items()}
    slope = float(fits[kind][0])
    return Divergence(kind, slope if kind == "exponential" else None, slope if kind == "power-law" else None,
                      None, gamma, rms, precision)
