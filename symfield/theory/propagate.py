"""Depth recursions of the mean-field maps over (sigma_w2, sigma_b2) grids.

    layer 1 (linear):  q = sigma_w2 q0 + sigma_b2,    q12 = sigma_w2 q12_0 + sigma_b2
    layer l >= 2:      q' = sigma_w2 V(q) + sigma_b2,  q12' = sigma_w2 C(qa, qb, q12) + sigma_b2
    residual=alpha:    q' = q + alpha^2 (sigma_w2 V(q) + sigma_b2)        (docs/theory.md section 8)

One recursion (``codegen.STEP_SOURCE``, grid kernel ``codegen.GRID_SOURCE``), three ways to get V, C:

- ``numba-generated``: closed-form maps (relu family, erf, sin/cos, polynomials, avg-pools of these)
  printed to a generated Numba module (:mod:`symfield.codegen`), run in parallel over grid points;
- ``numba-table``: maps without a closed form (tanh, softplus, sigmoid, silu, gelu, ELU, max-pools,
  avg-pools of these) interpolated from a certified table (:mod:`symfield.tables`, built once per
  activation and cached on disk) inside the same compiled kernel. The table covers the q-range the
  grid reaches: a point that leaves it stops (status LEFT_TABLE inside the kernel), the table is extended and
  the point continues from its state; beyond the table cap (q > 2^16), or for unequal input norms
  with a non-homogeneous psi, points continue on the quadrature path (method ``numba-table+numpy-quadrature``);
- ``numpy-quadrature``: the same step executed with NumPy arrays and the error-controlled quadrature
  of :func:`symfield.numeric.evaluate` per layer (slow; used for tiny jobs whose table is not cached,
  for unequal norms with non-homogeneous maps, and for non-monotone max-pools).
"""
from __future__ import annotations

from symfield.core.errors import InvalidValue
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import ClassVar, Literal
from functools import cached_property

import numpy as np
from numpy.typing import ArrayLike

from symfield.core import validate as check
from symfield.core.dataset import ToXarray, grid_coords
from symfield.numeric import codegen, tables
from symfield.numeric.distance import rule as distance_rule
from symfield.numeric.evaluate import evaluate
from symfield.symbolic.gaussian import q as Q, q1 as Q1, q2 as Q2, q12 as Q12
from symfield.symbolic.activation import Activation
from symfield.symbolic.kernel import kernel

_F = "propagate"
METHODS = ("auto", "table", "quadrature")
# point-layers below which building an uncached table costs more than quadrature (method="auto"):
# a table takes ~1e3 polar-rule or ~2e4 quadrature node evaluations per q-octave
SMALL_JOB = {True: 64, False: 20000}


def _small_job(T):
    """Point-layers below which quadrature beats building T (ski rental: SMALL_JOB by T's evaluator)."""
    return SMALL_JOB[T.evaluator().fast]


# the compiled recursion's status codes (named in one place, codegen.Status); 0-3 are public, LEFT_TABLE
# (the point stopped outside the table) and PAUSED (a chunk of layers ended) are internal
_S = codegen.Status
OK, OVERFLOW, DOMAIN, UNDERFLOW, LEFT_TABLE, PAUSED = (int(s) for s in (_S.OK, _S.OVERFLOW, _S.DOMAIN, _S.UNDERFLOW,
                                                                       _S.LEFT_TABLE, _S.PAUSED))
STATUS = {OK: "ok", OVERFLOW: "q overflowed (later layers NaN)",
          DOMAIN: "left the maps' domain (later layers NaN)",
          UNDERFLOW: "d underflowed: gamma beyond float64 after layer last_finite (q, q12 go on)"}


