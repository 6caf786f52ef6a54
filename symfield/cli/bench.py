"""``symfield bench``: its arguments and the command (the benchmark itself is symfield.reports.bench;
``--suite cold``, the cold-start table, is symfield.reports.bench_cold)."""
from __future__ import annotations

from symfield.core.errors import InvalidValue
import json
import math

RANGE_W, RANGE_B = "0.1:4:256", "0:0.2:256"    # the default grid, start:stop:num as everywhere


def add_parser(sub):
    """The ``symfield bench`` sub-command, registered on the sub-parsers ``sub``."""
    what = "time propagate against NumPy Gauss-Hermite, SciPy quad and a Numba floor"
    p = sub.add_parser("bench", help=what, description=what + " on a sigma_w2 x sigma_b2 grid, with an mpmath "
                                                              "accuracy check (--suite cold: cold-start times).",
                       epilog="examples: symfield bench tanh --grid 256x256 --depth 100   (--quick: seconds);   "
                              "symfield bench --suite cold --rows gelu-phase --warm -o cold.json")
    p.add_argument("activation", nargs="?", default="tanh", help="activation (default tanh)")
    p.add_argument("--pool", choices=["max", "avg"], help="multi-node activation: pool phi over k nodes")
    p.add_argument("--k", type=int, default=2, help="nodes per pool (default 2)")
    p.add_argument("--grid", help="NWxNB points of sigma_w2 x sigma_b2, a shorthand for the num of both ranges "
                                  "(default 256x256)")
    p.add_argument("--sigma-w2", help=f"start:stop:num, num points with both ends included (default {RANGE_W})")
    p.add_argument("--sigma-b2", help=f"start:stop:num, num points with both ends included (default {RANGE_B})")
    p.add_argument("--depth", type=int, default=100, help="layers propagated (default 100)")
    p.add_argument("--repeat", type=int, default=3, help="timing repetitions (best is kept)")
    p.add_argument("--gh-grid", default="8x8", help="sub-grid for the Gauss-Hermite baseline (default 8x8)")
    p.add_argument("--scipy-samples", type=int, default=4, help="cell-layers timed with scipy quad/dblquad")
    p.add_argument("--n-check", type=int, default=20, help="(cell, layer) points checked against mpmath")
    p.add_argument("--dps", type=int, default=30, help="mpmath digits of the check (default 30)")
    p.add_argument("--n-traj", type=int, default=4, help="whole trajectories compared with the quadrature path")
    p.add_argument("--quick", action="store_true", help="small sizes: 32x32 grid, depth 20, 4x4 GH sub-grid, "
                                                         "2 SciPy samples, 3 mpmath checks at dps 15, 2 trajectories")
    p.add_argument("--json", action="store_true", help="machine-readable output on standard output")
    p.add_argument("-o", "--output", metavar="PATH", help="also write the JSON report to PATH, a .json file in an "
                                                         "existing directory (atomic)")
    cold = p.add_argument_group("cold suite (cold-start targets, each row in a new process with an empty cache)")
    cold.add_argument("--suite", choices=["cold"], help="run a benchmark suite instead of the propagate comparison")
    cold.add_argument("--rows", metavar="NAMES", help="comma-separated rows of the suite (default: all; "
                                                       "--rows list prints them)")
    cold.add_argument("--timeout", type=float, metavar="S", help="time limit per row run in seconds "
                                                                 "(default 3x its target, at least 60)")
    cold.add_argument("--warm", action="store_true", help="run each row again in a new process on the cache it filled")
    return p


def _dims(text, name):
    """'NWxNB' -> (NW, NB)."""
    try:
        a, b = (int(v) for v in text.lower().split("x"))
        return a, b
    except ValueError:
        raise InvalidValue(f"The '--{name}' option of bench must look like 256x256. Got {text!r} instead.") from None


