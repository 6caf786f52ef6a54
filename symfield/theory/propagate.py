"""Depth recursions of the mean-field maps over (sigma_w2, sigma_b2) grids.

    layer 1 (linear):  q = sigma_w2 q0 + sigma_b2,    q12 = sigma_w2 q12_0 + sigma_b2
    layer l >= 2:      q' = sigma_w2 V(q) + sigma_b2,  q12' = sigma_w2 C(qa, qb, q12) + sigma_b2
    residual=alpha:    q' = q + alpha^2 (sigma_w2 V(q) + sigma_b2)        (docs/theory.md section 8)

The recursion runs on the path the maps engine chooses (:meth:`symfield.numeric.maps.Maps.run_grid`):
generated compiled code for closed forms ("numba-generated"), the compiled recursion over a certified
table grown as the points move ("numba-table", "+numpy-quadrature" for points it cannot finish; "python-table",
the same table looked up in NumPy, when a few point-layers would not repay loading the compiled table module), or the
same step with NumPy quadrature ("numpy-quadrature"); docs/numerics.md section 1.
"""
from __future__ import annotations

from symfield.core.errors import InvalidValue
import math
from dataclasses import dataclass, field
from typing import ClassVar, Literal
from functools import cached_property

import mpmath
import numpy as np
from numpy.typing import ArrayLike

from symfield.core import validate as check
from symfield.core.dataset import ToXarray, grid_coords
from symfield.numeric.kernels.layout import DOMAIN, OK, OVERFLOW, UNDERFLOW
from symfield.numeric.maps import maps
from symfield.symbolic.activation import Activation
from symfield.numeric.evaluate import GUARD_DIGITS, to_mpf
from symfield.symbolic.kernel import kernel
from symfield.theory import norm as nm
from symfield.theory.ntk_core import Coefficients, compiled_maps, compiled_note, terms_f64, theta_f64

_F = "propagate"
METHODS = ("auto", "table", "quadrature")
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
    theta_aa: np.ndarray | None = field(default=None, repr=False)
    theta_ab: np.ndarray | None = field(default=None, repr=False)
    d_theta: np.ndarray | None = field(default=None, repr=False)
    STATUS: ClassVar[dict] = STATUS      # code -> meaning
    STATUS_NAMES: ClassVar[tuple] = ("ok", "overflow", "domain", "underflow")   # flag_meanings of status

    def dataset_parts(self) -> dict:
        """The arrays, coordinates, dims and parameters of :meth:`to_xarray` (for symfield.io.output.save)."""
        grid, coords, scalars = grid_coords(self.sigma_w2, self.sigma_b2)
        names = ("q", "qab", "qbb", "d", "c", "one_minus_c", "gamma", "theta_aa", "theta_ab", "d_theta", "gamma_theta")
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
    def gamma_theta(self) -> np.ndarray | None:
        """NTK drift ratio Theta_ab/(Theta_aa - Theta_ab) = 2 Theta_ab/d_Theta (``ntk=True`` only; section 13)."""
        if self.theta_ab is None:
            return None
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            return 2 * self.theta_ab / self.d_theta

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


def _layerwise(K, opts, swf, sbf, shape, qa0, qb0, qab, d0, depth, store, alpha, dps):
    """The recursion layer by layer on the engine (:func:`symfield.theory.norm.recursion`): normalised maps,
    or any maps at ``dps``."""
    if alpha is not None:
        check.fail(_F, "residual", "None with norm or dps (residual normalised blocks are not supported)", alpha)
    if dps is not None:
        with mpmath.workdps(dps + GUARD_DIGITS):
            swf, sbf = (np.frompyfunc(to_mpf, 1, 1)(v) for v in (swf, sbf))
            qa0, qb0, qab, d0 = (to_mpf(v) for v in (qa0, qb0, qab, d0))
    qa, qb, qq, d = nm.recursion(K, opts, swf, sbf, qa0, qb0, qab, d0, depth, dps)
    pick = store - 1
    rows = (store.size,) + tuple(shape)
    general = qa0 != qb0 and (opts is None or depth == 1 or any(store == 1))
    return Propagation(
        q=qa[pick].reshape(rows), qab=qq[pick].reshape(rows), qbb=qb[pick].reshape(rows) if general else None,
        layers=store, status=np.zeros(shape, np.int8), grid_shape=tuple(shape),
        method="mpmath" if dps is not None else "numpy-norm",
        params=dict(act=K.act.name, depth=depth, q0=float(qa0), qab0=float(qab), qbb0=float(qb0), d0=float(d0),
                    residual=None, norm=None if opts is None else opts.kind,
                    norm_at=None if opts is None else opts.at, batch=None if opts is None else opts.batch, dps=dps),
        d=d[pick].reshape(rows), last_finite=np.full(shape, depth), sigma_w2=swf.reshape(shape),
        sigma_b2=sbf.reshape(shape))


