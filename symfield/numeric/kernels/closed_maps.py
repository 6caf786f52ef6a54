"""The maps of a closed-form kernel in compiled code: V, C and D call the printed expressions
``V_expr(q)``, ``C_expr(q1, q2, q12)`` and the distance forms ``D_eq(q, d)``, ``D_near(q1, q2, d)``,
``D_far(q1, q2, q12)`` that :mod:`symfield.numeric.codegen` prints above this code from the kernel's SymPy
expressions (the generated code IS the formula). M is unused (closed forms have no data).

The NTK's maps (docs/theory.md section 13) likewise: P(N, q) = E[psi'^2], and ntk_maps(N, p, q, q12, d) gives
P = p, dC/dq12 and their difference at equal norms from the printed ``P_expr``, ``T_expr``, ``T2_expr`` and
``DT_eq`` by the printed DT_MODE (N unused).
A module printed without the NTK has stand-ins that return NaN there (never called: ntk False).
"""
from __future__ import annotations

import numpy as np

from symfield.numeric.kernels.jit import OPTS, njit

DT_MODE = 0        # stand-ins: printed by codegen (0 plain difference, 1 Price's theorem, 2 distance map of phi')
DT_DIV = 2.0       # mode 2: dT = D[phi']/DT_DIV (2 k for an avg-pool of k)
DT_SMALL = 1e-4    # mode 1: the quadrature form for d <= DT_SMALL max(q, 1)


def V_expr(q):                 # stand-ins: printed by codegen into the generated module
    raise NotImplementedError


def C_expr(q1, q2, q12):
    raise NotImplementedError


def D_eq(q, d):
    raise NotImplementedError


def D_near(q1, q2, d):
    raise NotImplementedError


def D_far(q1, q2, q12):
    raise NotImplementedError


def P_expr(q):
    raise NotImplementedError


def T_expr(q1, q2, q12):
    raise NotImplementedError


def T2_expr(q1, q2, q12):
    raise NotImplementedError


def DT_eq(q, d):
    raise NotImplementedError


def CT_expr(q1, q2, q12):      # (C_expr, T_expr) printed side by side
    raise NotImplementedError


def DDT_eq(q, d):              # (D_eq, DT_eq) printed side by side
    raise NotImplementedError


# ---- compiled ----
@njit(inline="always", **OPTS)
def V(M, q):
    return V_expr(q)


@njit(inline="always", **OPTS)
def C(M, q1, q2, q12):
    return C_expr(q1, q2, q12)


@njit(inline="always", **OPTS)
def D(M, q1, q2, q12, d):
    """E[(psi(u) - psi(v))^2], d = q1 + q2 - 2 q12: in d where c >= 1/2 (no cancellation as c -> 1), else in q12."""
    if d <= 0.5 * (q1 + q2):
        if q1 == q2:
            return D_eq(q1, d)
        return D_near(q1, q2, d)
    return D_far(q1, q2, q12)


@njit(inline="always", **OPTS)
def in_domain(M, qa, qb, qab):
    return True


_GL = np.polynomial.legendre.leggauss(8)
GL_T = (_GL[0] + 1.0) / 2.0      # 8-point Gauss-Legendre on [0, 1]
GL_W = _GL[1] / 2.0
_GL3 = np.polynomial.legendre.leggauss(3)
GL3_T = (_GL3[0] + 1.0) / 2.0    # 3 points where d <= DT_TINY max(q, 1)
GL3_W = _GL3[1] / 2.0
DT_TINY = 1e-8


@njit(inline="always", **OPTS)
def P(N, q):
    return P_expr(q)


@njit(inline="always", **OPTS)
def ntk_maps(N, p, q, q12, d):
    """(P, T, dT) at equal norms q, covariance q12, d = 2 (q - q12), given p = P = E[psi'^2](q): T = dC/dq12 and
    dT = P - T,
    without cancellation as c -> 1 by DT_MODE: 1 (dC free of kinks, T2 = d(dC)/dq12) for d <= DT_SMALL max(q, 1)
    Price's theorem, dT = (d/2) int_0^1 T2(q, q, q - t d/2) dt by 8-point Gauss-Legendre (3 points for
    d <= DT_TINY max(q, 1), where the rule's error is ~(d/q)^6 of dT: below rounding); 2 for c >= 1/2 the
    distance map of phi' (D[phi'] = E[(phi'(u) - phi'(v))^2] in d) over DT_DIV. There T = P - dT (the printed dC has
    sqrt(q^2 - q12^2) in it, which loses digits as c -> 1); elsewhere, and in mode 0, T is the printed dC and
    dT = P - T (no cancellation where c < 1/2 or d > DT_SMALL max(q, 1))."""
    if DT_MODE == 1 and d <= DT_SMALL * max(q, 1.0):
        s = 0.0
        if d <= DT_TINY * max(q, 1.0):
            for i in range(3):
                s += GL3_W[i] * T2_expr(q, q, q - GL3_T[i] * d / 2)
        else:
            for i in range(8):
                s += GL_W[i] * T2_expr(q, q, q - GL_T[i] * d / 2)
        dt = d / 2 * s
        return p, p - dt, dt
    if DT_MODE == 2 and d <= q:
        dt = DT_eq(q, d) / DT_DIV
        return p, p - dt, dt
    t = T_expr(q, q, q12)
    return p, t, p - t


@njit(inline="always", **OPTS)
def joint_maps(M, N, va, p, q, q12, d):
    """(C, D, T, dT) at equal norms q, va = V(q), p = P(q): the layer's maps (C or D by c >= 1/2, the other one derived,
    as layer_maps) and ntk_maps, with the printed pairs CT_expr = (C, T) and DDT_eq = (D, D[phi']) where both are
    needed (the same numbers as each by itself)."""
    if d <= 0.5 * (q + q):
        if DT_MODE == 2:
            dv, dt = DDT_eq(q, d)
            dt = dt / DT_DIV
            return 0.5 * (va + va - dv), dv, p - dt, dt
        dv = D(M, q, q, q12, d)
        _, t, dt = ntk_maps(N, p, q, q12, d)
        return 0.5 * (va + va - dv), dv, t, dt
    if DT_MODE == 1 and d <= DT_SMALL * max(q, 1.0):
        cv = C(M, q, q, q12)
        _, t, dt = ntk_maps(N, p, q, q12, d)
    else:
        cv, t = CT_expr(q, q, q12)
        dt = p - t
    return cv, va + va - 2.0 * cv, t, dt
