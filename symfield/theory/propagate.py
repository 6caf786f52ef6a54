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
  grid reaches: a point that leaves it stops (status 2 inside the kernel), the table is extended and
  the point continues from its state; beyond the table cap (q > 2^16), or for unequal input norms
  with a non-homogeneous psi, points continue on the quadrature path (method ``numba-table+numpy-quadrature``);
- ``numpy-quadrature``: the same step executed with NumPy arrays and the error-controlled quadrature
  of :func:`symfield.numeric.evaluate` per layer (slow; used for tiny jobs whose table is not cached,
  for unequal norms with non-homogeneous maps, and for non-monotone max-pools).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from symfield.core import validate as check
from symfield.numeric import codegen, tables
from symfield.numeric.evaluate import evaluate
from symfield.symbolic.gaussian import q as Q, q1 as Q1, q2 as Q2, q12 as Q12
from symfield.symbolic.kernel import kernel

_F = "propagate"
METHODS = ("auto", "table", "quadrature")
# point-layers below which building an uncached table costs more than quadrature (method="auto"):
# a table takes ~1e3 polar-rule or ~2e4 quadrature node evaluations per q-octave
SMALL_JOB = {True: 64, False: 20000}


@dataclass(frozen=True)
class Propagation:
    """Per-layer q, q12 (and qbb) on a grid; arrays have shape (len(layers), *grid_shape).

    Row i holds layer ``layers[i]`` (1-based; layer 1 is the linear layer). ``status`` has
    the grid shape: 0 ok, 1 a value went non-finite (overflow); such a point stops there and
    its later rows are NaN. ``qbb`` is None when both inputs have equal norm. ``method`` names the
    path that ran; ``error`` holds the certified per-step bounds of the table path (V relative,
    C against sqrt(V V), C_rel for odd psi; empty for closed forms and quadrature).
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
    def gamma(self) -> np.ndarray:
        """Drift ratio gamma = q12/(q - q12) (docs/theory.md section 7); = c/(1 - c) with unequal norms."""
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            if self.qbb is None:
                return self.qab / (self.q - self.qab)
            return self.qab / (np.sqrt(self.q * self.qbb) - self.qab)

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
        raise ValueError(f"The 'sigma_b2' parameter of {_F} must broadcast with sigma_w2 (shape {sw.shape}). "
                         f"Got shape {sb.shape} instead.") from None
    qa0 = _scalar("q0", q0, lo=0, lo_open=True)
    qb0 = qa0 if qbb0 is None else _scalar("qbb0", qbb0, lo=0, lo_open=True)
    qab = _scalar("qab0", qab0)
    if abs(qab) > math.sqrt(qa0 * qb0) * (1 + 4e-16):
        check.fail(_F, "qab0", f"a covariance with |qab0| <= sqrt(q0*qbb0) = {math.sqrt(qa0 * qb0)!r}", qab0)
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


def propagate(act, sigma_w2, sigma_b2, depth, q0=1.0, qab0=0.0, layers=None, residual=None, qbb0=None,
              method="auto"):
    """Propagate q and q12 of two inputs through ``depth`` layers on a broadcast grid.

    Parameters
    ----------
    act : activation or spec string.
    sigma_w2, sigma_b2 : weight and bias VARIANCES, scalars or arrays broadcast to the grid.
    depth : number of layers L >= 1; layer 1 is linear (docs/theory.md section 1).
    q0, qab0, qbb0 : input variances and covariance (defaults: normalised, uncorrelated,
        equal norms). With qbb0 != q0 the second input's variance has its own recursion
        and ``.qbb`` is returned.
    layers : layer indices (1..depth) to store; memory is grid x stored layers.
    residual : alpha >= 0 for residual blocks q' = q + alpha^2 (sigma_w2 V(q) + sigma_b2).
    method : "auto" (closed form -> generated code; else a table, or quadrature for a tiny job whose
        table is not cached yet), "table" (a table whenever the activation has one) or "quadrature"
        (the NumPy quadrature path; closed forms still run generated code).

    Returns a :class:`Propagation` with ``.q``, ``.qab``, ``.qbb``, ``.c``, ``.gamma`` of shape
    (len(layers), *grid_shape), ``.layers``, per-point ``.status`` (0 ok, 1 non-finite), ``.method``
    ("numba-generated", "numba-table", "numba-table+numpy-quadrature" or "numpy-quadrature") and
    ``.error`` / ``.error_bound`` (the table's certified per-step bounds).
    """
    depth, sw, sb, shape, qa0, qb0, qab, store, alpha = _validate(
        sigma_w2, sigma_b2, depth, q0, qab0, layers, residual, qbb0, method)
    K = kernel(act)
    general = qbb0 is not None and qb0 != qa0
    # fresh writable C-contiguous copies: one numba signature for every call
    swf = np.array(np.broadcast_to(sw, shape), dtype=np.float64, order="C").ravel()
    sbf = np.array(np.broadcast_to(sb, shape), dtype=np.float64, order="C").ravel()
    alpha2 = 0.0 if alpha is None else alpha * alpha
    args = (swf, sbf, qa0, qb0, qab, depth, store, alpha2, alpha is not None, general)

    module, error, info = None, {}, {}
    if K.closed_form:
        try:
            module = codegen.load(K)
        except NotImplementedError:
            module = None  # closed form outside the printer's allow-list: quadrature path below
    if module is not None:
        out_qa, out_qb, out_qab, status = _run_numba(module, *args)
        how = "numba-generated"
    else:
        T = None if method == "quadrature" else _table_for(K, general, swf.size * max(depth - 1, 0), method)
        if T is not None:
            try:
                out_qa, out_qb, out_qab, status, n_quad = _run_table(K, T, *args)
                how = "numba-table" + ("+numpy-quadrature" if n_quad else "")
                error = T.error
                info = dict(table=T.describe(), table_path=T.info.get("path"), points_on_quadrature=n_quad)
            except tables.TableError as err:   # the first build failed its accuracy checks: say so, use quadrature
                T, info = None, dict(table_refused=str(err))
        if T is None:
            out_qa, out_qb, out_qab, status = _run_numpy(K, *args)
            how = "numpy-quadrature"

    rows = (store.size,) + tuple(shape)
    return Propagation(
        q=out_qa.reshape(rows), qab=out_qab.reshape(rows),
        qbb=out_qb.reshape(rows) if general else None,
        layers=store, status=status.reshape(shape), grid_shape=tuple(shape), method=how,
        params=dict(act=K.act.name, depth=depth, q0=qa0, qab0=qab, qbb0=qb0, residual=alpha, **info),
        error=error)


def _table_for(K, general, work, method):
    """The table to use, or None (quadrature): not tabulable, unequal norms for a non-homogeneous
    psi, or (method "auto") a tiny job whose table is not on disk yet."""
    try:
        T = tables.table(K)
    except NotImplementedError:
        return None
    if general and T.kind != "homogeneous":
        return None
    if method == "auto" and not T.panels and work <= SMALL_JOB[T.evaluator().fast]:
        return None
    return T


def _run_numba(module, sw, sb, qa0, qb0, qab0, depth, store, alpha2, residual, general, M=None):
    """One pass of the compiled kernel from layer 1 at every point (closed forms never leave the domain)."""
    n = sw.size
    out_qa, out_qb, out_qab, status = _outputs(store.size, n, general)
    state = [np.ones(n, dtype=np.int64), np.zeros(n), np.zeros(n), np.zeros(n)]
    module.recurse(sw, sb, float(qa0), float(qb0), float(qab0), int(depth), store, float(alpha2),
                   bool(residual), bool(general), codegen.no_data() if M is None else M,
                   *state, out_qa, out_qb, out_qab, status)
    return out_qa, out_qb, out_qab, status


def _outputs(nstore, n, general, alloc=np.empty):
    """Output rows; the numba kernel writes every entry, so it gets uninitialised memory."""
    qb = alloc((nstore, n)) if general else np.empty((0, 0))
    return alloc((nstore, n)), qb, alloc((nstore, n)), np.zeros(n, dtype=np.int8)


def _run_table(K, T, sw, sb, qa0, qb0, qab0, depth, store, alpha2, residual, general):
    """Compiled recursion with table maps; the table grows to the q-range the points reach.

    A point leaving the table stops with status 2 and its state; the table is extended to cover
    the stopped points (generously: x4 up, /8 down, to q = 0 below 2^(E0+3)) and they continue. Points
    beyond the table cap, or whose extension fails, continue on the quadrature path."""
    n = sw.size
    out_qa, out_qb, out_qab, status = _outputs(store.size, n, general)
    start = np.ones(n, dtype=np.int64)
    st = [np.zeros(n), np.zeros(n), np.zeros(n)]
    mod = tables.load_module()
    if T.kind == "general":   # first guess: the first layer's q (and one V bound for bounded psi later)
        q1 = sw * qa0 + sb
        _extend(T, float(q1.min()), float(q1.max()))
    run = np.ones(n, dtype=bool)
    quad = np.zeros(n, dtype=bool)
    while True:
        s = np.where(run, start, 0)
        mod.recurse(sw, sb, float(qa0), float(qb0), float(qab0), int(depth), store, float(alpha2),
                    bool(residual), bool(general), T.arrays(), s, *st, out_qa, out_qb, out_qab, status)
        start[run] = s[run]
        need = np.flatnonzero(run & (status == 2))
        if need.size == 0:
            break
        qs = st[0][need]
        cap = 2.0 ** tables.Q_CAP_EXP
        ok = qs < cap * 0.99
        try:
            if ok.any():
                _extend(T, float(qs[ok].min()), float(qs[ok].max()))
        except tables.TableError:
            ok[:] = False
        run[:] = False
        run[need[ok]] = True
        quad[need[~ok]] = True
    n_quad = int(quad.sum())
    if n_quad:
        idx = np.flatnonzero(quad)
        _run_numpy(K, sw, sb, qa0, qb0, qab0, depth, store, alpha2, residual, general,
                   idx=idx, start=start[idx], state=[v[idx] for v in st], out=(out_qa, out_qb, out_qab, status))
    return out_qa, out_qb, out_qab, status, n_quad


def _extend(T, lo, hi):
    """Grow a general table to cover [lo, hi] with margins (see _run_table)."""
    qlo, qhi = T.q_range
    new_lo = lo if not (lo < qlo) else (0.0 if lo < 2.0 ** (tables.E0 + 3) else lo / 8)
    new_hi = hi if not (hi >= qhi) else min(4 * hi, 2.0 ** tables.Q_CAP_EXP * 0.99)
    if not T.panels:
        new_lo = 0.0 if lo < 2.0 ** (tables.E0 + 3) else lo / 2
        new_hi = min(2 * hi, 2.0 ** tables.Q_CAP_EXP * 0.99)
    T.ensure(new_lo, max(new_hi, hi))


def _numpy_step(K):
    """codegen.STEP_SOURCE executed with vectorised quadrature maps (the same recursion text)."""

    def V(M, qv):
        return evaluate(K.V, (Q,), (qv,), K.kinks)

    def C(M, a, b, c):
        return evaluate(K.C, (Q1, Q2, Q12), (a, b, c), K.kinks)

    return codegen.step_functions(V, C)


def _run_numpy(K, sw, sb, qa0, qb0, qab0, depth, store, alpha2, residual, general,
               idx=None, start=None, state=None, out=None):
    """The recursion with NumPy arrays and quadrature maps, over all points or the points ``idx``
    continuing from layer ``start`` with ``state`` (the values of layer start - 1), writing into ``out``."""
    first_layer, layer_step = _numpy_step(K)
    if out is None:
        out_qa, out_qb, out_qab, status = _outputs(store.size, sw.size, True, lambda shape: np.full(shape, np.nan))
    else:
        out_qa, out_qb, out_qab, status = out
    idx = np.arange(sw.size) if idx is None else np.asarray(idx)
    m = idx.size
    start = np.ones(m, dtype=np.int64) if start is None else np.asarray(start)
    qa, qb, qab = (np.zeros(m) for _ in range(3)) if state is None else (np.array(v, dtype=float) for v in state)
    sw, sb = sw[idx], sb[idx]
    live = np.ones(m, dtype=bool)
    status[idx] = 0
    for k, layer in enumerate(store):   # rows this call owns are NaN until written
        rows = start <= layer
        out_qa[k, idx[rows]] = np.nan
        out_qab[k, idx[rows]] = np.nan
        if general:
            out_qb[k, idx[rows]] = np.nan
    k = 0
    for layer in range(int(start.min()) if m else depth + 1, depth + 1):
        act = np.flatnonzero(live & (start <= layer))
        if act.size:
            with np.errstate(over="ignore", invalid="ignore"):
                if layer == 1:
                    new = first_layer(qa0, qb0, qab0, sw[act], sb[act])
                else:
                    new = layer_step(qa[act], qb[act], qab[act], sw[act], sb[act], alpha2, residual, general, None)
            qa[act], qb[act], qab[act] = (np.broadcast_to(np.asarray(v, dtype=float), act.shape) for v in new)
        while k < store.size and store[k] < layer:
            k += 1
        if k < store.size and store[k] == layer and act.size:
            out_qa[k, idx[act]], out_qab[k, idx[act]] = qa[act], qab[act]
            if general:
                out_qb[k, idx[act]] = qb[act]
        bad = act[~(np.isfinite(qa[act]) & np.isfinite(qb[act]) & np.isfinite(qab[act]))]
        if bad.size:
            status[idx[bad]] = 1
            live[bad] = False
        if not live.any():
            break
    return out_qa, out_qb, out_qab, status
