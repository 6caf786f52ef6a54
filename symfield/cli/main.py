"""The ``symfield`` command line. Bad input: one line on stderr and exit code 2 (exit codes: EXIT_CODES).

Tables (per layer, per sigma_b2, per grid point) go to standard output as CSV, or with
``-o FILE`` to FILE.csv / FILE.npz / FILE.nc with the parameters that produced them inside
(symfield/io/output.py); ``--json`` prints what a program reads; ``--plot FILE`` draws the figure.
"""
from __future__ import annotations

from symfield.core.errors import InvalidValue, PrecisionError
import json
import sys

from symfield.cli.common import (
    INCOMPLETE,
    INTERRUPTED,
    act_arg,
    fail,
    parse_range,
    writable,
)


def _number(v, dps):
    """A number as text: an mpmath number to dps significant digits (symfield.io.output.mp_text),
    a float64 as its shortest repr (never padded to dps digits it does not have)."""
    import numpy as np

    from symfield.io.output import mp_text
    v = v.item() if isinstance(v, (np.ndarray, np.generic)) else v
    return mp_text(v, dps)


def _print(args, values, params=None, dps=None):
    """Print named values as aligned 'name value' lines (numbers as :func:`_number` text), or under
    --json one JSON object: ``params`` (default: every parameter of ``args``) and the values as JSON
    numbers (with dps, also ``name_exact`` decimal text: :func:`_plain`)."""
    if args.json:
        print(_json({"params": _params(args) if params is None else params, **values}, dps))
    else:
        width = max(map(len, values)) + 1
        text = {k: v if isinstance(v, str) else ("None" if v is None else _number(v, dps)) for k, v in values.items()}
        print("\n".join(f"{k:{width}s} {v}" for k, v in text.items()))


def _bar(items, desc):
    """tqdm over items on a terminal (stderr), the plain items when piped."""
    from tqdm.auto import tqdm
    return tqdm(items, desc=desc, leave=False, file=sys.stderr, disable=not sys.stderr.isatty())


def _files(args):
    """Validate -o/--output and --plot before any work: (data path or None, plot path or None)."""
    out = writable(args.output, "-o/--output", (".csv", ".npz", ".nc")) if getattr(args, "output", None) else None
    plot = writable(args.plot, "--plot", (".png", ".pdf", ".svg")) if getattr(args, "plot", None) else None
    return out, plot


def _emit(args, out, data, coords, params, dims=None, dps=None, summary=None, var_attrs=None):
    """Write the table to ``out`` (or as CSV to stdout); under --json print summary + params instead.
    ``var_attrs`` (name -> CF attributes, e.g. a status variable's flag_meanings) go to the .nc file."""
    from symfield.io.output import save
    if out is not None:
        save(out, data, coords, params, dims, dps, var_attrs=var_attrs)
    if args.json:
        print(_json({"params": params, **(summary or {}), "output": str(out) if out else None}, dps))
    else:
        if out is None:
            save(sys.stdout, data, coords, params, dims, dps)
        plot = (summary or {}).get("plot")
        _say_files(out, plot)      # status lines on stderr (under --json the JSON names the files)


def _incomplete(args, what):
    """One stderr line ``symfield <command>: incomplete result: <what>``; returns INCOMPLETE (the
    results were still written or printed, each with its status)."""
    print(f"symfield {args.command}: incomplete result: {what}", file=sys.stderr)
    return INCOMPLETE


def _nonfinite(arrays, nan_only=False):
    """(number of non-finite -- or NaN -- entries, number of entries) over the numeric arrays."""
    import numpy as np
    bad = total = 0
    for v in arrays:
        v = np.asarray(v)
        if v.dtype.kind in "fc":
            bad += int((np.isnan(v) if nan_only else ~np.isfinite(v)).sum())
            total += v.size
    return bad, total


def _check(args, arrays, advice, nan_only=False):
    """0 when every value of ``arrays`` (name -> array) is finite, else the _incomplete line naming them."""
    bad, total = _nonfinite(arrays.values(), nan_only)
    if not bad:
        return 0
    names = [k for k, v in arrays.items() if _nonfinite([v], nan_only)[0]]
    kind = "NaN" if nan_only else "non-finite"
    return _incomplete(args, f"{bad} of {total} values are {kind} (in {', '.join(names)}); {advice}")


def _json(obj, dps=None) -> str:
    """``obj`` as JSON text (strict: no NaN/Infinity tokens): see :func:`_plain`."""
    return json.dumps(_plain(obj, dps), indent=2, allow_nan=False)


