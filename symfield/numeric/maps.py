"""The maps engine: how one kernel's maps are evaluated is decided here, and only here (docs/numerics.md section 1).

    maps(K, dps=None) -> Maps      .V .dpsi2 .mean .dV (q)   .C .dC (q1, q2, q12)   .D (q1, q2, q12, d)
                                   .expect(expr, args, values)   .run_grid(...)   .ctx (number context)

Every theory module asks this object for numbers; none chooses a path. In float64 each map is, in
order, a closed form (lambdified, or printed into compiled code for grids), a certified table
(:mod:`.table1d`, :mod:`.tables`) where one is loaded or worth building, else the error-controlled
quadrature (:mod:`.evaluate`). "Worth building" is one ski-rental rule (:class:`_Rental`): build once
the quadrature already spent plus what the request would spend exceeds the expected build cost.
In mpmath (``dps=N``) every map is its closed form or its quadrature at N digits. ``how`` names each path.
"""
from __future__ import annotations

import math
import time
from functools import cached_property, partial

import numpy as np
import sympy as sp

from symfield.core import caches
from symfield.core.errors import NotCertified, NotPrintable, NotTabulable
from symfield.numeric import codegen, grid, small_q, tables
from symfield.numeric.tables import lookup
from symfield.numeric.context import FLOAT64, Mp
from symfield.numeric.distance import rule as distance_rule
from symfield.numeric.evaluate import evaluate, evaluator
from symfield.numeric.tail import tail
from symfield.numeric.table1d import Table1D
from symfield.symbolic.gaussian import q as Q, q1 as Q1, q2 as Q2, q12 as Q12
from symfield.symbolic.kernel_type import Kernel

ONE_D = ("V", "dpsi2", "mean", "dV")
TABLE_1D = ("V", "dpsi2")          # 1-D maps that get a table when they are integrals
METHODS = ("auto", "table", "quadrature")
TAIL_Q = tables.q_top()            # equal norms from the table top up: the large-q tail (numerics section 11)
TAIL_Q_MIN = 32.0                  # ... and from here up, above the panels built, where panels cost minutes
COMPILE_WORK = 2e4                 # point-layers from which a table-backed grid runs compiled (NumPy below it)
_MAPS: dict = caches.memo()


def maps(K: Kernel, dps: int | None = None, method: str = "auto") -> "Maps | MpMaps":
    """The engine object of kernel K in the number context of ``dps`` (memoised per process).

    ``method`` (float64): "auto" (the ski rental), "table" (build tables whenever there is one),
    "quadrature" (no tables: the defining integrals, closed forms as they are)."""
    key = (K, dps, method if dps is None else "auto")
    m = _MAPS.get(key)
    if m is None:
        m = _MAPS[key] = Maps(K, method) if dps is None else MpMaps(K, dps)
    return m


def shipped_1d_name(K: Kernel, what: str) -> str:
    """The stable name of K's 1-D table of ``what`` among the shipped tables: what it tabulates (phi's
    expression, pool, k, kinks), not how SymPy writes the integral."""
    return f"{what} of {sp.srepr(K.act.expr)} pool {K.act.pool} k {K.act.k} kinks {tuple(K.kinks)!r}"


def _step(M):
    """The one recursion's (first_layer, layer_step) run as plain Python on the maps of engine M (any number
    type: NumPy arrays in float64, mpmath numbers at dps)."""
    return codegen.step_functions(lambda _, q: M.V(q), lambda _, a, b, c: M.C(a, b, c),
                                  lambda _, a, b, c, d: M.D(a, b, c, d))


class _Rental:
    """The ski rental of one table: quadrature seconds spent so far, and the rule that says when building
    pays. ``per_eval`` is the measured quadrature cost of one evaluation (a guess until measured)."""

    def __init__(self, per_eval=0.01):
        self.spent, self.per_eval, self.measured = 0.0, per_eval, False

    def worth(self, n_evals, build_seconds):
        """Build now: the quadrature spent plus this request's estimate exceeds the build's cost."""
        return self.spent + n_evals * self.per_eval >= build_seconds

    def timed(self, fn, n, *args):
        t0 = time.perf_counter()
        out = fn(*args)
        dt = time.perf_counter() - t0
        self.spent += dt
        if n:
            self.per_eval = dt / n if not self.measured else 0.5 * (self.per_eval + dt / n)
            self.measured = True
        return out