@dataclass(frozen=True)
class Propagation(ToXarray):
    """Per-layer q, q12, d (and qbb) on a grid; arrays have shape (len(layers), *grid_shape).

    Row i holds layer ``layers[i]`` (1-based; layer 1 is the linear layer). ``d = q_aa + q_bb - 2 q_ab``
    has its own map (docs/theory.md section 7), so ``gamma = 2 q12/d`` and ``one_minus_c`` keep their
    relative accuracy as c -> 1. ``status`` has the grid shape (see :data:`STATUS`): 0 ok; 1 q overflowed
    and 2 left the maps' domain (the point stops, later rows NaN); 3 d underflowed (gamma beyond float64)
    after layer ``last_finite`` (q and q12 go on; gamma is inf from there). ``last_finite`` is the last
    layer with a finite gamma (depth when none failed). Points the table path cannot finish (beyond the
    table cap, a failed extension, or a table that covers a point but could not evaluate it: one
    RuntimeWarning) go on from their state on the quadrature path (``params["points_on_quadrature"]``,
    method "numba-table+numpy-quadrature"); their status is the quadrature run's, with the same meanings.
    ``qbb`` is None when both inputs have equal norm.
    ``method`` names the path that ran; ``error`` holds the certified per-step bounds of the table path
    (V relative, C against sqrt(V V), C_rel for odd psi; empty for closed forms and quadrature);
    ``params["distance"]`` names how D was evaluated and whether it is exact as c -> 1.
    ``sigma_w2``, ``sigma_b2``: the grid's values (grid shape). ``to_xarray()``: an xarray.Dataset with
    dims (layer, sigma_w2, sigma_b2) for an outer-product grid (a dim per varying axis; see
    :func:`symfield.core.dataset.grid_coords`), ``status``/``last_finite`` over the grid only.
    """
    q: np.ndarray
    qab: np.ndarray
    qbb: np.ndarray | None
    layers: np.ndarray
    status: np.ndarray
    grid_shape: tuple
    method: str
    params: dict = field(default_factory=dict, repr=False)
    error: dict = field(default_factory=dict, repr=False)
    d: np.ndarray | None = None
    last_finite: np.ndarray | None = None
    sigma_w2: np.ndarray | None = field(default=None, repr=False)
    sigma_b2: np.ndarray | None = field(default=None, repr=False)
    STATUS: ClassVar[dict] = STATUS      # code -> meaning
    STATUS_NAMES: ClassVar[tuple] = ("ok", "overflow", "domain", "underflow")   # flag_meanings of status

    def dataset_parts(self) -> dict:
        """The arrays, coordinates, dims and parameters of :meth:`to_xarray` (for symfield.io.output.save)."""
        grid, coords, scalars = grid_coords(self.sigma_w2, self.sigma_b2)
        names = ("q", "qab", "qbb", "d", "c", "one_minus_c", "gamma")
        data = {n: np.asarray(getattr(self, n)) for n in names if getattr(self, n) is not None}
        data.update(status=np.asarray(self.status), last_finite=np.asarray(self.last_finite))
        dims = {n: ("layer",) + grid for n in names}
        dims.update(status=grid, last_finite=grid)
        params = {k: v for k, v in self.params.items() if v is None or isinstance(v, (bool, int, float, str))}
        return dict(data=data, coords={"layer": np.asarray(self.layers), **coords}, dims=dims,
                    params={**params, **scalars, "method": self.method},
                    var_attrs={"status": {"flag_values": np.arange(4, dtype=self.status.dtype),
                                          "flag_meanings": " ".join(self.STATUS_NAMES)}})

    @property
    def error_bound(self) -> float | None:
        """Largest certified per-step error of the maps (table path), else None."""
        vals = [v for k, v in self.error.items() if k in ("V", "C")]
        return max(vals) if vals else None

    @cached_property
    def c(self) -> np.ndarray:
        """Correlation q12 / sqrt(q_aa q_bb)."""
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            return self.qab / (self.q if self.qbb is None else np.sqrt(self.q * self.qbb))

    @cached_property
    def _gap(self) -> np.ndarray:
        """sqrt(q_aa q_bb) - q12 = (d - (sqrt q_aa - sqrt q_bb)^2)/2 (= d/2 at equal norms), from d."""
        if self.qbb is None:
            return self.d / 2
        with np.errstate(invalid="ignore", divide="ignore"):   # (sqrt a - sqrt b)^2 = ((a - b)/(sqrt a + sqrt b))^2
            return (self.d - ((self.q - self.qbb) / (np.sqrt(self.q) + np.sqrt(self.qbb))) ** 2) / 2

    @cached_property
    def one_minus_c(self) -> np.ndarray:
        """1 - c from d (relative-accurate as c -> 1)."""
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            return self._gap / (self.q if self.qbb is None else np.sqrt(self.q * self.qbb))

    @cached_property
    def gamma(self) -> np.ndarray:
        """Drift ratio gamma = q12/(q - q12) = 2 q12/d (docs/theory.md section 7); c/(1 - c) with unequal norms."""
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            return self.qab / self._gap

    @property
    def n_failed(self) -> int:
        return int(np.count_nonzero(self.status))