def _plain(v, dps=None):
    """JSON-ready values: every number a JSON number at full precision (float64 as its repr; an
    mpmath number as the nearest float64), arrays -> lists, NaN -> null, +-inf -> "inf"/"-inf" (strict
    JSON has no infinity). With ``dps``, an entry ``name`` holding mpmath numbers gets a sibling
    ``name_exact``: the same values as decimal text with dps significant digits (mp_text)."""
    import math

    import numpy as np
    if isinstance(v, dict):
        out = {}
        for k, x in v.items():
            out[str(k)] = _plain(x, dps)
            if dps is not None and _has_mp(x) and f"{k}_exact" not in v:
                out[f"{k}_exact"] = _exact(x, dps)
        return out
    if isinstance(v, (list, tuple)):
        return [_plain(x, dps) for x in v]
    if isinstance(v, np.ndarray):
        return _plain(v.tolist(), dps) if v.ndim else _plain(v.item(), dps)
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, (int, str, bool)) or v is None:
        return v
    v = float(v)        # float64 as it is; mpmath numbers: the nearest float64 (all digits in name_exact)
    return None if math.isnan(v) else (v if math.isfinite(v) else ("inf" if v > 0 else "-inf"))


def _has_mp(v):
    """Whether ``v`` (a number, list, tuple or array) holds an mpmath number."""
    import mpmath
    import numpy as np
    if isinstance(v, np.ndarray):
        return v.dtype == object and any(_has_mp(x) for x in v.ravel())
    if isinstance(v, (list, tuple)):
        return any(_has_mp(x) for x in v)
    return isinstance(v, (mpmath.mpf, mpmath.mpc))


def _exact(v, dps):
    """The decimal text (dps significant digits) of every number of ``v``; None stays None."""
    import numpy as np
    if isinstance(v, np.ndarray):
        return _exact(v.tolist(), dps)
    if isinstance(v, (list, tuple)):
        return [_exact(x, dps) for x in v]
    return None if v is None else _number(v, dps)


def _params(args, **extra):
    from symfield.io.output import params_record
    skip = {"command", "json", "output", "plot", "func", "activation", "pool", "k"}
    base = {k: v for k, v in vars(args).items() if k not in skip}
    return params_record(command=args.command, activation=act_arg(args).name, **{**base, **extra})


# ---------------------------------------------------------------- commands: maps and fixed points
def cmd_list(args):
    from symfield.symbolic.activation import BUILTINS
    for name, (_, defaults, desc) in sorted(BUILTINS.items()):
        print(f"{name:12s} {desc}" + (f"   parameters: {defaults}" if defaults else ""))
    return 0


def cmd_kernel(args):
    from symfield.symbolic.kernel import MAPS, kernel
    K = kernel(act_arg(args))
    if args.json:
        print(json.dumps({"activation": K.act.name, "closed_form": K.closed_form,
                          "maps": {n: {"expr": str(K[n]), "method": K.methods[n]} for n in MAPS}}, indent=2))
    else:
        print(K.describe())
    return 0


def _norm_kw(args):
    """The normalisation options of a command (docs/theory.md section 12)."""
    return dict(norm=getattr(args, "norm", None), norm_at=getattr(args, "norm_at", "before"),
                batch=getattr(args, "batch", None))


def cmd_map(args):
    from symfield.theory import maps
    act = act_arg(args)
    q12 = args.q if args.q12 is None else args.q12
    q2 = args.q if args.q2 is None else args.q2
    nk = _norm_kw(args)
    out = {
        "q_map": maps.q_map(act, args.q, args.sigma_w2, args.sigma_b2, dps=args.dps, **nk),
        "qab_map": maps.qab_map(act, args.q, q2, q12, args.sigma_w2, args.sigma_b2, dps=args.dps, **nk),
        "chi1": maps.chi1(act, args.sigma_w2, args.sigma_b2, q=None if args.norm else args.q, dps=args.dps, **nk),
    }
    import sympy as sp

    from symfield.symbolic.kernel import kernel
    jumps = kernel(act).dpsi2 == sp.oo   # phi jumps: chi1 = sigma_w2 E[phi'^2] = inf is the true value
    _finite({k: v for k, v in out.items() if not (jumps and k == "chi1")},
            "(float64 overflow?) use --dps 30 or smaller q, sigma_w2, sigma_b2")
    _print(args, out, _params(args, q2=q2, q12=q12), dps=args.dps)
    return 0


def _finite(values, advice):
    """Raise ArithmeticError naming every non-finite value of ``values`` (finite input, so an overflow)."""
    import mpmath
    bad = [f"{k} = {v}" for k, v in values.items() if not mpmath.isfinite(v)]
    if bad:
        raise PrecisionError(f"non-finite result {', '.join(bad)}: {advice}")


def cmd_qstar(args):
    import mpmath

    from symfield.theory.qstar import q_star
    from symfield.theory.maps import chi1
    act = act_arg(args)
    qs = q_star(act, args.sigma_w2, args.sigma_b2, dps=args.dps)
    if mpmath.isnan(qs):
        raise PrecisionError(f"q_star is NaN at sigma_w2 = {args.sigma_w2!r}, sigma_b2 = {args.sigma_b2!r} "
                              "(float64 overflow?); use --dps 30 or smaller sigma_w2, sigma_b2")
    slope = chi1(act, args.sigma_w2, args.sigma_b2, q=qs, dps=args.dps) if 0 < qs < mpmath.inf else None
    _print(args, {"q_star": qs, "chi1": slope}, dps=args.dps)
    return 0


