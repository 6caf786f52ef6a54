"""The NTK recursion's core, shared by :func:`symfield.ntk` and ``propagate(..., ntk=True)`` (docs/theory.md section 13).

    terms_f64 / terms_mp:  V, D, Tdot_aa, Tdot_ab, dTdot of every layer's NNGP kernel (the maps engine)
    theta_f64 / theta_mp:  Theta_aa, Theta_ab, d_Theta per layer (and the layer shares), given those terms
    compiled_maps:         the same maps of a closed-form kernel as SymPy expressions for the compiled grid
                           recursion (propagate(..., ntk=True); symfield.numeric.kernels.closed_maps)

Layer l -> l+1: Theta' = A Theta + B with A = [1 if residual] + g sigma_w2 Tdot, B = g (cw T + cb), g = alpha^2 or 1,
(cw, cb) = (sigma_w2, sigma_b2) in the NTK parameterisation, (n, 1) in the standard one; the NTK distance
d_Theta' = A_aa d_Theta + g (cw D + 2 sigma_w2 dTdot Theta_ab).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import mpmath
import numpy as np
import sympy as sp

from symfield.core.errors import InvalidValue, NotPrintable, SYMPY_GAVE_UP, Unsupported
from symfield.numeric.codegen import NtkMaps
from symfield.numeric.distance import SERIES_D, rule as distance_rule
from symfield.numeric.evaluate import GUARD_DIGITS, to_mpf
from symfield.numeric.maps import maps
from symfield.symbolic.activation import Activation
from symfield.symbolic.distance import distance
from symfield.symbolic.formula import X
from symfield.symbolic.gaussian import q1 as Q1, q2 as Q2, q12 as Q12
from symfield.symbolic.kernel import kernel


@dataclass(frozen=True)
class Coefficients:
    """Layer l -> l+1: A = [1 if residual] + g sigma_w2 Tdot, B = g (cw T + cb), g = alpha^2 or 1."""
    sw: object
    cw: object
    cb: object
    alpha: object

    @property
    def g(self):
        return 1 if self.alpha is None else self.alpha * self.alpha

    @property
    def skip(self):
        return 0 if self.alpha is None else 1


# paired with theta_mp: float64 runs on (depth, points) arrays, mpmath on lists with guard digits (docs/numerics.md section 7)
def theta_f64(first, terms, c):
    """Theta_aa, Theta_ab, d_Theta (arrays (depth, *points), row 0 = layer 1) and the layer shares at the last
    layer, from float64 ``terms`` (each (depth, *points)) and ``first`` = layer 1's (aa, ab, d)."""
    V, D, td_aa, td_ab, dtd = (np.asarray(t, dtype=float) for t in terms)
    n, g, skip = V.shape[0], c.g, c.skip
    taa, tab, dth = (np.empty(V.shape) for _ in range(3))
    A_aa, A_ab, B_aa, B_ab = (np.ones(V.shape) for _ in range(4))
    taa[0], tab[0], dth[0] = first
    B_aa[0], B_ab[0] = taa[0], tab[0]
    with np.errstate(over="ignore", invalid="ignore"):
        for i in range(n - 1):          # layer i+1 -> i+2 with the maps at layer i+1's kernel
            A_aa[i + 1] = skip + g * c.sw * td_aa[i]
            A_ab[i + 1] = skip + g * c.sw * td_ab[i]
            B_aa[i + 1] = g * (c.cw * V[i] + c.cb)
            B_ab[i + 1] = g * (c.cw * (V[i] - D[i] / 2) + c.cb)
            taa[i + 1] = A_aa[i + 1] * taa[i] + B_aa[i + 1]
            tab[i + 1] = A_ab[i + 1] * tab[i] + B_ab[i + 1]
            dth[i + 1] = A_aa[i + 1] * dth[i] + g * (c.cw * D[i] + 2 * c.sw * dtd[i] * tab[i])
        shares = []
        for A, B, T in ((A_aa, B_aa, taa), (A_ab, B_ab, tab)):
            later = np.ones(V.shape)        # prod_{j > i} A_j
            for i in range(n - 2, -1, -1):
                later[i] = later[i + 1] * A[i + 1]
            shares.append(B * later / T[n - 1])
    return taa, tab, dth, shares