def _scalar(name, value, **rule):
    arr = check.real(_F, name, value, **rule)
    if arr.ndim != 0:
        check.fail(_F, name, "a scalar (a finite float)", value, TypeError)
    return float(arr)


def _validate(sigma_w2, sigma_b2, depth, q0, qab0, layers, residual, qbb0, method):
    depth = check.integer(_F, "depth", depth, lo=1)
    sw = check.real(_F, "sigma_w2", sigma_w2, lo=0)
    sb = check.real(_F, "sigma_b2", sigma_b2, lo=0)
    try:
        shape = np.broadcast_shapes(sw.shape, sb.shape)
    except ValueError:
        raise InvalidValue(f"The 'sigma_b2' parameter of {_F} must broadcast with sigma_w2 (shape {sw.shape}). "
                         f"Got shape {sb.shape} instead.") from None
    qa0 = _scalar("q0", q0, lo=0, lo_open=True)
    qb0 = qa0 if qbb0 is None else _scalar("qbb0", qbb0, lo=0, lo_open=True)
    qab = _scalar("qab0", qab0)
    if abs(qab) > math.sqrt(qa0 * qb0) * (1 + 4e-16):
        check.fail(_F, "qab0", f"a covariance with |qab0| <= sqrt(q0*qbb0) = {math.sqrt(qa0 * qb0)!r}", qab0)
    grid = math.prod(shape)
    n_store = depth if layers is None else int(np.size(layers))
    check.memory(_F, f"{n_store} stored layers (depth = {depth}) x {grid} grid points x 4 arrays x 8 bytes",
                 n_store * grid * 4 * 8 + (8 * depth if layers is None else 0))
    if layers is None:
        store = np.arange(1, depth + 1, dtype=np.int64)
    else:
        arr = np.asarray(layers)
        rule = f"a list of layer indices in 1..depth = 1..{depth}"
        if arr.dtype == object or arr.dtype.kind not in "iu" or arr.ndim > 1:
            check.fail(_F, "layers", rule, layers, TypeError)
        arr = arr.ravel().astype(np.int64)
        if arr.size == 0 or np.any((arr < 1) | (arr > depth)):
            check.fail(_F, "layers", rule, layers)
        store = np.unique(arr)
    alpha = None if residual is None else _scalar("residual", residual, lo=0)
    if not isinstance(method, str):
        check.fail(_F, "method", f"one of {METHODS}", method, TypeError)
    if method not in METHODS:
        check.fail(_F, "method", f"one of {METHODS}", method)
    return depth, sw, sb, shape, qa0, qb0, qab, store, alpha


def _compute(K, method, general, steps, args):
    """Run the recursion on the best path for K: generated code for closed forms, else a table (quadrature
    for a tiny job or when the table is refused). (out, status, last, method name, error, info)."""
    module, error, info = None, {}, {}
    if K.closed_form:
        try:
            module = codegen.load(K)
        except NotImplementedError:
            module = None  # closed form outside the printer's allow-list: quadrature path below
    if module is not None:
        out, status, last = _run_numba(module, *args)
        how = "numba-generated"
        info["distance"] = _distance_note(K)
    else:
        T = None if method == "quadrature" else _table_for(K, general, steps, method)
        if T is not None:
            try:
                spill = _small_job(T) if method == "auto" else 0
                out, status, last, n_quad = _run_table(K, T, *args, spill=spill)
                how = "numba-table" + ("+numpy-quadrature" if n_quad else "")
                error = T.error
                eD = T.error.get("D", math.inf)
                info = dict(table=T.describe(), table_path=T.info.get("path"), points_on_quadrature=n_quad,
                            distance=(f"tabulated (relative error <= {eD:.1e})" if math.isfinite(eD) else
                                      "plain difference V + V - 2C of the table; gamma loses digits once 1 - c < ~1e-8"))
            except tables.TableError as err:   # the first build failed its accuracy checks: say so, use quadrature
                T, info = None, dict(table_refused=str(err))
        if T is None:
            out, status, last = _run_numpy(K, *args)
            how = "numpy-quadrature"
            info["distance"] = _distance_note(K)
    return out, status, last, how, error, info


