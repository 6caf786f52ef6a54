"""Depth recursions of the mean-field maps over (sigma_w2, sigma_b2) grids.

    layer 1 (linear):  q = sigma_w2 q0 + sigma_b2,    q12 = sigma_w2 q12_0 + sigma_b2
    layer l >= 2:      q' = sigma_w2 V(q) + sigma_b2,  q12' = sigma_w2 C(qa, qb, q12) + sigma_b2
    residual=alpha:    q' = q + alpha^2 (sigma_w2 V(q) + sigma_b2)        (MATH.md section 8)

One recursion (``codegen.STEP_SOURCE``), two number systems:

- closed-form maps (relu family, erf, sin/cos, polynomials, avg-pools of these, ...): the maps
  are printed to a generated Numba module (:mod:`symfield.codegen`) and the recursion runs
  compiled, in parallel over grid points (prange);
- maps without a closed form (tanh, softplus, max-pools, ...): the same step is executed with
  NumPy arrays, every map evaluated by the error-controlled quadrature of
  :func:`symfield.numeric.evaluate` over all live grid points at once. This path is correct
  but SLOW (one vectorised quadrature per layer); a table-based fast path is future work.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from . import validate as check
from .gaussian import q as Q, q1 as Q1, q2 as Q2, q12 as Q12
from .kernel import kernel

_F = "propagate"


@dataclass(frozen=True)
class Propagation:
    """Per-layer q, q12 (and qbb) on a grid; arrays have shape (len(layers), *grid_shape).

    Row i holds layer ``layers[i]`` (1-based; layer 1 is the linear layer). ``status`` has
    the grid shape: 0 ok, 1 a value went non-finite (overflow); such a point stops there and
    its later rows are NaN. ``qbb`` is None when both inputs have equal norm.
    """
    q: np.ndarray
    qab: np.ndarray
    qbb: np.ndarray | None
    layers: np.ndarray
    status: np.ndarray
    grid_shape: tuple
    method: str
    params: dict = field(default_factory=dict, repr=False)

    @cached_property
    def c(self) -> np.ndarray:
        """Correlation q12 / sqrt(q_aa q_bb)."""
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            return self.qab / (self.q if self.qbb is None else np.sqrt(self.q * self.qbb))

    @cached_property
    def gamma(self) -> np.ndarray:
        """Drift ratio gamma = q12/(q - q12) (MATH.md section 5); = c/(1 - c) with unequal norms."""
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


def _validate(sigma_w2, sigma_b2, depth, q0, qab0, layers, residual, qbb0):
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
    return depth, sw, sb, shape, qa0, qb0, qab, store, alpha


def propagate(act, sigma_w2, sigma_b2, depth, q0=1.0, qab0=0.0, layers=None, residual=None, qbb0=None):
    """Propagate q and q12 of two inputs through ``depth`` layers on a broadcast grid.

    Parameters
    ----------
    act : activation or spec string.
    sigma_w2, sigma_b2 : weight and bias VARIANCES, scalars or arrays broadcast to the grid.
    depth : number of layers L >= 1; layer 1 is linear (MATH.md section 1).
    q0, qab0, qbb0 : input variances and covariance (defaults: normalised, uncorrelated,
        equal norms). With qbb0 != q0 the second input's variance has its own recursion
        and ``.qbb`` is returned.
    layers : layer indices (1..depth) to store; memory is grid x stored layers.
    residual : alpha >= 0 for residual blocks q' = q + alpha^2 (sigma_w2 V(q) + sigma_b2).

    Returns a :class:`Propagation` with ``.q``, ``.qab``, ``.qbb``, ``.c``, ``.gamma`` of shape
    (len(layers), *grid_shape), ``.layers``, per-point ``.status`` (0 ok, 1 non-finite) and
    ``.method`` ("numba-generated" or "numpy-quadrature").

    Closed-form maps run generated Numba code in parallel over grid points. Maps without a
    closed form (tanh, max-pools, ...) use a vectorised NumPy recursion with quadrature per
    layer: correct to the quadrature tolerance (~1e-10) but slow -- keep such grids small.
    """
    depth, sw, sb, shape, qa0, qb0, qab, store, alpha = _validate(
        sigma_w2, sigma_b2, depth, q0, qab0, layers, residual, qbb0)
    K = kernel(act)
    general = qbb0 is not None and qb0 != qa0
    # fresh writable C-contiguous copies: one numba signature for every call
    swf = np.array(np.broadcast_to(sw, shape), dtype=np.float64, order="C").ravel()
    sbf = np.array(np.broadcast_to(sb, shape), dtype=np.float64, order="C").ravel()
    alpha2 = 0.0 if alpha is None else alpha * alpha
    args = (swf, sbf, qa0, qb0, qab, depth, store, alpha2, alpha is not None, general)

    module = None
    if K.closed_form:
        from . import codegen
        try:
            module = codegen.load(K)
        except NotImplementedError:
            module = None  # closed form outside the printer's allow-list: quadrature path below
    if module is not None:
        out_qa, out_qb, out_qab, status = _run_numba(module, *args)
        method = "numba-generated"
    else:
        out_qa, out_qb, out_qab, status = _run_numpy(K, *args)
        method = "numpy-quadrature"

    rows = (store.size,) + tuple(shape)
    return Propagation(
        q=out_qa.reshape(rows), qab=out_qab.reshape(rows),
        qbb=out_qb.reshape(rows) if general else None,
        layers=store, status=status.reshape(shape), grid_shape=tuple(shape), method=method,
        params=dict(act=K.act.name, depth=depth, q0=qa0, qab0=qab, qbb0=qb0, residual=alpha))


def _outputs(nstore, n, general, alloc=np.empty):
    """Output rows; the numba kernel writes every entry, so it gets uninitialised memory."""
    qb = alloc((nstore, n)) if general else np.empty((0, 0))
    return alloc((nstore, n)), qb, alloc((nstore, n)), np.zeros(n, dtype=np.int8)


def _run_numba(module, sw, sb, qa0, qb0, qab0, depth, store, alpha2, residual, general):
    out_qa, out_qb, out_qab, status = _outputs(store.size, sw.size, general)
    module.recurse(sw, sb, float(qa0), float(qb0), float(qab0), int(depth), store, float(alpha2),
                   bool(residual), bool(general), out_qa, out_qb, out_qab, status)
    return out_qa, out_qb, out_qab, status


def _numpy_step(K):
    """codegen.STEP_SOURCE executed with vectorised quadrature maps (the same recursion text)."""
    from . import codegen
    from .numeric import evaluate

    def V(qv):
        return evaluate(K.V, (Q,), (qv,), K.kinks)

    def C(a, b, c):
        return evaluate(K.C, (Q1, Q2, Q12), (a, b, c), K.kinks)

    ns = {"V": V, "C": C}
    exec(compile(codegen.STEP_SOURCE, "<symfield.codegen.STEP_SOURCE>", "exec"), ns)
    return ns["first_layer"], ns["layer_step"]


def _run_numpy(K, sw, sb, qa0, qb0, qab0, depth, store, alpha2, residual, general):
    first_layer, layer_step = _numpy_step(K)
    out_qa, out_qb, out_qab, status = _outputs(store.size, sw.size, True, lambda shape: np.full(shape, np.nan))
    with np.errstate(over="ignore", invalid="ignore"):
        qa, qb, qab = (np.asarray(v, dtype=float) for v in first_layer(qa0, qb0, qab0, sw, sb))
    qb = np.broadcast_to(qb, qa.shape).copy()
    live = np.arange(sw.size)
    k = 0
    for layer in range(1, depth + 1):
        if layer > 1 and live.size:
            with np.errstate(over="ignore", invalid="ignore"):
                new = layer_step(qa[live], qb[live], qab[live], sw[live], sb[live], alpha2, residual, general)
            qa[live], qb[live], qab[live] = new
        if k < store.size and store[k] == layer:
            out_qa[k, live], out_qb[k, live], out_qab[k, live] = qa[live], qb[live], qab[live]
            k += 1
        bad = ~(np.isfinite(qa[live]) & np.isfinite(qb[live]) & np.isfinite(qab[live]))
        if bad.any():
            status[live[bad]] = 1
            live = live[~bad]
        if not live.size:
            break
    return out_qa, out_qb, out_qab, status
