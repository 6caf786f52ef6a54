"""The certified table of one activation's V and C (and the distance map D), built as far as it is needed.

V(q) and C(q1, q2, q12) do not depend on sigma_w2, sigma_b2, so each activation psi gets ONE table, built
panel by panel as computations reach new q, checked, cached on disk (:mod:`.store`) and evaluated inside
compiled code (:mod:`symfield.numeric.kernels.table_maps`). Two kinds:

``homogeneous``  psi(t u) = t^n psi(u) (relu + max-pool, ...): V = q^n V(1), C = (q1 q2)^(n/2) g(theta), one
                 table in theta = arccos c for ANY q1, q2;
``general``      the equal-norm maps, V(q) = q v(q), C(q, q, q cos theta) = q w(theta) g(q, theta) when
                 psi(0) = 0 (w = cos theta for odd psi), else V = v, C = g, on the q-panels of :mod:`.geometry`.
The distance map D = E[(psi(u) - psi(v))^2] has theta-cells of its own for R = (V - C)/(q sin^2(theta/2)),
so D keeps its relative accuracy as c -> 1. Construction and certification: :mod:`.build`;
docs/numerics.md section 3.
"""
from __future__ import annotations

import math
import time

import numpy as np

from symfield.core.errors import NotCertified, NotTabulable
from symfield.core.progress import bar
from symfield.numeric import codegen
from symfield.numeric.tables import store
from symfield.numeric.tables.build import D_DIFF, TableBuilder, accept
from symfield.numeric.tables import geometry
from symfield.numeric.tables.geometry import E0, Panel, panel_of, q_top
from symfield.numeric.tables.nodes import rule_kind
from symfield.numeric.tables.pack import pack
from symfield.symbolic.integrals import Kind, kinds

# seconds per panel before one was timed: general-kind q-panels by node evaluator (tanh+max2 by the max-pool
# rule: ~140 s measured), and the one theta-table of a homogeneous kind (relu+max2: ~3 s)
BUILD_GUESS = {"polar": 2.0, "rule": 60.0, "quadrature": 150.0, "homogeneous": 5.0}


def analyse(K):
    """(kind, degree, parity, psi(0)^2) of a kernel (its facts: symbolic.kernel_type.Kernel), or raise
    NotTabulable."""
    if Kind.LEVEL2 in kinds(K.C):
        raise NotTabulable(f"{K.act.name}: max-pool of a non-monotone activation is not tabulated "
                           f"(the accuracy of its float64 rule is not certified here); quadrature is used")
    if K.degree is not None:
        return "homogeneous", K.degree, K.parity, 0.0
    return "general", 0, K.parity, K.psi0 * K.psi0


