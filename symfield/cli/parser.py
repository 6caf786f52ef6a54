"""Arguments of every ``symfield`` sub-command (the commands themselves are in cli/main.py).

One table, :data:`SUBCOMMANDS`: name, help, examples and the function that adds its arguments;
``sweep`` and ``bench`` register themselves (cli/sweep.py, cli/bench.py).
"""
from __future__ import annotations

import argparse
from functools import partial

from symfield.cli import bench as bench_cli
from symfield.cli import sweep as sweep_cli
from symfield.cli.common import EPILOG, Parser
from symfield.core.version import __version__

RAW = argparse.RawDescriptionHelpFormatter
DATA_HELP = "write the table to FILE.csv, FILE.npz or FILE.nc (netCDF, needs xarray); parameters recorded inside"


# ---------------------------------------------------------------- argument groups
def _common(p, json=True):
    p.add_argument("activation", help="built-in name (see `symfield list`) or a formula in x, e.g. \"x*erf(x)\"")
    p.add_argument("--pool", choices=["max", "avg"], help="multi-node activation: pool phi over k nodes")
    p.add_argument("--k", type=int, default=2, help="nodes per pool (default 2)")
    if json:
        p.add_argument("--json", action="store_true", help="machine-readable output")


def _files(p, plot=None):
    p.add_argument("-o", "--output", metavar="FILE", help=DATA_HELP + " (default: CSV on standard output)")
    if plot:
        p.add_argument("--plot", metavar="FILE", help=f"draw {plot} to FILE.png/.pdf/.svg")


def _point(p, required=True):
    p.add_argument("--sigma-w2", type=float, required=required, help="weight variance sigma_w^2")
    p.add_argument("--sigma-b2", type=float, required=required, help="bias variance sigma_b^2")


def _dps(p, default=None):
    p.add_argument("--dps", type=int, default=default,
                   help=f"decimal digits (mpmath); default {default if default else 'float64'}")


def _norm(p, batch_default=None):
    p.add_argument("--norm", choices=["layer", "batch"], help="normalisation in every block: LayerNorm or BatchNorm "
                   "(docs/theory.md section 12)")
    p.add_argument("--norm-at", choices=["before", "after"], default="before",
                   help="normalise the pre-activation h (before phi, default) or phi(h) (after)")
    p.add_argument("--batch", type=int, default=batch_default,
                   help="BatchNorm batch size B >= 2 (default: B -> infinity)")


def _network(p, width, depth, n_inputs, n_networks):
    p.add_argument("--width", type=int, default=width, help=f"nodes per layer N (default {width})")
    p.add_argument("--depth", type=int, default=depth, help=f"layers L (default {depth})")
    p.add_argument("--n-inputs", type=int, default=n_inputs, help=f"inputs P (default {n_inputs})")
    p.add_argument("--n-networks", type=int, default=n_networks, help=f"independent networks (default {n_networks})")
    p.add_argument("--seed", type=int, default=0, help="seed (default 0); the same seed gives the same numbers")
    p.add_argument("--residual", type=float, metavar="ALPHA", help="residual blocks h + ALPHA (W y + b)")


# ---------------------------------------------------------------- maps and fixed points
def _map(p):
    _common(p)
    p.add_argument("--q", type=float, required=True, help="variance q (q1 of the pair)")
    p.add_argument("--q2", type=float, help="second variance (default q)")
    p.add_argument("--q12", type=float, help="covariance (default q, i.e. c = 1)")
    p.add_argument("--sigma-w2", type=float, default=1.0, help="weight variance (default 1)")
    p.add_argument("--sigma-b2", type=float, default=0.0, help="bias variance (default 0)")
    _dps(p)
    _norm(p)


def _qstar(p):
    _common(p)
    _point(p)
    _dps(p)


def _eoc(p):
    _common(p)
    p.add_argument("--sigma-b2", type=float, required=True, help="bias variance sigma_b^2 of the point")
    _dps(p)
    _norm(p)


