"""Results to files people load elsewhere: CSV, .npz and netCDF (xarray), parameters inside.

One call, :func:`save`, writes a table of named arrays over named coordinates:

- ``.csv``: a first comment line ``# {...}`` (the parameters as JSON), a header, then one row per point
  of the coordinate grid (C order). Variables over fewer coordinates than the grid (e.g. the EOC
  line of a phase diagram) do not fit a CSV row and go only to .npz/.nc.
- ``.npz``: every coordinate and variable, plus ``params`` (the JSON text).
- ``.nc``: an ``xarray.Dataset`` (netCDF via xarray's default engine); ``attrs["params"]`` holds
  the JSON text and each scalar parameter is also an attribute of its own.

Values computed with mpmath at ``dps`` = N are written as text with N significant digits
(:func:`mp_text`, trailing zeros kept): CSV cells hold that text, .npz/.nc store float64 in the
variable and the text in ``<name>_mp``.
"""
from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

import numpy as np

from symfield.core.files import atomic_write, replacing, save_npz
from symfield.core.version import __version__

SUFFIXES = (".csv", ".npz", ".nc")


def writable(path, name, suffixes=SUFFIXES) -> Path:
    """Check, before any work, that ``path`` has an accepted suffix and can be written."""
    p = Path(path)
    if p.suffix.lower() not in suffixes:
        raise ValueError(f"{name} must end in one of {', '.join(suffixes)}; got {str(path)!r}")
    if not p.parent.is_dir():
        raise ValueError(f"{name}: directory {str(p.parent)!r} does not exist")
    if not os.access(p.parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ValueError(f"{name}: {str(path)!r} is not writable")
    if p.suffix.lower() == ".nc":
        _xarray()
    return p


def _xarray():
    try:
        import xarray
    except ImportError:
        raise NotImplementedError("netCDF (.nc) output needs xarray (pip install xarray); use .csv or .npz") from None
    return xarray


def params_record(**params) -> dict:
    """The parameters as stored: JSON-safe values plus the symfield version."""
    return {**{k: _plain(v) for k, v in params.items()}, "symfield": __version__}


def _plain(v):
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return v if v is None or isinstance(v, (bool, int, float, str)) else str(v)


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


def _split_mp(data, dps):
    """Object arrays of mpmath numbers -> float64 arrays plus '<name>_mp' text arrays (dps digits)."""
    out = {}
    for k, v in data.items():
        v = np.asarray(v)
        if v.dtype == object:
            out[k] = np.array([float(x) for x in v.ravel()]).reshape(v.shape)
            out[f"{k}_mp"] = np.array([mp_text(x, dps) for x in v.ravel()]).reshape(v.shape)
        else:
            out[k] = v
    return out


def _cell(v, dps):
    if isinstance(v, float):
        return repr(v)
    return str(v) if isinstance(v, (int, str)) else mp_text(v, dps)


def save(path, data: dict, coords: dict, params: dict, dims: dict | None = None, dps: int | None = None):
    """Write ``data`` (name -> array over ``coords``, or over ``dims[name]``) with ``params``;
    mpmath values (object arrays) are written to ``dps`` digits."""
    dims = dims or {}
    grid = tuple(coords)
    stream = hasattr(path, "write")          # an open text file (e.g. sys.stdout): CSV
    suffix = ".csv" if stream else Path(path).suffix.lower()
    if suffix == ".csv":
        full = [k for k in data if dims.get(k, grid) == grid]
        axes = np.meshgrid(*[np.asarray(c) for c in coords.values()], indexing="ij")
        cols = [a.ravel().tolist() for a in axes] + [np.asarray(data[k]).ravel().tolist() for k in full]
        fh = path if stream else io.StringIO()
        fh.write(f"# {json.dumps(params, sort_keys=True)}\n")
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(list(grid) + full)
        w.writerows([_cell(v, dps) for v in row] for row in zip(*cols))
        if not stream:       # built in memory, then written whole: never a file cut mid-row
            atomic_write(path, fh.getvalue())
        return path
    path = Path(path)
    flat = _split_mp(data, dps or 15)
    if suffix == ".npz":
        arrays = {k: np.asarray(v) for k, v in coords.items()}
        arrays.update(flat)
        save_npz(path, {**arrays, "params": np.array(json.dumps(params, sort_keys=True))})
        return path
    xr = _xarray()
    var_dims = {k: dims.get(k.removesuffix("_mp"), grid) for k in flat}
    attrs = {"params": json.dumps(params, sort_keys=True)}
    attrs.update({k: (int(v) if isinstance(v, bool) else v) for k, v in params.items()
                  if isinstance(v, (bool, int, float, str))})
    ds = xr.Dataset({k: (var_dims[k], np.asarray(v)) for k, v in flat.items()},
                    coords={k: np.asarray(v) for k, v in coords.items()}, attrs=attrs)
    with replacing(path) as tmp:
        ds.to_netcdf(tmp)
    return path