def cmd_eoc(args):
    from symfield.theory.eoc import eoc
    e = eoc(act_arg(args), args.sigma_b2, dps=args.dps, **_norm_kw(args))
    out = {k: getattr(e, k) for k in ("sigma_b2", "sigma_w2", "q_star")}
    if args.norm:
        out["ratio"] = e.ratio
    slope, note = float(e.q_slope), getattr(e, "note", "")
    if args.json:     # q_slope is float64 (a JSON number); stable: q_slope <= 1
        out.update(q_slope=slope, stable=e.stable, note=note)
    else:
        out["q_slope"] = f"{slope!r}" + ("" if e.stable else " (> 1: q* is unstable, the recursion does not reach it)")
        if note:
            out["note"] = note.splitlines()[0]
    _print(args, out, dps=args.dps)
    return _check(args, {"sigma_w2": float(e.sigma_w2), "q_slope": slope}, "(float64 overflow?) try --dps 30",
                  nan_only=True)


def cmd_batchnorm(args):
    from symfield.theory.norm import batchnorm
    r = batchnorm(act_arg(args), args.sigma_w2, args.sigma_b2, args.batch, norm_at=args.norm_at, dps=args.dps)
    out = {k: getattr(r, k) for k in ("c_star", "gamma", "q_star", "q_ab_star", "rate", "method")}
    _print(args, out, _params(args), dps=args.dps)
    return 0


def cmd_line(args):
    """eoc-curve and neutrality: one root per sigma_b2; a point without a line records its reason."""
    import numpy as np

    from symfield.theory.eoc import eoc
    from symfield.theory.neutrality import neutrality
    sb = parse_range(args.sigma_b2, "--sigma-b2")
    out, _ = _files(args)
    act = act_arg(args)
    if args.command == "eoc-curve":
        names = ("sigma_w2", "q_star")

        def solve(b):
            e = eoc(act, b, dps=args.dps)
            return e.sigma_w2, e.q_star
    else:
        names = ("sigma_w2",)

        def solve(b):
            return (neutrality(act, b, dps=args.dps),)
    cols = {n: np.full(sb.size, np.nan, dtype=float if args.dps is None else object) for n in names}
    errors = np.full(sb.size, "", dtype=object)
    for i, b in enumerate(_bar(sb, args.command)):
        try:
            for n, v in zip(names, solve(float(b))):
                cols[n][i] = v
        except (ValueError, ArithmeticError) as err:
            errors[i] = str(err).splitlines()[0]
    if errors.all():
        raise InvalidValue(errors[0] if sb.size == 1 else f"no point of the {args.command} exists: {errors[0]}")
    data = {**cols, "error": errors.astype(str)}
    summary = {"sigma_b2": sb, **cols, "errors": int((errors != "").sum())}
    _emit(args, out, data, {"sigma_b2": sb}, _params(args), dps=args.dps, summary=summary)
    solved = errors == ""     # a point without a line is a result (its reason is in the error column)
    return _check(args, {n: np.array([float(v) for v in c[solved]]) for n, c in cols.items()},
                  "(float64 overflow?) try --dps 30", nan_only=True)


# ---------------------------------------------------------------- commands: depth, phases, divergence
def cmd_propagate(args):
    import numpy as np

    from symfield.theory.propagate import propagate
    out, _ = _files(args)
    r = propagate(act_arg(args), args.sigma_w2, args.sigma_b2, args.depth, q0=args.q0, qab0=args.qab0,
                  residual=args.residual, dps=args.dps, **_norm_kw(args))
    from symfield.theory.propagate import STATUS
    data = {n: np.asarray(getattr(r, n), dtype=float) for n in ("q", "qab", "d", "c", "one_minus_c", "gamma")}
    status = int(r.status)
    params = _params(args, method=r.method, status=status, status_text=STATUS[status],
                     last_finite=int(r.last_finite), distance=r.params.get("distance", ""))
    _emit(args, out, data, {"layer": np.asarray(r.layers)}, params, summary={"layer": r.layers, **data})
    bad_rows = int((~np.isfinite(np.column_stack(list(data.values())))).any(axis=1).sum())
    if status or bad_rows:
        return _incomplete(args, f"status {status} ({STATUS[status]}): {bad_rows} of {len(r.layers)} layers "
                                 f"hold non-finite values (last finite gamma at layer {int(r.last_finite)})")
    return 0


def _phase_blocks(act, sw, sb, depth, eoc_tol):
    """phase_diagram over blocks of sigma_b2 columns (every point is solved on its own, so the
    blocks join into the full diagram), with a progress bar on a terminal."""
    import dataclasses

    import numpy as np

    from symfield.theory.phase_diagram import phase_diagram
    blocks = np.array_split(np.arange(sb.size), min(sb.size, 20))
    parts = [phase_diagram(act, sigma_w2=sw, sigma_b2=sb[j], depth=depth, eoc_tol=eoc_tol)
             for j in _bar(blocks, "phase")]
    joined = {}
    for f in dataclasses.fields(parts[0]):
        v = getattr(parts[0], f.name)
        if isinstance(v, np.ndarray) and f.name != "sigma_w2":
            axis = 0 if v.ndim == 1 else 1
            joined[f.name] = np.concatenate([getattr(p, f.name) for p in parts], axis=axis)
    return dataclasses.replace(parts[0], **joined)