def _batchnorm(p):
    _common(p)
    _point(p)
    p.add_argument("--batch", type=int, help="batch size B >= 2 (default: B -> infinity)")
    p.add_argument("--norm-at", choices=["before", "after"], default="before", help="BatchNorm before or after phi")
    _dps(p)


def _line(p, default):
    """eoc-curve and neutrality: one parser shape for both lines (cli.main.cmd_line runs both)."""
    _common(p)
    p.add_argument("--sigma-b2", default=default, help=f"start:stop:num or a number (default {default})")
    _dps(p)
    _files(p)


# ---------------------------------------------------------------- depth, phases, divergence
def _propagate(p):
    _common(p)
    _point(p)
    p.add_argument("--depth", type=int, default=50, help="layers (default 50)")
    p.add_argument("--q0", type=float, default=1.0, help="input variance (default 1)")
    p.add_argument("--qab0", type=float, default=0.0, help="input covariance (default 0)")
    p.add_argument("--residual", type=float, metavar="ALPHA", help="residual blocks q + ALPHA^2 (sigma_w2 V + sigma_b2)")
    _norm(p)
    _dps(p)
    _files(p)


def _phase(p):
    _common(p)
    p.add_argument("--sigma-w2", default="0:4:401", help="start:stop:num (default 0:4:401)")
    p.add_argument("--sigma-b2", default="0:0.2:201", help="start:stop:num (default 0:0.2:201)")
    p.add_argument("--depth", type=int, help="also record c and gamma at this layer")
    p.add_argument("--eoc-tol", type=float, default=1e-6, help="|chi1 - 1| counted as edge of chaos (default 1e-6)")
    p.add_argument("-o", "--output", metavar="FILE", help=DATA_HELP)
    p.add_argument("--plot", metavar="FILE", help="draw the paper-style phase diagram to FILE.png/.pdf/.svg")


def _divergence(p):
    _common(p)
    _point(p)
    p.add_argument("--depth", type=int, default=200, help="layers fitted (default 200, at least 20)")
    _dps(p, 40)
    _norm(p)
    p.add_argument("-o", "--output", metavar="FILE", help="write gamma per layer to FILE.csv/.npz/.nc (fit recorded inside)")
    p.add_argument("--plot", metavar="FILE", help="gamma on semi-log and log-log axes to FILE.png/.pdf/.svg")


def _ntk(p):
    _common(p)
    _point(p)
    p.add_argument("--depth", type=int, default=50, help="layers (default 50)")
    p.add_argument("--q0", type=float, default=1.0, help="input variance (default 1)")
    p.add_argument("--qab0", type=float, default=0.0, help="input covariance (default 0)")
    p.add_argument("--residual", type=float, metavar="ALPHA", help="residual blocks z + ALPHA (W psi(z) + b)")
    p.add_argument("--parameterization", choices=["ntk", "standard"], default="ntk", help="default ntk")
    p.add_argument("--m", type=int, default=10, help="inputs for kappa and lr_max (default 10)")
    _dps(p)
    _files(p, plot="Theta and gamma_Theta per layer")


def _trainability(p):
    _common(p)
    _point(p)
    p.add_argument("--eoc-tol", type=float, default=1e-6, help="|chi1 - 1| counted as edge of chaos (default 1e-6)")


# ---------------------------------------------------------------- finite width
def _simulate(p):
    _common(p)
    _point(p)
    _network(p, width=1000, depth=50, n_inputs=100, n_networks=4)
    p.add_argument("--method", choices=["gram", "weights"], default="gram",
                   help="gram: exact per-layer Gram sampling (default); weights: explicit weight matrices")
    p.add_argument("--norm", choices=["layer", "batch"], help="real LayerNorm (over units) or BatchNorm (over the "
                   "n-inputs samples) in every block")
    p.add_argument("--norm-at", choices=["before", "after"], default="before", help="normalise h or phi(h)")
    _files(p, "c^(l) and gamma^(l) against depth with the simulated spread (percentiles over input pairs; "
              "min-max over fewer than 20 networks)")


