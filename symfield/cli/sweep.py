"""``symfield sweep``: its arguments and the command (the Dask engine is symfield.sweep)."""
from __future__ import annotations

from symfield.core.errors import InvalidValue
import argparse
import json
import math
import sys
from pathlib import Path

from symfield.cli.common import INCOMPLETE, act_arg, fail, parse_range, writable
from symfield.sweep import KINDS, first_line, sweep

EXAMPLES = """examples:
  symfield sweep eoc tanh --sigma-b2 0.01:0.3:30 --dps 30 -d runs/tanh-eoc
  symfield sweep phase erf --sigma-w2 0:4:401 --sigma-b2 0:0.2:201 --chunk 20 -d runs/erf
  symfield sweep verify tanh "x*erf(x)" gelu -d runs/verify --scheduler tcp://host:8786
Rerun the same command to resume; finished chunks are not recomputed."""


def add_parser(sub):
    """Register the ``sweep`` sub-command on the sub-parsers ``sub``."""
    what = "distributed, resumable sweep on Dask: eoc / neutrality / phase / verify"
    p = sub.add_parser("sweep", help=what, epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
                       description=what + ". Points are computed in chunks, each saved in the results directory "
                                          "as it finishes; rerunning the same command resumes.")
    p.add_argument("kind", choices=KINDS, help="what to sweep: " + ", ".join(KINDS))
    p.add_argument("activation", nargs="*", help="activation (eoc/neutrality/phase) or formulas (verify)")
    p.add_argument("-d", "--results", required=True, help="results directory (created; rerun to resume)")
    p.add_argument("--formulas", help="verify: file with one formula per line (# comments)")
    p.add_argument("--pool", choices=["max", "avg"], help="multi-node activation: pool phi over k nodes")
    p.add_argument("--k", type=int, default=2, help="nodes per pool (default 2)")
    p.add_argument("--sigma-w2", help="phase: start:stop:num (default 0:4:401)")
    p.add_argument("--sigma-b2", help="start:stop:num or a number (phase default 0:0.2:201)")
    p.add_argument("--dps", type=int, help="eoc/neutrality: decimal digits (mpmath); default float64")
    p.add_argument("--depth", type=int, help="phase: also record c and gamma at this layer")
    p.add_argument("--eoc-tol", type=float, default=1e-6, help="phase: |chi1 - 1| counted as edge of chaos")
    p.add_argument("--chunk", help="points per chunk, or ROWSxCOLS tiles for phase")
    p.add_argument("--scheduler", help="address of a running Dask scheduler (default: a local cluster)")
    p.add_argument("--workers", type=int, help="local cluster size (default: the usable CPUs)")
    p.add_argument("--connect-timeout", type=float, default=10.0, help="seconds to reach the scheduler (default 10)")
    p.add_argument("-o", "--output", help="also write FILE.npz or FILE.nc (parameters recorded inside)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (it shows only on a terminal)")
    p.add_argument("--json", action="store_true", help="machine-readable summary")
    return p


def _chunk(text):
    """--chunk N or ROWSxCOLS -> None, N or (ROWS, COLS)."""
    if text is None:
        return None
    try:
        parts = [int(t) for t in text.lower().split("x")]
    except ValueError:
        parts = []
    if len(parts) not in (1, 2):
        raise InvalidValue(f"--chunk must be N or ROWSxCOLS (e.g. 16 or 100x20); got {text!r}")
    return parts[0] if len(parts) == 1 else tuple(parts)


def _formulas(args):
    """kind verify: the formula arguments, then the lines of --formulas FILE (no blanks, no # comments)."""
    act = list(args.activation)
    if args.formulas:
        try:
            lines = Path(args.formulas).read_text().splitlines()
        except OSError as err:
            raise InvalidValue(f"--formulas: cannot read {args.formulas!r} ({err.strerror})") from None
        act += [s.strip() for s in lines if s.strip() and not s.strip().startswith("#")]
    if not act:
        raise InvalidValue("sweep verify needs formulas (arguments or --formulas FILE)")
    return act


