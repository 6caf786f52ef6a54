"""Command-line conventions (issue 19): --version, a bare `symfield` prints help, data on stdout and status
on stderr, --json numbers as JSON numbers with every parameter, Ctrl-C exits 130, one range syntax
(start:stop:num, bench included), help for every option and a description for every subcommand."""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import symfield
from symfield.cli.main import main
from symfield.cli.parser import build_parser


def _cli(capsys, *argv):
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:    # argparse: --version, --help, usage errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def _run(*argv, timeout=120):
    return subprocess.run([sys.executable, "-m", "symfield", *map(str, argv)], capture_output=True, text=True,
                          timeout=timeout)


# ---------------------------------------------------------------- --version, bare symfield
def test_version_is_the_package_version(capsys):
    code, out, err = _cli(capsys, "--version")
    assert code == 0 and out.strip() == symfield.__version__ and err == ""


def test_bare_symfield_prints_help_and_exits_0():
    r = _run()
    assert r.returncode == 0 and r.stdout.startswith("usage: symfield") and "COMMAND" in r.stdout and r.stderr == ""


# ---------------------------------------------------------------- --json: numbers, all parameters
def _walk(v, path="$"):
    """Every leaf of a JSON document as (path, value)."""
    if isinstance(v, dict):
        for k, x in v.items():
            yield from _walk(x, f"{path}.{k}")
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from _walk(x, f"{path}[{i}]")
    else:
        yield path, v


def _numeric_text(v):
    try:
        float(v)
        return True
    except (TypeError, ValueError):
        return False


JSON_CASES = {
    "map": ("map", "erf", "--q", "1", "--q12", "0.5", "--sigma-w2", "1.5", "--sigma-b2", "0.1"),
    "map-dps": ("map", "tanh", "--q", "0.7", "--sigma-w2", "1.2", "--sigma-b2", "0.05", "--dps", "30"),
    "qstar": ("qstar", "tanh", "--sigma-w2", "1.5", "--sigma-b2", "0.05"),
    "qstar-dps": ("qstar", "erf", "--sigma-w2", "1.5", "--sigma-b2", "0.05", "--dps", "25"),
    "eoc": ("eoc", "tanh", "--sigma-b2", "0.05"),
    "eoc-dps": ("eoc", "erf", "--sigma-b2", "0.1", "--dps", "30"),
    "phase": ("phase", "tanh", "--sigma-w2", "0.5:3:4", "--sigma-b2", "0.01:0.1:3"),
    "gram": ("gram", "relu", "--sigma-w2", "2", "--sigma-b2", "0.1", "--depth", "3", "--width", "50"),
    "gram-dps": ("gram", "relu", "--sigma-w2", "2", "--sigma-b2", "0.05", "--depth", "2", "--width", "50",
                 "--dps", "20"),
    "jacobian": ("jacobian", "tanh", "--sigma-w2", "1.2", "--sigma-b2", "0.05", "--depth", "3"),
}