def _gram(p):
    _common(p)
    _point(p)
    p.add_argument("--depth", type=int, default=10, help="layers L (default 10)")
    p.add_argument("--width", type=int, required=True, help="hidden width n for the mean, spread and plot")
    p.add_argument("--q0", default="1,1,0", metavar="QA,QB,QAB",
                   help="the two inputs: |x_a|^2/n0, |x_b|^2/n0, x_a.x_b/n0 (default 1,1,0)")
    p.add_argument("--residual", type=float, metavar="ALPHA",
                   help="residual blocks z + ALPHA (W phi(z) + b) (float64, single-node activations)")
    _dps(p)
    p.add_argument("--n-networks", type=int, default=200,
                   help="networks simulated for --plot (default 200; 0 draws the theory alone)")
    p.add_argument("--seed", type=int, default=0, help="seed of the simulation (default 0)")
    _files(p, "theory bands of the Gram entries per layer over simulated networks")


def _jacobian(p):
    _common(p)
    p.add_argument("--sigma-w2", required=True, help="weight variance sigma_w^2 (with --map: start:stop:num)")
    p.add_argument("--sigma-b2", required=True, help="bias variance sigma_b^2 (with --map: start:stop:num)")
    p.add_argument("--depth", type=int, required=True, help="layers L: J = W_L D_{L-1} W_{L-1} ... D_1 W_1")
    p.add_argument("--weights", choices=["gaussian", "orthogonal"], default="gaussian",
                   help="W ~ N(0, sigma_w2/n) (default) or sqrt(sigma_w2) x Haar orthogonal")
    p.add_argument("--q0", type=float, default=1.0, help="input variance |x|^2/n0 (default 1)")
    _dps(p)
    p.add_argument("--map", action="store_true", help="m1, m2 and the relative variance m2/m1^2 - 1 over the "
                   "sigma_w2 x sigma_b2 grid; --plot draws it beside the phase diagram")
    p.add_argument("--width", type=int, default=200, help="width of the networks simulated for --plot (default 200)")
    p.add_argument("--n-networks", type=int, default=4,
                   help="networks simulated for --plot (default 4; 0 draws the theory alone)")
    p.add_argument("--seed", type=int, default=0, help="seed of the simulation (default 0)")
    _files(p, "the theory density over the simulated histogram (--map: the isometry map)")


def _gradients(p):
    _common(p)
    _point(p)
    _network(p, width=300, depth=20, n_inputs=100, n_networks=4)
    _files(p, "mean squared gradients per class against depth")


# ---------------------------------------------------------------- documents and checks
def _derive(p):
    _common(p, json=False)
    p.add_argument("-o", "--output", metavar="FILE", help="write the .tex file here (default: standard output)")
    p.add_argument("--norm", action="store_true", help="add a section on LayerNorm and BatchNorm")


VERIFY_EXIT = """

exit status:
  0  PASS: every check ran and held
  1  FAIL: a check failed (or the Gaussian moments diverge)
  2  bad input (not a formula, a bad option)
  3  INCONCLUSIVE: nothing failed, but a check did not finish in its time limit or could not run
"""


def _verify(p):
    p.add_argument("formula", help='formula in x, e.g. "x*erf(x)" (or a built-in name)')
    p.add_argument("--json", action="store_true", help="machine-readable report")
    p.add_argument("--seed", type=int, default=0, help="Monte Carlo seed (default 0)")
    p.add_argument("--n-mc", type=int, default=200_000, help="Monte Carlo samples (default 200000)")
    p.add_argument("--phase-seconds", type=float, metavar="S",
                   help="limit per phase check in CPU seconds of the computing thread (> 0; default 15; other load "
                        "on the machine does not spend it); a phase not determined in time makes the result "
                        "INCONCLUSIVE, never PASS")
    p.epilog = (p.epilog or "") + VERIFY_EXIT