def cmd_phase(args):
    import time

    import numpy as np

    from symfield.theory.phases import PHASES
    sw, sb = parse_range(args.sigma_w2, "--sigma-w2"), parse_range(args.sigma_b2, "--sigma-b2")
    out, plot = _files(args)
    t0 = time.perf_counter()
    act = act_arg(args)
    pd = _phase_blocks(act, sw, sb, args.depth, args.eoc_tol)
    seconds = time.perf_counter() - t0
    if out is not None:
        data = dict(phase=pd.labels, codes=pd.codes, q_star=pd.q_star, c_star=pd.c_star, gamma_star=pd.gamma_star,
                    slope=pd.slope, eoc=pd.eoc, neutrality=pd.neutrality, phases=np.asarray(PHASES))
        if pd.depth is not None:
            data.update(c_depth=pd.c_depth, gamma_depth=pd.gamma_depth)
        from symfield.io.output import save
        save(out, data, {"sigma_w2": pd.sigma_w2, "sigma_b2": pd.sigma_b2}, _params(args),
             dims={"eoc": ("sigma_b2",), "neutrality": ("sigma_b2",), "phases": ("code",)})
    if plot is not None:
        from symfield.io import plots
        plots.phase_diagram(pd, plot, act=act, dpi=args.dpi)
    summary = {"activation": pd.act, "grid": [int(sw.size), int(sb.size)], "seconds": round(seconds, 3),
               "counts": pd.counts(), "output": str(out) if out else None, "plot": str(plot) if plot else None}
    if args.json:
        summary.update(params=_params(args), sigma_b2=pd.sigma_b2, eoc=pd.eoc, neutrality=pd.neutrality)
        print(_json(summary))
    else:
        print(f"{pd.act}: {sw.size} x {sb.size} grid (sigma_w2 x sigma_b2)")
        for name, n in summary["counts"].items():
            print(f"  {name:24s} {n}")
        _status(f"computed in {seconds:.2f} s")
        _say_files(out, plot)
    # inf is a value here (q* of an unbounded q, gamma* of a deep-prejudice phase); NaN is not
    return _check(args, {"q_star": pd.q_star, "c_star": pd.c_star, "slope": pd.slope}, "(float64 overflow?) "
                  "use smaller sigma_w2, sigma_b2", nan_only=True)


def _status(text):
    """A status line for people (files written, timing): standard error, never mixed with the data."""
    print(text, file=sys.stderr)


def _say_files(out, plot):
    """Name the files a command wrote (status lines on stderr, after the summary on stdout)."""
    for label, path in (("data", out), ("plot", plot)):
        if path:
            _status(f"{label}: {path}")


def cmd_divergence(args):
    import numpy as np

    from symfield.theory.divergence import divergence
    out, plot = _files(args)
    d = divergence(act_arg(args), args.sigma_w2, args.sigma_b2, depth=args.depth, dps=args.dps)
    value = {"exponential": ("rate", d.rate), "power-law": ("exponent", d.exponent),
             "finite": ("gamma_star", d.gamma_star)}[d.kind]
    summary = {"kind": d.kind, value[0]: value[1], "rms": d.rms, "precision": d.precision}
    if out is not None:
        from symfield.io.output import save
        save(out, {"gamma": d.gamma}, {"layer": np.arange(1, d.gamma.size + 1)}, _params(args, **summary))
    if plot is not None:
        from symfield.io import plots
        plots.divergence(d, path=plot, dpi=args.dpi, act=act_arg(args).name, sigma_w2=args.sigma_w2, sigma_b2=args.sigma_b2)
    if args.json:
        print(_json({"params": _params(args), **summary, "gamma": d.gamma, "output": str(out) if out else None,
                     "plot": str(plot) if plot else None}, args.dps))
    else:
        _print(args, {"kind": d.kind, value[0]: repr(float(value[1])), "precision": d.precision,
                      **{f"rms_{k}": f"{v:.3g}" for k, v in d.rms.items()}})
        _say_files(out, plot)
    return _check(args, {value[0]: float(value[1]), "gamma": d.gamma}, "gamma left float64 or the fit failed; "
                  "use a smaller --depth")


