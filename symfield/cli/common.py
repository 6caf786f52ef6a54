"""Helpers shared by the ``symfield`` commands: the parser class, errors, activations, ranges, files."""
from __future__ import annotations

from symfield.core.errors import InvalidValue
import argparse
import sys
import warnings

EPILOG = """examples:
  symfield list                             built-in activations
  symfield kernel tanh                      symbolic maps and how each was obtained
  symfield kernel relu --pool max --k 2 --json
  symfield map erf --q 1 --q12 0.5 --sigma-w2 1.5 --sigma-b2 0.1 --dps 30
  symfield propagate relu --sigma-w2 2.5 --sigma-b2 0.1 --depth 30 -o relu.csv
  symfield qstar tanh --sigma-w2 1.76095 --sigma-b2 0.05 --dps 30
  symfield eoc tanh --sigma-b2 0.05 --dps 50
  symfield eoc-curve tanh --sigma-b2 0:0.3:31 -o eoc.nc
  symfield neutrality tanh --sigma-b2 0.01:0.2:20 --json
  symfield phase tanh --plot phase.png      phase diagram (sigma_b2 on x, sigma_w2 on y)
  symfield phase relu --pool max --k 2 --sigma-w2 0.5:4:36 --sigma-b2 0:0.2:21 -o relu-max2.nc
  symfield divergence relu --sigma-w2 2.5 --sigma-b2 0.1 --depth 400 --plot div.png
  symfield simulate tanh --sigma-w2 2.5 --sigma-b2 0.1 --width 2000 --depth 60 --plot depth.png
  symfield gradients relu --sigma-w2 2.5 --sigma-b2 0.1 --width 300 --depth 20 --plot grad.png
  symfield jacobian tanh --sigma-w2 1.05 --sigma-b2 0.001 --depth 8 --weights orthogonal --plot j.png
  symfield derive "x*erf(x)" -o xerf.tex
  symfield verify "x*erf(x)"
  symfield sweep eoc tanh --sigma-b2 0.01:0.3:30 --dps 30 -d runs/tanh-eoc
  symfield bench tanh --quick
Ranges are start:stop:num (num points, both ends included). Values and formulas may start with '-'
(--sigma-b2 -1:2:3, symfield kernel "-x**2").
Standard output carries data only: tables (CSV; its first line "# {...}" records the parameters),
values, summaries, JSON. Status lines for people (files written, timing, progress bars, errors) go
to standard error; progress bars appear on a terminal only, so piped output stays clean.
--json prints one JSON object: "params" records every parameter, every number is a JSON number at
full precision (float64 repr), NaN is null and an infinity "inf"/"-inf" (JSON has no infinity);
with --dps each high-precision value NAME also comes as NAME_exact, decimal text with dps digits.
Output files (-o, --plot) are written to a temporary file and renamed into place: an interrupted or
failed run leaves the earlier file untouched and no partial file.

exit status:
  0    success
  1    verify: a check failed
  2    error (bad input, a failed computation, a file that cannot be written): one line on stderr,
       nothing written; --debug also prints the traceback
  3    verify: inconclusive
  4    incomplete result: written or printed, but some values are non-finite (overflow, status != 0)
       or some sweep points failed; one line on stderr says how many
  130  interrupted (Ctrl-C): one line "interrupted", no partial output file
"""

INCOMPLETE = 4      # results written, but some values are non-finite or some points failed
INTERRUPTED = 130   # Ctrl-C


def fail(message):
    """Print ``symfield: error: message`` on stderr; return the exit code 2."""
    print(f"symfield: error: {message}", file=sys.stderr)
    return 2


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr and exit code 2."""

    def error(self, message):
        raise SystemExit(fail(message))


def act_arg(args):
    """The activation of ``args.activation`` (pooled by ``--pool``/``--k`` when given), quietly."""
    from symfield.symbolic.activation import activation
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return activation(args.activation, pool=args.pool, k=args.k) if args.pool else activation(args.activation)


def parse_range(text, name):
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
    raise InvalidValue(f"{name} must be a number or start:stop:num with num >= 1 (e.g. 0:4:401); got {text!r}")


def writable(path, name, suffixes):
    """``path`` checked before any work (accepted suffix, writable directory): symfield.io.output.writable."""
    from symfield.io.output import writable as check_writable
    return check_writable(path, name, suffixes)