def propagate(act: str | Activation, sigma_w2: ArrayLike, sigma_b2: ArrayLike, depth: int, q0: float = 1.0,
              qab0: float = 0.0, layers: ArrayLike | None = None, residual: float | None = None,
              qbb0: float | None = None, method: Literal["auto", "table", "quadrature"] = "auto",
              d0: float | None = None) -> Propagation:
    """Propagate q and q12 of two inputs through ``depth`` layers on a broadcast grid.

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation` (pools included).
    sigma_w2, sigma_b2 : array_like
        Weight and bias VARIANCES, scalars or arrays broadcast to the grid.
    depth : int
        Number of layers L >= 1; layer 1 is linear (docs/theory.md section 1).
    q0, qab0, qbb0 : float
        Input variances and covariance (defaults: normalised, uncorrelated, equal norms). With
        qbb0 != q0 the second input's variance has its own recursion and ``.qbb`` is returned.
    layers : array_like of int, optional
        Layer indices (1..depth) to store; memory is grid x stored layers.
    residual : float, optional
        alpha >= 0 for residual blocks q' = q + alpha^2 (sigma_w2 V(q) + sigma_b2).
    method : {'auto', 'table', 'quadrature'}
        "auto": closed form -> generated code; else a table, or quadrature for a tiny job whose table
        is not cached yet. "table": a table whenever there is one. "quadrature": NumPy quadrature
        (closed forms still run generated code).
    d0 : float, optional
        The inputs' squared distance q0 + qbb0 - 2 qab0, for inputs too close for qab0 to resolve it
        (then qab0 = (q0 + qbb0 - d0)/2).

    Returns
    -------
    Propagation
        ``.q``, ``.qab``, ``.qbb``, ``.d``, ``.c``, ``.one_minus_c``, ``.gamma`` of shape
        ``(len(layers), *grid_shape)``, ``.layers``, per-point ``.status`` (:data:`STATUS`) and ``.last_finite``,
        ``.method`` ("numba-generated", "numba-table", "numba-table+numpy-quadrature" or
        "numpy-quadrature") and ``.error`` / ``.error_bound`` (the table's certified per-step bounds).

    Examples
    --------
    >>> sf.propagate("relu", 2.0, 0.0, depth=3).c.round(6)      # c^(2) = 1/pi
    array([0.      , 0.31831 , 0.493731])
    """
    depth, sw, sb, shape, qa0, qb0, qab, store, alpha = _validate(
        sigma_w2, sigma_b2, depth, q0, qab0, layers, residual, qbb0, method)
    K = kernel(act)
    general = qbb0 is not None and qb0 != qa0
    # fresh writable C-contiguous copies: one numba signature for every call
    swf = np.array(np.broadcast_to(sw, shape), dtype=np.float64, order="C").ravel()
    sbf = np.array(np.broadcast_to(sb, shape), dtype=np.float64, order="C").ravel()
    alpha2 = 0.0 if alpha is None else alpha * alpha
    if d0 is None:
        d0 = max(qa0 + qb0 - 2.0 * qab, 0.0)
    else:
        d0 = _scalar("d0", d0, lo=0)
        if d0 > 2 * (qa0 + qb0):
            check.fail(_F, "d0", f"a squared distance 0 <= d0 <= 2 (q0 + qbb0) = {2 * (qa0 + qb0)!r}", d0)
        qab = (qa0 + qb0 - d0) / 2
    args = (swf, sbf, qa0, qb0, qab, d0, depth, store, alpha2, alpha is not None, general)
    out, status, last, how, error, info = _compute(K, method, general, swf.size * max(depth - 1, 0), args)
    rows = (store.size,) + tuple(shape)
    out_qa, out_qb, out_qab, out_d = out
    return Propagation(
        q=out_qa.reshape(rows), qab=out_qab.reshape(rows),
        qbb=out_qb.reshape(rows) if general else None,
        layers=store, status=status.reshape(shape), grid_shape=tuple(shape), method=how,
        params=dict(act=K.act.name, depth=depth, q0=qa0, qab0=qab, qbb0=qb0, d0=d0, residual=alpha, **info),
        error=error, d=out_d.reshape(rows), last_finite=last.reshape(shape),
        sigma_w2=swf.reshape(shape), sigma_b2=sbf.reshape(shape))


