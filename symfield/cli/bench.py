"""``symfield bench``: its arguments and the command (the benchmark itself is symfield.reports.bench)."""
from __future__ import annotations

import json


def add_parser(sub):
    """The ``symfield bench`` sub-command, registered on the sub-parsers ``sub``."""
    p = sub.add_parser("bench", help="time propagate against NumPy Gauss-Hermite, SciPy quad and a Numba floor",
                       epilog="example: symfield bench tanh --grid 256x256 --depth 100   (--quick: seconds)")
    p.add_argument("activation", nargs="?", default="tanh", help="activation (default tanh)")
    p.add_argument("--pool", choices=["max", "avg"], help="multi-node activation: pool phi over k nodes")
    p.add_argument("--k", type=int, default=2, help="nodes per pool (default 2)")
    p.add_argument("--grid", default="256x256", help="NWxNB points of sigma_w2 x sigma_b2 (default 256x256)")
    p.add_argument("--sigma-w2", default="0.1:4", help="lo:hi (default 0.1:4)")
    p.add_argument("--sigma-b2", default="0:0.2", help="lo:hi (default 0:0.2)")
    p.add_argument("--depth", type=int, default=100)
    p.add_argument("--repeat", type=int, default=3, help="timing repetitions (best is kept)")
    p.add_argument("--gh-grid", default="8x8", help="sub-grid for the Gauss-Hermite baseline (default 8x8)")
    p.add_argument("--scipy-samples", type=int, default=4, help="cell-layers timed with scipy quad/dblquad")
    p.add_argument("--n-check", type=int, default=20, help="(cell, layer) points checked against mpmath")
    p.add_argument("--dps", type=int, default=30, help="mpmath digits of the check (default 30)")
    p.add_argument("--n-traj", type=int, default=4, help="whole trajectories compared with the quadrature path")
    p.add_argument("--quick", action="store_true", help="small sizes: 32x32 grid, depth 20, 4x4 GH sub-grid, "
                                                         "2 SciPy samples, 3 mpmath checks at dps 15, 2 trajectories")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def _dims(text, name):
    """'NWxNB' -> (NW, NB)."""
    try:
        a, b = (int(v) for v in text.lower().split("x"))
        return a, b
    except ValueError:
        raise ValueError(f"The '--{name}' option of bench must look like 256x256. Got {text!r} instead.") from None


def _interval(text, name):
    """'lo:hi' -> (lo, hi)."""
    try:
        a, b = (float(v) for v in text.split(":"))
        return a, b
    except ValueError:
        raise ValueError(f"The '--{name}' option of bench must look like lo:hi. Got {text!r} instead.") from None


def cli(args):
    """``symfield bench``: run the benchmark, print its report (or --json)."""
    from symfield.reports.bench import bench
    from symfield.symbolic.activation import activation
    act = activation(args.activation, pool=args.pool, k=args.k) if args.pool else activation(args.activation)
    kw = dict(grid=_dims(args.grid, "grid"), depth=args.depth, repeat=args.repeat, gh_grid=_dims(args.gh_grid, "gh-grid"),
              scipy_samples=args.scipy_samples, n_check=args.n_check, check_dps=args.dps, n_traj=args.n_traj,
              sigma_w2=_interval(args.sigma_w2, "sigma-w2"), sigma_b2=_interval(args.sigma_b2, "sigma-b2"))
    if args.quick:
        kw.update(grid=(32, 32), depth=20, gh_grid=(4, 4), scipy_samples=2, n_check=3, check_dps=15, repeat=2, n_traj=2)
    res = bench(act, **kw)
    if args.json:
        print(json.dumps(dict(act=res.act, grid=res.grid, depth=res.depth, method=res.method, times=res.times,
                              ratios=res.ratios(), notes=res.notes, accuracy=res.accuracy, setup=res.setup),
                         indent=2, default=str))
    else:
        print(res.report())
    return 0