def theta_mp(first, terms, c):
    """The same recursion on lists of mpmath numbers (object arrays out)."""
    V, D, td_aa, td_ab, dtd = terms
    n, g, skip = len(V), c.g, c.skip
    taa, tab, dth = [first[0]], [first[1]], [first[2]]
    A_aa, A_ab, B_aa, B_ab = [1], [1], [first[0]], [first[1]]
    for i in range(n - 1):
        A_aa.append(skip + g * c.sw * td_aa[i])
        A_ab.append(skip + g * c.sw * td_ab[i])
        B_aa.append(g * (c.cw * V[i] + c.cb))
        B_ab.append(g * (c.cw * (V[i] - D[i] / 2) + c.cb))
        dth.append(A_aa[-1] * dth[-1] + g * (c.cw * D[i] + 2 * c.sw * dtd[i] * tab[-1]))
        taa.append(A_aa[-1] * taa[-1] + B_aa[-1])
        tab.append(A_ab[-1] * tab[-1] + B_ab[-1])
    shares = []
    for A, B, T in ((A_aa, B_aa, taa), (A_ab, B_ab, tab)):
        out, prod = [None] * n, 1
        for i in range(n - 1, -1, -1):      # layer i+1's parameters: B_i times the later slopes
            out[i] = B[i] * prod / T[n - 1] if T[n - 1] != 0 else mpmath.nan
            prod = prod * A[i]
        shares.append(np.array(out, dtype=object))
    return tuple(np.array(v, dtype=object) for v in (taa, tab, dth)) + (shares,)


# ------------------------------------------------------------------------------------------- the maps per layer
def _derivative_kernel(K):
    """The kernel of phi' (single node), or None (a pool of k > 1 or no derivative kernel)."""
    act = K.act if K.base is None else K.base.act
    if K.act.pool is not None and K.act.k > 1 and K.act.pool == "max":
        return None
    try:
        d1 = sp.diff(act.expr, X)
        if d1.has(sp.DiracDelta):
            return None
        return kernel(Activation(f"d({act.name})/dx", d1))
    except (Unsupported, InvalidValue, *SYMPY_GAVE_UP):
        return None


_GL_T, _GL_W = np.polynomial.legendre.leggauss(8)
_GL3_T, _GL3_W = np.polynomial.legendre.leggauss(3)
TINY_D = 1e-8   # 3 Gauss-Legendre points do for d <= TINY_D max(q, 1): the rule's error is ~(d/q)^6 of dTdot
PRICE_NOTE = ("dTdot by Price's theorem, (d/2) int d(dC)/dq12 (8-point Gauss-Legendre, 3 points below d = 1e-8) "
              "for d <= 1e-4, plain above")


def _price_form(K):
    """d/dq12 of a closed-form, kink-free dC (= E[grad^2 psi(u) : grad^2 psi(v)] by Price's theorem), or None."""
    if K.kinks or K.dC.has(sp.Integral) or (K.act.pool == "max" and K.act.k > 1):
        return None
    return sp.diff(K.dC, Q12)


def _dtdot_small(K, M, dC2, qv, cv, dv):
    """dTdot = dC(q, q, q) - dC(q, q, q - d/2) = (d/2) int_0^1 dC2(q, q, q - t d/2) dt by 8-point Gauss-Legendre,
    3 points for d <= TINY_D max(q, 1) (dC2 is analytic near c = 1 for a kink-free psi; no difference of nearly
    equal numbers). The compiled recursion's closed_maps.joint_rows uses the same rule."""
    total = np.zeros(qv.shape)
    tiny = dv <= TINY_D * np.maximum(qv, 1.0)
    for sel, T, W in ((~tiny, _GL_T, _GL_W), (tiny, _GL3_T, _GL3_W)):
        if sel.any():
            a, dd = qv[sel], dv[sel]
            part = np.zeros(a.shape)
            for t, w in zip((T + 1) / 2, W / 2):
                part += w * M.expect(dC2, (Q1, Q2, Q12), (a, a, a - t * dd / 2))
            total[sel] = part
    return dv / 2 * total


