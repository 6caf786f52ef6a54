"""Results as labelled datasets (xarray): the one builder behind every ``to_xarray()`` and every .nc file.

:func:`build` turns named arrays over named coordinates into an ``xarray.Dataset``:

- every coordinate is its own dimension; a variable spans the whole grid unless ``dims[name]`` says otherwise;
- variables and coordinates get ``long_name`` and ``units`` from :data:`META` (CF conventions; ``"1"``
  is dimensionless: the theory's variances are in the units of the inputs' squared entries);
- phase codes get CF ``flag_values`` / ``flag_meanings`` (:func:`flags`);
- object arrays of mpmath numbers become float64 plus ``<name>_mp``, the text to ``dps`` digits;
- ``attrs["params"]`` holds the parameters as JSON text, each scalar parameter also as its own attribute.

xarray is imported inside :func:`build` only, so ``import symfield`` stays light. The .nc writers
(symfield/io/output.py, symfield/sweep.py) call :func:`build` (docs/numerics.md section 9).
"""
from __future__ import annotations

from symfield.core.errors import Unsupported
import json

import numpy as np

# name -> (long_name, units)
META = {
    # coordinates
    "layer": ("layer index (1 = the linear first layer)", "1"),
    "sigma_w2": ("weight variance sigma_w^2 (W_ij ~ N(0, sigma_w^2/fan_in))", "1"),
    "sigma_b2": ("bias variance sigma_b^2", "1"),
    "network": ("index of the random network", "1"),
    "input": ("index of the input", "1"),
    "input2": ("index of the second input", "1"),
    "entry": ("Gram matrix entry (aa, bb, ab)", None),
    "entry2": ("second Gram matrix entry (aa, bb, ab)", None),
    "quantile": ("quantile level", "1"),
    "feature": ("coordinate of the input vector", "1"),
    "moment": ("moment order k of (1/n) tr (J J^T)^k", "1"),
    "rank": ("index of the squared singular value (ascending)", "1"),
    "formula": ("activation formula", None),
    "code": ("phase code", "1"),
    # propagation
    "q": ("pre-activation variance q_aa", "1"),
    "qab": ("pre-activation covariance q_ab of the two inputs", "1"),
    "qbb": ("pre-activation variance q_bb of the second input", "1"),
    "d": ("squared distance q_aa + q_bb - 2 q_ab", "1"),
    "c": ("correlation c = q_ab / sqrt(q_aa q_bb)", "1"),
    "one_minus_c": ("1 - c", "1"),
    "gamma": ("drift ratio gamma = 2 q_ab / d = c / (1 - c)", "1"),
    "status": ("point status (see flag_meanings)", "1"),
    "last_finite": ("last layer with a finite gamma", "1"),
    # phase diagram
    "codes": ("phase code (see flag_meanings)", "1"),
    "phase": ("phase", None),
    "phases": ("phase names, indexed by code", None),
    "q_star": ("fixed point q* of the variance map", "1"),
    "c_star": ("stable fixed point c* of the correlation map", "1"),
    "gamma_star": ("gamma* = c* / (1 - c*)", "1"),
    "slope": ("chi_1 = sigma_w^2 E[phi'(h)^2] at q*", "1"),
    "eoc": ("sigma_w^2 of the edge of chaos (chi_1 = 1)", "1"),
    "neutrality": ("sigma_w^2 of the neutrality line (c* = 1/2)", "1"),
    "c_depth": ("correlation c at layer depth", "1"),
    "gamma_depth": ("gamma at layer depth", "1"),
    "failed": ("the computation of this point failed", "1"),
    "error": ("error message (empty: none)", None),
    # simulations
    "c_quantiles": ("quantiles of c_ab over input pairs and networks", "1"),
    "V": ("mean over nodes of the variance over inputs, V", "1"),
    "Vtilde": ("variance over nodes of the mean over inputs, Vtilde", "1"),
    "kurtosis": ("excess kurtosis of the pre-activations", "1"),
    "gamma_norm": ("gamma after rescaling each input to the mean norm", "1"),
    "q_cond": ("mean conditional variance E[G]", "1"),
    "kurtosis_cond": ("excess kurtosis from the conditional variances, 3 E[G^2]/E[G]^2 - 3", "1"),
    "V_norm": ("V after rescaling each input to the mean norm", "1"),
    "Vtilde_norm": ("Vtilde after rescaling each input to the mean norm", "1"),
    "m4": ("mean fourth moment of the pre-activations", "1"),
    "g1": ("mean conditional variance G", "1"),
    "g2": ("mean squared conditional variance G^2", "1"),
    "gram": ("empirical Gram matrix (1/N) sum_i h_ia h_ib", "1"),
    "inputs": ("network inputs x_a", "1"),
    "grad_all": ("mean squared gradient (1/N) sum_i (dl_a/dh_i)^2, all samples", "1"),
    "grad_favoured": ("mean squared gradient, samples of the favoured class", "1"),
    "grad_unfavoured": ("mean squared gradient, samples of the other class", "1"),
    "favoured_class": ("class most inputs are assigned to at initialisation", "1"),
    "g0": ("fraction of inputs assigned to class 0", "1"),
    "labels": ("class label of the input", "1"),
    "sv2": ("squared singular values of the input-output Jacobian", "1"),
    "moments": ("(1/n) tr (J J^T)^k", "1"),
    # Gram fluctuations
    "K": ("infinite-width Gram entry", "1"),
    "K1": ("1/n mean shift of the Gram entry: E[Ghat] = K + K1/n", "1"),
    "gram_cov": ("lim n Cov(Ghat)", "1"),
    "metric_cov": ("lim n Cov(G)", "1"),
}