class _Evaluators(dict):
    """name -> float64 evaluator of the kernel's map by its closed form or defining integral, made when first
    asked for (lambdifying and rewriting a map costs ~0.1 s; a run served by tables asks for none)."""

    def __init__(self, K: Kernel):
        super().__init__()
        self.K = K

    def __missing__(self, name):
        args = (Q,) if name in ONE_D else (Q1, Q2, Q12)
        fn = self[name] = evaluator(self.K[name], args, self.K.kinks)
        return fn


class Maps:
    """float64 maps of one kernel, vectorised over numpy arrays (see the module docstring)."""
    dps = None
    ctx = FLOAT64

    def __init__(self, K: Kernel, method: str = "auto"):
        self.K, self.method = K, method
        self.how: dict = {}
        self._t1d: dict = {}
        self._rent1d = {name: _Rental(1e-4) for name in TABLE_1D}
        self._rent2d = _Rental(0.01)
        self._ahead = 0                      # evaluations a caller announced (plan): the rental's known future
        self.tally = {"tail": 0, "quadrature": 0}   # equal-norm points at q >= the table top, by path

    # ------------------------------------------------------------------ quadrature / closed forms
    @cached_property
    def _direct(self) -> dict:
        """Each map by its closed form or its defining integral (no table), built on first use."""
        return _Evaluators(self.K)

    def _call_direct(self, name, *args):
        """``name`` by its closed form or integral (a table's evaluator outside its panels: built when first called)."""
        return self._direct[name](*args)

    def expect(self, expr: sp.Expr, args: tuple, values: tuple):
        """Any other expression of this kernel (Gram moments, Jacobian terms) at ``values`` of ``args``."""
        return evaluate(expr, args, values, self.K.kinks)

    # ------------------------------------------------------------------ one input
    def _one(self, name, q):
        q = np.asarray(q, float)
        if self._small is not None and name in self._small.names:
            low = (q < small_q.Q_SMALL) & (q > 0)
            if low.any():
                self.how.setdefault(name + " (q < %g)" % small_q.Q_SMALL, "scaled z-rule (numerics section 8)")
                out = np.empty(q.shape)
                out[low] = self._small(name, q[low])
                if (~low).any():
                    out[~low] = self._path(name, q[~low])
                return out
        return self._path(name, q)

    @cached_property
    def _small(self):
        return small_q.small_q(self.K)

    def _path(self, name, q):
        if name not in TABLE_1D or not self.K[name].has(sp.Integral) or self.method == "quadrature":
            self.how.setdefault(name, "quadrature" if self.K[name].has(sp.Integral) else "closed form")
            return self._direct[name](q)
        tab = self._table1d(name, q.size)
        if tab is None:
            return self._rent1d[name].timed(self._direct[name], q.size, q)
        return tab(q)

    def _table1d(self, name, n):
        """The 1-D table of ``name`` when loaded (cache or shipped) or worth building now, else None."""
        tab = self._t1d.get(name)
        if tab is None:
            K = self.K
            key = f"{name} {sp.srepr(K[name])} kinks {K.kinks!r}"
            tab, refused = Table1D.cached(partial(self._call_direct, name), key, shipped_1d_name(K, name))
            rent = self._rent1d[name]
            # a refused (damaged) file was built by a process that found it worth building: rebuilt at once
            if tab is None and (refused or self.method == "table" or rent.worth(n + self._ahead, Table1D.BUILD_EVALS * rent.per_eval)):
                tab = Table1D(partial(self._call_direct, name), key=key, ship=shipped_1d_name(K, name), load=False)
            if tab is None:
                self.how[name] = "quadrature (1-D table not yet worth building)"
                return None
            self._t1d[name] = tab
            self.how[name] = "1-D table"
        return tab

    def V(self, q):
        q = np.asarray(q, float)
        big = q >= TAIL_Q
        if not big.any() or not self.K.V.has(sp.Integral) or self._tail is None:   # the tail is built only when asked
            return self._one("V", q)
        out = np.full(q.shape, np.nan)
        out[big] = self._from_tail("V", q[big])
        rest = np.isnan(out)
        if rest.any():
            out[rest] = self._one("V", q[rest])
        return out

    @cached_property
    def _tail(self):
        """The large-q tail series (:mod:`.tail`), or None (method "quadrature", or psi has none)."""
        return None if self.method == "quadrature" or self.K.closed_form else tail(self.K)

    def tail_from(self) -> float:
        """Equal norms above the panels built go to the large-q tail from this q: TAIL_Q_MIN where panels cost
        minutes (quadrature-node tables) and psi has a tail, else the tables' top TAIL_Q."""
        T = self.table
        return TAIL_Q_MIN if T is not None and not T.cheap and self._tail is not None else TAIL_Q

    def _from_tail(self, name, q, *rest):
        """The tail's V(q), C(q, q, q12) or D(q, q, q12, d) at flat arrays; NaN where it is not certified."""
        self.how.setdefault(f"{name} (q >= table top)", "large-q tail series (numerics section 11), else quadrature")
        T = self._tail
        out, ok = T.V(q) if name == "V" else T.C(q, rest[0] / q) if name == "C" else T.D(q, rest[1])
        self.tally["tail"] += int(ok.sum())
        return out

    def dpsi2(self, q):
        return self._one("dpsi2", q)

    def mean(self, q):
        return self._one("mean", q)

    def dV(self, q):
        return self._one("dV", q)

    def table1d(self, name: str):
        """The 1-D table of V or dpsi2, loaded or built now (for shipping)."""
        tab = self._table1d(name, 0)
        if tab is None:
            key = f"{name} {sp.srepr(self.K[name])} kinks {self.K.kinks!r}"
            self._t1d[name] = tab = Table1D(partial(self._call_direct, name), key=key,
                                            ship=shipped_1d_name(self.K, name))
        return tab

    # ------------------------------------------------------------------ two inputs
    @cached_property
    def table(self):
        """The (q, theta) table of C and D (:mod:`.tables`, loaded or empty), or None (closed form, not
        tabulable, or method "quadrature")."""
        if self.method == "quadrature" or not self.K.C.has(sp.Integral):
            return None
        try:
            return tables.find(self.K)
        except NotTabulable:
            return None

    @property
    def fast_C(self) -> bool:
        """C costs microseconds at every q: a closed form, or a table whose panels build in seconds."""
        T = self.table
        return not self.K.C.has(sp.Integral) or (T is not None and T.cheap)

    def _plan(self, a, b, n_evals):
        """Points (flat arrays a, b = q1, q2) the table evaluates, after building what the ski rental pays for."""
        T = self.table
        if T is None:
            return np.zeros(a.shape, bool)
        covered = T.covers(a, b)
        if covered.all():               # the common case once the panels exist: nothing to plan
            return covered
        could = T.could_cover(a, b)
        if could.any() and not covered[could].all():
            lo, hi = float(a[could].min()), float(a[could].max())
            need = T.panels_needed(lo, hi)
            if self.method == "table" or self._rent2d.worth(n_evals + self._ahead, need * T.seconds_per_panel):
                try:
                    T.extend_to(lo, hi)
                except NotCertified:
                    self.table_refused = True
        return T.covers(a, b) & could if could.any() else could

    def _tabled(self, name, slow, a, b, *rest):
        a, b, *rest = np.broadcast_arrays(np.asarray(a, float), np.asarray(b, float), *(np.asarray(v, float) for v in rest))
        shape = a.shape
        a, b, rest = a.ravel(), b.ravel(), [v.ravel() for v in rest]
        out = np.full(a.shape, np.nan)
        T, done = self.table, np.zeros(a.shape, bool)
        if self.tail_from() == TAIL_Q_MIN:     # the tail serves what it certifies above the panels built
            big = np.flatnonzero(~T.covers(a, b) & (a == b) & (a >= TAIL_Q_MIN))
            if big.size:
                out[big] = self._from_tail(name, a[big], *(v[big] for v in rest))
                done = ~np.isnan(out)
        ok = np.zeros(a.shape, bool)
        ok[~done] = self._plan(a[~done], b[~done], int((~done).sum()))
        if ok.any():
            out[ok] = self._lookup(name, a[ok], b[ok], *(v[ok] for v in rest))
        bad = np.isnan(out)
        big = np.flatnonzero(bad & (a == b) & (a >= TAIL_Q))
        if big.size and self._tail is not None:   # equal norms beyond the table: the large-q tail
            out[big] = self._from_tail(name, a[big], *(v[big] for v in rest))
            bad = np.isnan(out)
        if bad.any():
            self.tally["quadrature"] += int(bad.sum())
            out[bad] = self._rent2d.timed(slow, int(bad.sum()), a[bad], b[bad], *(v[bad] for v in rest))
        return out.reshape(shape)

    def _lookup(self, name, *args):
        """Table values at flat arrays: the compiled table module's once it is loaded (a grid ran there), else the
        same table in NumPy (:mod:`symfield.numeric.tables.lookup`, about 0.5 us a point: loading numba costs
        more than the lookups of a phase diagram)."""
        M = self.table.arrays()
        if codegen.table_module_loaded():
            fn = getattr(codegen.table_module(), f"{name}_many")
            return fn(M, *(np.ascontiguousarray(v) for v in args))
        return getattr(lookup, name)(M, *args)

    def plan(self, n_evals: int) -> None:
        """Announce about ``n_evals`` evaluations to come (a scan over a grid). Rent or buy with the future
        known: a 1-D table of V or E[psi'^2], or the panels of C's table, are built at once when those
        evaluations by quadrature would cost more."""
        self._ahead = max(self._ahead, int(n_evals))

    def C(self, q1, q2, q12):
        T = self.table
        self.how.setdefault("C", "closed form" if T is None and not self.K.C.has(sp.Integral) else
                            "quadrature" if T is None else f"{T.kind} table (grown by the ski rental), else quadrature")
        if T is None:
            return self._direct["C"](*(np.asarray(v, float) for v in (q1, q2, q12)))
        return self._tabled("C", partial(self._call_direct, "C"), q1, q2, q12)

    def dC(self, q1, q2, q12):
        return self._direct["dC"](*(np.asarray(v, float) for v in (q1, q2, q12)))

    def C_eq(self, q, c):
        """C(q, q, c q): two inputs of equal variance q at correlation c."""
        q, c = np.broadcast_arrays(np.asarray(q, float), np.asarray(c, float))
        return self.C(q, q, c * q)

    @cached_property
    def _distance(self):
        return distance_rule(self.K)

    @property
    def D_exact(self) -> bool:
        """D keeps its relative accuracy as d -> 0 (a cancellation-free rule, or a table with distance cells)."""
        T = self.table
        return (self._distance.exact and not self.K.C.has(sp.Integral)) or (T is not None and T.has_distance)

    def D(self, q1, q2, q12, d):
        T = self.table
        if T is None or not T.has_distance:
            return self._untabled_D(q1, q2, q12, d)
        return self._tabled("D", self._distance.fn, q1, q2, q12, d)

    def _untabled_D(self, q1, q2, q12, d):
        """D without table cells: the large-q tail at equal norms from :meth:`tail_from` where it certifies
        (elu's table keeps no distance cells; its distance rule is a 2-D quadrature of ~1 s at large q),
        else the distance rule."""
        args = np.broadcast_arrays(*(np.asarray(v, float) for v in (q1, q2, q12, d)))
        shape = args[0].shape
        a, b, ab, dd = (v.ravel() for v in args)
        big = np.flatnonzero((a == b) & (a >= self.tail_from()))
        if not big.size or self._tail is None:
            return self._distance.fn(q1, q2, q12, d)
        out = np.full(a.shape, np.nan)
        out[big] = self._from_tail("D", a[big], ab[big], dd[big])
        rest = np.isnan(out)
        if rest.any():
            out[rest] = self._distance.fn(a[rest], b[rest], ab[rest], dd[rest])
        return out.reshape(shape)

    def cover(self, lo: float, hi: float) -> None:
        """A caller about to walk q over [lo, hi] with many C evaluations (the q* = 0 descent): a table whose
        panels build in seconds is grown in one build (one round of its mpmath spot checks). Panel 0
        (q < 2^E0) is refused for some psi (relative accuracy as q -> 0): then the panels above it."""
        T = self.table
        if T is None or not T.cheap or not lo < hi:
            return
        for a in T.starts(lo):
            try:
                T.ensure(a, min(hi, T.q_top))
                return
            except NotCertified:
                pass

    # ------------------------------------------------------------------ the recursion over a grid
    @staticmethod
    def norm_code(norm, general: bool) -> int | None:
        """The compiled recursion's code for a normalisation (:mod:`symfield.theory.norm` ``Norm`` or None):
        0 none, 1 LayerNorm before phi, 2 LayerNorm after phi at equal input norms; None where the normalised
        recursion runs layer by layer in NumPy (BatchNorm: its Gram is constant after one layer; LayerNorm
        after phi with unequal input norms)."""
        if norm is None:
            return 0
        if norm.kind == "layer" and norm.at == "before":
            return 1
        if norm.kind == "layer" and norm.at == "after" and not general:
            return 2
        return None

    def _ln_aux(self, sw, sb, qa0):
        """(mean, Var) of psi at layer 1's q = sigma_w2 q0 + sigma_b2 and at q* = sigma_w2 + sigma_b2, per point
        (shape (n, 4)), from this engine's maps (LayerNorm after phi)."""
        q = np.concatenate([sw * qa0 + sb, sw + sb])
        u, inv = np.unique(q, return_inverse=True)
        m = np.asarray(self.mean(u), float)
        var = np.asarray(self.V(u), float) - m * m
        m, var = m[inv].reshape(2, -1), var[inv].reshape(2, -1)
        return np.ascontiguousarray(np.stack([m[0], var[0], m[1], var[1]], axis=1))

    def run_grid(self, sw, sb, qa0, qb0, qab0, d0, depth, store, alpha2, residual, general, norm=None, ntk=None):
        """The layer recursion at every grid point on the best path: generated code for closed forms, else the
        table (grown by the ski rental), else NumPy quadrature. (out, status, last, method, error, info).

        ``norm`` (a :class:`symfield.theory.norm.Norm` or None): LayerNorm runs in the same compiled recursion
        (closed forms or a table; :meth:`norm_code`); None is returned where the normalised recursion has no
        compiled path here (BatchNorm, LayerNorm after phi with unequal norms, maps on quadrature): the
        caller runs it layer by layer (:func:`symfield.theory.norm.recursion`, method "numpy-norm").
        ``ntk`` (:class:`symfield.numeric.codegen.NtkMaps`, closed forms): the NTK goes along in the generated
        code, its rows in out[4]; on the other paths out[4] is empty (the caller evaluates the NTK itself)."""
        code = self.norm_code(norm, general)
        if code is None:
            return None
        aux = self._ln_aux(sw, sb, qa0) if code == 2 else grid.NO_AUX
        label = {} if not code else dict(norm=norm.kind, norm_at=norm.at)
        args = (sw, sb, qa0, qb0, qab0, d0, depth, store, alpha2, residual, general)
        K, info = self.K, {}
        if K.closed_form:
            try:
                module = codegen.load(K, ntk)
            except NotPrintable:
                module = None  # closed form outside the printer's table: quadrature path below
            if module is not None:
                out, status, last = grid.run_compiled(module, *args, norm=code, aux=aux, ntk=ntk is not None)
                return out, status, last, "numba-generated", {}, dict(label, distance=self._distance_note())
        T = self.table
        work = sw.size * max(depth - 1, 0)
        if T is not None and not (general and T.kind != "homogeneous" and code != 1):
            q1 = sw * qa0 + sb
            cover = None
            if code == 1:
                cover = (1.0, 1.0)
            elif code == 2:
                cover = (float(min(q1.min(), (sw + sb).min())), float(max(q1.max(), (sw + sb).max())))
            lo, hi = cover or (float(q1.min()), float(q1.max()))
            if T.kind == "homogeneous":
                use = T.panels or self.method == "table" or self._rent2d.worth(work, T.seconds_per_panel)
            else:
                use = (T.covers(np.array([lo, hi]), np.array([lo, hi])).all() or self.method == "table"
                       or self._rent2d.worth(work, T.seconds_per_panel * max(1, T.panels_needed(lo, min(hi, T.q_top)))))
            if use and not code and not self._compile_pays(work):   # a few point-layers: the same table, looked up in Python
                out, status, last = grid.run_numpy(self, *args)
                return out, status, last, "python-table", getattr(T, "error", {}), dict(
                    table=T.describe(), table_path=T.info.get("path"), distance=self._distance_note(),
                    compiled="no: the table module is not loaded and compiling it costs more than the lookups")
            if use:
                try:
                    out = self._run_table(T, args, code, aux, cover)
                    return out[:5] + (dict(out[5], **label),)
                except NotCertified as err:   # the first build failed its accuracy checks: say so, quadrature
                    info = dict(table_refused=str(err))
        if code:
            return None
        before = dict(self.tally)
        out, status, last = grid.run_numpy(self, *args)
        method = "numpy-quadrature" + ("+tail" if self.tally["tail"] > before["tail"] else "")
        return out, status, last, method, {}, dict(info, distance=self._distance_note())

    def _compile_pays(self, work):
        """Run the grid in the compiled table module: the method is "table", the module is loaded, or ``work``
        point-layers reach COMPILE_WORK (below it the NumPy recursion over the table's NumPy lookups costs
        less than loading numba; a 24-layer network's few points compile nothing, which cold costs 30 s)."""
        return self.method == "table" or codegen.table_module_loaded() or work >= COMPILE_WORK

    def _run_table(self, T, args, norm=0, aux=grid.NO_AUX, cover=None):
        def spill(point_layers, lo, hi):      # quadrature for these points is cheaper than building
            return self.method != "table" and not self._rent2d.worth(point_layers, T.seconds_per_panel *
                                                                       max(1, T.panels_needed(lo, min(hi, T.q_top))))
        before = dict(self.tally)
        out, status, last, n_quad = grid.run_table(self, T, *args, spill=spill, norm=norm, aux=aux, cover=cover)
        eD = T.error.get("D", math.inf)
        info = dict(table=T.describe(), table_path=T.info.get("path"), points_on_quadrature=n_quad,
                    distance=(f"tabulated (relative error <= {eD:.1e})" if math.isfinite(eD) else
                              "plain difference V + V - 2C of the table; gamma loses digits once 1 - c < ~1e-8"))
        return out, status, last, "numba-table" + (self._numpy_paths(before) if n_quad else ""), T.error, info

    def _numpy_paths(self, before):
        """"+numpy-tail", "+numpy-quadrature", both, or "+numpy-table": the paths of the points finished on NumPy."""
        used = [k for k in ("tail", "quadrature") if self.tally[k] > before[k]]
        return "".join("+numpy-" + k for k in used) or "+numpy-table"

    def step(self):
        """(first_layer, layer_step) of the recursion on these maps (:func:`_step`)."""
        return _step(self)

    def _distance_note(self):
        r = self._distance
        return r.method + ("" if r.exact else "; gamma loses digits once 1 - c < ~1e-8")


