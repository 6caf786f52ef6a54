"""The maps of a closed-form kernel in compiled code: V, C and D call the printed expressions
``V_expr(q)``, ``C_expr(q1, q2, q12)`` and the distance forms ``D_eq(q, d)``, ``D_near(q1, q2, d)``,
``D_far(q1, q2, q12)`` that :mod:`symfield.numeric.codegen` prints above this code from the kernel's SymPy
expressions (the generated code IS the formula). M is unused (closed forms have no data).

The NTK's maps (docs/theory.md section 13) likewise: P(N, q) = E[psi'^2], and joint_rows(k, m, q, q12, d, rows, branch)
gives C, D, dC/dq12 and its difference from P at equal norms from the printed ``P_expr``, ``T_expr``, ``T2_expr`` and
``DT_eq`` by the printed DT_MODE (N unused).
A module printed without the NTK has stand-ins that return NaN there (never called: ntk False).
"""
from __future__ import annotations

import numpy as np

from symfield.numeric.kernels.jit import OPTS, njit

NTK_MAPS = False   # stand-ins: printed by codegen (the module has the NTK's maps)
MEMO_V = False     # (V calls a function without a vector form, exp, erf, ...: the recursion memoises V per point)
DT_MODE = 0        # (0 plain difference, 1 Price's theorem, 2 distance map of phi')
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
UNIFORM = True     # the recursion may run a block as one loop without branches (no data, domain everywhere)
BRANCH0 = NTK_MAPS and DT_MODE == 2   # the branches of joint_rows this module's maps can take (module constants:
BRANCH1 = NTK_MAPS and DT_MODE == 1   # numba compiles no code for the others)
BRANCH2 = NTK_MAPS and DT_MODE == 1
BRANCH3 = NTK_MAPS and DT_MODE != 2
BRANCH4 = NTK_MAPS
BRANCH5 = NTK_MAPS and DT_MODE == 1


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
def C_equal(M, q, q12):
    """C at equal norms: the printed C, as C(M, q, q, q12)."""
    return C_expr(q, q, q12)


@njit(inline="always", **OPTS)
def D_equal(M, q, q12, d):
    """D at equal norms where c >= 1/2: the printed D_eq, as D(M, q, q, q12, d) there."""
    return D_eq(q, d)


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
def _gl3(q, d):
    s = 0.0
    for i in range(3):
        s += GL3_W[i] * T2_expr(q, q, q - GL3_T[i] * d / 2)
    return d / 2 * s


@njit(inline="always", **OPTS)
def _gl8(q, d):
    s = 0.0
    for i in range(8):
        s += GL_W[i] * T2_expr(q, q, q - GL_T[i] * d / 2)
    return d / 2 * s


@njit(inline="always", **OPTS)
def _price_dt(q, d):
    """Price's theorem (DT_MODE 1): dT = (d/2) int_0^1 T2(q, q, q - t d/2) dt by 8-point Gauss-Legendre (3 points for
    d <= DT_TINY max(q, 1), where the rule's error is ~(d/q)^6 of dT: below rounding)."""
    return _gl3(q, d) if d <= DT_TINY * max(q, 1.0) else _gl8(q, d)


@njit(inline="always", **OPTS)
def joint_branch(q, d):
    """Which formulas joint_rows uses at equal norms q and distance d (the recursion runs the points of a block branch by
    branch, each as one loop): c >= 1/2 (d <= q) with DT_MODE 2: 0, the printed pair (D, D[phi']); else D and Price's
    theorem for d <= DT_SMALL max(q, 1) (DT_MODE 1) by 3 points (1, d <= DT_TINY max(q, 1)) or 8 (2), or 3, D and the
    printed T; c < 1/2: 4, the printed pair (C, T), or 5, C and Price's theorem (DT_MODE 1, d <= DT_SMALL max(q, 1):
    q below it)."""
    price = DT_MODE == 1 and d <= DT_SMALL * max(q, 1.0)
    if d <= 0.5 * (q + q):
        if DT_MODE == 2:
            return 0
        if price:
            return 1 if d <= DT_TINY * max(q, 1.0) else 2
        return 3
    return 5 if price else 4


@njit(inline="always", **OPTS)
def _joint0(va, p, q, q12, d):      # c >= 1/2, DT_MODE 2: the printed pair (D, D[phi'])
    dv, dt = DDT_eq(q, d)
    dt = dt / DT_DIV
    return 0.5 * (va + va - dv), dv, p - dt, dt