def _distance_note(K):
    r = distance_rule(K)
    return r.method + ("" if r.exact else "; gamma loses digits once 1 - c < ~1e-8")


def _table_for(K, general, work, method):
    """The table to use, or None (quadrature): not tabulable, unequal norms for a non-homogeneous
    psi, or (method "auto") a tiny job whose table is not on disk yet."""
    try:
        T = tables.table(K)
    except NotImplementedError:
        return None
    if general and T.kind != "homogeneous":
        return None
    if method == "auto" and not T.panels and work <= _small_job(T):
        return None
    return T


def _run_numba(module, sw, sb, qa0, qb0, qab0, d0, depth, store, alpha2, residual, general, M=None):
    """One pass of the compiled kernel from layer 1 at every point (closed forms never leave the domain)."""
    n = sw.size
    out, status, last = _outputs(store.size, n, general, depth)
    start, st = np.ones(n, dtype=np.int64), [np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n)]
    _recurse(module.recurse, (sw, sb, float(qa0), float(qb0), float(qab0), float(d0)), int(depth), store,
             (float(alpha2), bool(residual), bool(general), codegen.no_data() if M is None else M),
             start, st, out, status, last)
    return out, status, last


# Compiled code does not see Ctrl-C: the recursion runs in chunks of layers, each one compiled call, and a
# KeyboardInterrupt surfaces between them, so Ctrl-C waits for at most the chunk under way. The first chunk
# does CHUNK_WORK point-layers (~0.02 s for closed forms, ~1 us per point-layer; a few times that for
# tables); each later one is sized from the measured (wall) time per layer of the one before to last about
# CHUNK_SECONDS, growing at most 8x per chunk: on a loaded machine the measured rate is the loaded one.
CHUNK_SECONDS = 0.2
CHUNK_WORK = 2e4


def _recurse(recurse, inputs, depth, store, opts, start, st, out, status, last):
    """``recurse`` (codegen.GRID_SOURCE) over layers min(start[start > 0])..depth in chunks of layers.

    ``inputs`` = (sw, sb, qa0, qb0, qab0, d0), ``opts`` = (alpha2, residual, general, M). start, st, out,
    status and last end as after one call with stop = depth (bit-identical: the state between chunks is
    the kernel's own continuation, start/st_* of status PAUSED). Every chunk advances at least one layer."""
    run = start > 0
    if not run.any():
        return
    lo = int(start[run].min())
    cs = np.where(run, start, 0)
    chunk = max(1, int(CHUNK_WORK / np.count_nonzero(run)))
    while True:
        stop = min(depth, lo + chunk - 1)
        t0 = time.perf_counter()
        recurse(*inputs, depth, stop, store, *opts, cs, *st, *out, status, last)
        per_layer = (time.perf_counter() - t0) / (stop - lo + 1)
        act = cs > 0
        start[act] = cs[act]
        paused = act & (status == PAUSED)
        if stop >= depth or not paused.any():
            return
        cs = np.where(paused, cs, 0)
        lo = stop + 1
        chunk = _next_chunk(chunk, per_layer)


def _next_chunk(chunk, per_layer):
    """Layers in the next chunk: about CHUNK_SECONDS at the last chunk's seconds per layer (growing at most 8x)."""
    return max(1, min(8 * chunk, int(CHUNK_SECONDS / max(per_layer, 1e-9))))