class MpMaps:
    """mpmath maps of one kernel at ``dps`` digits, element-wise (the quadrature or closed form at dps)."""

    def __init__(self, K: Kernel, dps: int):
        self.K, self.dps, self.ctx = K, dps, Mp(dps)
        self.how = {name: ("closed form" if not K[name].has(sp.Integral) else f"quadrature at dps={dps}")
                    for name in ONE_D + ("C", "dC")}
        self.D_exact = True     # mpmath's plain difference works at extra digits

    @cached_property
    def _distance(self):
        return distance_rule(self.K, self.dps)

    def expect(self, expr: sp.Expr, args: tuple, values: tuple):
        return evaluate(expr, args, values, self.K.kinks, self.dps)

    def _one(self, name, q):
        return evaluate(self.K[name], (Q,), (q,), self.K.kinks, self.dps)

    def V(self, q):
        return self._one("V", q)

    def dpsi2(self, q):
        return self._one("dpsi2", q)

    def mean(self, q):
        return self._one("mean", q)

    def dV(self, q):
        return self._one("dV", q)

    def C(self, q1, q2, q12):
        return evaluate(self.K.C, (Q1, Q2, Q12), (q1, q2, q12), self.K.kinks, self.dps)

    def dC(self, q1, q2, q12):
        return evaluate(self.K.dC, (Q1, Q2, Q12), (q1, q2, q12), self.K.kinks, self.dps)

    def C_eq(self, q, c):
        """C(q, q, c q)."""
        return self.C(q, q, c * q)

    def D(self, q1, q2, q12, d):
        self.how.setdefault("D", self._distance.method)
        return self._distance.fn(q1, q2, q12, d)

    def step(self):
        """(first_layer, layer_step) of the recursion on these maps (:func:`_step`)."""
        return _step(self)
