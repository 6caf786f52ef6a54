"""V, C and D of a certified table, read from its packed array M (layout: :mod:`.layout`).

One function per map, each for one point: the same code runs as plain Python (scalar calls, the table
builder's spot checks, tests) and compiled inside the generated table module, where the recursion of
:mod:`.recursion` calls it per grid point. theta = atan2(sqrt((1 - c)(1 + c)), c) (|c| for odd or even
psi), q in its panel's coordinate x (sqrt(q) on panel 0, log2 q above), interpolation by Clenshaw's
recurrence over the cell's NT x NT Chebyshev coefficients (docs/numerics.md section 3).
The NTK's maps (P, joint_rows) are NaN here: a table holds no derivative maps, so propagate(ntk=True) on a table
evaluates them with the engine in NumPy (symfield.theory.ntk_core.terms_f64); the recursion never calls them.
"""
from __future__ import annotations

import math

import numpy as np

from symfield.numeric.kernels.jit import OPTS, njit
from symfield.numeric.kernels.layout import (BLOCK, DEGREE, E0, HAS_R, KIND, NT, OFF_COEF, OFF_EDGES, OFF_FIRST,
                                             OFF_RCOEF, OFF_REDGES, OFF_RFIRST, OFF_V, P_HI, P_LO, PARITY, PSI0SQ,
                                             Q0, SCALED, SQ0, V1)

# ---- compiled ----
# ---- Chebyshev sums: compiled modules print an unrolled equivalent (symfield.numeric.chebyshev.compiled_source)


@njit(inline="always", **OPTS)
def _cheb1(c, o, y):
    """sum_(k<NT) c[o + k] T_k(y) (Clenshaw)."""
    b1 = 0.0
    b2 = 0.0
    for k in range(NT - 1, 0, -1):
        b0 = 2.0 * y * b1 - b2 + c[o + k]
        b2 = b1
        b1 = b0
    return y * b1 - b2 + c[o]


@njit(inline="always", **OPTS)
def _cheb2(c, o, x, y):
    """sum_(i,j<NT) c[o + NT i + j] T_i(x) T_j(y): Clenshaw in x over the rows' sums in y."""
    b1 = 0.0
    b2 = 0.0
    for i in range(NT - 1, 0, -1):
        b0 = 2.0 * x * b1 - b2 + _cheb1(c, o + NT * i, y)
        b2 = b1
        b1 = b0
    return x * b1 - b2 + _cheb1(c, o, y)
# ---- end of the Chebyshev sums


@njit(inline="always", **OPTS)
def _panel(M, q):
    """(i, x): index of q's panel among those stored (-1 if none) and q's coordinate in [-1, 1]."""
    if q < M[Q0]:
        p = 0
        x = 2.0 * math.sqrt(q) / M[SQ0] - 1.0
    else:
        mant, e = math.frexp(q)
        p = e - int(M[E0])
        x = 2.0 * math.log2(mant) + 1.0
    if p < M[P_LO] or p > M[P_HI] or not (0.0 <= q < math.inf):
        return -1, x
    return p - int(M[P_LO]), x


@njit(inline="always", **OPTS)
def _locate(M, first, edges, i, th):
    """(j, y): the last cell j of panel i (first-cell index at M[first], edges at M[edges]) whose lower
    edge is <= theta, and theta's coordinate y in [-1, 1] in it."""
    lo = int(M[first + i])
    hi = int(M[first + i + 1]) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if M[edges + 2 * mid] <= th:
            lo = mid
        else:
            hi = mid - 1
    ta = M[edges + 2 * lo]
    tb = M[edges + 2 * lo + 1]
    return lo, min(1.0, max(-1.0, (2.0 * th - ta - tb) / (tb - ta)))


@njit(inline="always", **OPTS)
def in_domain(M, qa, qb, qab):
    """True where the table can evaluate the step (always for the homogeneous kind)."""
    if M[KIND] == 1.0:
        return True
    return _panel(M, qa)[0] >= 0


@njit(**OPTS)
def V(M, q):
    """homogeneous: V(1) q^n; general: q v(x) if psi(0) = 0 else v(x) (NaN outside the table)."""
    if M[KIND] == 1.0:
        return M[V1] * q ** int(M[DEGREE])
    i, x = _panel(M, q)
    if i < 0:
        return math.nan
    v = _cheb1(M, int(M[OFF_V]) + NT * i, x)
    return q * v if M[SCALED] == 1.0 else v


@njit(**OPTS)
def C(M, q1, q2, q12):
    """C from the theta-cells of q1's panel (general kind: equal norms q2 = q1 only; NaN outside)."""
    hom = M[KIND] == 1.0
    par = int(M[PARITY])
    if q1 == q2:
        sq = q1
        if sq == 0.0:
            return 0.0 if hom else M[PSI0SQ]
        a = (q1 - q12) / q1
        b = (q1 + q12) / q1
        c = q12 / q1
    else:
        if not hom:
            return math.nan
        sq = math.sqrt(q1) * math.sqrt(q2)
        if sq == 0.0:
            return 0.0
        c = q12 / sq
        a = 1.0 - c
        b = 1.0 + c
    sn = math.sqrt(max(a * b, 0.0))
    th = math.atan2(sn, abs(c)) if par != 0 else math.atan2(sn, c)
    i = 0
    x = 0.0
    if not hom:
        i, x = _panel(M, q1)
        if i < 0:
            return math.nan
    lo, y = _locate(M, int(M[OFF_FIRST]), int(M[OFF_EDGES]), i, th)
    o = int(M[OFF_COEF]) + int(M[BLOCK]) * lo
    if hom:
        g = _cheb1(M, o, y)
        n = int(M[DEGREE])
        if par == 1:
            return q12 * sq ** (n - 1) * g
        return sq ** n * g
    g = _cheb2(M, o, x, y)
    if M[SCALED] == 0.0:
        return g
    if par == 1:
        return q12 * g
    return q1 * g