def _outputs(nstore, n, general, depth, alloc=np.empty):
    """Output rows (qa, qb, qab, d), status and last finite layer; the numba kernel writes every entry."""
    qb = alloc((nstore, n)) if general else np.empty((0, 0))
    out = (alloc((nstore, n)), qb, alloc((nstore, n)), alloc((nstore, n)))
    return out, np.zeros(n, dtype=np.int8), np.full(n, depth, dtype=np.int64)


def _run_table(K, T, sw, sb, qa0, qb0, qab0, d0, depth, store, alpha2, residual, general, spill=0):
    """Compiled recursion with table maps; the table grows to the q-range the points reach.

    A point leaving the table stops with status LEFT_TABLE and its state; the table is extended to cover
    the stopped points (generously: x4 up, /8 down, to q = 0 below 2^(E0+3)) and they continue. Each round
    makes progress or stops (:func:`_grow`): a point continues only if the packed table it left did not
    cover its q and the extended one does, so the covered q-range grows every round (at most
    Q_CAP_EXP - E0 + 1 rounds). Points beyond the table cap, whose extension fails, or that left a table
    that covers them (one warning) continue on the quadrature path; so do stopped points whose remaining
    point-layers are at most ``spill`` (method "auto": cheaper than building a panel, the ski-rental rule
    of :func:`_table_for`)."""
    n = sw.size
    out, status, last = _outputs(store.size, n, general, depth)
    start = np.ones(n, dtype=np.int64)
    st = [np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n)]
    mod = tables.load_module()
    if T.kind == "general":   # first guess: the first layer's q (and one V bound for bounded psi later)
        q1 = sw * qa0 + sb
        _extend(T, float(q1.min()), float(q1.max()))
    run = np.ones(n, dtype=bool)
    quad = np.zeros(n, dtype=bool)
    while run.any():
        M = T.arrays()
        s = np.where(run, start, 0)
        _recurse(mod.recurse, (sw, sb, float(qa0), float(qb0), float(qab0), float(d0)), int(depth), store,
                 (float(alpha2), bool(residual), bool(general), M), s, st, out, status, last)
        start[run] = s[run]
        need = np.flatnonzero(run & (status == LEFT_TABLE))
        run[:] = False
        if need.size and np.sum(depth + 1 - start[need]) <= spill:
            quad[need] = True
        elif need.size:
            again = _grow(T, M, st[0][need])
            run[need[again]] = True
            quad[need[~again]] = True
    n_quad = int(quad.sum())
    if n_quad:
        idx = np.flatnonzero(quad)
        _run_numpy(K, sw, sb, qa0, qb0, qab0, d0, depth, store, alpha2, residual, general,
                   idx=idx, start=start[idx], state=[v[idx] for v in st], out=(out, status, last))
    return out, status, last, n_quad


def _grow(T, M, qs):
    """Extend T for points that stopped (status LEFT_TABLE) at q = qs under the packed table M. True where a
    point may go on with the table: M did not cover its q and T.arrays() now does. False (quadrature) beyond
    the cap, when the extension fails, and where the table covers q but the point left it anyway (M covered
    it, or the extension did not reach it: an inconsistent table, one warning; never another round)."""
    left = ~tables.covers(M, qs)
    ok = left & (qs < tables.q_top())
    try:
        if ok.any():
            _extend(T, float(qs[ok].min()), float(qs[ok].max()))
    except tables.TableError:
        return np.zeros(qs.shape, dtype=bool)
    again = ok & tables.covers(T.arrays(), qs)
    odd = ~left | (ok & ~again)
    if odd.any():
        lo, hi = T.q_range
        warnings.warn(f"propagate: {int(odd.sum())} point(s) left the table of {T.name} at q = {qs[odd][0]:.6g}, "
                      f"which it covers (q in [{lo:.3g}, {hi:.3g}]); they continue on the quadrature path",
                      RuntimeWarning, stacklevel=5)
    return again


def _extend(T, lo, hi):
    """Grow a general table to cover [lo, hi] with margins (see _run_table)."""
    qlo, qhi = T.q_range
    new_lo = lo if not (lo < qlo) else (0.0 if lo < 2.0 ** (tables.E0 + 3) else lo / 8)
    new_hi = hi if not (hi >= qhi) else min(4 * hi, tables.q_top())
    if not T.panels:
        new_lo = 0.0 if lo < 2.0 ** (tables.E0 + 3) else lo / 2
        new_hi = min(2 * hi, tables.q_top())
    T.ensure(new_lo, max(new_hi, hi))