def cmd_ntk(args):
    import numpy as np

    from symfield.theory.ntk import ntk
    out, plot = _files(args)
    r = ntk(act_arg(args), args.sigma_w2, args.sigma_b2, args.depth, q0=args.q0, qab0=args.qab0,
            residual=args.residual, parameterization=args.parameterization, dps=args.dps)
    data = {"theta_aa": r.theta_aa, "theta_ab": r.theta_ab, "d_theta": r.d_theta, "gamma_theta": r.gamma_theta,
            f"kappa_m{args.m}": r.kappa(args.m), f"lr_max_m{args.m}": r.lr_max(args.m), "q": r.q, "qab": r.qab,
            "gamma": r.gamma, "share_aa": r.shares_aa, "share_ab": r.shares_ab}
    if args.dps is None:
        data = {k: np.asarray(v, dtype=float) for k, v in data.items()}
    if plot is not None:
        from symfield.io import plots
        plots.ntk_depth(r, path=plot)
    params = _params(args, status=r.status, exact=r.exact, how=r.how, precision=r.precision)
    _emit(args, out, data, {"layer": np.asarray(r.layers)}, params, dps=args.dps,
          summary={"layer": r.layers, **data, "plot": str(plot) if plot else None})
    if r.status != "ok":
        return _incomplete(args, r.status)
    return 0


def cmd_trainability(args):
    import dataclasses

    from symfield.theory.trainability import trainability
    t = trainability(act_arg(args), args.sigma_w2, args.sigma_b2, eoc_tol=args.eoc_tol)
    values = {k: (v if isinstance(v, str) or v is None else float(v)) for k, v in dataclasses.asdict(t).items()}
    if not args.json:
        values = {k: (repr(v) if isinstance(v, float) else v) for k, v in values.items()}
    _print(args, values)
    return 0


# ---------------------------------------------------------------- commands: finite width
def cmd_simulate(args):
    import numpy as np

    from symfield.simulate import finite_data_gamma, simulate
    from symfield.theory.propagate import propagate
    if args.n_inputs < 2:
        raise InvalidValue(f"--n-inputs must be an integer >= 2 (c, qab and gamma compare pairs of inputs); "
                         f"got {args.n_inputs}")
    out, plot = _files(args)
    act = act_arg(args)
    nk = _norm_kw(args)
    s = simulate(act, args.width, args.depth, args.sigma_w2, args.sigma_b2, args.n_inputs, args.n_networks,
                 args.seed, args.residual, method=args.method, **nk)
    th = propagate(act, args.sigma_w2, args.sigma_b2, args.depth, residual=args.residual,
                   **{**nk, "batch": args.n_inputs if args.norm == "batch" else None})
    q_th, qab_th = np.asarray(th.q, float), np.asarray(th.qab, float)
    data = {n: np.asarray(getattr(s, n)) for n in ("q", "qab", "c", "c05", "c50", "c95", "V", "Vtilde",
                                                     "gamma", "gamma_norm", "kurtosis")}
    data.update(q_theory=q_th, qab_theory=qab_th, c_theory=np.asarray(th.c, float),
                gamma_theory=np.asarray(th.gamma, float))
    if s.params["n_inputs"] >= 2:
        data["gamma_finite_data"] = finite_data_gamma(q_th, qab_th, s.params["n_inputs"])[2]
    if plot is not None:
        from symfield.io import plots
        plots.depth_curves(th, sim=s, path=plot, dpi=args.dpi)
    _emit(args, out, data, {"layer": s.layers}, _params(args, theory=th.method),
          summary={"layer": s.layers, **data, "plot": str(plot) if plot else None})
    return _check(args, data, "overflow at this sigma_w2, sigma_b2, depth? (theory status "
                              f"{int(th.status)}: {th.STATUS[int(th.status)]})")


def cmd_gram(args):
    import numpy as np

    from symfield.theory.gram import STATUS_NAMES, gram_fluctuations, status_attrs
    out, plot = _files(args)
    try:
        q0 = tuple(float(v) for v in args.q0.split(","))
    except ValueError:
        raise InvalidValue(f"--q0 must be three numbers QA,QB,QAB; got {args.q0!r}") from None
    act = act_arg(args)
    n = args.width
    if not isinstance(n, int) or n < 1:
        raise InvalidValue(f"--width must be an integer >= 1; got {n}")
    g = gram_fluctuations(act, args.sigma_w2, args.sigma_b2, args.depth, q0=q0, residual=args.residual, dps=args.dps)
    cov = g.gram_cov
    data = {"K_aa": g.K[:, 0], "K_bb": g.K[:, 1], "K_ab": g.K[:, 2],
            "K1_aa": g.K1[:, 0], "K1_bb": g.K1[:, 1], "K1_ab": g.K1[:, 2],
            **{f"cov_{a}_{b}": cov[:, i, j] for i, j, a, b in ((0, 0, "aa", "aa"), (1, 1, "bb", "bb"), (2, 2, "ab", "ab"),
                                                                  (0, 1, "aa", "bb"), (0, 2, "aa", "ab"), (1, 2, "bb", "ab"))},
            "c": g.c, "c_mean": g.c_mean(n), "c_sd": np.array([v ** 0.5 for v in g.c_var(n)], dtype=g.K.dtype),
            "one_minus_c": g.one_minus_c, "one_minus_c_mean": g.one_minus_c_mean(n),
            "gamma": g.gamma, "gamma_mean": g.gamma_mean(n),
            "gamma_sd": np.array([v ** 0.5 for v in g.gamma_var(n)], dtype=g.K.dtype), "status": g.status}
    if plot is not None:
        from symfield.io import plots
        sim = None
        if args.n_networks:
            from symfield.simulate import simulate
            sim = simulate(act, n, args.depth, args.sigma_w2, args.sigma_b2, 2, args.n_networks, args.seed,
                           residual=args.residual, inputs=_two_inputs(q0))
        plots.gram_bands(g, sim, width=n, path=plot, dpi=args.dpi)
    _emit(args, out, data, {"layer": g.layers}, _params(args, derivatives=g.moments.methods["derivatives"]),
          dps=args.dps, summary={"layer": g.layers, **data, "plot": str(plot) if plot else None},
          var_attrs={"status": status_attrs(np.asarray(g.status).dtype)})
    at_one = np.asarray(g.status) == 3      # c = 1 in float64 terms: gamma inf and gamma_sd undefined by design
    bad = _check(args, {k: np.asarray(v, float)[~at_one] if k.startswith("gamma") else np.asarray(v, float)
                        for k, v in data.items()}, "non-finite values (status column)")
    if bad or not (g.status != 0).any():
        return bad
    meaning = {1: "an error estimate above its tolerance (numeric derivatives, the residual pair rule, or "
                  "(aa, bb, ab) ingredients where 1 - c is too small for them; try --dps)",
               2: "non-finite", 3: "c = 1 in float64 terms (identical inputs, or 1 - c below 1e-150): gamma = inf, "
                                   "gamma_sd undefined; the Gram entries and covariances are accurate"}
    counts = [f"{int((g.status == s).sum())} with status {s} ({STATUS_NAMES[s]}: {meaning[s]})"
              for s in (1, 2, 3) if (g.status == s).any()]
    return _incomplete(args, "layers flagged in the status column: " + "; ".join(counts))