@njit(**OPTS)
def D(M, q1, q2, q12, d):
    """E[(psi(u) - psi(v))^2], d = q1 + q2 - 2 q12, accurate as c -> 1 (q12 is used only for theta > pi/2).
    With s2 = sin^2(theta/2) (equal norms: d/(4q)) and R(theta) = (V - C)/(q s2) from the R-cells:
    general kind (q2 = q1): D = 2 q s2 R; homogeneous of degree n:
    D = V1 (q1^(n/2) - q2^(n/2))^2 + 2 (q1 q2)^(n/2) s2 R, s2 = (d - (sqrt q1 - sqrt q2)^2)/(4 sqrt(q1 q2)).
    theta > pi/2: odd psi D = V + V - 2C (C <= 0), even psi R at pi - theta with cos^2(theta/2) = (1 + c)/2.
    No R-cells (no cancellation-free node rule): V + V - 2C. NaN outside the table."""
    hom = M[KIND] == 1.0
    par = int(M[PARITY])
    if not hom and (q1 != q2 or _panel(M, q1)[0] < 0):
        return math.nan
    if M[HAS_R] == 0.0:
        return V(M, q1) + V(M, q2) - 2.0 * C(M, q1, q2, q12)
    i = 0
    x = 0.0
    a0 = 0.0
    if hom:
        n = int(M[DEGREE])
        if q1 == q2:
            sq = q1
            s2 = d / (4.0 * q1) if q1 > 0.0 else 0.0
        else:
            r1 = math.sqrt(q1)
            r2 = math.sqrt(q2)
            sq = r1 * r2
            dr = (q1 - q2) / (r1 + r2)          # sqrt(q1) - sqrt(q2) without cancellation
            sn = 0.0                             # (r1^n - r2^n)/(r1 - r2)
            for j in range(n):
                sn += r1 ** j * r2 ** (n - 1 - j)
            a0 = M[V1] * (dr * sn) ** 2
            s2 = (d - dr * dr) / (4.0 * sq) if sq > 0.0 else 0.0
        scale = 2.0 * sq ** n
    else:
        i, x = _panel(M, q1)
        sq = q1
        s2 = d / (4.0 * q1) if q1 > 0.0 else 0.0
        scale = 2.0 * q1
    if sq == 0.0:
        return a0
    s2 = min(max(s2, 0.0), 1.0)
    if s2 <= 0.5:
        co2 = 1.0 - s2
    else:
        co2 = min(max((sq + q12) / (2.0 * sq), 0.0), 1.0)
        if par == 1:
            return V(M, q1) + V(M, q2) - 2.0 * C(M, q1, q2, q12)
        if par == 2:
            s2, co2 = co2, s2
    th = 2.0 * math.atan2(math.sqrt(s2), math.sqrt(co2))
    lo, y = _locate(M, int(M[OFF_RFIRST]), int(M[OFF_REDGES]), i, th)
    o = int(M[OFF_RCOEF]) + int(M[BLOCK]) * lo
    r = _cheb1(M, o, y) if hom else _cheb2(M, o, x, y)
    return a0 + scale * s2 * r


UNIFORM = False    # table lookups branch and may leave the table: the recursion keeps its per-point loop
NTK_MAPS = False   # no NTK maps (joint_rows does nothing)
MEMO_V = True      # (read only where UNIFORM)


@njit(inline="always", **OPTS)
def C_equal(M, q, q12):      # (layer_maps at equal norms)
    return C(M, q, q, q12)


@njit(inline="always", **OPTS)
def D_equal(M, q, q12, d):
    return D(M, q, q, q12, d)


@njit(inline="always", **OPTS)
def P(N, q):
    return math.nan


@njit(inline="always", **OPTS)
def joint_branch(q, d):
    return 0


@njit(inline="always", **OPTS)
def joint_rows(k, m, q, q12, d, rows, branch):
    return


@njit(**OPTS)
def V_many(M, q):
    """V at an array of q (NaN outside the table)."""
    out = np.empty(q.shape[0])
    for i in range(q.shape[0]):
        out[i] = V(M, q[i])
    return out


@njit(**OPTS)
def C_many(M, q1, q2, q12):
    """C at arrays (NaN outside the table)."""
    out = np.empty(q1.shape[0])
    for i in range(q1.shape[0]):
        out[i] = C(M, q1[i], q2[i], q12[i])
    return out


@njit(**OPTS)
def D_many(M, q1, q2, q12, d):
    """D at arrays (NaN outside the table)."""
    out = np.empty(q1.shape[0])
    for i in range(q1.shape[0]):
        out[i] = D(M, q1[i], q2[i], q12[i], d[i])
    return out


@njit(**OPTS)
def covers_many(M, q):
    """in_domain at an array of equal-norm points q (where the table evaluates the recursion's step)."""
    out = np.empty(q.shape[0], dtype=np.bool_)
    for i in range(q.shape[0]):
        out[i] = in_domain(M, q[i], q[i], 0.0)
    return out
