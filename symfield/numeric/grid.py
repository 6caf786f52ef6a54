"""The layer recursion over a grid of points, on the path the engine chose (docs/numerics.md section 1).

Three runners of the one recursion (:mod:`symfield.numeric.kernels.recursion`):

- :func:`run_compiled`: a generated module (closed-form maps), compiled, parallel over points;
- :func:`run_table`: the compiled table module with a certified table's data M; a point that leaves the
  table stops (LEFT_TABLE) with its state, the table grows to cover it and the point goes on
  (:func:`_grow`: each round makes progress or stops); points the table cannot finish go on by quadrature;
- :func:`run_numpy`: the same step run as plain Python on NumPy arrays with the engine's maps (quadrature).

Compiled code does not see Ctrl-C: long runs go in chunks of layers, each one compiled call, so a
KeyboardInterrupt surfaces between them (:func:`_recurse`).
"""
from __future__ import annotations

import time
import warnings

import numpy as np

from symfield.core.errors import NotCertified
from symfield.numeric import codegen
from symfield.numeric.kernels import recursion
from symfield.numeric.kernels.layout import DOMAIN, LEFT_TABLE, OK, OVERFLOW, PAUSED, TINY, UNDERFLOW

# The first chunk does CHUNK_WORK point-layers (~0.02 s for closed forms, ~1 us per point-layer; a few times
# that for tables); each later one is sized from the measured (wall) time per layer of the one before to last
# about CHUNK_SECONDS, growing at most 8x per chunk: on a loaded machine the measured rate is the loaded one.
CHUNK_SECONDS = 0.2
CHUNK_WORK = 2e4


def outputs(nstore, n, general, depth, alloc=np.empty, ntk=False):
    """Output rows (qa, qb, qab, d, theta), status and last finite layer; the compiled kernel writes every entry.
    theta (3, nstore, n) holds the NTK's (Theta_aa, Theta_ab, d_Theta) with ``ntk``, else it is empty."""
    qb = alloc((nstore, n)) if general else np.empty((0, 0))
    th = alloc((3, nstore, n)) if ntk else np.empty((0, 0, 0))
    out = (alloc((nstore, n)), qb, alloc((nstore, n)), alloc((nstore, n)), th)
    return out, np.zeros(n, dtype=np.int8), np.full(n, depth, dtype=np.int64)


NO_AUX = np.zeros((0, 4))


def _state(n, ntk=False):
    """The continuation state (qa, qb, qab, d, theta (n, 3) or empty) of n points."""
    return [np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n), np.zeros((n if ntk else 0, 3))]


def run_compiled(module, sw, sb, qa0, qb0, qab0, d0, depth, store, alpha2, residual, general, norm=0, aux=NO_AUX,
                 ntk=False):
    """One pass of a generated module's kernel from layer 1 at every point (closed forms never leave the domain).
    ``norm``, ``aux``: the LayerNorm step of :func:`symfield.numeric.kernels.recursion.recurse` (0: none);
    ``ntk``: the NTK goes along (a module printed with its maps, equal norms, no norm), rows in out[4]."""
    n = sw.size
    out, status, last = outputs(store.size, n, general, depth, ntk=ntk)
    start, st = np.ones(n, dtype=np.int64), _state(n, ntk)
    _recurse(module.recurse, (sw, sb, float(qa0), float(qb0), float(qab0), float(d0)), int(depth), store,
             (float(alpha2), bool(residual), bool(general), codegen.no_data(), int(norm), aux, codegen.no_data(),
              bool(ntk)), start, st, out, status, last)
    return out, status, last


