"""Commands on the maps and fixed points: list, kernel, map, qstar, eoc, batchnorm, eoc-curve, neutrality."""
from __future__ import annotations

import json

from symfield.cli.common import act_arg, parse_range
from symfield.cli.format import check_finite, emit, files, norm_kw, progress, require_finite, run_params, show
from symfield.core.errors import InvalidValue, PrecisionError


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


def cmd_map(args):
    from symfield.theory import maps
    act = act_arg(args)
    q12 = args.q if args.q12 is None else args.q12
    q2 = args.q if args.q2 is None else args.q2
    nk = norm_kw(args)
    out = {
        "q_map": maps.q_map(act, args.q, args.sigma_w2, args.sigma_b2, dps=args.dps, **nk),
        "qab_map": maps.qab_map(act, args.q, q2, q12, args.sigma_w2, args.sigma_b2, dps=args.dps, **nk),
        "chi1": maps.chi1(act, args.sigma_w2, args.sigma_b2, q=None if args.norm else args.q, dps=args.dps, **nk),
    }
    import sympy as sp

    from symfield.symbolic.kernel import kernel
    jumps = kernel(act).dpsi2 == sp.oo   # phi jumps: chi1 = sigma_w2 E[phi'^2] = inf is the true value
    require_finite({k: v for k, v in out.items() if not (jumps and k == "chi1")},
            "(float64 overflow?) use --dps 30 or smaller q, sigma_w2, sigma_b2")
    show(args, out, run_params(args, q2=q2, q12=q12), dps=args.dps)
    return 0


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
    show(args, {"q_star": qs, "chi1": slope}, dps=args.dps)
    return 0


def cmd_eoc(args):
    from symfield.theory.eoc import eoc
    e = eoc(act_arg(args), args.sigma_b2, dps=args.dps, **norm_kw(args))
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
    show(args, out, dps=args.dps)
    return check_finite(args, {"sigma_w2": float(e.sigma_w2), "q_slope": slope}, "(float64 overflow?) try --dps 30",
                  nan_only=True)


def cmd_batchnorm(args):
    from symfield.theory.norm import batchnorm
    r = batchnorm(act_arg(args), args.sigma_w2, args.sigma_b2, args.batch, norm_at=args.norm_at, dps=args.dps)
    out = {k: getattr(r, k) for k in ("c_star", "gamma", "q_star", "q_ab_star", "rate", "method")}
    show(args, out, run_params(args), dps=args.dps)
    return 0


def cmd_line(args):
    """eoc-curve and neutrality: one root per sigma_b2; a point without a line records its reason."""
    import numpy as np

    from symfield.theory.eoc import eoc
    from symfield.theory.neutrality import neutrality
    sb = parse_range(args.sigma_b2, "--sigma-b2")
    out, _ = files(args)
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
    for i, b in enumerate(progress(sb, args.command)):
        try:
            for n, v in zip(names, solve(float(b))):
                cols[n][i] = v
        except (ValueError, ArithmeticError) as err:
            errors[i] = str(err).splitlines()[0]
    if errors.all():
        raise InvalidValue(errors[0] if sb.size == 1 else f"no point of the {args.command} exists: {errors[0]}")
    data = {**cols, "error": errors.astype(str)}
    summary = {"sigma_b2": sb, **cols, "errors": int((errors != "").sum())}
    emit(args, out, data, {"sigma_b2": sb}, run_params(args), dps=args.dps, summary=summary)
    solved = errors == ""     # a point without a line is a result (its reason is in the error column)
    return check_finite(args, {n: np.array([float(v) for v in c[solved]]) for n, c in cols.items()},
                  "(float64 overflow?) try --dps 30", nan_only=True)
