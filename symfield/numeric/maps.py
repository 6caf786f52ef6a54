"""The maps engine: how one kernel's maps are evaluated, decided in one place (docs/numerics.md section 1).

    maps(K, dps=None) -> Maps       V(q), dpsi2(q), mean(q), C(q1, q2, q12), dC(q1, q2, q12), D(q1, q2, q12, d)

Every theory module asks this object for numbers; none of them chooses a path. The number context is
float64 (``dps=None``: numpy arrays in, arrays out, scalars for scalars) or mpmath at ``dps`` digits
(element-wise, mpf in, mpf out). The path of each map, in float64:

- a closed form: its SymPy expression, lambdified (:mod:`symfield.numeric.evaluate`);
- an integral 1-D map (V, E[psi'^2]): the certified 1-D table in log q (:mod:`symfield.numeric.table1d`);
- an integral C: the certified (q, theta) table (:mod:`symfield.numeric.tables`) -- any norms for a
  positively homogeneous psi, equal norms inside the table's q-range otherwise (grown on demand) --
  else the error-controlled quadrature;
- D = E[(psi(u) - psi(v))^2]: the cancellation-free rule of :mod:`symfield.numeric.distance` or the table's
  distance cells where one exists (``D_exact``), else V + V - 2C (flagged by ``D_exact = False``).

In mpmath every map is the quadrature (or closed form) at dps digits. ``how`` names the path of each map.
"""
from __future__ import annotations

import numpy as np
import sympy as sp

from symfield.core import caches
from symfield.numeric import tables
from symfield.numeric.distance import rule as distance_rule
from symfield.numeric.evaluate import evaluate, evaluator
from symfield.numeric.table1d import Table1D
from symfield.symbolic.gaussian import q as Q, q1 as Q1, q2 as Q2, q12 as Q12
from symfield.symbolic.kernel_type import Kernel

ONE_D = ("V", "dpsi2", "mean", "dV")
TWO_D = ("C", "dC")
_MAPS = caches.memo()


def maps(K: Kernel, dps: int | None = None) -> "Maps":
    """The engine object of kernel K in the number context of ``dps`` (memoised per process)."""
    key = (K, dps)
    m = _MAPS.get(key)
    if m is None:
        m = _MAPS[key] = Maps(K) if dps is None else MpMaps(K, dps)
    return m


def shipped_1d_name(K: Kernel, what: str) -> str:
    """The stable name of K's 1-D table of ``what`` among the shipped tables: what it tabulates (phi's
    expression, pool, k, kinks), not how SymPy writes the integral."""
    return f"{what} of {sp.srepr(K.act.expr)} pool {K.act.pool} k {K.act.k} kinks {tuple(K.kinks)!r}"


class Maps:
    """float64 maps of one kernel, vectorised over numpy arrays (see the module docstring)."""
    dps = None

    def __init__(self, K: Kernel):
        self.K = K
        self.how: dict = {}
        self._one = {}
        for name in ONE_D:
            expr = K[name]
            f = evaluator(expr, (Q,), K.kinks)
            if expr.has(sp.Integral) and name in ("V", "dpsi2"):
                f = Table1D(f, key=f"{name} {sp.srepr(expr)} kinks {K.kinks!r}", ship=shipped_1d_name(K, name))
                self.how[name] = "1-D table"
            else:
                self.how[name] = "quadrature" if expr.has(sp.Integral) else "closed form"
            self._one[name] = f
        self._C = evaluator(K.C, (Q1, Q2, Q12), K.kinks)
        self._dC = evaluator(K.dC, (Q1, Q2, Q12), K.kinks)
        self.how["dC"] = "quadrature" if K.dC.has(sp.Integral) else "closed form"
        self._T = None
        if K.C.has(sp.Integral):
            try:
                self._T = tables.table(K)
            except (NotImplementedError, tables.TableError):
                self._T = None
        self.how["C"] = ("closed form" if not K.C.has(sp.Integral) else
                         "quadrature" if self._T is None else f"{self._T.kind} table, else quadrature")
        r = distance_rule(K)
        self._D = r.fn
        self.D_exact = r.exact and not K.C.has(sp.Integral)
        if self._T is not None and self._T.info.get("D") not in (None, tables.D_DIFF):
            self.D_exact = True
        self.how["D"] = r.method if self._T is None else f"table ({self._T.info.get('D')}), else {r.method}"

    # ------------------------------------------------------------------ one input
    def V(self, q):
        return self._one["V"](np.asarray(q, float))

    def dpsi2(self, q):
        return self._one["dpsi2"](np.asarray(q, float))

    def mean(self, q):
        return self._one["mean"](np.asarray(q, float))

    def dV(self, q):
        return self._one["dV"](np.asarray(q, float))

    # ------------------------------------------------------------------ two inputs
    @property
    def table(self):
        """The (q, theta) table of C (symfield.numeric.tables), or None."""
        return self._T

    def _covered(self, a, b):
        """Points the table evaluates: any norms (homogeneous), else equal norms below the table cap."""
        if self._T is None:
            return np.zeros(a.shape, bool)
        if self._T.kind == "homogeneous":
            return np.isfinite(a) & np.isfinite(b)
        return (a == b) & (a >= 0) & (a < tables.q_top())

    def _tabled(self, fn_table, fn_slow, a, b, *rest):
        a, b, *rest = np.broadcast_arrays(np.asarray(a, float), np.asarray(b, float), *(np.asarray(v, float) for v in rest))
        shape = a.shape
        a, b, rest = a.ravel(), b.ravel(), [v.ravel() for v in rest]
        out = np.full(a.shape, np.nan)
        ok = self._covered(a, b)
        if ok.any():
            try:
                if self._T.kind != "homogeneous":
                    self._T.ensure(float(a[ok].min()), float(a[ok].max()))
                mod = tables.load_module()
                out[ok] = fn_table(mod)(self._T.arrays(), *(np.ascontiguousarray(v[ok]) for v in (a, b, *rest)))
            except tables.TableError:
                pass
        bad = np.isnan(out)
        if bad.any():
            out[bad] = fn_slow(a[bad], b[bad], *(v[bad] for v in rest))
        return out.reshape(shape)

    def C(self, q1, q2, q12):
        if self._T is None:
            return self._C(*(np.asarray(v, float) for v in (q1, q2, q12)))
        return self._tabled(lambda mod: mod.C_many, self._C, q1, q2, q12)

    def dC(self, q1, q2, q12):
        return self._dC(*(np.asarray(v, float) for v in (q1, q2, q12)))

    def D(self, q1, q2, q12, d):
        if self._T is None or self._T.info.get("D") in (None, tables.D_DIFF):
            return self._D(q1, q2, q12, d)
        return self._tabled(lambda mod: mod.D_many, self._D, q1, q2, q12, d)


class MpMaps:
    """mpmath maps of one kernel at ``dps`` digits, element-wise (the quadrature or closed form at dps)."""

    def __init__(self, K: Kernel, dps: int):
        self.K, self.dps = K, dps
        self.how = {name: ("closed form" if not K[name].has(sp.Integral) else f"quadrature at dps={dps}")
                    for name in ONE_D + TWO_D}
        r = distance_rule(K, dps)
        self._D, self.D_exact = r.fn, True     # mpmath's plain difference works at extra digits
        self.how["D"] = r.method

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

    def D(self, q1, q2, q12, d):
        return self._D(q1, q2, q12, d)