# (name, help = description, examples, adds the arguments), in the order `symfield --help` lists them
SUBCOMMANDS = (
    ("list", "built-in activations", ["symfield list"], None),
    ("kernel", "symbolic kernel maps of an activation",
     ["symfield kernel tanh", 'symfield kernel "x*erf(x)" --json', "symfield kernel relu --pool max --k 2"], _common),
    ("map", "evaluate q_map, qab_map and chi1 at one point",
     ["symfield map erf --q 1 --q12 0.5 --sigma-w2 1.5 --sigma-b2 0.1 --dps 30"], _map),
    ("qstar", "variance fixed point q* and chi1 there",
     ["symfield qstar tanh --sigma-w2 1.76095 --sigma-b2 0.05 --dps 30"], _qstar),
    ("eoc", "edge of chaos sigma_w2 (and q*) at one sigma_b2", ["symfield eoc tanh --sigma-b2 0.05 --dps 50",
                                                                "symfield eoc tanh --sigma-b2 0.1 --norm layer --dps 30"], _eoc),
    ("batchnorm", "BatchNorm on an equicorrelated batch: the batch fixed point c*, gamma and the gradient rate "
                  "lambda_B",
     ["symfield batchnorm relu --sigma-w2 2 --sigma-b2 0.1 --batch 8", "symfield batchnorm tanh --sigma-w2 1 "
      "--sigma-b2 0 --norm-at after --batch 16 --json"], _batchnorm),
    ("eoc-curve", "edge-of-chaos line: sigma_w2 and q* for each sigma_b2 of a range",
     ["symfield eoc-curve tanh --sigma-b2 0:0.3:31", "symfield eoc-curve erf --sigma-b2 0.01:0.2:5 --dps 30 -o erf-eoc.csv",
      "symfield eoc-curve tanh --pool avg --k 2 --sigma-b2 0:0.2:21 -o eoc.nc --json"],
     partial(_line, default="0:0.2:21")),
    ("neutrality", "neutrality line c* = 1/2: sigma_w2 for each sigma_b2 > 0",
     ["symfield neutrality tanh --sigma-b2 0.1", "symfield neutrality erf --sigma-b2 0.01:0.2:20 -o neutral.npz",
      "symfield neutrality tanh --sigma-b2 0.05 --dps 30 --json"],
     partial(_line, default="0.01:0.2:20")),
    ("propagate", "q, qab, c, gamma per layer at one (sigma_w2, sigma_b2)",
     ["symfield propagate relu --sigma-w2 2.5 --sigma-b2 0.1 --depth 30",
      "symfield propagate tanh --sigma-w2 1.5 --sigma-b2 0.05 --depth 1000 --residual 0.03 -o res.nc"], _propagate),
    ("phase", "phase diagram on a (sigma_w2, sigma_b2) grid: labels, EOC and neutrality lines",
     ["symfield phase tanh --plot phase.png",
      "symfield phase tanh --sigma-w2 0:4:401 --sigma-b2 0:0.2:201 -o tanh.nc",
      "symfield phase relu --pool max --k 2 --sigma-w2 0.5:4:36 --sigma-b2 0:0.2:21 --plot relu-max2.png"], _phase),
    ("divergence", "how gamma^(l) diverges: exponential (rate), power law (exponent) or finite",
     ["symfield divergence relu --sigma-w2 2.5 --sigma-b2 0.1", "symfield divergence relu --sigma-w2 1.5 --sigma-b2 0.1 --json",
      "symfield divergence relu --pool max --k 2 --sigma-w2 2 --sigma-b2 0 --depth 300 --plot div.png -o gamma.csv"],
     _divergence),
    ("ntk", "neural tangent kernel per layer: Theta_aa, Theta_ab, gamma_Theta, kappa and lr_max on m inputs",
     ["symfield ntk erf --sigma-w2 1.25 --sigma-b2 0.05 --depth 1000 --json",
      "symfield ntk relu --sigma-w2 2 --sigma-b2 0 --depth 10 --q0 1 --qab0 0.5 -o ntk.csv --plot ntk.png"], _ntk),
    ("trainability", "NTK depth scales: regime, chi1, chi_c*, Theta*, xi_1, xi*, edge-of-chaos limit",
     ["symfield trainability erf --sigma-w2 1.5 --sigma-b2 0.05", "symfield trainability relu --sigma-w2 2 --sigma-b2 0 --json"],
     _trainability),
    ("simulate", "finite-width networks: per-layer q, qab, c (5/50/95 percentiles), V, Vtilde, gamma, theory alongside",
     ["symfield simulate tanh --sigma-w2 2.5 --sigma-b2 0.1 --width 2000 --depth 60 -o sim.nc",
      "symfield simulate relu --sigma-w2 2 --sigma-b2 0 --n-networks 8 --plot depth.png --json",
      "symfield simulate tanh --sigma-w2 1.5 --sigma-b2 0.05 --depth 200 --residual 0.07"], _simulate),
    ("gram", "finite-width Gram matrix of two inputs: mean, n Cov and the spread of c and gamma at width n",
     ["symfield gram relu --sigma-w2 2 --sigma-b2 0 --depth 6 --width 200 --q0 1,1,0.3",
      "symfield gram tanh --sigma-w2 1.5 --sigma-b2 0.1 --depth 8 --width 256 --plot gram.png",
      "symfield gram erf --sigma-w2 1.2 --sigma-b2 0.05 --depth 4 --width 100 --dps 30 --json"], _gram),
    ("jacobian", "spectrum of the input-output Jacobian J J^T at infinite width: moments, density, "
                 "support, condition (dynamical isometry)",
     ["symfield jacobian relu --sigma-w2 2 --sigma-b2 0 --depth 6 --plot relu.png",
      "symfield jacobian tanh --sigma-w2 1.05 --sigma-b2 0.001 --depth 8 --weights orthogonal --json",
      "symfield jacobian linear --sigma-w2 1 --sigma-b2 0 --depth 10 --dps 30",
      "symfield jacobian tanh --map --sigma-w2 0.5:2.5:41 --sigma-b2 0:0.1:21 --depth 8 --weights orthogonal "
      "--plot iso.png"], _jacobian),
    ("gradients", "per-class gradients (favoured / unfavoured class) per layer, softmax cross-entropy",
     ["symfield gradients relu --sigma-w2 2.5 --sigma-b2 0.1 --width 300 --depth 20 --plot grad.png",
      "symfield gradients tanh --sigma-w2 3 --sigma-b2 0.05 --n-networks 8 -o grad.nc"], _gradients),
    ("derive", "LaTeX document deriving the mean-field theory of an activation",
     ["symfield derive tanh -o tanh.tex", 'symfield derive "x*erf(x)"', "symfield derive relu --pool max --k 2"], _derive),
    ("verify", "check a new activation: closed forms, V/C/chi1 three ways, drift, EOC, phases",
     ['symfield verify "x*erf(x)"', 'symfield verify "x*sigmoid(x)" --json',
      'symfield verify "x*erf(x)" --phase-seconds 60'], _verify),
)


def build_parser():
    """The ``symfield`` parser: the sub-commands of :data:`SUBCOMMANDS`, then sweep and bench."""
    parser = Parser(prog="symfield", description="Exact mean-field theory of wide random networks.",
                    epilog=EPILOG, formatter_class=RAW)
    parser.add_argument("--debug", action="store_true", help="on an error, print the traceback too "
                        "(accepted anywhere on the command line)")
    parser.add_argument("--version", action="version", version=__version__,
                        help="print the version of symfield and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser, metavar="COMMAND")
    for name, what, examples, add_arguments in SUBCOMMANDS:
        p = sub.add_parser(name, help=what, description=what + ".", formatter_class=RAW,
                           epilog="examples:\n" + "\n".join(f"  {e}" for e in examples))
        if add_arguments is not None:
            add_arguments(p)
        if any("--plot" in a.option_strings for a in p._actions):
            p.add_argument("--dpi", type=float, default=None, metavar="DPI",
                           help="resolution of a .png --plot (default: the figure's, 120)")
    sweep_cli.add_parser(sub)
    bench_cli.add_parser(sub)
    return parser
