"""Commands on depth: propagate, phase, divergence, ntk, trainability."""
from __future__ import annotations


from symfield.cli.common import act_arg, parse_range
from symfield.cli.format import (check_finite, emit, files, incomplete, norm_kw, progress, run_params, say_files,
                                 show, status, to_json)


def cmd_propagate(args):
    import numpy as np

    from symfield.theory.propagate import propagate
    out, _ = files(args)
    r = propagate(act_arg(args), args.sigma_w2, args.sigma_b2, args.depth, q0=args.q0, qab0=args.qab0,
                  residual=args.residual, dps=args.dps, **norm_kw(args))
    from symfield.theory.propagate import STATUS
    data = {n: np.asarray(getattr(r, n), dtype=float) for n in ("q", "qab", "d", "c", "one_minus_c", "gamma")}
    status = int(r.status)
    params = run_params(args, method=r.method, status=status, status_text=STATUS[status],
                     last_finite=int(r.last_finite), distance=r.params.get("distance", ""))
    emit(args, out, data, {"layer": np.asarray(r.layers)}, params, summary={"layer": r.layers, **data})
    bad_rows = int((~np.isfinite(np.column_stack(list(data.values())))).any(axis=1).sum())
    if status or bad_rows:
        return incomplete(args, f"status {status} ({STATUS[status]}): {bad_rows} of {len(r.layers)} layers "
                                 f"hold non-finite values (last finite gamma at layer {int(r.last_finite)})")
    return 0


BLOCK_SECONDS = 1.0   # the phase diagram's blocks of sigma_b2 columns after the first: about this long each


def phase_blocks(act, sw, sb, depth, eoc_tol):
    """phase_diagram over blocks of sigma_b2 columns (every point is solved on its own, so the blocks join
    into the full diagram), with a progress bar on a terminal. The first block is a twentieth of the columns;
    each later one is sized from the time per column so far to last about BLOCK_SECONDS (each call has a fixed
    cost: a few-second diagram is two or three calls, not twenty)."""
    import dataclasses
    import time

    import numpy as np

    from symfield.theory.phase_diagram import phase_diagram
    parts, i, step, spent = [], 0, max(1, sb.size // 20), 0.0
    with progress(None, "phase", total=sb.size) as bar:
        while i < sb.size:
            j = np.arange(i, min(sb.size, i + step))
            t0 = time.perf_counter()
            parts.append(phase_diagram(act, sigma_w2=sw, sigma_b2=sb[j], depth=depth, eoc_tol=eoc_tol))
            spent += time.perf_counter() - t0
            i += j.size
            bar.update(j.size)
            step = max(1, int(BLOCK_SECONDS * i / max(spent, 1e-9)))
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
    out, plot = files(args)
    t0 = time.perf_counter()
    act = act_arg(args)
    pd = phase_blocks(act, sw, sb, args.depth, args.eoc_tol)
    seconds = time.perf_counter() - t0
    if out is not None:
        data = dict(phase=pd.labels, codes=pd.codes, q_star=pd.q_star, c_star=pd.c_star, gamma_star=pd.gamma_star,
                    slope=pd.slope, eoc=pd.eoc, neutrality=pd.neutrality, phases=np.asarray(PHASES))
        if pd.depth is not None:
            data.update(c_depth=pd.c_depth, gamma_depth=pd.gamma_depth)
        from symfield.io.output import save
        save(out, data, {"sigma_w2": pd.sigma_w2, "sigma_b2": pd.sigma_b2}, run_params(args),
             dims={"eoc": ("sigma_b2",), "neutrality": ("sigma_b2",), "phases": ("code",)})
    if plot is not None:
        from symfield.io import plots
        plots.phase_diagram(pd, plot, act=act, dpi=args.dpi)
    summary = {"activation": pd.act, "grid": [int(sw.size), int(sb.size)], "seconds": round(seconds, 3),
               "counts": pd.counts(), "output": str(out) if out else None, "plot": str(plot) if plot else None}
    if args.json:
        summary.update(params=run_params(args), sigma_b2=pd.sigma_b2, eoc=pd.eoc, neutrality=pd.neutrality)
        print(to_json(summary))
    else:
        print(f"{pd.act}: {sw.size} x {sb.size} grid (sigma_w2 x sigma_b2)")
        for name, n in summary["counts"].items():
            print(f"  {name:24s} {n}")
        status(f"computed in {seconds:.2f} s")
        say_files(out, plot)
    # inf is a value here (q* of an unbounded q, gamma* of a deep-prejudice phase); NaN is not
    return check_finite(args, {"q_star": pd.q_star, "c_star": pd.c_star, "slope": pd.slope}, "(float64 overflow?) "
                  "use smaller sigma_w2, sigma_b2", nan_only=True)


def cmd_divergence(args):
    import numpy as np

    from symfield.theory.divergence import divergence
    out, plot = files(args)
    d = divergence(act_arg(args), args.sigma_w2, args.sigma_b2, depth=args.depth, dps=args.dps, **norm_kw(args))
    value = {"exponential": ("rate", d.rate), "power-law": ("exponent", d.exponent),
             "finite": ("gamma_star", d.gamma_star)}[d.kind]
    summary = {"kind": d.kind, value[0]: value[1], "rms": d.rms, "precision": d.precision}
    if out is not None:
        from symfield.io.output import save
        save(out, {"gamma": d.gamma}, {"layer": np.arange(1, d.gamma.size + 1)}, run_params(args, **summary))
    if plot is not None:
        from symfield.io import plots
        plots.divergence(d, path=plot, dpi=args.dpi, act=act_arg(args).name, sigma_w2=args.sigma_w2, sigma_b2=args.sigma_b2)
    if args.json:
        print(to_json({"params": run_params(args), **summary, "gamma": d.gamma, "output": str(out) if out else None,
                     "plot": str(plot) if plot else None}, args.dps))
    else:
        show(args, {"kind": d.kind, value[0]: repr(float(value[1])), "precision": d.precision,
                      **{f"rms_{k}": f"{v:.3g}" for k, v in d.rms.items()}})
        say_files(out, plot)
    return check_finite(args, {value[0]: float(value[1]), "gamma": d.gamma}, "gamma left float64 or the fit failed; "
                  "use a smaller --depth")


def cmd_ntk(args):
    import numpy as np

    from symfield.theory.ntk import ntk
    out, plot = files(args)
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
    params = run_params(args, status=r.status, exact=r.exact, how=r.how, precision=r.precision)
    emit(args, out, data, {"layer": np.asarray(r.layers)}, params, dps=args.dps,
          summary={"layer": r.layers, **data, "plot": str(plot) if plot else None})
    if r.status != "ok":
        return incomplete(args, r.status)
    return 0


def cmd_trainability(args):
    import dataclasses

    from symfield.theory.trainability import trainability
    t = trainability(act_arg(args), args.sigma_w2, args.sigma_b2, eoc_tol=args.eoc_tol)
    values = {k: (v if isinstance(v, str) or v is None else float(v)) for k, v in dataclasses.asdict(t).items()}
    if not args.json:
        values = {k: (repr(v) if isinstance(v, float) else v) for k, v in values.items()}
    show(args, values)
    return 0
