"""Certified piecewise-Chebyshev tables of the maps without a closed form (docs/numerics.md section 3).

:func:`table` gives the table of an activation (from this process, the disk cache, the shipped tables, or
built now over the requested q-range); :func:`find` gives it without building anything. The parts:
:mod:`.geometry` (panels and cells), :mod:`.polar` (the polar rule), :mod:`.nodes` (node values),
:mod:`.build` (fitting and certification), :mod:`.pack` (the array compiled code reads), :mod:`.store`
(files), :mod:`.table` (the Table).
"""
from __future__ import annotations

from symfield.core import caches
from symfield.numeric.tables.build import D_DIFF, MP_CHECKS, QUAD_FLOOR  # noqa: F401 (named in tests and docs)
from symfield.numeric.tables.geometry import E0, Q_CAP_EXP, Panel, panel_of, q_top  # noqa: F401
from symfield.numeric.tables.pack import check_structure, pack  # noqa: F401
from symfield.numeric.tables.polar import polar_coefficients, polar_eval  # noqa: F401
from symfield.numeric.tables import build, store  # noqa: F401 (tests patch build.MP_CHECKS, store.path_of)
from symfield.numeric.tables.store import key, read, save, ship_name  # noqa: F401
from symfield.numeric.tables.table import Table
from symfield.symbolic.kernel import Kernel, kernel

_TABLES: dict = caches.memo()


def find(act) -> Table:
    """The table of ``act`` as it stands (this process, the disk cache or the shipped copy; else empty),
    building nothing. Raises NotTabulable for activations that are not tabulated."""
    K = act if isinstance(act, Kernel) else kernel(act)
    k = key(K)
    T = _TABLES.get(k)
    if T is None:
        T = (read(store.path_of(K), K, Table) or read(store.shipped_copy(K), K, Table, is_shipped=True)
             or Table(K))
        _TABLES[k] = T
    return T


def table(act, q_lo: float | None = None, q_hi: float | None = None) -> Table:
    """The table of ``act``, built now where needed: the theta-table (homogeneous kind), or the panels
    covering [q_lo, q_hi] when given (general kind). Raises NotTabulable for activations that are not
    tabulated, NotCertified when a panel fails its checks."""
    T = find(act)
    if T.kind == "homogeneous" or q_hi is not None:
        T.ensure(0.0 if q_lo is None else q_lo, q_hi)
    return T
