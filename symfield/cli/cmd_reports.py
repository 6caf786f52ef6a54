"""Commands that write documents or run checks: derive, verify, sweep, bench."""
from __future__ import annotations

import json
import sys

from symfield.cli.common import act_arg, fail


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