def _recurse(recurse, inputs, depth, store, opts, start, st, out, status, last):
    """``recurse`` over layers min(start[start > 0])..depth in chunks of layers.

    ``inputs`` = (sw, sb, qa0, qb0, qab0, d0), ``opts`` = (alpha2, residual, general, M, norm, aux, N, ntk). start, st, out,
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


def run_table(maps, T, sw, sb, qa0, qb0, qab0, d0, depth, store, alpha2, residual, general, spill, norm=0,
              aux=NO_AUX, cover=None):
    """Compiled recursion with table maps; the table grows to the q-range the points reach.

    A point leaving the table stops with status LEFT_TABLE and its state; the table is extended to cover the
    stopped points (:meth:`symfield.numeric.tables.Table.extend_to`) and they continue. Each round makes
    progress or stops (:func:`_grow`): a point continues only if the packed table it left did not cover its q
    and the extended one does, so the covered q-range grows every round. Points beyond the table cap, whose
    extension fails, or that left a table that covers them (one warning) continue on the quadrature path; so
    do stopped points for which ``spill(point_layers, q_lo, q_hi)`` (the engine's ski rental) says that
    quadrature is cheaper than building. Returns (out, status, last, points on quadrature).

    Under LayerNorm (``norm`` > 0) the table is first extended to ``cover`` = (q_lo, q_hi), the variances the
    maps see (1 before phi; layer 1's q and q* after phi); a point that still leaves it raises NotCertified
    (the NumPy quadrature fallback runs the unnormalised step)."""
    n = sw.size
    out, status, last = outputs(store.size, n, general, depth)
    start = np.ones(n, dtype=np.int64)
    st = _state(n)
    mod = codegen.table_module()
    q1 = sw * qa0 + sb           # first guess: the first layer's q (homogeneous: its one theta-table)
    T.extend_to(*((float(q1.min()), float(q1.max())) if cover is None else cover))
    run = np.ones(n, dtype=bool)
    quad = np.zeros(n, dtype=bool)
    while run.any():
        M = T.arrays()
        s = np.where(run, start, 0)
        _recurse(mod.recurse, (sw, sb, float(qa0), float(qb0), float(qab0), float(d0)), int(depth), store,
                 (float(alpha2), bool(residual), bool(general), M, int(norm), aux, M, False), s, st, out, status, last)
        start[run] = s[run]
        need = np.flatnonzero(run & (status == LEFT_TABLE))
        run[:] = False
        if norm and need.size:
            raise NotCertified(f"{need.size} point(s) left the table of {T.name} under LayerNorm")
        if need.size and spill(int(np.sum(depth + 1 - start[need])), float(st[0][need].min()), float(st[0][need].max())):
            quad[need] = True
        elif need.size:
            again = _grow(mod, T, M, st[0][need], maps.tail_from())
            run[need[again]] = True
            quad[need[~again]] = True
    n_quad = int(quad.sum())
    if n_quad:
        idx = np.flatnonzero(quad)
        run_numpy(maps, sw, sb, qa0, qb0, qab0, d0, depth, store, alpha2, residual, general,
                  idx=idx, start=start[idx], state=[v[idx] for v in st[:4]], out=(out, status, last))
    return out, status, last, n_quad


def _grow(mod, T, M, qs, top):
    """Extend T for points that stopped (LEFT_TABLE) at q = qs under the packed table M. True where a point may
    go on with the table: M did not cover its q and T.arrays() now does. False (quadrature) from ``top`` (the
    large-q tail's start, :meth:`Maps.tail_from`: below the cap where panels cost minutes) and beyond the cap,
    when the extension fails, and where the table covers q but the point left it anyway (M covered it, or the
    extension did not reach it: an inconsistent table, one warning; never another round)."""
    qs = np.ascontiguousarray(qs, dtype=float)
    left = ~mod.covers_many(M, qs)
    ok = left & (qs < min(T.q_top, top))
    try:
        if ok.any():
            T.extend_to(float(qs[ok].min()), float(qs[ok].max()))
    except NotCertified:
        return np.zeros(qs.shape, dtype=bool)
    again = ok & mod.covers_many(T.arrays(), qs)
    odd = ~left | (ok & ~again)
    if odd.any():
        lo, hi = T.q_range
        warnings.warn(f"propagate: {int(odd.sum())} point(s) left the table of {T.name} at q = {qs[odd][0]:.6g}, "
                      f"which it covers (q in [{lo:.3g}, {hi:.3g}]); they continue on the quadrature path",
                      RuntimeWarning, stacklevel=6)
    return again


def _status(qa, qb, qab, dv):
    """Per-point status of a state (the compiled point_status, vectorised): OK, OVERFLOW, DOMAIN or UNDERFLOW."""
    code = np.zeros(qa.shape, dtype=np.int8)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        code[~((dv >= TINY) & np.isfinite(qab / (0.5 * dv)))] = UNDERFLOW
        code[~((qa >= 0) & (qb >= 0) & (dv >= 0))] = DOMAIN
        code[~(np.isfinite(qa) & np.isfinite(qb) & np.isfinite(qab))] = OVERFLOW
    return code


def run_numpy(maps, sw, sb, qa0, qb0, qab0, d0, depth, store, alpha2, residual, general,
              idx=None, start=None, state=None, out=None):
    """The recursion with NumPy arrays and the engine's maps ``maps.V/C/D`` (quadrature), over all points or
    the points ``idx`` continuing from layer ``start`` with ``state`` (the values of layer start - 1),
    writing into ``out``."""
    first_layer, layer_step = maps.step()
    if out is None:
        out = outputs(store.size, sw.size, True, depth, lambda shape: np.full(shape, np.nan))
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
        code = _status(*(v[act] for v in st))
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


def python_recursion(V, C, D, in_domain):
    """The grid kernel ``recurse`` run as plain Python with the given scalar maps (tests, small checks)."""
    return codegen.bind(recursion, in_domain=in_domain, **codegen.plain_maps(V, C, D))["recurse"]
