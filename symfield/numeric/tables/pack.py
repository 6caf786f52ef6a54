"""A table packed into the one float64 array M that compiled code reads, and the check of what it may index.

Layout of M (field names: :mod:`symfield.numeric.kernels.layout`): a header of HEADER numbers, the V
coefficients (N_T per panel), the index of each panel's first theta-cell (and an end), the cell edges
(2 per cell), the cell coefficients (BLOCK per cell), then the same three parts for the R cells of the
distance map (when every panel has them).
"""
from __future__ import annotations

import math

import numpy as np

from symfield.core.errors import InvalidValue, NotCertified
from symfield.numeric.kernels import layout as LY
from symfield.numeric.tables import geometry
from symfield.numeric.tables.geometry import E0, N_T, N_TH


def pack(T):
    """Flatten a table into M (see the module docstring)."""
    ps = sorted(T.panels) or [0]
    plo, phi = (0, 0) if T.kind == "homogeneous" else (ps[0], ps[-1])
    if T.kind == "general" and ps != list(range(plo, phi + 1)):
        raise NotCertified(f"{T.name}: panels {ps} are not contiguous")
    blk = N_TH if T.kind == "homogeneous" else N_T * N_TH
    vco, first, edges, cco = [], [0], [], []
    rfirst, redges, rco = [0], [], []
    hasR = all(T.panels[p].rcells for p in range(plo, phi + 1)) if T.panels else False
    for p in range(plo, phi + 1):
        pn = T.panels[p]
        if T.kind == "general":
            if pn.vcoef.size != N_T:
                raise NotCertified(f"panel {p}: {pn.vcoef.size} V coefficients, the compiled evaluation needs {N_T}")
            vco.append(pn.vcoef)
        for a, b, coef in pn.cells:
            if coef.size != blk:
                raise NotCertified(f"cell shape {coef.shape}: the compiled evaluation needs {blk} coefficients")
            edges += [a, b]
            cco.append(coef.ravel())
        first.append(first[-1] + len(pn.cells))
        for a, b, coef in (pn.rcells if hasR else []):
            if coef.size != blk:
                raise NotCertified(f"R cell shape {coef.shape}: the compiled evaluation needs {blk} coefficients")
            redges += [a, b]
            rco.append(coef.ravel())
        rfirst.append(rfirst[-1] + (len(pn.rcells) if hasR else 0))
    vco = np.concatenate(vco) if vco else np.zeros(0)
    head = np.full(LY.HEADER, np.nan)
    head[LY.OFF_V] = LY.HEADER
    head[LY.OFF_FIRST] = head[LY.OFF_V] + vco.size
    head[LY.OFF_EDGES] = head[LY.OFF_FIRST] + len(first)
    head[LY.OFF_COEF] = head[LY.OFF_EDGES] + len(edges)
    head[LY.OFF_RFIRST] = head[LY.OFF_COEF] + blk * len(cco)
    head[LY.OFF_REDGES] = head[LY.OFF_RFIRST] + len(rfirst)
    head[LY.OFF_RCOEF] = head[LY.OFF_REDGES] + len(redges)
    head[LY.KIND] = 1 if T.kind == "homogeneous" else 0
    head[LY.PARITY], head[LY.P_LO], head[LY.P_HI], head[LY.E0], head[LY.DEGREE] = T.parity, plo, phi, E0, T.degree
    head[LY.SCALED] = 1 if T.psi0sq == 0 else 0
    head[LY.V1] = T.V1 if T.V1 is not None else np.nan
    head[LY.PSI0SQ], head[LY.Q0], head[LY.SQ0] = T.psi0sq, 2.0 ** E0, 2.0 ** (E0 / 2)
    head[LY.BLOCK], head[LY.HAS_R] = blk, 1 if hasR else 0
    return np.concatenate([head, vco, np.asarray(first, dtype=float), np.asarray(edges, dtype=float)] + cco
                          + [np.asarray(rfirst, dtype=float), np.asarray(redges, dtype=float)] + rco)


def check_structure(T):
    """ValueError unless T is what the compiled lookup (_pack, _panel, _locate, _cheb*) may index into:
    panels {0} (homogeneous) or contiguous 0 <= p <= geometry.Q_CAP_EXP - E0; V coefficients (N_T,) (none for
    homogeneous); per panel >= 1 theta-cell, cells (and R-cells, if any) tiling [0, theta_max] in order
    with coefficients (1 or N_T, N_TH); all values finite; V1 finite (homogeneous); error entries numbers."""
    ps = sorted(T.panels)
    hom = T.kind == "homogeneous"
    if not ps or (ps != [0] if hom else (ps != list(range(ps[0], ps[-1] + 1)) or ps[0] < 0 or ps[-1] > geometry.Q_CAP_EXP - E0)):
        raise InvalidValue(f"panels {ps}")
    if hom and not (isinstance(T.V1, (int, float)) and math.isfinite(T.V1)):
        raise InvalidValue(f"V1 = {T.V1!r}")
    if not (isinstance(T.info, dict) and isinstance(T.info.get("mp_checks"), list)):
        raise InvalidValue("info")
    nt = 1 if hom else N_T
    for p in ps:
        pn = T.panels[p]
        v = np.asarray(pn.vcoef)
        if v.shape != ((0,) if hom else (N_T,)) or not np.isfinite(v).all():
            raise InvalidValue(f"panel {p}: V coefficients of shape {v.shape}")
        if not all(isinstance(e, (int, float)) and (e == e or k not in ("V", "C", "D")) for k, e in pn.err.items()):
            raise InvalidValue(f"panel {p}: error entries {pn.err}")
        for what, cells in (("cells", pn.cells), ("R-cells", pn.rcells)):
            if what == "cells" or cells:
                _check_cells(cells, nt, T.theta_max, f"panel {p} {what}")


def _check_cells(cells, nt, tmax, what):
    if not cells:
        raise InvalidValue(f"{what}: none")
    edges = [e for a, b, _ in cells for e in (a, b)]
    if not all(isinstance(e, float) and math.isfinite(e) for e in edges):
        raise InvalidValue(f"{what}: edges {edges}")
    if edges[0] != 0.0 or edges[-1] != tmax or any(b <= a for a, b, _ in cells) or \
            any(cells[j][1] != cells[j + 1][0] for j in range(len(cells) - 1)):
        raise InvalidValue(f"{what}: edges do not tile [0, {tmax}]")
    for _, _, coef in cells:
        if not (isinstance(coef, np.ndarray) and coef.shape == (nt, N_TH) and coef.dtype == np.float64
                and np.isfinite(coef).all()):
            raise InvalidValue(f"{what}: coefficients of shape {np.shape(coef)}")