def _two_inputs(q0, d=64):
    """Two input vectors of dimension d with |x_a|^2/d, |x_b|^2/d, x_a.x_b/d = q0."""
    import numpy as np
    qa, qb, qab = q0
    X = np.zeros((2, d))
    X[0, 0] = np.sqrt(qa * d)
    X[1, 0] = qab * d / X[0, 0]
    X[1, 1] = np.sqrt(max(qb * d - X[1, 0] ** 2, 0.0))
    return X


def _one_number(text, name):
    """A single number of ``--sigma-w2``/``--sigma-b2`` (ranges only with --map)."""
    v = parse_range(text, name)
    if v.size != 1 or ":" in text:
        raise InvalidValue(f"{name} must be a single number (a range start:stop:num needs --map); got {text!r}")
    return float(v[0])


def _spectrum_summary(spec, dps):
    """The numbers of a JacobianSpectrum as printed and recorded (moments at dps digits)."""
    m = spec.moments
    return {**{f"m{k}": v for k, v in enumerate(m, 1)}, "var": spec.var,
            "rel_var": spec.rel_var,
            "support": list(spec.support), "atoms": [list(a) for a in spec.atoms], "condition": spec.condition,
            "checks": {k: float(v) for k, v in spec.checks.items()}, "status": int(spec.status),
            "status_text": spec.message}


def _jacobian_simulation(args, act, sw, sb):
    """simulate_jacobian for the --plot overlay (None with --n-networks 0) and its m1, m2 with stderr."""
    if args.n_networks == 0:
        return None, {}
    from symfield.simulate import simulate_jacobian
    s = simulate_jacobian(act, args.width, args.depth, sw, sb, args.n_networks, args.seed, args.weights, args.q0)
    stats = {"width": args.width, "n_networks": args.n_networks,
             **{f"m{k}": s.mean(k) for k in (1, 2)}, **{f"m{k}_stderr": s.stderr(k) for k in (1, 2)}}
    return s, {"simulation": stats}


def cmd_jacobian(args):
    """Spectrum of J J^T at one point (--map: its spread over a grid, _jacobian_map)."""
    if args.n_networks < 0:
        raise InvalidValue(f"--n-networks must be an integer >= 0 (0: no simulation); got {args.n_networks}")
    if args.map:
        return _jacobian_map(args)
    from symfield.theory.jacobian import jacobian_spectrum
    sw, sb = _one_number(args.sigma_w2, "--sigma-w2"), _one_number(args.sigma_b2, "--sigma-b2")
    out, plot = _files(args)
    if plot is not None and args.n_networks and args.width < 2:
        raise InvalidValue(f"--width must be an integer >= 2 (the simulated networks); got {args.width}")
    act = act_arg(args)
    spec = jacobian_spectrum(act, sw, sb, args.depth, q0=args.q0, weights=args.weights, dps=args.dps)
    summary, sim = _spectrum_summary(spec, args.dps), {}
    if plot is not None:
        from symfield.io import plots
        s, sim = _jacobian_simulation(args, act, sw, sb)
        plots.jacobian_spectrum(spec, sim=s, path=plot, dpi=args.dpi)
    if out is not None:
        from symfield.io.output import save
        save(out, {"pdf": spec.pdf}, {"x": spec.x}, _params(args, **_plain({**summary, **sim}, args.dps)))
    if args.json:
        print(_json({"params": _params(args, sigma_w2=sw, sigma_b2=sb), **summary, **sim, "x": spec.x, "pdf": spec.pdf,
                     "q_layers": spec.q,
                     "output": str(out) if out else None, "plot": str(plot) if plot else None}, args.dps))
    else:
        text = {k: (_number(v, args.dps) if k[0] == "m" else str(_plain(v))) for k, v in summary.items()
                if k not in ("checks", "status_text")}
        text["status"] += f" ({spec.message})"
        text.update({f"sim_{k}": f"{v:.6g}" for k, v in sim.get("simulation", {}).items() if k[0] == "m"})
        _print(args, text)
        _say_files(out, plot)
    if spec.status in (1, 2, 4):     # 3 (an atom at 0: condition = inf) is a result, not a failure
        return _incomplete(args, f"status {spec.status}: {spec.message}")
    return 0