def flags(names, values=None) -> dict:
    """CF ``flag_values`` / ``flag_meanings`` for codes 0, 1, ... (or ``values``) naming ``names``
    (blanks inside a name become underscores: flag_meanings is a blank-separated list)."""
    names = [str(n).replace(" ", "_") for n in names]
    values = np.arange(len(names), dtype=np.int8) if values is None else np.asarray(values)
    return {"flag_values": values, "flag_meanings": " ".join(names)}


def mp_text(v, dps) -> str:
    """A number as text: an mpmath number to ``dps`` significant digits, trailing zeros kept (so the
    text shows the precision it was computed to: at dps 30, q* = 0.4 prints as 0.4 and 29 zeros),
    anything else (float64, int) as its shortest repr. Never str(mpf), which follows the global mpmath
    precision (15 digits), and never float()."""
    import mpmath
    if isinstance(v, mpmath.mpf) and dps:
        if not mpmath.isfinite(v):
            return "nan" if mpmath.isnan(v) else ("inf" if v > 0 else "-inf")
        return mpmath.nstr(v, int(dps), strip_zeros=False)
    return repr(float(v))


def split_mp(data, dps):
    """Object arrays of mpmath numbers -> float64 arrays plus '<name>_mp' text arrays (dps digits)."""
    out = {}
    for k, v in data.items():
        v = np.asarray(v)
        if v.dtype == object and v.size and not isinstance(v.flat[0], str):
            out[k] = np.array([float(x) for x in v.ravel()]).reshape(v.shape)
            out[f"{k}_mp"] = np.array([mp_text(x, dps) for x in v.ravel()]).reshape(v.shape)
        elif v.dtype == object:
            out[k] = v.astype(str)
        else:
            out[k] = v
    return out


def scalar_attrs(params) -> dict:
    """The scalar entries of ``params`` as netCDF attributes (bool as int)."""
    plain = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in params.items()}
    return {k: (int(v) if isinstance(v, bool) else v) for k, v in plain.items()
            if isinstance(v, (bool, int, float, str))}


