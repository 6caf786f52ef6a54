"""The maps of a closed-form kernel in compiled code: V, C and D call the printed expressions
``V_expr(q)``, ``C_expr(q1, q2, q12)`` and the distance forms ``D_eq(q, d)``, ``D_near(q1, q2, d)``,
``D_far(q1, q2, q12)`` that :mod:`symfield.numeric.codegen` prints above this code from the kernel's SymPy
expressions (the generated code IS the formula). M is unused (closed forms have no data).
"""
from __future__ import annotations

from symfield.numeric.kernels.jit import OPTS, njit


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
