"""The five phases of Table 1 of Bassi et al. and the depth scales (docs/theory.md sections 5 and 6).

The phase of (sigma_w2, sigma_b2) follows from q*, c* (gamma* = c*/(1 - c*)) and the slope of the c-map at
c = 1 (chi1 at q*, or the limit map's slope where q* is 0 or inf); xi_q and xi_c are the depth scales of
Schoenholz et al. at the fixed point.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from symfield.core import validate as check
from symfield.numeric.maps import maps
from symfield.symbolic.activation import Activation
from symfield.symbolic.kernel import kernel

from symfield.theory import norm as nm
from symfield.theory.cstar import c_star_f64, gap_star
from symfield.theory.qstar import at_infinity, at_zero, fixed_points, limit_q


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
    cs, qs = c_star_f64(K, sw, sb)
    finite = (qs > 0) & (qs < math.inf)
    L, at_inf = at_infinity(K, qs)
    Z, at_0 = at_zero(K, qs)
    qe = np.where(finite, qs, limit_q(K, qs))
    slope = np.empty(qs.shape)
    on = ~at_inf & ~at_0
    slope[on] = sw[on] * maps(K).dpsi2(qe[on])
    for E, lim in ((L, at_inf), (Z, at_0)):       # the exact limit kernels' E[psi'^2] (q-independent)
        if lim.any():
            slope[lim] = sw[lim] * E.dpsi2(np.ones(int(lim.sum())))
    gap = gap_star(K, sw, sb, cs, qs)          # 1 - c*, from the distance map where c* is near 1
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
          full: bool = False, norm: str | None = None, norm_at: str = "before",
          batch: int | None = None) -> str | Phase:
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
    norm : {None, 'layer', 'batch'}
        Normalisation (docs/theory.md section 12): c* of the normalised c-map and chi1 = its slope at
        c = 1 (LayerNorm), or the batch fixed point and the gradient rate lambda_B (BatchNorm).
    norm_at : {'before', 'after'}
        Normalise the pre-activation h ("before") or phi(h) ("after").
    batch : int, optional
        BatchNorm batch size B >= 2; None for B -> infinity.

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
    opts = nm.options("phase", norm, norm_at, batch)
    if opts is not None:
        qs, cs, gamma, slope, note = nm.normed_phase(K, opts, sw, sb)
        code = nm.phase_code(cs, slope, tol)
        return PHASES[code] if not full else Phase(PHASES[code], qs, cs, gamma, slope, note)
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
    c_all, q_all = (v.reshape(sw.shape) for v in c_star_f64(K, sw.ravel(), sb.ravel()))
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
                        lambda K, qs, cs: float(maps(K).dV(qs)))


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
                        lambda K, qs, cs: float(maps(K).dC(qs, qs, cs * qs)))