def _distance(d0, qa0, qb0, qab):
    """(d0, qab): the inputs' squared distance, given (checked, and qab from it) or from the overlap."""
    if d0 is None:
        return max(qa0 + qb0 - 2.0 * qab, 0.0), qab
    d0 = _scalar("d0", d0, lo=0)
    if d0 > 2 * (qa0 + qb0):
        check.fail(_F, "d0", f"a squared distance 0 <= d0 <= 2 (q0 + qbb0) = {2 * (qa0 + qb0)!r}", d0)
    return d0, (qa0 + qb0 - d0) / 2


def _ntk_allowed(ntk, opts, dps, general, qbb0):
    """ntk=True runs on the float64 grid, unnormalised, with equal input norms: anything else is one error."""
    if ntk and (opts is not None or dps is not None):
        check.fail(_F, "ntk", "False with norm or dps (the NTK runs on the float64 grid, unnormalised; "
                   "use sf.ntk(..., dps=N) for mpmath)", ntk)
    if ntk and general:
        check.fail(_F, "qbb0", "None or equal to q0 with ntk=True (the NTK recursion takes equal norms)", qbb0)


def propagate(act: str | Activation, sigma_w2: ArrayLike, sigma_b2: ArrayLike, depth: int, q0: float = 1.0,
              qab0: float = 0.0, layers: ArrayLike | None = None, residual: float | None = None,
              qbb0: float | None = None, method: Literal["auto", "table", "quadrature"] = "auto",
              d0: float | None = None, norm: str | None = None, norm_at: str = "before",
              batch: int | None = None, dps: int | None = None, ntk: bool = False) -> Propagation:
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
    norm, norm_at, batch : optional
        None / "layer" / "batch", "before" / "after" phi, BatchNorm batch size (None: B -> inf); the
        normalised maps of docs/theory.md section 12. LayerNorm runs in the compiled grid recursion of the
        engine (methods as without a norm; ``params["norm"]`` says which); BatchNorm, LayerNorm after phi with
        qbb0 != q0 and maps on quadrature run layer by layer in NumPy (method "numpy-norm").
    dps : int, optional
        mpmath numbers at N digits, layer by layer on the engine (object arrays; method "mpmath").
    ntk : bool
        Also the neural tangent kernel (NTK parameterisation; equal norms): ``.theta_aa``, ``.theta_ab``,
        ``.d_theta`` and ``.gamma_theta`` per stored layer (docs/theory.md section 13; as :func:`symfield.ntk`).
        Closed forms carry it in the compiled recursion; other kernels evaluate its maps in NumPy over every
        layer (``method`` ends in "+numpy-ntk"); ``params["ntk"]`` names the rule of dTdot. A non-finite Theta
        is status 1, an underflowed d_Theta status 3.

    Returns
    -------
    Propagation
        ``.q``, ``.qab``, ``.qbb``, ``.d``, ``.c``, ``.one_minus_c``, ``.gamma`` of shape
        ``(len(layers), *grid_shape)``, ``.layers``, per-point ``.status`` (:data:`STATUS`) and ``.last_finite``,
        ``.method`` ("numba-generated", "numba-table", with "+numpy-tail" / "+numpy-quadrature" for points
        beyond the table, "python-table" or "numpy-quadrature") and ``.error`` / ``.error_bound`` (the table's certified per-step bounds).

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
    swf, sbf = (np.array(np.broadcast_to(v, shape), dtype=np.float64, order="C").ravel() for v in (sw, sb))
    alpha2 = 0.0 if alpha is None else alpha * alpha
    d0, qab = _distance(d0, qa0, qb0, qab)
    opts, dps = nm.options(_F, norm, norm_at, batch), check.dps(_F, dps)
    _ntk_allowed(ntk, opts, dps, general, qbb0)
    if dps is not None or (opts is not None and alpha is not None):
        return _layerwise(K, opts, swf, sbf, shape, qa0, qb0, qab, d0, depth, store, alpha, dps)
    forms, args = (compiled_maps(K) if ntk else None), (swf, sbf, qa0, qb0, qab, d0, depth)
    M = maps(K, method=method)
    every = (lambda: np.arange(1, depth + 1, dtype=np.int64))   # the NumPy NTK's rows: every layer
    ran = M.run_grid(*args, every() if ntk and forms is None else store, alpha2, alpha is not None, general,
                     norm=opts, ntk=forms)
    if ran is None:                      # the engine has no compiled path for this normalisation
        return _layerwise(K, opts, swf, sbf, shape, qa0, qb0, qab, d0, depth, store, alpha, dps)
    if forms is not None and not ran[0][4].size:   # the closed form ran off the generated code: NTK in NumPy
        ran = M.run_grid(*args, every(), alpha2, alpha is not None, general)
    return _grid_result(K, ran, swf, sbf, shape, store, general, ntk, dict(
        act=K.act.name, depth=depth, q0=qa0, qab0=qab, qbb0=qb0, d0=d0, residual=alpha, norm=None, norm_at=None,
        batch=None))


def _grid_result(K, ran, swf, sbf, shape, store, general, ntk, params):
    """The :class:`Propagation` of an engine run ``ran`` = (out, status, last, method, error, info) over every layer
    (ntk) or the stored ones, with the NTK rows when asked."""
    out, status, last, how, error, info = ran
    qa0, qab, d0, alpha = params["q0"], params["qab0"], params["d0"], params["residual"]
    rows = (store.size,) + tuple(shape)
    thetas = (None, None, None)
    if ntk and out[4].size:          # the compiled recursion carried the NTK (closed forms)
        thetas = tuple(out[4])
        note, exact = compiled_note(compiled_maps(K))
        info = dict(info, ntk=f"compiled with the recursion; {note}", ntk_exact=exact)
    elif ntk:                        # every layer's NNGP rows: the NTK's maps from the engine in NumPy
        thetas, note, exact = _ntk_rows(K, out, swf, sbf, qa0, qab, d0, alpha, store)
        out = tuple(v[store - 1] if np.size(v) else v for v in out)
        how, info = how + "+numpy-ntk", dict(info, ntk=f"NumPy (terms_f64); {note}", ntk_exact=exact)
    out_qa, out_qb, out_qab, out_d = out[:4]
    return Propagation(
        q=out_qa.reshape(rows), qab=out_qab.reshape(rows),
        qbb=out_qb.reshape(rows) if general else None,
        layers=store, status=status.reshape(shape), grid_shape=tuple(shape), method=how,
        params=dict(params, **info), error=error, d=out_d.reshape(rows), last_finite=last.reshape(shape),
        sigma_w2=swf.reshape(shape), sigma_b2=sbf.reshape(shape),
        **({} if not ntk else dict(zip(("theta_aa", "theta_ab", "d_theta"), (v.reshape(rows) for v in thetas)))))


def _ntk_rows(K, out, sw, sb, qa0, qab0, d0, alpha, store):
    """Theta_aa, Theta_ab, d_Theta at the stored layers from the NNGP rows of every layer (arrays (depth, P)), how
    dTdot was evaluated and whether it is exact as c -> 1: the documented path of kernels without compiled
    NTK maps (tables, quadrature; :func:`symfield.theory.ntk_core.compiled_maps`)."""
    q, _, qab, d = (np.asarray(v, dtype=float) for v in out[:4])
    vd = None
    if alpha is None:   # layer l+1's q = sigma_w2 V(q_l) + sigma_b2 and d = sigma_w2 D: the recursion has evaluated them
        V, D = np.full(q.shape, np.nan), np.full(q.shape, np.nan)
        V[:-1], D[:-1] = (q[1:] - sb) / sw, d[1:] / sw
        vd = (V.ravel(), D.ravel())
    terms, note, exact = terms_f64(K, q.ravel(), qab.ravel(), d.ravel(), vd)
    terms = [t.reshape(q.shape) for t in terms]
    first = (sw * qa0 + sb, sw * qab0 + sb, sw * d0)
    taa, tab, dth, _ = theta_f64(first, terms, Coefficients(sw, sw, sb, alpha))
    return (taa[store - 1], tab[store - 1], dth[store - 1]), note, exact
