"""Commands on finite width: simulate, gram, jacobian (one point or --map), gradients."""
from __future__ import annotations


from symfield.cli.common import act_arg, parse_range
from symfield.cli.format import (check_finite, emit, files, incomplete, norm_kw, number, plain, progress,
                                 run_params, say_files, show, to_json)
from symfield.core.errors import InvalidValue
from symfield.cli.cmd_depth import phase_blocks


def cmd_simulate(args):
    import numpy as np

    from symfield.simulate import finite_data_gamma, simulate
    from symfield.theory.propagate import propagate
    if args.n_inputs < 2:
        raise InvalidValue(f"--n-inputs must be an integer >= 2 (c, qab and gamma compare pairs of inputs); "
                         f"got {args.n_inputs}")
    out, plot = files(args)
    act = act_arg(args)
    nk = norm_kw(args)
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
    emit(args, out, data, {"layer": s.layers}, run_params(args, theory=th.method),
          summary={"layer": s.layers, **data, "plot": str(plot) if plot else None})
    return check_finite(args, data, "overflow at this sigma_w2, sigma_b2, depth? (theory status "
                              f"{int(th.status)}: {th.STATUS[int(th.status)]})")


def cmd_gram(args):
    import numpy as np

    from symfield.theory.gram import STATUS_NAMES, gram_fluctuations, status_attrs
    out, plot = files(args)
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
    emit(args, out, data, {"layer": g.layers}, run_params(args, derivatives=g.moments.methods["derivatives"]),
          dps=args.dps, summary={"layer": g.layers, **data, "plot": str(plot) if plot else None},
          var_attrs={"status": status_attrs(np.asarray(g.status).dtype)})
    at_one = np.asarray(g.status) == 3      # c = 1 in float64 terms: gamma inf and gamma_sd undefined by design
    bad = check_finite(args, {k: np.asarray(v, float)[~at_one] if k.startswith("gamma") else np.asarray(v, float)
                        for k, v in data.items()}, "non-finite values (status column)")
    if bad or not (g.status != 0).any():
        return bad
    meaning = {1: "an error estimate above its tolerance (numeric derivatives, the residual pair rule, or "
                  "(aa, bb, ab) ingredients where 1 - c is too small for them; try --dps)",
               2: "non-finite", 3: "c = 1 in float64 terms (identical inputs, or 1 - c below 1e-150): gamma = inf, "
                                   "gamma_sd undefined; the Gram entries and covariances are accurate"}
    counts = [f"{int((g.status == s).sum())} with status {s} ({STATUS_NAMES[s]}: {meaning[s]})"
              for s in (1, 2, 3) if (g.status == s).any()]
    return incomplete(args, "layers flagged in the status column: " + "; ".join(counts))


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
    out, plot = files(args)
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
        save(out, {"pdf": spec.pdf}, {"x": spec.x}, run_params(args, **plain({**summary, **sim}, args.dps)))
    if args.json:
        print(to_json({"params": run_params(args, sigma_w2=sw, sigma_b2=sb), **summary, **sim, "x": spec.x, "pdf": spec.pdf,
                     "q_layers": spec.q,
                     "output": str(out) if out else None, "plot": str(plot) if plot else None}, args.dps))
    else:
        text = {k: (number(v, args.dps) if k[0] == "m" else str(plain(v))) for k, v in summary.items()
                if k not in ("checks", "status_text")}
        text["status"] += f" ({spec.message})"
        text.update({f"sim_{k}": f"{v:.6g}" for k, v in sim.get("simulation", {}).items() if k[0] == "m"})
        show(args, text)
        say_files(out, plot)
    if spec.status in (1, 2, 4):     # 3 (an atom at 0: condition = inf) is a result, not a failure
        return incomplete(args, f"status {spec.status}: {spec.message}")
    return 0


def _isometry_blocks(act, sw, sb, depth, weights, q0):
    """isometry_diagram over blocks of sigma_b2 columns (points are independent), progress bar on a terminal."""
    import dataclasses

    import numpy as np

    from symfield.theory.jacobian import isometry_diagram
    blocks = np.array_split(np.arange(sb.size), min(sb.size, 20))
    parts = [isometry_diagram(act, sw, sb[j], depth, weights, q0) for j in progress(blocks, "isometry")]
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
    out, plot = files(args)
    act = act_arg(args)
    d = _isometry_blocks(act, sw, sb, args.depth, args.weights, args.q0)
    if plot is not None:
        from symfield.io import plots
        plots.isometry_map(d, phase_blocks(act, sw, sb, None, 1e-6), path=plot, act=act, dpi=args.dpi)
    data = {"m1": d.m1, "m2": d.m2, "var": d.var, "rel_var": d.rel_var, "status": d.status}
    with np.errstate(all="ignore"):     # the most isometric point with m1 within a factor 2 of 1
        score = np.where((d.status == 0) & (np.abs(np.log(d.m1)) <= np.log(2)), d.rel_var, np.inf)
    best = None
    if np.isfinite(score).any():
        i, j = np.unravel_index(np.argmin(score), score.shape)
        best = {"sigma_w2": sw[i], "sigma_b2": sb[j], "m1": d.m1[i, j], "rel_var": d.rel_var[i, j]}
    summary = {"grid": [int(sw.size), int(sb.size)], "sigma_w2": sw, "sigma_b2": sb, "m1": d.m1,
               "rel_var": d.rel_var, "most_isometric": best, "plot": str(plot) if plot else None}
    emit(args, out, data, {"sigma_w2": sw, "sigma_b2": sb}, run_params(args), summary=summary)
    failed, out_of_range = int((d.status == 5).sum()), int((d.status == 4).sum())
    if failed or out_of_range:
        first = d.errors[d.status == 5][0] if failed else ""
        parts = ([f"{out_of_range} have m1 or m2 outside the float64 range (status 4; rel_var is still given)"]
                 if out_of_range else []) + ([f"{failed} could not be computed (status 5: {first})"] if failed else [])
        return incomplete(args, f"of {d.status.size} grid points, {' and '.join(parts)}")
    return 0


def cmd_gradients(args):
    from symfield.simulate import class_gradients
    out, plot = files(args)
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
    emit(args, out, data, {"layer": g.layers}, run_params(args), dims=dims, summary=summary)
    return check_finite(args, data, "overflow at this sigma_w2, sigma_b2, depth?")