@njit(inline="always", **OPTS)
def _joint1(va, p, q, q12, d):      # c >= 1/2, DT_MODE 1, d <= DT_TINY max(q, 1): D and Price's theorem, 3 points
    dv = D_eq(q, d)
    dt = _gl3(q, d)
    return 0.5 * (va + va - dv), dv, p - dt, dt


@njit(inline="always", **OPTS)
def _joint2(va, p, q, q12, d):      # c >= 1/2, DT_MODE 1, d <= DT_SMALL max(q, 1): D and Price's theorem, 8 points
    dv = D_eq(q, d)
    dt = _gl8(q, d)
    return 0.5 * (va + va - dv), dv, p - dt, dt


@njit(inline="always", **OPTS)
def _joint3(va, p, q, q12, d):      # c >= 1/2 otherwise: D and the printed T
    dv = D_eq(q, d)
    t = T_expr(q, q, q12)
    return 0.5 * (va + va - dv), dv, t, p - t


@njit(inline="always", **OPTS)
def _joint4(va, p, q, q12, d):      # c < 1/2: the printed pair (C, T)
    cv, t = CT_expr(q, q, q12)
    return cv, va + va - 2.0 * cv, t, p - t


@njit(inline="always", **OPTS)
def _joint5(va, p, q, q12, d):      # c < 1/2, DT_MODE 1, d <= DT_SMALL max(q, 1) (q below it): C and Price's theorem
    cv = C_expr(q, q, q12)
    dt = _price_dt(q, d)
    return cv, va + va - 2.0 * cv, p - dt, dt


@njit(inline="always", **OPTS)
def joint_rows(k, m, q, q12, d, rows, branch):
    """(C, D, T, dT) at equal norms by the formulas of branch k (:func:`joint_branch`) at the m points with
    branch[j] == k: rows[:4, j], from rows[4, j] = V(q[j]) and rows[5, j] = P(q[j]) -- one loop of that branch's
    formulas over all m points (it vectorises; the others' results are not stored). The layer's maps are C or D by
    c >= 1/2, the other one derived (as layer_maps); the NTK's T = dC/dq12 and dT = P - T without cancellation as
    c -> 1 -- DT_MODE 1 (dC free of kinks, T2 = d(dC)/dq12): Price's theorem for d <= DT_SMALL max(q, 1); 2: for
    c >= 1/2 the distance map of phi' (D[phi'] = E[(phi'(u) - phi'(v))^2] in d) over DT_DIV. There T = P - dT (the
    printed dC has sqrt(q^2 - q12^2) in it, which loses digits as c -> 1); elsewhere, and in mode 0, T is the
    printed dC and dT = P - T (no cancellation where c < 1/2 or d > DT_SMALL max(q, 1)). The printed pairs
    CT_expr = (C, T) and DDT_eq = (D, D[phi']) give the same numbers as each by itself, computing what they share
    once. (BRANCHk: whether this module's maps take branch k; numba compiles no code for the others.)"""
    if BRANCH0 and k == 0:
        for j in range(m):
            c, dv, t, dt = _joint0(rows[4, j], rows[5, j], q[j], q12[j], d[j])
            if branch[j] == 0:
                rows[0, j], rows[1, j], rows[2, j], rows[3, j] = c, dv, t, dt
    elif BRANCH1 and k == 1:
        for j in range(m):
            c, dv, t, dt = _joint1(rows[4, j], rows[5, j], q[j], q12[j], d[j])
            if branch[j] == 1:
                rows[0, j], rows[1, j], rows[2, j], rows[3, j] = c, dv, t, dt
    elif BRANCH2 and k == 2:
        for j in range(m):
            c, dv, t, dt = _joint2(rows[4, j], rows[5, j], q[j], q12[j], d[j])
            if branch[j] == 2:
                rows[0, j], rows[1, j], rows[2, j], rows[3, j] = c, dv, t, dt
    elif BRANCH3 and k == 3:
        for j in range(m):
            c, dv, t, dt = _joint3(rows[4, j], rows[5, j], q[j], q12[j], d[j])
            if branch[j] == 3:
                rows[0, j], rows[1, j], rows[2, j], rows[3, j] = c, dv, t, dt
    elif BRANCH4 and k == 4:
        for j in range(m):
            c, dv, t, dt = _joint4(rows[4, j], rows[5, j], q[j], q12[j], d[j])
            if branch[j] == 4:
                rows[0, j], rows[1, j], rows[2, j], rows[3, j] = c, dv, t, dt
    elif BRANCH5 and k == 5:
        for j in range(m):
            c, dv, t, dt = _joint5(rows[4, j], rows[5, j], q[j], q12[j], d[j])
            if branch[j] == 5:
                rows[0, j], rows[1, j], rows[2, j], rows[3, j] = c, dv, t, dt