def build(data: dict, coords: dict, dims: dict | None = None, params: dict | None = None,
          attrs: dict | None = None, var_attrs: dict | None = None, dps: int | None = None, phases=None):
    """An ``xarray.Dataset`` of ``data`` (name -> array over all ``coords``, or over ``dims[name]``).

    ``params`` go to ``attrs["params"]`` (JSON text) and, when scalar, to attributes of their own;
    ``attrs`` are added as they are; a coordinate given as (dims, values) is not a dimension of its own; ``var_attrs`` (name -> dict) override :data:`META`; ``phases``
    (or a ``phases`` variable in ``data``) names the codes of an integer ``codes``/``phase`` variable."""
    try:
        import xarray as xr
    except ImportError:
        raise Unsupported("xarray output needs xarray (pip install xarray); use .csv or .npz") from None
    dims, var_attrs = dims or {}, var_attrs or {}
    grid = tuple(k for k, v in coords.items() if not isinstance(v, tuple))
    flat = split_mp(data, dps or 15)
    if phases is None and "phases" in data:
        phases = np.asarray(data["phases"]).tolist()
    variables = {}
    for k, v in flat.items():
        base = k.removesuffix("_mp")
        a = _meta(base, var_attrs, mp=k != base)
        if phases is not None and base in ("codes", "phase") and v.dtype.kind in "iu":
            failed = bool((v < 0).any())      # a sweep tile that could not be computed: code -1
            a.update(flags((["failed"] if failed else []) + list(phases),
                           np.arange(-failed, len(phases)).astype(v.dtype)))
        variables[k] = (tuple(dims.get(base, grid)), v, a)
    ds = xr.Dataset(variables, coords={k: ((v[0], np.asarray(v[1])) if isinstance(v, tuple) else (k, np.asarray(v)))
                                       + (_meta(k, var_attrs),) for k, v in coords.items()})
    if params is not None:
        ds.attrs["params"] = json.dumps(params, sort_keys=True, default=_json_default)
        ds.attrs.update(scalar_attrs(params))
    ds.attrs.update(attrs or {})
    return ds


def _json_default(v):
    """JSON for what json does not know: numpy scalars and arrays as numbers and lists, the rest
    (mpmath numbers, activations) as text."""
    if isinstance(v, (np.generic, np.ndarray)):
        return v.tolist()
    return str(v)


def _meta(name, overrides, mp=False):
    if name.startswith("net_") and name[4:] in META:      # per-network rows of a simulation
        long_name, units = META[name[4:]]
        long_name += ", per network"
    else:
        long_name, units = META.get(name, (name.replace("_", " "), None))
    a = {"long_name": long_name + (" (decimal text, full precision)" if mp else "")}
    if units is not None and not mp:
        a["units"] = units
    a.update(overrides.get(name, {}))
    return a


class ToXarray:
    """Mixin of the result classes: ``to_xarray()`` builds :func:`build` from ``self.dataset_parts()``
    (a dict of build's arguments: data, coords, dims, params, var_attrs, dps, phases)."""

    def dataset_parts(self) -> dict:   # pragma: no cover - every result class defines it
        raise NotImplementedError

    def to_xarray(self):
        """The result as an ``xarray.Dataset``: named dims and coordinates, ``long_name``/``units`` per
        variable, the parameters in ``attrs`` (needs xarray; imported here only)."""
        return build(**self.dataset_parts())


def grid_coords(sigma_w2, sigma_b2):
    """Dims and coordinates of a (sigma_w2, sigma_b2) grid given as two broadcast arrays of one shape:
    (dim names, coords, scalar params). Each axis along which only sigma_w2 (or only sigma_b2) varies
    is named after it, with a 1-D coordinate (a 0-d grid has no dims: the values go to the parameters);
    any other grid has dims grid_0, grid_1, ... with sigma_w2 and sigma_b2 as coordinates over them."""
    W, B = np.asarray(sigma_w2, dtype=float), np.asarray(sigma_b2, dtype=float)
    if W.ndim == 0:
        return (), {}, {"sigma_w2": float(W), "sigma_b2": float(B)}
    names = []
    for i in range(W.ndim):
        for name, A, other in (("sigma_w2", W, B), ("sigma_b2", B, W)):
            if name not in names and _only_along(A, i) and _constant_along(other, i):
                names.append(name)
                break
    if len(names) == W.ndim:
        coords = {n: (W if n == "sigma_w2" else B)[tuple(slice(None) if j == i else 0 for j in range(W.ndim))]
                  for i, n in enumerate(names)}
        return tuple(names), coords, {}
    dims = tuple(f"grid_{i}" for i in range(W.ndim))
    return dims, {"sigma_w2": (dims, W), "sigma_b2": (dims, B)}, {}


def _only_along(A, i):
    ref = A[tuple(slice(None) if j == i else slice(0, 1) for j in range(A.ndim))]
    return np.array_equal(A, np.broadcast_to(ref, A.shape), equal_nan=True)


def _constant_along(A, i):
    return np.array_equal(A, np.broadcast_to(A.take([0], axis=i), A.shape), equal_nan=True)