class Table(TableBuilder):
    """The table of one activation; see the module docstring. Get one with :func:`symfield.numeric.tables.table`."""

    def __init__(self, K):
        self.K = K
        self.kind, self.degree, self.parity, self.psi0sq = analyse(K)
        self.panels: dict[int, Panel] = {}
        self.V1 = None
        self.info = dict(build_seconds=0.0, mp_checks=[], evaluator=None)
        self._ev = None
        self._mr = None
        self._packed = None      # (V1, [(p, panel), ...], M): the panels M was packed from (see arrays)

    # ---------------------------------------------------------------- properties
    @property
    def name(self):
        return self.K.act.name

    @property
    def theta_max(self):
        return math.pi / 2 if self.parity else math.pi

    @property
    def q_top(self) -> float:
        """The largest q the table is asked to cover (homogeneous: inf)."""
        return math.inf if self.kind == "homogeneous" else q_top()

    @property
    def q_range(self):
        """(q_lo, q_hi) covered (homogeneous: (0, inf))."""
        if self.kind == "homogeneous":
            return (0.0, math.inf)
        if not self.panels:
            return (math.nan, math.nan)
        lo, hi = min(self.panels), max(self.panels)
        return (0.0 if lo == 0 else 2.0 ** (E0 + lo - 1), 2.0 ** (E0 + hi))

    @property
    def has_distance(self) -> bool:
        """D is tabulated without cancellation (R cells), not the difference of C."""
        if self.info.get("D") is None:
            self.evaluator()          # decides the distance rule (info["D"])
        return self.info.get("D") not in (None, D_DIFF)

    @property
    def cheap(self) -> bool:
        """Panels build in seconds (the polar rule), not minutes (the max-pool rule or quadrature)."""
        return self.kind != "homogeneous" and self.K.act.pool != "max" and self._evaluator_kind() == "polar"

    def _evaluator_kind(self):
        """"rule", "polar" or "quadrature" (nodes.rule_kind; the homogeneous kind trades the rule for quadrature,
        TableBuilder.evaluator), without building the node evaluator."""
        kind = rule_kind(self.K)
        return "quadrature" if kind == "rule" and self.kind == "homogeneous" else kind

    @property
    def seconds_per_panel(self) -> float:
        """The measured build time per panel, else a guess by the node evaluator's kind (BUILD_GUESS)."""
        if self.panels and self.info["build_seconds"] > 0:
            return self.info["build_seconds"] / len(self.panels)
        return BUILD_GUESS["homogeneous" if self.kind == "homogeneous" else self._evaluator_kind()]

    def could_cover(self, q1, q2) -> np.ndarray:
        """Points a table of this kind can evaluate once built: any norms (homogeneous), else equal norms
        0 <= q < q_top."""
        q1, q2 = np.asarray(q1, float), np.asarray(q2, float)
        if self.kind == "homogeneous":
            return np.isfinite(q1) & np.isfinite(q2)
        return (q1 == q2) & (q1 >= 0) & (q1 < q_top())

    def covers(self, q1, q2) -> np.ndarray:
        """Points the panels built so far evaluate."""
        ok = self.could_cover(q1, q2)
        if self.kind == "homogeneous":
            return ok & bool(self.panels)
        q = np.where(ok, q1, 1.0)
        ps = np.where(q < 2.0 ** E0, 0, np.frexp(q)[1] - E0)      # panel_of, vectorised
        built = np.zeros(max(self.panels, default=0) + 2, bool)
        built[list(self.panels)] = True
        return ok & built[np.clip(ps, 0, built.size - 1)]

    def panels_needed(self, q_lo: float, q_hi: float) -> int:
        """How many panels a build covering [q_lo, q_hi] (contiguously with those present) would add."""
        if self.kind == "homogeneous":
            return 0 if self.panels else 1
        lo, hi = panel_of(max(q_lo, 0.0)), panel_of(min(q_hi, q_top()))
        if self.panels:
            lo, hi = min(lo, min(self.panels)), max(hi, max(self.panels))
        return sum(1 for p in range(lo, hi + 1) if p not in self.panels)

    def starts(self, lo: float) -> tuple:
        """Lower ends to try for a build from ``lo``: lo itself, then 2^E0 (panel 0 is refused for some psi)."""
        return (lo, 2.0 ** E0) if lo < 2.0 ** E0 else (lo,)

    def extend_to(self, lo: float, hi: float) -> int:
        """Grow the table to cover [lo, hi] with margins (a walk in q tends to go on the way it went): x4 up,
        /8 down, down to q = 0 below 2^(E0+3); an empty table starts at [lo/2, 2 hi]. Returns the panels built."""
        if self.kind == "homogeneous":
            return self.ensure()
        qlo, qhi = self.q_range
        if not self.panels:
            new_lo, new_hi = (0.0 if lo < 2.0 ** (E0 + 3) else lo / 2), min(2 * hi, q_top())
        else:
            new_lo = lo if not (lo < qlo) else (0.0 if lo < 2.0 ** (E0 + 3) else lo / 8)
            new_hi = hi if not (hi >= qhi) else min(4 * hi, q_top())
        return self.ensure(new_lo, max(new_hi, hi))

    def ensure(self, q_lo=None, q_hi=None):
        """Build the panels needed to cover [q_lo, q_hi] (contiguously with those present); returns
        the number of panels built (a progress bar on a terminal once it takes 2 s). Homogeneous kind:
        builds the theta-table once."""
        t0 = time.perf_counter()
        if self.kind == "homogeneous":
            todo = [] if 0 in self.panels else [0]
        else:
            lo = panel_of(max(q_lo, 0.0))
            hi = panel_of(q_hi)
            if hi > geometry.Q_CAP_EXP - E0:
                raise NotCertified(f"{self.name}: q = {q_hi:.3g} is beyond the table cap 2^{geometry.Q_CAP_EXP}")
            if self.panels:
                lo, hi = min(lo, min(self.panels)), max(hi, max(self.panels))
            todo = [p for p in range(lo, hi + 1) if p not in self.panels]
        if not todo:
            return 0
        ev = self.evaluator()
        with bar(len(todo) + 1, f"building the table of {self.name}", "step") as shown:
            for p in todo:
                pn = self._build_theta_table(ev) if self.kind == "homogeneous" else self._build_panel(ev, p)
                self.panels[p] = accept(self, p, pn)
                shown.update()
            self._mp_checks(todo)
            shown.update()
        self.info["build_seconds"] += time.perf_counter() - t0
        store.save(self)
        return len(todo)

    # ---------------------------------------------------------------- run time
    def arrays(self):
        """The data array M read by the compiled V, C, in_domain (symfield.numeric.kernels.table_maps), packed from the panels
        as they are now: M is re-packed whenever a panel was added, replaced or removed since the last
        packing, by any route (a build, the merge of another process's panels in :func:`save`, a caller),
        so M never covers less (or more) than :attr:`panels` and :attr:`q_range` say."""
        key = self._packed
        if key is None or key[0] is not self.V1 or len(key[1]) != len(self.panels) or \
                any(self.panels.get(p) is not pn for p, pn in key[1]):
            key = self._packed = (self.V1, list(self.panels.items()), pack(self))
        return key[2]

    def merge(self, other):
        """Adopt the panels of ``other`` (the same kernel's table, e.g. read from disk) that extend this
        table's panels contiguously (the compiled lookup needs one run of panels); returns how many."""
        if not self.panels:
            self.panels.update(other.panels)
            if self.V1 is None:
                self.V1 = other.V1
            return len(other.panels)
        n = 0
        for step, end in ((1, max(self.panels)), (-1, min(self.panels))):
            while end + step in other.panels and end + step not in self.panels:
                end += step
                self.panels[end] = other.panels[end]
                n += 1
        return n

    def module(self):
        return codegen.table_module()

    def V(self, q):
        """V(q) from the table (float64, compiled evaluation; NaN outside the table)."""
        q = np.asarray(q, dtype=float)
        out = self.module().V_many(self.arrays(), np.ascontiguousarray(q.ravel()))
        return out.reshape(q.shape) if q.ndim else float(out[0])

    def C(self, q1, q2, q12):
        """C(q1, q2, q12) from the table (general kind: q1 == q2 only; NaN outside)."""
        a, b, c = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (q1, q2, q12)))
        out = self.module().C_many(self.arrays(), *(np.ascontiguousarray(v.ravel()) for v in (a, b, c)))
        return out.reshape(a.shape) if a.ndim else float(out[0])

    def D(self, q1, q2, q12, d):
        """D = E[(psi(u) - psi(v))^2] from the table, d = q1 + q2 - 2 q12 (general kind: q1 == q2; NaN outside)."""
        a, b, c, e = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (q1, q2, q12, d)))
        out = self.module().D_many(self.arrays(), *(np.ascontiguousarray(v.ravel()) for v in (a, b, c, e)))
        return out.reshape(a.shape) if a.ndim else float(out[0])

    def describe(self) -> str:
        e = self.error
        lo, hi = self.q_range
        rng = "all q" if self.kind == "homogeneous" else f"q in [{lo:.3g}, {hi:.3g}]"
        ncells = sum(len(p.cells) for p in self.panels.values())
        return (f"table of {self.name}: {self.kind}" + (f" degree {self.degree}" if self.kind == "homogeneous" else "")
                + f", parity {('none', 'odd', 'even')[self.parity]}, {rng}, {len(self.panels)} panel(s), {ncells} cells; "
                + ", ".join(f"{k} <= {v:.1e}" for k, v in e.items()) + f"; nodes by {self.info['evaluator']}"
                + f"; D by {self.info.get('D')}")