def _numpy_step(K):
    """codegen.STEP_SOURCE executed with vectorised quadrature maps (the same recursion text)."""
    dist = distance_rule(K)

    def V(M, qv):
        return evaluate(K.V, (Q,), (qv,), K.kinks)

    def C(M, a, b, c):
        return evaluate(K.C, (Q1, Q2, Q12), (a, b, c), K.kinks)

    def D(M, a, b, c, dv):
        return dist.fn(a, b, c, dv)

    return codegen.step_functions(V, C, D)


def _code(qa, qb, qab, dv):
    """Per-point status of a state (codegen's _code, vectorised): 0, 1 overflow, 2 domain, 3 underflow."""
    code = np.zeros(qa.shape, dtype=np.int8)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        code[~((dv >= codegen.TINY) & np.isfinite(qab / (0.5 * dv)))] = UNDERFLOW
        code[~((qa >= 0) & (qb >= 0) & (dv >= 0))] = DOMAIN
        code[~(np.isfinite(qa) & np.isfinite(qb) & np.isfinite(qab))] = OVERFLOW
    return code


def _run_numpy(K, sw, sb, qa0, qb0, qab0, d0, depth, store, alpha2, residual, general,
               idx=None, start=None, state=None, out=None):
    """The recursion with NumPy arrays and quadrature maps, over all points or the points ``idx``
    continuing from layer ``start`` with ``state`` (the values of layer start - 1), writing into ``out``."""
    first_layer, layer_step = _numpy_step(K)
    if out is None:
        out = _outputs(store.size, sw.size, True, depth, lambda shape: np.full(shape, np.nan))
    rows, status, last = out
    idx = np.arange(sw.size) if idx is None else np.asarray(idx)
    m = idx.size
    start = np.ones(m, dtype=np.int64) if start is None else np.asarray(start)
    st = [np.zeros(m) for _ in range(4)] if state is None else [np.array(v, dtype=float) for v in state]
    sw, sb = sw[idx], sb[idx]
    live = np.ones(m, dtype=bool)
    status[idx] = 0
    for k, layer in enumerate(store):   # rows this call owns are NaN until written
        for r in rows:
            if r.size:
                r[k, idx[start <= layer]] = np.nan
    k = 0
    for layer in range(int(start.min()) if m else depth + 1, depth + 1):
        act = np.flatnonzero(live & (start <= layer))
        if act.size:
            with np.errstate(over="ignore", invalid="ignore"):
                if layer == 1:
                    parts = [(act, first_layer(qa0, qb0, qab0, d0, sw[act], sb[act]))]
                else:   # layer_step takes the distance or the covariance map: one call per side of c = 1/2
                    m = codegen.near_mask(st[3][act], st[0][act], st[1][act] if general else st[0][act])
                    parts = [(ix, layer_step(*(v[ix] for v in st), sw[ix], sb[ix], alpha2, residual, general, None))
                             for ix in (act[m], act[~m]) if ix.size]
            for ix, new in parts:
                for v, nv in zip(st, new):
                    v[ix] = np.broadcast_to(np.asarray(nv, dtype=float), ix.shape)
        while k < store.size and store[k] < layer:
            k += 1
        if k < store.size and store[k] == layer and act.size:
            for r, v in zip(rows, st):
                if r.size:
                    r[k, idx[act]] = v[act]
        code = _code(*(v[act] for v in st))
        under = act[(code == UNDERFLOW) & (last[idx[act]] == depth)]
        last[idx[under]] = layer - 1
        bad = (code == OVERFLOW) | (code == DOMAIN)
        if bad.any():
            status[idx[act[bad]]] = code[bad]
            last[idx[act[bad]]] = np.minimum(last[idx[act[bad]]], layer - 1)
            live[act[bad]] = False
        if not live.any():
            break
    fine = idx[live]
    status[fine] = np.where(last[fine] < depth, UNDERFLOW, OK)
    return rows, status, last