def _isometry_blocks(act, sw, sb, depth, weights, q0):
    """isometry_diagram over blocks of sigma_b2 columns (points are independent), progress bar on a terminal."""
    import dataclasses

    import numpy as np

    from symfield.theory.jacobian import isometry_diagram
    blocks = np.array_split(np.arange(sb.size), min(sb.size, 20))
    parts = [isometry_diagram(act, sw, sb[j], depth, weights, q0) for j in _bar(blocks, "isometry")]
    joined = {n: np.concatenate([getattr(p, n) for p in parts], axis=1)
              for n in ("m1", "m2", "rel_var", "status", "errors")}
    joined["error"] = joined.pop("errors")
    return dataclasses.replace(parts[0], sigma_b2=sb, **joined)


def _jacobian_map(args):
    """m1, m2, var, rel_var over the grid; --plot: the isometry map beside the phase diagram."""
    import numpy as np
    if args.dps is not None:
        raise InvalidValue(f"--dps is not available with --map (the map is float64); got --dps {args.dps}")
    sw, sb = parse_range(args.sigma_w2, "--sigma-w2"), parse_range(args.sigma_b2, "--sigma-b2")
    out, plot = _files(args)
    act = act_arg(args)
    d = _isometry_blocks(act, sw, sb, args.depth, args.weights, args.q0)
    if plot is not None:
        from symfield.io import plots
        plots.isometry_map(d, _phase_blocks(act, sw, sb, None, 1e-6), path=plot, act=act, dpi=args.dpi)
    data = {"m1": d.m1, "m2": d.m2, "var": d.var, "rel_var": d.rel_var, "status": d.status}
    with np.errstate(all="ignore"):     # the most isometric point with m1 within a factor 2 of 1
        score = np.where((d.status == 0) & (np.abs(np.log(d.m1)) <= np.log(2)), d.rel_var, np.inf)
    best = None
    if np.isfinite(score).any():
        i, j = np.unravel_index(np.argmin(score), score.shape)
        best = {"sigma_w2": sw[i], "sigma_b2": sb[j], "m1": d.m1[i, j], "rel_var": d.rel_var[i, j]}
    summary = {"grid": [int(sw.size), int(sb.size)], "sigma_w2": sw, "sigma_b2": sb, "m1": d.m1,
               "rel_var": d.rel_var, "most_isometric": best, "plot": str(plot) if plot else None}
    _emit(args, out, data, {"sigma_w2": sw, "sigma_b2": sb}, _params(args), summary=summary)
    failed, out_of_range = int((d.status == 5).sum()), int((d.status == 4).sum())
    if failed or out_of_range:
        first = d.errors[d.status == 5][0] if failed else ""
        parts = ([f"{out_of_range} have m1 or m2 outside the float64 range (status 4; rel_var is still given)"]
                 if out_of_range else []) + ([f"{failed} could not be computed (status 5: {first})"] if failed else [])
        return _incomplete(args, f"of {d.status.size} grid points, {' and '.join(parts)}")
    return 0


def cmd_gradients(args):
    from symfield.simulate import class_gradients
    out, plot = _files(args)
    g = class_gradients(act_arg(args), args.width, args.depth, args.sigma_w2, args.sigma_b2, args.n_inputs,
                        args.n_networks, args.seed, args.residual)
    data = {n: getattr(g, n).mean(axis=0) for n in ("all", "favoured", "unfavoured")}
    data.update({f"net_{n}": getattr(g, n) for n in ("all", "favoured", "unfavoured")},
                g0=g.g0, favoured_class=g.favoured_class)
    dims = {**{f"net_{n}": ("network", "layer") for n in ("all", "favoured", "unfavoured")},
            "g0": ("network",), "favoured_class": ("network",)}
    if plot is not None:
        from symfield.io import plots
        plots.class_gradients(g, path=plot, dpi=args.dpi)
    summary = {"layer": g.layers, **{n: data[n] for n in ("all", "favoured", "unfavoured")}, "g0": g.g0,
               "favoured_class": g.favoured_class, "plot": str(plot) if plot else None}
    _emit(args, out, data, {"layer": g.layers}, _params(args), dims=dims, summary=summary)
    return _check(args, data, "overflow at this sigma_w2, sigma_b2, depth?")


