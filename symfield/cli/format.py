"""How the commands print and write: aligned values or strict JSON, tables to CSV/.npz/.nc with their
parameters, status lines on stderr, and the "incomplete result" exit for non-finite values."""
from __future__ import annotations

import json
import sys

from symfield.cli.common import INCOMPLETE, act_arg, writable
from symfield.core.errors import PrecisionError


def number(v, dps):
    """A number as text: an mpmath number to dps significant digits (symfield.io.output.mp_text),
    a float64 as its shortest repr (never padded to dps digits it does not have)."""
    import numpy as np

    from symfield.io.output import mp_text
    v = v.item() if isinstance(v, (np.ndarray, np.generic)) else v
    return mp_text(v, dps)


def show(args, values, params=None, dps=None):
    """Print named values as aligned 'name value' lines (numbers as :func:`number` text), or under
    --json one JSON object: ``params`` (default: every parameter of ``args``) and the values as JSON
    numbers (with dps, also ``name_exact`` decimal text: :func:`plain`)."""
    if args.json:
        print(to_json({"params": run_params(args) if params is None else params, **values}, dps))
    else:
        width = max(map(len, values)) + 1
        text = {k: v if isinstance(v, str) else ("None" if v is None else number(v, dps)) for k, v in values.items()}
        print("\n".join(f"{k:{width}s} {v}" for k, v in text.items()))


def progress(items, desc, total=None):
    """tqdm over items on a terminal (stderr), the plain items when piped; with items None a bar of ``total``
    steps advanced by ``update(n)`` (silent when piped)."""
    from tqdm.auto import tqdm
    return tqdm(items, total=total, desc=desc, leave=False, file=sys.stderr, disable=not sys.stderr.isatty())


def files(args):
    """Validate -o/--output and --plot before any work: (data path or None, plot path or None)."""
    out = writable(args.output, "-o/--output", (".csv", ".npz", ".nc")) if getattr(args, "output", None) else None
    plot = writable(args.plot, "--plot", (".png", ".pdf", ".svg")) if getattr(args, "plot", None) else None
    return out, plot


def emit(args, out, data, coords, params, dims=None, dps=None, summary=None, var_attrs=None):
    """Write the table to ``out`` (or as CSV to stdout); under --json print summary + params instead.
    ``var_attrs`` (name -> CF attributes, e.g. a status variable's flag_meanings) go to the .nc file."""
    from symfield.io.output import save
    if out is not None:
        save(out, data, coords, params, dims, dps, var_attrs=var_attrs)
    if args.json:
        print(to_json({"params": params, **(summary or {}), "output": str(out) if out else None}, dps))
    else:
        if out is None:
            save(sys.stdout, data, coords, params, dims, dps)
        plot = (summary or {}).get("plot")
        say_files(out, plot)      # status lines on stderr (under --json the JSON names the files)


def incomplete(args, what):
    """One stderr line ``symfield <command>: incomplete result: <what>``; returns INCOMPLETE (the
    results were still written or printed, each with its status)."""
    print(f"symfield {args.command}: incomplete result: {what}", file=sys.stderr)
    return INCOMPLETE


def nonfinite(arrays, nan_only=False):
    """(number of non-finite -- or NaN -- entries, number of entries) over the numeric arrays."""
    import numpy as np
    bad = total = 0
    for v in arrays:
        v = np.asarray(v)
        if v.dtype.kind in "fc":
            bad += int((np.isnan(v) if nan_only else ~np.isfinite(v)).sum())
            total += v.size
    return bad, total


def check_finite(args, arrays, advice, nan_only=False):
    """0 when every value of ``arrays`` (name -> array) is finite, else the incomplete line naming them."""
    bad, total = nonfinite(arrays.values(), nan_only)
    if not bad:
        return 0
    names = [k for k, v in arrays.items() if nonfinite([v], nan_only)[0]]
    kind = "NaN" if nan_only else "non-finite"
    return incomplete(args, f"{bad} of {total} values are {kind} (in {', '.join(names)}); {advice}")


def to_json(obj, dps=None) -> str:
    """``obj`` as JSON text (strict: no NaN/Infinity tokens): see :func:`plain`."""
    return json.dumps(plain(obj, dps), indent=2, allow_nan=False)


def plain(v, dps=None):
    """JSON-ready values: every number a JSON number at full precision (float64 as its repr; an
    mpmath number as the nearest float64), arrays -> lists, NaN -> null, +-inf -> "inf"/"-inf" (strict
    JSON has no infinity). With ``dps``, an entry ``name`` holding mpmath numbers gets a sibling
    ``name_exact``: the same values as decimal text with dps significant digits (mp_text)."""
    import math

    import numpy as np
    if isinstance(v, dict):
        out = {}
        for k, x in v.items():
            out[str(k)] = plain(x, dps)
            if dps is not None and has_mp(x) and f"{k}_exact" not in v:
                out[f"{k}_exact"] = exact(x, dps)
        return out
    if isinstance(v, (list, tuple)):
        return [plain(x, dps) for x in v]
    if isinstance(v, np.ndarray):
        return plain(v.tolist(), dps) if v.ndim else plain(v.item(), dps)
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, (int, str, bool)) or v is None:
        return v
    v = float(v)        # float64 as it is; mpmath numbers: the nearest float64 (all digits in name_exact)
    return None if math.isnan(v) else (v if math.isfinite(v) else ("inf" if v > 0 else "-inf"))


def has_mp(v):
    """Whether ``v`` (a number, list, tuple or array) holds an mpmath number."""
    import mpmath
    import numpy as np
    if isinstance(v, np.ndarray):
        return v.dtype == object and any(has_mp(x) for x in v.ravel())
    if isinstance(v, (list, tuple)):
        return any(has_mp(x) for x in v)
    return isinstance(v, (mpmath.mpf, mpmath.mpc))


def exact(v, dps):
    """The decimal text (dps significant digits) of every number of ``v``; None stays None."""
    import numpy as np
    if isinstance(v, np.ndarray):
        return exact(v.tolist(), dps)
    if isinstance(v, (list, tuple)):
        return [exact(x, dps) for x in v]
    return None if v is None else number(v, dps)


def run_params(args, **extra):
    from symfield.io.output import params_record
    skip = {"command", "json", "output", "plot", "func", "activation", "pool", "k"}
    base = {k: v for k, v in vars(args).items() if k not in skip}
    return params_record(command=args.command, activation=act_arg(args).name, **{**base, **extra})


def require_finite(values, advice):
    """Raise ArithmeticError naming every non-finite value of ``values`` (finite input, so an overflow)."""
    import mpmath
    bad = [f"{k} = {v}" for k, v in values.items() if not mpmath.isfinite(v)]
    if bad:
        raise PrecisionError(f"non-finite result {', '.join(bad)}: {advice}")


def status(text):
    """A status line for people (files written, timing): standard error, never mixed with the data."""
    print(text, file=sys.stderr)


def say_files(out, plot):
    """Name the files a command wrote (status lines on stderr, after the summary on stdout)."""
    for label, path in (("data", out), ("plot", plot)):
        if path:
            status(f"{label}: {path}")


def norm_kw(args):
    """The normalisation options of a command (docs/theory.md section 12)."""
    return dict(norm=getattr(args, "norm", None), norm_at=getattr(args, "norm_at", "before"),
                batch=getattr(args, "batch", None))
