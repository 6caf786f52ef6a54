"""Trainability at initialisation from the NTK's approach to its fixed point (Xiao, Pennington, Schoenholz 2020).

At the fixed point (q*, c*) the NTK recursion is affine in Theta (docs/theory.md section 13):

    Theta_aa' = q* + chi1 Theta_aa,          chi1   = sigma_w2 Tdot(q*, q*, q*)      = sigma_w2 E[|grad psi|^2]
    Theta_ab' = c* q* + chi_c* Theta_ab,     chi_c* = sigma_w2 Tdot(q*, q*, c* q*)

ordered (chi1 < 1): Theta -> q*/(1 - chi1), depth scale xi_1 = -1/log chi1; chaotic (chi1 > 1):
Theta_ab/Theta_aa -> 0 at xi* = -1/(log chi_c* - log chi1); edge of chaos (chi1 = 1): Theta_ab/Theta_aa
tends to 1/3 for smooth psi and 1/4 for the relu family.

For positively homogeneous psi with q* = 0 or inf (the relu family and its pools) the normalised NTK
theta = Theta/q obeys theta_aa' = 1 + rho theta_aa, rho = chi1/(sigma_w2 V(1)), with the c-map at q = 1;
the regime, xi_1 = -1/log rho and the ratio limit are those of theta. q* = 0 otherwise: Theta -> 0;
q* = inf for other psi: the depth scale is not derived (NaN). Derivations: docs/theory.md section 13.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from symfield.core import validate as check
from symfield.numeric.maps import maps
from symfield.symbolic.activation import Activation
from symfield.symbolic.kernel import kernel
from symfield.theory.phases import phase

_F = "trainability"


@dataclass(frozen=True)
class Trainability:
    """Depth scales of the NTK at (sigma_w2, sigma_b2); see the module docstring.

    ``regime`` ("ordered", "edge-of-chaos" or "chaotic"), ``phase`` (sf.phase's label), ``q_star``, ``c_star``,
    ``chi1``, ``chi_c_star``, ``theta_star`` (Theta_aa's limit; inf where it grows), ``theta_ab_star``,
    ``xi_1`` = -1/log chi1, ``xi_star`` = -1/(log chi_c* - log chi1), ``depth_scale`` (xi_1 ordered, xi* chaotic,
    inf on the edge), ``eoc_ratio_limit`` (lim Theta_ab/Theta_aa on the edge of chaos: 1/3 smooth, 1/4 relu
    family, None elsewhere or where not derived), ``note``, ``q_growth`` (sigma_w2 V(1) where q* is 0 or inf and
    psi is positively homogeneous: the regime, xi_1 and the limit then describe Theta/q, module docstring).
    Where a quantity is not derived it is NaN and ``note`` says why."""
    regime: str
    phase: str
    q_star: float
    c_star: float
    chi1: float
    chi_c_star: float
    theta_star: float
    theta_ab_star: float
    xi_1: float
    xi_star: float
    depth_scale: float
    eoc_ratio_limit: float | None
    note: str = ""
    q_growth: float | None = None


def _xi(rate: float) -> float:
    """-1/log(rate): the depth over which rate^l falls by e (inf at rate 1)."""
    if rate <= 0:
        return 0.0
    lg = math.log(rate)
    return math.inf if lg == 0 else -1 / lg


def _eoc_limit(K, q_star: float) -> tuple[float | None, str]:
    if K.degree_one and K.kinks and (K.act.pool is None or K.act.k == 1):
        return 0.25, "relu family: sigma_w2 Tdot_ab = 1 - 3/l, limit 1/4"
    if not K.kinks and (K.act.pool is None or K.act.k == 1) and 0 < q_star < math.inf:
        return 1 / 3, "smooth psi: sigma_w2 Tdot_ab = 1 - 2/l, limit 1/3"
    return None, "limit of Theta_ab/Theta_aa on the edge of chaos not derived for this psi (pool, or q* = 0 or inf)"


def trainability(act: str | Activation, sigma_w2: float, sigma_b2: float, eoc_tol: float = 1e-6) -> Trainability:
    """The NTK's fixed point and depth scales at one initialisation (Xiao et al. 2020).

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation` (pools included).
    sigma_w2 : float
        Weight variance (> 0).
    sigma_b2 : float
        Bias variance (>= 0).
    eoc_tol : float
        Half-width of the edge-of-chaos band in chi1 (as :func:`symfield.phase`).

    Returns
    -------
    Trainability
        regime, chi1, chi_c*, Theta*, xi_1, xi*, the depth scale and, on the edge of chaos, lim Theta_ab/Theta_aa.

    Examples
    --------
    >>> t = sf.trainability("relu", 2.0, 0.0)
    >>> t.regime, t.eoc_ratio_limit
    ('edge-of-chaos', 0.25)
    """
    K = kernel(act)
    sw = float(check.real(_F, "sigma_w2", sigma_w2, lo=0, lo_open=True))
    sb = float(check.real(_F, "sigma_b2", sigma_b2, lo=0))
    ph = phase(act, sw, sb, eoc_tol=eoc_tol, full=True)
    qs, cs, chi1 = ph.q_star, ph.c_star, ph.slope
    phase_note = ph.note if len(ph.note) < 300 else ""
    if K.degree_one and not 0 < qs < math.inf:
        return _homogeneous_limit(K, ph, sw, eoc_tol, phase_note)
    if cs >= 1 and abs(chi1 - 1) <= eoc_tol:
        regime = "edge-of-chaos"
    else:
        regime = "ordered" if chi1 < 1 else "chaotic"
    finite_q = 0 < qs < math.inf
    if cs < 1 and finite_q:
        chi_c = float(sw * maps(K).dC(np.array([qs]), np.array([qs]), np.array([cs * qs]))[0])
    else:
        chi_c = chi1
    theta = qs / (1 - chi1) if chi1 < 1 and finite_q else math.inf
    theta_ab = cs * qs / (1 - chi_c) if chi_c < 1 and finite_q else math.inf
    xi_1 = _xi(chi1)
    xi_star = math.inf if chi_c <= 0 or chi_c == chi1 else -1 / (math.log(chi_c) - math.log(chi1))
    limit, note = (None, "")
    if regime == "edge-of-chaos":
        limit, note = _eoc_limit(K, qs)
    depth = {"ordered": xi_1, "chaotic": xi_star}.get(regime, math.inf)
    if qs == 0 and chi1 < 1 - eoc_tol:
        theta = theta_ab = 0.0
        note = "; ".join(p for p in (note, "q* = 0 with chi1 < 1 at q -> 0: Theta_aa and Theta_ab fall to 0") if p)
    elif qs == math.inf:
        xi_star, depth = math.nan, (math.inf if regime == "edge-of-chaos" else math.nan)
        note = "; ".join(p for p in (note, "q* = inf and psi is not positively homogeneous: the NTK's depth scale "
                                     "is not derived (NaN); its maps only tend to those of psi's large-q limit") if p)
    return Trainability(regime, ph.label, qs, cs, chi1, chi_c, theta, theta_ab, xi_1, xi_star, depth, limit,
                        "; ".join(p for p in (note, phase_note) if p))


def _theta_over_q(K, sw: np.ndarray, cs: np.ndarray, slope: np.ndarray, eoc_tol: float):
    """The normalised NTK theta = Theta/q where q* is 0 or inf and psi is positively homogeneous (module
    docstring), vectorised: (sigma_w2 V(1), rho = chi1/(sigma_w2 V(1)), chi_c* = sigma_w2 Tdot(1, 1, c*) where
    c* < 1 else chi1, depth scale): xi* = -1/(log chi_c* - log chi1) where c* < 1; where c* = 1, inf on the edge
    (abs(rho - 1) <= eoc_tol), -1/log rho ordered, NaN for rho > 1 (not derived)."""
    growth = sw * maps(K).V(np.ones(sw.size))
    rho = slope / growth
    chi_c = np.array(slope, dtype=float)
    part = cs < 1
    if part.any():
        n = int(part.sum())
        chi_c[part] = sw[part] * maps(K).dC(np.ones(n), np.ones(n), cs[part])
    with np.errstate(divide="ignore", invalid="ignore"):
        xs = -1 / (np.log(chi_c) - np.log(slope))
        d = np.where(np.abs(rho - 1) <= eoc_tol, np.inf, np.where(rho < 1, -1 / np.log(rho), np.nan))
    return growth, rho, chi_c, np.where(part, xs, d)


def _homogeneous_limit(K, ph, sw: float, eoc_tol: float, phase_note: str) -> Trainability:
    """q* = 0 or inf, psi positively homogeneous: the regime and depth scales of the normalised NTK Theta/q
    (:func:`_theta_over_q` at one point)."""
    qs, cs, chi1 = ph.q_star, ph.c_star, ph.slope
    growth, rho, chi_c, depth = (float(v[0]) for v in _theta_over_q(K, np.array([sw]), np.array([cs]),
                                                                     np.array([chi1]), eoc_tol))
    scale = 0.0 if qs == 0 else math.inf           # where Theta itself goes
    limit, why = None, ""
    if cs < 1:
        regime, xi_star = "chaotic", depth
    else:
        xi_star = math.inf
        if math.isinf(depth):
            regime = "edge-of-chaos"
            limit, why = _eoc_limit(K, 1.0)
        elif rho < 1:
            regime = "ordered"
            why = f"Theta_aa/q -> 1/(1 - rho) = {1 / (1 - rho):.10g}, approached like rho^l"
        else:
            regime = "chaotic"
            why = "c* = 1 with rho > 1: the normalised NTK's depth scale is not derived (NaN)"
    note = (f"q* = {qs:g} and psi is positively homogeneous: Theta -> {scale:g} with q, and regime, xi_1 and the "
            f"limit describe Theta/q, whose slope is rho = chi1/(sigma_w2 V(1)) = {chi1:.10g}/{growth:.10g} = {rho:.10g}")
    return Trainability(regime, ph.label, qs, cs, chi1, chi_c, scale, scale, _xi(rho), xi_star, depth, limit,
                        "; ".join(p for p in (note, why, phase_note) if p), growth)


def depth_scale_fields(K, sw: np.ndarray, qs: np.ndarray, cs: np.ndarray, slope: np.ndarray,
                       eoc_tol: float) -> tuple[np.ndarray, np.ndarray]:
    """(chi_c*, depth scale) on arrays of fixed points (as :func:`trainability`, vectorised): xi_1 = -1/log chi1
    where c* = 1 and chi1 < 1, xi* = -1/(log chi_c* - log chi1) where c* < 1, inf on the edge of chaos; where q* is
    0 or inf and psi is positively homogeneous, those of the normalised NTK Theta/q (slope rho = chi1/(sigma_w2 V(1)))."""
    chi_c = np.array(slope, dtype=float)
    inner = (cs < 1) & (qs > 0) & np.isfinite(qs)
    if inner.any():
        chi_c[inner] = sw[inner] * maps(K).dC(qs[inner], qs[inner], cs[inner] * qs[inner])
    with np.errstate(divide="ignore", invalid="ignore"):
        xi_1 = -1 / np.log(slope)
        xi_s = -1 / (np.log(chi_c) - np.log(slope))
    edge = (cs >= 1) & (np.abs(slope - 1) <= eoc_tol)
    # not derived (NaN): q* = 0 or inf with c* < 1, and c* = 1 with chi1 > 1 (chaotic deep prejudice)
    out = np.where(cs >= 1, np.where(slope < 1, xi_1, np.nan), np.where(inner, xi_s, np.nan))
    out = np.where(edge, np.inf, out)
    lim = ~((qs > 0) & np.isfinite(qs))
    if K.degree_one and lim.any():     # the normalised NTK Theta/q, as trainability's _homogeneous_limit
        _, _, chi_c[lim], out[lim] = _theta_over_q(K, sw[lim], cs[lim], slope[lim], eoc_tol)
    return chi_c, out