def terms_f64(K, q, qab, d, vd=None):
    """V, D, Tdot_aa, Tdot_ab, dTdot at every layer (float64 arrays from the maps engine); ``vd`` = (V, D) when the
    caller has them already (propagate: from the next layer's kernel), else the engine evaluates them."""
    M = maps(K)
    ok = np.isfinite(q) & np.isfinite(d)
    out = [np.full(q.shape, np.nan) for _ in range(5)]
    qv, cv, dv = q[ok], qab[ok], d[ok]
    if vd is None:
        out[0][ok], out[1][ok] = M.V(qv), M.D(qv, qv, cv, dv)
    else:
        out[0], out[1] = (np.asarray(v, dtype=float) for v in vd)
    out[2][ok], out[3][ok] = M.dpsi2(qv), M.dC(qv, qv, cv)
    dtd = out[2][ok] - out[3][ok]
    small = dv <= SERIES_D * np.maximum(qv, 1.0)
    dC2 = _price_form(K)
    td_ab = out[3][ok]      # where dTdot has its cancellation-free form, Tdot_ab = E[psi'^2] - dTdot: dC's
    if dC2 is not None:     # sqrt(q^2 - q12^2) loses digits as c -> 1
        if small.any():
            dtd[small] = _dtdot_small(K, M, dC2, qv[small], cv[small], dv[small])
            td_ab[small] = out[2][ok][small] - dtd[small]
        out[3][ok], out[4][ok] = td_ab, dtd
        return out, PRICE_NOTE, True
    Kd = _derivative_kernel(K)
    if Kd is None:
        out[4][ok] = dtd
        return out, "dTdot = dpsi2 - dC (plain difference: loses digits as c -> 1)", False
    r = distance_rule(Kd)
    k = 1 if K.act.pool is None else K.act.k
    use = np.ones(qv.shape, bool) if Kd.closed_form and r.exact else small
    if use.any():
        dtd[use] = maps(Kd).D(qv[use], qv[use], cv[use], dv[use]) / (2 * k)
        near = use & (dv <= qv)
        td_ab[near] = out[2][ok][near] - dtd[near]
    out[3][ok], out[4][ok] = td_ab, dtd
    how = f"dTdot = D[phi']/2{'' if k == 1 else f'/{k}'} ({r.method})" + ("" if use.all() else ", plain above d = 1e-4")
    return out, how, r.exact


@lru_cache(maxsize=64)
def compiled_maps(K) -> NtkMaps | None:
    """The NTK's maps of a closed-form kernel K for the compiled grid recursion, by the rules of :func:`terms_f64`:
    Tdot_aa = E[psi'^2], Tdot_ab = dC, and dTdot by Price's theorem (dC free of kinks), by the distance map of
    phi' (when that map has a checked closed form in d), or as the plain difference (no derivative kernel). None
    where the rule of terms_f64 has no printed form (no closed form, phi' without a closed-form distance map, a
    function outside the printer's table): propagate then runs terms_f64."""
    if not K.closed_form or K.dpsi2.has(sp.Integral) or K.dC.has(sp.Integral):
        return None
    dC2 = _price_form(K)
    if dC2 is not None:
        forms = NtkMaps(K.dpsi2, K.dC, "price", T2=dC2, small=SERIES_D)
    else:
        Kd = _derivative_kernel(K)
        if Kd is None:
            forms = NtkMaps(K.dpsi2, K.dC, "plain")
        elif Kd.closed_form and distance(Kd).stable:
            dist = distance(Kd)
            k = 1 if K.act.pool is None else K.act.k
            forms = NtkMaps(K.dpsi2, K.dC, "derivative", dt_eq=dist.near_eq, div=2 * k)
        else:
            return None
    try:
        forms.printed(K.act.name)
    except NotPrintable:
        return None
    return forms


def compiled_note(forms: NtkMaps) -> tuple:
    """(how dTdot is evaluated, whether it keeps its relative accuracy as c -> 1) for the compiled maps ``forms``."""
    if forms.mode == "price":
        return PRICE_NOTE, True
    if forms.mode == "derivative":
        return f"dTdot = D[phi']/{forms.div} (closed form in d) for c >= 1/2, plain difference below", True
    return "dTdot = dpsi2 - dC (plain difference: loses digits as c -> 1)", False


def terms_mp(K, q, qab, d, dps):
    """The same in mpmath: dTdot = dpsi2 - dC at dps + log10(q/d) + guard digits (no digits lost)."""
    M = maps(K, dps)
    out = [[], [], [], [], []]
    for qa, qc, dd in zip(q, qab, d):
        out[0].append(M.V(qa))
        out[1].append(M.D(qa, qa, qc, dd))
        out[2].append(M.dpsi2(qa))
        out[3].append(M.dC(qa, qa, qc))
        extra = 0 if dd <= 0 else max(0, int(mpmath.log10(max(qa, 1) / dd)))
        work = dps + 10 * (extra // 10 + 1) + GUARD_DIGITS
        Mw = maps(K, work)
        with mpmath.workdps(work):
            qa_w = to_mpf(qa)
            diff = Mw.dpsi2(qa_w) - Mw.dC(qa_w, qa_w, qa_w - to_mpf(dd) / 2)
        with mpmath.workdps(dps + GUARD_DIGITS):
            out[4].append(+diff)
    return out