def _range(text, name):
    """'start:stop:num' (the range syntax of every symfield command) -> (start, stop, num)."""
    try:
        a, b, n = text.split(":")
        a, b, n = float(a), float(b), int(n)
        if n >= 1:
            return a, b, n
    except ValueError:
        pass
    raise InvalidValue(f"The '--{name}' option of bench must be start:stop:num with num >= 1 (e.g. "
                     f"{RANGE_W if name == 'sigma-w2' else RANGE_B}). Got {text!r} instead.")


def _grid(args):
    """(sigma_w2 interval, sigma_b2 interval, (NW, NB)) from --sigma-w2/--sigma-b2 and --grid, whose
    NWxNB must agree with the num of a range given explicitly."""
    w = _range(args.sigma_w2 or RANGE_W, "sigma-w2")
    b = _range(args.sigma_b2 or RANGE_B, "sigma-b2")
    grid = (w[2], b[2])
    if args.grid is not None:
        grid = _dims(args.grid, "grid")
        for given, r, n, name in ((args.sigma_w2, w, grid[0], "sigma-w2"), (args.sigma_b2, b, grid[1], "sigma-b2")):
            if given is not None and r[2] != n:
                raise InvalidValue(f"The '--grid' option of bench ({args.grid}) must agree with the num of "
                                 f"'--{name}' ({given}). Got {r[2]} and {n} points instead.")
    return w[:2], b[:2], grid


def _output(args):
    """-o/--output checked before any work, like every command's output (symfield.io.output.writable)."""
    if args.output:
        from symfield.cli.common import writable
        writable(args.output, "-o/--output", (".json",))


def cli(args):
    """``symfield bench``: run the benchmark, print its report (or --json)."""
    _output(args)
    if args.suite == "cold":
        return _cold(args)
    for opt, val in (("rows", args.rows), ("timeout", args.timeout), ("warm", args.warm or None)):
        if val is not None:
            raise InvalidValue(f"The '--{opt}' option of bench is allowed only with '--suite cold'. Got {val!r} without it instead.")
    from symfield.reports.bench import bench
    from symfield.symbolic.activation import activation
    act = activation(args.activation, pool=args.pool, k=args.k) if args.pool else activation(args.activation)
    sigma_w2, sigma_b2, grid = _grid(args)
    kw = dict(grid=grid, depth=args.depth, repeat=args.repeat, gh_grid=_dims(args.gh_grid, "gh-grid"),
              scipy_samples=args.scipy_samples, n_check=args.n_check, check_dps=args.dps, n_traj=args.n_traj,
              sigma_w2=sigma_w2, sigma_b2=sigma_b2)
    if args.quick:
        kw.update(grid=(32, 32), depth=20, gh_grid=(4, 4), scipy_samples=2, n_check=3, check_dps=15, repeat=2, n_traj=2)
    res = bench(act, **kw)
    from symfield.core.version import provenance
    text = json.dumps(dict(act=res.act, grid=res.grid, depth=res.depth, method=res.method, times=res.times,
                           ratios=res.ratios(), notes=res.notes, accuracy=res.accuracy, setup=res.setup,
                           provenance=provenance()), indent=2, default=str)
    if args.output:
        from symfield.core.files import atomic_write
        atomic_write(args.output, text + "\n")
    print(text if args.json else res.report())
    return 0


def _cold(args):
    """``symfield bench --suite cold``: the table on stdout (JSON with --json); -o PATH also writes the JSON."""
    from symfield.reports import bench_cold as bc
    if args.rows == "list":
        for r in bc.ROWS:
            print(f"{r.name:24s} target {r.target:g} s ({r.metric})  {r.case}")
        return 0
    rows = bc.select(args.rows)
    if args.timeout is not None and not (math.isfinite(args.timeout) and args.timeout > 0):
        raise InvalidValue(f"The '--timeout' option of bench must be a finite number of seconds > 0. "
                         f"Got {args.timeout!r} instead.")
    results = bc.run(rows, timeout=args.timeout, warm=args.warm)
    if args.output:
        bc.write_json(results, args.output)
    print(json.dumps(bc.jsonable(bc.to_dict(results)), indent=2) if args.json else bc.table(results))
    return 0