def _inputs(args):
    """(activation or formulas, sigma_w2 axis or None, sigma_b2 axis or None) from the arguments."""
    kind = args.kind
    if kind == "verify":
        return _formulas(args), None, None
    if len(args.activation) != 1:
        raise InvalidValue(f"sweep {kind} takes exactly one activation; got {len(args.activation)}")
    args.activation = args.activation[0]
    act = act_arg(args)
    if kind == "phase":
        return (act, parse_range(args.sigma_w2 or "0:4:401", "--sigma-w2"),
                parse_range(args.sigma_b2 or "0:0.2:201", "--sigma-b2"))
    if args.sigma_b2 is None:
        raise InvalidValue(f"sweep {kind} needs --sigma-b2 (start:stop:num or a number)")
    return act, None, parse_range(args.sigma_b2, "--sigma-b2")


def _summary(args, r):
    """What the command reports about a finished sweep ``r`` (the --json output)."""
    kind = args.kind
    summary = {"kind": kind, "activation": r.act, "results_dir": str(r.results_dir), "result": str(r.path),
               "output": args.output, "chunks": len(r.computed) + len(r.reused), "computed": len(r.computed),
               "reused": len(r.reused), "seconds": round(r.seconds, 3), "failed": r.failed}
    if kind in ("eoc", "neutrality"):
        vals = [None if math.isnan(v) else float(v) for v in r["sigma_w2"]]     # JSON numbers (null: no point)
        summary.update(sigma_b2=r["sigma_b2"].tolist(), sigma_w2=vals, errors=int((r["error"] != "").sum()))
        if args.dps:     # all dps digits as decimal text beside the float64 numbers
            summary["sigma_w2_exact"] = [None if v is None else str(t)
                                         for v, t in zip(vals, r.data["sigma_w2_mp"].tolist())]
    elif kind == "phase":
        summary.update(grid=[int(r["sigma_w2"].size), int(r["sigma_b2"].size)], counts=r.phase_diagram().counts())
    else:
        summary.update(ok={f: bool(o) for f, o in zip(r["formulas"], r["ok"])},
                       errors={f: e for f, e in zip(r["formulas"], r["error"]) if e})
    return summary


def _say(args, r, summary):
    """The summary as text: one line per point, phase or formula on stdout; how the run went (chunks,
    time) and the files written are status lines on stderr."""
    kind = args.kind
    print(f"{kind} sweep of {r.act}: {summary['chunks']} chunks ({summary['computed']} computed, "
          f"{summary['reused']} reused) in {r.seconds:.2f} s", file=sys.stderr)
    if kind in ("eoc", "neutrality"):
        for b, v, e in zip(summary["sigma_b2"], summary["sigma_w2"], r["error"]):
            print(f"  sigma_b2 {b!r:24s} sigma_w2 {v if not e else 'none: ' + str(e)}")
    elif kind == "phase":
        for n, c in summary["counts"].items():
            print(f"  {n:24s} {c}")
    else:
        for f, o in summary["ok"].items():
            print(f"  {'ok  ' if o else 'FAIL'} {f}" + (f"  ({summary['errors'][f]})" if f in summary["errors"] else ""))
    print(f"result: {r.path}" + (f"\noutput: {args.output}" if args.output else ""), file=sys.stderr)


def cli(args):
    """``symfield sweep``: run, print a summary (or --json); errors as one line, exit code 2."""
    kind = args.kind
    act, sw, sb = _inputs(args)
    if args.output:
        writable(args.output, "-o/--output", (".npz", ".nc"))
    try:
        r = sweep(kind, act, args.results, sigma_w2=sw, sigma_b2=sb, dps=args.dps, chunk=_chunk(args.chunk),
                  scheduler=args.scheduler, n_workers=args.workers, progress=False if args.no_progress else None,
                  depth=args.depth, eoc_tol=args.eoc_tol if kind == "phase" else 1e-6, output=args.output,
                  connect_timeout=args.connect_timeout)
    except (OSError, TimeoutError, RuntimeError) as err:   # unreachable scheduler, no cluster, crashed chunk
        return fail(first_line(err))
    summary = _summary(args, r)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _say(args, r, summary)
    if r.failed:
        total = r["error"].size
        print(f"symfield sweep: {r.failed} of {total} points failed (NaN values; the reason is in the 'error' "
              f"variable of {r.path})", file=sys.stderr)
        return INCOMPLETE
    return 0
