"""The ``symfield`` command line. Bad input: one line on stderr and exit code 2."""
from __future__ import annotations

import argparse
import json
import sys
import warnings

EPILOG = """examples:
  symfield kernel tanh                      symbolic maps and how each was obtained
  symfield kernel "x*erf(x)" --json
  symfield kernel relu --pool max --k 2
  symfield map erf --q 1 --q12 0.5 --sigma-w2 1.5 --sigma-b2 0.1 --dps 30
  symfield propagate relu --sigma-w2 2.5 --sigma-b2 0.1 --depth 30
  symfield qstar tanh --sigma-w2 1.76095 --sigma-b2 0.05 --dps 30
  symfield eoc tanh --sigma-b2 0.05 --dps 50
  symfield phase tanh --plot phase.png      phase diagram (sigma_b2 on x, sigma_w2 on y)
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise SystemExit(_fail(message))


def _fail(message):
    print(f"symfield: error: {message}", file=sys.stderr)
    return 2


def _act(args):
    from .activation import activation
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return activation(args.activation, pool=args.pool, k=args.k) if args.pool else activation(args.activation)


def _number(v, dps):
    """A float64 as its shortest repr, an mpmath number to dps digits."""
    import mpmath
    import numpy as np
    v = v.item() if isinstance(v, np.ndarray) else v
    if not dps:
        return repr(float(v))
    return mpmath.nstr(v if isinstance(v, mpmath.mpf) else mpmath.mpf(v), dps)  # mpf(mpf) would round to 15 digits


def _print(args, values, meta=None):
    """Print named numbers as aligned 'name value' lines, or JSON (with meta) under --json."""
    if args.json:
        print(json.dumps({**(meta or {}), **values}, indent=2))
    else:
        width = max(map(len, values)) + 1
        print("\n".join(f"{k:{width}s} {v}" for k, v in values.items()))


def cmd_kernel(args):
    from .kernel import MAPS, kernel
    K = kernel(_act(args))
    if args.json:
        print(json.dumps({"activation": K.act.name, "closed_form": K.closed_form,
                          "maps": {n: {"expr": str(K[n]), "method": K.methods[n]} for n in MAPS}}, indent=2))
    else:
        print(K.describe())
    return 0


def cmd_map(args):
    from . import maps
    act = _act(args)
    q12 = args.q if args.q12 is None else args.q12
    q2 = args.q if args.q2 is None else args.q2
    out = {
        "q_map": maps.q_map(act, args.q, args.sigma_w2, args.sigma_b2, dps=args.dps),
        "qab_map": maps.qab_map(act, args.q, q2, q12, args.sigma_w2, args.sigma_b2, dps=args.dps),
        "chi1": maps.chi1(act, args.sigma_w2, args.sigma_b2, q=args.q, dps=args.dps),
    }
    text = {k: _number(v, args.dps) for k, v in out.items()}
    _print(args, text, {"activation": act.name, "q": args.q, "q2": q2, "q12": q12, "sigma_w2": args.sigma_w2,
                        "sigma_b2": args.sigma_b2, "dps": args.dps})
    return 0


def _common(p):
    p.add_argument("activation", help="built-in name (see `symfield list`) or a formula in x, e.g. \"x*erf(x)\"")
    p.add_argument("--pool", choices=["max", "avg"], help="multi-node activation: pool phi over k nodes")
    p.add_argument("--k", type=int, default=2, help="nodes per pool (default 2)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def build_parser():
    parser = _Parser(prog="symfield", description="Exact mean-field theory of wide random networks.",
                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    sub.add_parser("list", help="built-in activations")
    p = sub.add_parser("kernel", help="symbolic kernel maps of an activation")
    _common(p)
    p = sub.add_parser("map", help="evaluate q_map, qab_map and chi1 at one point")
    _common(p)
    p.add_argument("--q", type=float, required=True, help="variance q (q1 of the pair)")
    p.add_argument("--q2", type=float, help="second variance (default q)")
    p.add_argument("--q12", type=float, help="covariance (default q, i.e. c = 1)")
    p.add_argument("--sigma-w2", type=float, default=1.0, help="weight variance (default 1)")
    p.add_argument("--sigma-b2", type=float, default=0.0, help="bias variance (default 0)")
    p.add_argument("--dps", type=int, help="decimal digits (mpmath); default float64")
    p = sub.add_parser("propagate", help="q, qab, c, gamma per layer at one (sigma_w2, sigma_b2), as CSV")
    _common(p)
    p.add_argument("--sigma-w2", type=float, required=True)
    p.add_argument("--sigma-b2", type=float, required=True)
    p.add_argument("--depth", type=int, default=50)
    p.add_argument("--q0", type=float, default=1.0, help="input variance (default 1)")
    p.add_argument("--qab0", type=float, default=0.0, help="input covariance (default 0)")
    p = sub.add_parser("eoc", help="edge of chaos sigma_w2 (and q*) at one sigma_b2")
    _common(p)
    p.add_argument("--sigma-b2", type=float, required=True)
    p.add_argument("--dps", type=int, help="decimal digits (mpmath); default float64")
    p = sub.add_parser("phase", help="phase diagram on a (sigma_w2, sigma_b2) grid: labels, EOC and neutrality lines",
                       epilog="example: symfield phase tanh --sigma-w2 0:4:401 --sigma-b2 0:0.2:201 --plot phase.png")
    _common(p)
    p.add_argument("--sigma-w2", default="0:4:401", help="start:stop:num (default 0:4:401)")
    p.add_argument("--sigma-b2", default="0:0.2:201", help="start:stop:num (default 0:0.2:201)")
    p.add_argument("--depth", type=int, help="also record c and gamma at this layer")
    p.add_argument("--eoc-tol", type=float, default=1e-6, help="|chi1 - 1| counted as edge of chaos (default 1e-6)")
    p.add_argument("-o", "--output", help="write the fields to FILE.npz or FILE.csv (parameters recorded inside)")
    p.add_argument("--plot", help="draw the paper-style phase diagram to FILE.png/.pdf/.svg")
    p = sub.add_parser("qstar", help="variance fixed point q* and chi1 there")
    _common(p)
    p.add_argument("--sigma-w2", type=float, required=True)
    p.add_argument("--sigma-b2", type=float, required=True)
    p.add_argument("--dps", type=int, help="decimal digits (mpmath); default float64")
    _derive_verify_parsers(sub)
    _sweep_parser(sub)
    _bench_parser(sub)
    return parser


def cmd_propagate(args):
    from .propagate import propagate
    r = propagate(_act(args), args.sigma_w2, args.sigma_b2, args.depth, q0=args.q0, qab0=args.qab0)
    rows = [(int(l), float(a), float(b), float(c), float(g))
            for l, a, b, c, g in zip(r.layers, r.q, r.qab, r.c, r.gamma)]
    if args.json:
        print(json.dumps({"activation": args.activation, "sigma_w2": args.sigma_w2, "sigma_b2": args.sigma_b2,
                          "depth": args.depth, "status": int(r.status), "method": r.method,
                          "layers": [dict(zip(("layer", "q", "qab", "c", "gamma"), row)) for row in rows]}, indent=2))
        return 0
    print(f"# {args.activation}: sigma_w2={args.sigma_w2} sigma_b2={args.sigma_b2} ({r.method}); status={int(r.status)}")
    print("layer,q,qab,c,gamma")
    for row in rows:
        print(",".join([str(row[0])] + [repr(v) for v in row[1:]]))
    return 0


def cmd_qstar(args):
    import mpmath

    from .fixedpoint import q_star
    from .maps import chi1
    act = _act(args)
    qs = q_star(act, args.sigma_w2, args.sigma_b2, dps=args.dps)
    slope = chi1(act, args.sigma_w2, args.sigma_b2, q=qs, dps=args.dps) if 0 < qs < mpmath.inf else None
    _print(args, {"q_star": _number(qs, args.dps), "chi1": None if slope is None else _number(slope, args.dps)})
    return 0


def cmd_eoc(args):
    from .fixedpoint import eoc
    e = eoc(_act(args), args.sigma_b2, dps=args.dps)
    _print(args, {k: _number(getattr(e, k), args.dps) for k in ("sigma_b2", "sigma_w2", "q_star")})
    return 0


def _range(text, name):
    """'start:stop:num' (num >= 1 points, inclusive) or a single number -> 1-D array."""
    import numpy as np
    parts = text.split(":")
    try:
        if len(parts) == 1:
            return np.array([float(parts[0])])
        if len(parts) == 3 and int(parts[2]) >= 1:
            return np.linspace(float(parts[0]), float(parts[1]), int(parts[2]))
    except ValueError:
        pass
    raise ValueError(f"{name} must be a number or start:stop:num with num >= 1 (e.g. 0:4:401); got {text!r}")


def _writable(path, name, suffixes):
    from pathlib import Path
    p = Path(path)
    if p.suffix.lower() not in suffixes:
        raise ValueError(f"{name} must end in one of {', '.join(suffixes)}; got {path!r}")
    if not p.parent.exists() or not p.parent.is_dir():
        raise ValueError(f"{name}: directory {str(p.parent)!r} does not exist")
    import os
    if not os.access(p.parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ValueError(f"{name}: {path!r} is not writable")
    return p


def cmd_phase(args):
    import time

    import numpy as np

    from .fixedpoint import PHASES
    from .phase_diagram import phase_diagram
    sw, sb = _range(args.sigma_w2, "--sigma-w2"), _range(args.sigma_b2, "--sigma-b2")
    out = _writable(args.output, "-o/--output", (".npz", ".csv")) if args.output else None
    plot = _writable(args.plot, "--plot", (".png", ".pdf", ".svg")) if args.plot else None
    t0 = time.perf_counter()
    pd = phase_diagram(_act(args), sigma_w2=sw, sigma_b2=sb, depth=args.depth, eoc_tol=args.eoc_tol)
    seconds = time.perf_counter() - t0
    params = dict(activation=pd.act, sigma_w2=args.sigma_w2, sigma_b2=args.sigma_b2, depth=args.depth,
                  eoc_tol=args.eoc_tol)
    if out is not None and out.suffix.lower() == ".npz":
        extra = {} if pd.depth is None else dict(c_depth=pd.c_depth, gamma_depth=pd.gamma_depth)
        np.savez_compressed(out, sigma_w2=pd.sigma_w2, sigma_b2=pd.sigma_b2, codes=pd.codes,
                            phases=np.asarray(PHASES), q_star=pd.q_star, c_star=pd.c_star,
                            gamma_star=pd.gamma_star, slope=pd.slope, eoc=pd.eoc, neutrality=pd.neutrality,
                            params=json.dumps(params), **extra)
    elif out is not None:
        with open(out, "w") as fh:
            fh.write(f"# {json.dumps(params)}\nsigma_w2,sigma_b2,phase,q_star,c_star,gamma_star,slope\n")
            for i, w in enumerate(pd.sigma_w2):
                for j, b in enumerate(pd.sigma_b2):
                    fh.write(f"{w!r},{b!r},{pd.labels[i, j]},{pd.q_star[i, j]!r},{pd.c_star[i, j]!r},"
                             f"{pd.gamma_star[i, j]!r},{pd.slope[i, j]!r}\n")
    if plot is not None:
        from . import plots
        plots.phase_diagram(pd, plot)
    summary = {"activation": pd.act, "grid": [int(sw.size), int(sb.size)], "seconds": round(seconds, 3),
               "counts": pd.counts(), "output": str(out) if out else None, "plot": str(plot) if plot else None}
    if args.json:
        summary["eoc"] = [None if np.isnan(v) else float(v) for v in pd.eoc]
        summary["neutrality"] = [None if np.isnan(v) else float(v) for v in pd.neutrality]
        summary["sigma_b2"] = [float(v) for v in pd.sigma_b2]
        print(json.dumps(summary, indent=2))
        return 0
    print(f"{pd.act}: {sw.size} x {sb.size} grid (sigma_w2 x sigma_b2) in {seconds:.2f} s")
    for name, n in summary["counts"].items():
        print(f"  {name:24s} {n}")
    for label, path in (("data", out), ("plot", plot)):
        if path:
            print(f"{label}: {path}")
    return 0


COMMANDS = {"phase": cmd_phase, "kernel": cmd_kernel, "map": cmd_map, "propagate": cmd_propagate, "qstar": cmd_qstar, "eoc": cmd_eoc}


def _derive_verify_parsers(sub):
    p = sub.add_parser("derive", help="LaTeX document deriving the mean-field theory of an activation")
    p.add_argument("activation", help="built-in name (see `symfield list`) or a formula in x")
    p.add_argument("--pool", choices=["max", "avg"], help="multi-node activation: pool phi over k nodes")
    p.add_argument("--k", type=int, default=2, help="nodes per pool (default 2)")
    p.add_argument("-o", "--output", metavar="FILE", help="write the .tex file here (default: standard output)")
    p = sub.add_parser("verify", help="check a new activation: closed forms, V/C/chi1 three ways, drift, EOC, phases")
    p.add_argument("formula", help='formula in x, e.g. "x*erf(x)" (or a built-in name)')
    p.add_argument("--json", action="store_true", help="machine-readable report")
    p.add_argument("--seed", type=int, default=0, help="Monte Carlo seed (default 0)")
    p.add_argument("--n-mc", type=int, default=200_000, help="Monte Carlo samples (default 200000)")


def cmd_derive(args):
    from .derive import derive
    tex = derive(_act(args))
    if not args.output:
        sys.stdout.write(tex)
        return 0
    try:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(tex)
    except OSError as err:
        return _fail(f"cannot write {args.output!r}: {err.strerror or err}")
    return 0


def cmd_verify(args):
    from .verify import verify
    report = verify(args.formula, seed=args.seed, n_mc=args.n_mc)
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.table())
    return 0 if report.ok else 1


COMMANDS.update(derive=cmd_derive, verify=cmd_verify)


def _sweep_parser(sub):
    from .sweep import add_parser
    add_parser(sub)


def cmd_sweep(args):
    from .sweep import cli
    return cli(args)


COMMANDS.update(sweep=cmd_sweep)


def _bench_parser(sub):
    from .bench import add_parser
    add_parser(sub)


def cmd_bench(args):
    from .bench import cli
    return cli(args)


COMMANDS.update(bench=cmd_bench)


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.command == "list":
        from .activation import BUILTINS
        for name, (_, defaults, desc) in sorted(BUILTINS.items()):
            print(f"{name:12s} {desc}" + (f"   parameters: {defaults}" if defaults else ""))
        return 0
    try:
        return COMMANDS[args.command](args)
    except (ValueError, TypeError, NotImplementedError, ArithmeticError) as err:
        return _fail(str(err).splitlines()[0])
    except KeyboardInterrupt:
        return _fail("interrupted")