# ---------------------------------------------------------------- commands: documents and checks
def cmd_derive(args):
    from pathlib import Path

    from symfield.core.files import atomic_write
    from symfield.reports.derive import derive
    if args.output and not Path(args.output).parent.is_dir():
        return fail(f"cannot write {args.output!r}: its directory does not exist")
    tex = derive(act_arg(args), norm=getattr(args, "norm", False))
    if not args.output:
        sys.stdout.write(tex)
        return 0
    try:
        atomic_write(args.output, tex.encode("utf-8"))
    except OSError as err:
        return fail(f"cannot write {args.output!r}: {err.strerror or err}")
    return 0


def cmd_verify(args):
    from symfield.reports.verify import EXIT_CODES, verify
    limit = {} if args.phase_seconds is None else {"phase_seconds": args.phase_seconds}
    report = verify(args.formula, seed=args.seed, n_mc=args.n_mc, **limit)
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.table())
    return EXIT_CODES[report.status]     # 0 pass, 1 fail, 3 inconclusive


def cmd_sweep(args):
    from symfield.cli.sweep import cli
    return cli(args)


def cmd_bench(args):
    from symfield.cli.bench import cli
    return cli(args)


COMMANDS = {"list": cmd_list, "kernel": cmd_kernel, "map": cmd_map, "qstar": cmd_qstar, "eoc": cmd_eoc,
            "batchnorm": cmd_batchnorm,
            "eoc-curve": cmd_line, "neutrality": cmd_line, "propagate": cmd_propagate, "phase": cmd_phase,
            "divergence": cmd_divergence, "simulate": cmd_simulate, "gram": cmd_gram, "jacobian": cmd_jacobian,
            "gradients": cmd_gradients, "ntk": cmd_ntk, "trainability": cmd_trainability,
            "derive": cmd_derive, "verify": cmd_verify, "sweep": cmd_sweep, "bench": cmd_bench}


def _dash_formulas(argv):
    """Formulas and numbers may start with '-' (``symfield kernel "-x**2"``, ``--q12 -1e300``): after the
    command, a token that starts with '-' and is none of -h, -o..., -d... or --name gets a leading space,
    which argparse reads as a value, not an option (formulas and numbers are read with spaces stripped)."""
    out, after = list(argv), False
    for i, t in enumerate(out):
        if not after:
            after = t in COMMANDS
        elif len(t) > 1 and t[0] == "-" and t[1] != "-" and t != "-h" and t[:2] not in ("-o", "-d"):
            out[i] = " " + t
    return out


def _message(err):
    """The first line of an exception's message, or its type when the message is empty."""
    text = str(err).strip()
    return text.splitlines()[0] if text else f"{type(err).__name__} (no message)"


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv       # anywhere on the line: tracebacks on stderr as well
    try:
        return _run([a for a in argv if a != "--debug"])
    except BrokenPipeError:  # the reader (e.g. `| head`) closed the pipe: stop quietly
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except BaseException as err:
        if isinstance(err, SystemExit):
            raise
        if debug:
            import traceback
            traceback.print_exc()
        return _failure(err)
    finally:  # nothing is freed after the command: skip the slow full collection at interpreter exit
        import gc
        gc.freeze()


def _run(argv):
    """Parse ``argv`` and run the command (floating-point warnings off: overflow shows as a non-finite
    result or a status)."""
    import numpy as np

    from symfield.cli.parser import build_parser
    parser = build_parser()
    if not argv:            # a bare `symfield`: what it can do, and success
        parser.print_help()
        return 0
    args = parser.parse_args(_dash_formulas(argv))
    for name, value in vars(args).items():  # undo the leading spaces of _dash_formulas
        if isinstance(value, str) and value.startswith(" -"):
            setattr(args, name, value[1:])
    if getattr(args, "plot", None):            # provenance of the figure: the command line, in its metadata
        import shlex

        from symfield.io import plots
        plots.PROVENANCE["command"] = shlex.join(["symfield", *argv])
    with np.errstate(all="ignore"):
        return COMMANDS[args.command](args)


def _failure(err):
    """The one stderr line (and exit code) of an exception that ended a command."""
    if isinstance(err, KeyboardInterrupt):
        fail("interrupted")
        return INTERRUPTED
    if isinstance(err, (ValueError, TypeError, NotImplementedError, ArithmeticError)):
        return fail(_message(err))
    if isinstance(err, MemoryError):
        return fail(f"out of memory ({_message(err)}); use a smaller grid, depth, width or size")
    if isinstance(err, OSError):  # e.g. the output directory vanished or filled up while computing
        return fail(f"{err.strerror or _message(err)}" + (f": {err.filename!r}" if err.filename else ""))
    # a bug: still one line, with the exception type (the traceback with --debug)
    return fail(f"internal error {type(err).__name__}: {_message(err)} (please report it; --debug shows where)")
