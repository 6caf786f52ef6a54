"""The ``symfield`` command line. Bad input: one line on stderr and exit code 2 (exit codes: EXIT_CODES).

Tables (per layer, per sigma_b2, per grid point) go to standard output as CSV, or with
``-o FILE`` to FILE.csv / FILE.npz / FILE.nc with the parameters that produced them inside
(symfield/io/output.py); ``--json`` prints what a program reads; ``--plot FILE`` draws the figure.
"""
from __future__ import annotations

import sys

from symfield.cli.common import INTERRUPTED, fail


# command -> (module symfield.cli.cmd_<module>, function): each command imports only its own module
COMMANDS = {
    "list": ("maps", "cmd_list"),
    "kernel": ("maps", "cmd_kernel"),
    "map": ("maps", "cmd_map"),
    "qstar": ("maps", "cmd_qstar"),
    "eoc": ("maps", "cmd_eoc"),
    "batchnorm": ("maps", "cmd_batchnorm"),
    "eoc-curve": ("maps", "cmd_line"),
    "neutrality": ("maps", "cmd_line"),
    "propagate": ("depth", "cmd_propagate"),
    "phase": ("depth", "cmd_phase"),
    "divergence": ("depth", "cmd_divergence"),
    "simulate": ("width", "cmd_simulate"),
    "gram": ("width", "cmd_gram"),
    "jacobian": ("width", "cmd_jacobian"),
    "gradients": ("width", "cmd_gradients"),
    "ntk": ("depth", "cmd_ntk"),
    "trainability": ("depth", "cmd_trainability"),
    "derive": ("reports", "cmd_derive"),
    "verify": ("reports", "cmd_verify"),
    "sweep": ("reports", "cmd_sweep"),
    "bench": ("reports", "cmd_bench"),
}


def command(name):
    """The function of command ``name``, imported on first use."""
    import importlib
    module, func = COMMANDS[name]
    return getattr(importlib.import_module(f"symfield.cli.cmd_{module}"), func)


def _dash_formulas(argv):
    """Formulas and numbers may start with '-' (``symfield kernel "-x**2"``, ``--q12 -1e300``): after the
    command, a token that starts with '-' and is none of -h, -o..., -d... or --name gets a leading space,
    which argparse reads as a value, not an option (formulas and numbers are read with spaces stripped)."""
    out, after = list(argv), False
    for i, t in enumerate(out):
        if not after:
            after = t in COMMANDS
        elif len(t) > 1 and t[0] == "-" and t[1] != "-" and t != "-h" and t[:2] not in ("-o", "-d"):
            out[i] = " " + t
    return out


def _message(err):
    """The first line of an exception's message, or its type when the message is empty."""
    text = str(err).strip()
    return text.splitlines()[0] if text else f"{type(err).__name__} (no message)"


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv       # anywhere on the line: tracebacks on stderr as well
    try:
        return _run([a for a in argv if a != "--debug"])
    except BrokenPipeError:  # the reader (e.g. `| head`) closed the pipe: stop quietly
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except BaseException as err:
        if isinstance(err, SystemExit):
            raise
        if debug:
            import traceback
            traceback.print_exc()
        return _failure(err)
    finally:  # nothing is freed after the command: skip the slow full collection at interpreter exit
        import gc
        gc.freeze()


def _run(argv):
    """Parse ``argv`` and run the command (floating-point warnings off: overflow shows as a non-finite
    result or a status)."""
    import numpy as np

    from symfield.cli.parser import build_parser
    parser = build_parser()
    if not argv:            # a bare `symfield`: what it can do, and success
        parser.print_help()
        return 0
    args = parser.parse_args(_dash_formulas(argv))
    for name, value in vars(args).items():  # undo the leading spaces of _dash_formulas
        if isinstance(value, str) and value.startswith(" -"):
            setattr(args, name, value[1:])
    if getattr(args, "plot", None):            # provenance of the figure: the command line, in its metadata
        import shlex

        from symfield.io import plots
        plots.PROVENANCE["command"] = shlex.join(["symfield", *argv])
    with np.errstate(all="ignore"):
        return command(args.command)(args)


def _failure(err):
    """The one stderr line (and exit code) of an exception that ended a command."""
    if isinstance(err, KeyboardInterrupt):
        fail("interrupted")
        return INTERRUPTED
    if isinstance(err, (ValueError, TypeError, NotImplementedError, ArithmeticError)):
        return fail(_message(err))
    if isinstance(err, MemoryError):
        return fail(f"out of memory ({_message(err)}); use a smaller grid, depth, width or size")
    if isinstance(err, OSError):  # e.g. the output directory vanished or filled up while computing
        return fail(f"{err.strerror or _message(err)}" + (f": {err.filename!r}" if err.filename else ""))
    # a bug: still one line, with the exception type (the traceback with --debug)
    return fail(f"internal error {type(err).__name__}: {_message(err)} (please report it; --debug shows where)")
