"""The layout of a table in (q, theta): its parameters, q-panels and first theta-cells (docs/numerics.md section 3).

q-panels: p = 0 is [0, 2^E0] in the variable sqrt(q); p >= 1 is [2^(E0+p-1), 2^(E0+p)] in log2 q, N_T
Chebyshev nodes each, up to the cap 2^Q_CAP_EXP. theta-cells start graded towards theta = 0 and pi (where
the kernel's scale is ~ 1/sqrt(q)) and are bisected until resolved.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from symfield.numeric.kernels.layout import NT

TABLE_VERSION = 4
E0 = -8                 # panel 0 is q in [0, 2^E0] (tanh's V is Gevrey, not analytic, at q = 0)
Q_CAP_EXP = 16          # tables never extend beyond q = 2^16
N_T = NT                # Chebyshev nodes per q-panel (fixed: the compiled evaluation has this size)
N_TH = N_T              # Chebyshev nodes per theta-cell (the compiled evaluation is square)


def q_top():
    """The largest q a table is asked to cover: 1% below the cap 2^Q_CAP_EXP."""
    return 2.0 ** Q_CAP_EXP * 0.99


def panel_q(p, xs):
    """q at panel coordinates x in [-1, 1] of q-panel p."""
    xs = np.asarray(xs, dtype=float)
    if p == 0:
        return (0.5 * (xs + 1) * 2.0 ** (E0 / 2)) ** 2
    return 2.0 ** (E0 + p - 1 + 0.5 * (xs + 1))


def panel_of(q):
    """Index of the q-panel containing q >= 0 (same rule as the compiled lookup)."""
    if q < 2.0 ** E0:
        return 0
    return math.frexp(q)[1] - E0


def initial_cells(qhi, tmax, parity, graded=True):
    """theta-cells: [pi/4, pi/2] (and its mirror), graded by halving towards 0 (and pi) down to
    ~1/(4 sqrt q) (graded=False: no grading; bisection refines where the Chebyshev tail asks)."""
    lo = [math.pi / 4]
    while graded and lo[-1] > 1.0 / (4.0 * math.sqrt(qhi)) and lo[-1] > 1e-3:
        lo.append(lo[-1] / 2)
    edges = sorted({0.0, math.pi / 2, *lo})
    if tmax > math.pi / 2 + 1e-12:
        edges = sorted(set(edges) | {math.pi - e for e in edges})
    edges[-1] = tmax
    return [(a, b) for a, b in zip(edges[:-1], edges[1:])]


@dataclass
class Panel:
    """One q-panel (or the single theta-table of a homogeneous kind)."""
    vcoef: np.ndarray                       # Chebyshev coefficients of v(x) (empty for homogeneous)
    cells: list                             # [(theta_lo, theta_hi, coef[nt, nth])]
    err: dict = field(default_factory=dict)  # held-out errors: V, C, C_rel, D, and 'diag' flag
    rcells: list = field(default_factory=list)  # [(theta_lo, theta_hi, coef)] of R (distance map D)
