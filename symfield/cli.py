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
    import mpmath

    from . import maps
    act = _act(args)
    q12 = args.q if args.q12 is None else args.q12
    q2 = args.q if args.q2 is None else args.q2
    out = {
        "q_map": maps.q_map(act, args.q, args.sigma_w2, args.sigma_b2, dps=args.dps),
        "qab_map": maps.qab_map(act, args.q, q2, q12, args.sigma_w2, args.sigma_b2, dps=args.dps),
        "chi1": maps.chi1(act, args.sigma_w2, args.sigma_b2, q=args.q, dps=args.dps),
    }
    digits = args.dps or 17
    text = {k: mpmath.nstr(mpmath.mpf(v), digits) if args.dps else repr(float(v)) for k, v in out.items()}
    if args.json:
        print(json.dumps({"activation": act.name, "q": args.q, "q2": q2, "q12": q12, "sigma_w2": args.sigma_w2,
                          "sigma_b2": args.sigma_b2, "dps": args.dps, **text}, indent=2))
    else:
        for k, v in text.items():
            print(f"{k:8s} {v}")
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
    return parser


COMMANDS = {"kernel": cmd_kernel, "map": cmd_map}


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