@pytest.mark.parametrize("name", list(JSON_CASES))
def test_json_values_are_numbers_with_every_parameter(capsys, name):
    argv = JSON_CASES[name]
    code, out, err = _cli(capsys, *argv, "--json")
    assert code == 0 and err == "", err             # stdout of a --json run is pure JSON, nothing on stderr
    d = json.loads(out, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    numbers = 0
    for path, v in _walk(d):
        if isinstance(v, str):     # text is text (names, formulas, ranges as given), never a number as text,
            assert not _numeric_text(v) or path.split(".")[-1].split("[")[0].endswith("_exact"), (path, v)
        numbers += isinstance(v, (int, float)) and not isinstance(v, bool)
    assert numbers >= 3
    params = d["params"]     # every parameter of the command line, as given (numbers as numbers)
    given = {a[2:].replace("-", "_"): b for a, b in zip(argv, argv[1:]) if a.startswith("--")}
    for k, v in given.items():
        assert k in params, (k, params)
        assert params[k] == (v if ":" in v else (int(v) if k in ("dps", "depth", "width") else float(v))), k
    if "--dps" in argv:       # each high-precision value beside its decimal text with all the digits
        exact = {k: v for k, v in d.items() if k.endswith("_exact")}
        assert exact, d.keys()
        for k, text in exact.items():
            base = d[k[: -len("_exact")]]
            if isinstance(text, str):
                assert float(text) == pytest.approx(base, rel=1e-15) and len(text.replace(".", "").lstrip("0-")) >= 15


def test_json_numbers_keep_full_precision(capsys):
    code, out, _ = _cli(capsys, "qstar", "tanh", "--sigma-w2", "1.5", "--sigma-b2", "0.05", "--json")
    d = json.loads(out)
    assert d["q_star"] == float(symfield.q_star("tanh", 1.5, 0.05))     # the float64 itself, not 6 digits
    code, out, _ = _cli(capsys, "map", "erf", "--q", "1", "--sigma-w2", "1.5", "--sigma-b2", "0.1", "--json")
    assert json.loads(out)["q_map"] == float(symfield.q_map("erf", 1.0, 1.5, 0.1))


# ---------------------------------------------------------------- data on stdout, status on stderr
def test_status_lines_go_to_stderr(tmp_path, capsys):
    path, png = tmp_path / "p.npz", tmp_path / "p.png"
    code, out, err = _cli(capsys, "phase", "relu", "--sigma-w2", "1:3:3", "--sigma-b2", "0:0.1:2", "-o", path,
                          "--plot", png)
    assert code == 0 and f"data: {path}" in err and f"plot: {png}" in err and "computed in" in err
    assert "data:" not in out and "plot:" not in out and "ordered-deep-prejudice" in out
    code, out, err = _cli(capsys, "eoc-curve", "tanh", "--sigma-b2", "0.1", "-o", tmp_path / "e.csv")
    assert code == 0 and out == "" and err.strip() == f"data: {tmp_path / 'e.csv'}"
    code, out, err = _cli(capsys, "phase", "relu", "--sigma-w2", "1:3:3", "--sigma-b2", "0:0.1:2", "--json",
                          "-o", tmp_path / "q.npz")
    assert code == 0 and err == "" and json.loads(out)["output"] == str(tmp_path / "q.npz")


def test_help_epilog_documents_the_conventions():
    text = build_parser().format_help()
    for phrase in ("Standard output carries data only", "standard error", "NAME_exact", "start:stop:num", "130"):
        assert phrase in text, phrase


# ---------------------------------------------------------------- Ctrl-C
CHILD = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)      # a user's interpreter (see test_interrupts.py)
signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
from symfield.cli.main import main
print('ready', flush=True)
raise SystemExit(main(sys.argv[1:]))
"""


def test_ctrl_c_exits_130_with_one_line(tmp_path):
    """SIGINT while `symfield simulate` works (minutes of it): exit 130, one stderr line, no output file."""
    out = tmp_path / "sim.npz"
    argv = ["simulate", "tanh", "--sigma-w2", "1.5", "--sigma-b2", "0.05", "--width", "2000", "--depth", "3000",
            "--n-networks", "100", "--n-inputs", "50", "-o", str(out)]
    child = subprocess.Popen([sys.executable, "-c", CHILD, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=dict(os.environ))
    try:
        assert child.stdout.readline().strip() == "ready"
        time.sleep(2.0)
        assert child.poll() is None
        child.send_signal(signal.SIGINT)
        stdout, stderr = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 130, stderr
    assert stderr == "symfield: error: interrupted\n" and stdout == "" and not out.exists()
    assert not list(tmp_path.iterdir())         # no partial or temporary file either


# ---------------------------------------------------------------- one range syntax
@pytest.mark.parametrize("value", ["0.1:4", "0.1:4:x", "0.1:4:0", "lo:hi:3", "0.1"])
def test_bench_ranges_are_start_stop_num(capsys, value):
    code, out, err = _cli(capsys, "bench", "tanh", "--sigma-w2", value)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "'--sigma-w2' option of bench must be start:stop:num" in err and repr(value) in err


def test_bench_range_sets_the_grid(monkeypatch, capsys):
    import symfield.reports.bench as B
    seen = {}

    class Res:
        act, grid, depth, method, times, notes, accuracy, setup = "tanh", (2, 3), 2, "m", {}, {}, {}, {}

        def ratios(self):
            return {}

        def report(self):
            return "report"

    monkeypatch.setattr(B, "bench", lambda act, **kw: seen.update(kw) or Res())
    code, out, err = _cli(capsys, "bench", "tanh", "--sigma-w2", "0.5:2:2", "--sigma-b2", "0:0.1:3", "--depth", "2")
    assert code == 0, err
    assert seen["grid"] == (2, 3) and seen["sigma_w2"] == (0.5, 2.0) and seen["sigma_b2"] == (0.0, 0.1)
    code, _, err = _cli(capsys, "bench", "tanh", "--sigma-w2", "0.5:2:2", "--grid", "4x4")
    assert code == 2 and "must agree" in err and err.count("\n") == 1


# ---------------------------------------------------------------- help everywhere
def _subparsers(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def test_every_subcommand_has_a_description_and_every_option_help():
    parser = build_parser()
    subs = _subparsers(parser)
    assert {"phase", "sweep", "bench", "map", "qstar", "eoc"} <= set(subs)
    missing = []
    for name, p in [("symfield", parser), *subs.items()]:
        if not (p.description or "").strip():
            missing.append(f"{name}: no description")
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                continue
            if not (a.help or "").strip() or a.help == argparse.SUPPRESS:
                missing.append(f"{name} {'/'.join(a.option_strings) or a.dest}: no help")
    assert not missing, "\n".join(missing)
