"""The command line's tables against independent oracles, files that record their parameters,
progress bars only on a terminal, and one-line errors with exit code 2 for every kind of bad input."""
import csv
import fcntl
import io
import json
import math
import os
import pty
import struct
import subprocess
import sys
import termios

import mpmath as mp
import numpy as np
import pytest

import symfield as sf
import symfield.theory.phases
from symfield.cli.main import main


def _cli(capsys, *argv):
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:   # argparse errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def _csv(text):
    """(params, rows as dicts) of a symfield CSV."""
    first, rest = text.split("\n", 1)
    assert first.startswith("# ")
    return json.loads(first[2:]), list(csv.DictReader(io.StringIO(rest)))


# ---------------------------------------------------------------- oracles written here, not taken from the package
def _erf_V(q):           # E[erf(u)^2], u ~ N(0, q)
    return 2 / mp.pi * mp.asin(2 * q / (1 + 2 * q))


def _erf_C(q, q12):      # E[erf(u) erf(v)], equal variances q
    return 2 / mp.pi * mp.asin(2 * q12 / (1 + 2 * q))


def _relu_C(q1, q2, q12):
    c = min(1.0, q12 / math.sqrt(q1 * q2))
    t = math.acos(c)
    return math.sqrt(q1 * q2) / (2 * math.pi) * (math.sin(t) + (math.pi - t) * math.cos(t))


# ---------------------------------------------------------------- eoc-curve, neutrality
def test_eoc_curve_reproduces_published_tanh_values(capsys):
    code, out, err = _cli(capsys, "eoc-curve", "tanh", "--sigma-b2", "0:0.1:3")
    assert code == 0 and err == "", err
    params, rows = _csv(out)
    assert params["command"] == "eoc-curve" and params["sigma_b2"] == "0:0.1:3"
    sw = [float(r["sigma_w2"]) for r in rows]
    assert sw[0] == 1.0 and abs(sw[1] - 1.76095) < 1e-5 and abs(sw[2] - 1.98607) < 1e-5   # docs/theory.md section 5
    assert abs(float(rows[1]["q_star"]) - 0.57005) < 1e-5 and all(r["error"] == "" for r in rows)


def test_eoc_curve_records_points_without_a_line(capsys):
    """x erf(x): E[psi'^2] -> 0 as q -> 0, so no EOC at sigma_b2 = 0 (recorded, null), one at 0.1."""
    code, out, _ = _cli(capsys, "eoc-curve", "x*erf(x)", "--sigma-b2", "0:0.1:2", "--json")
    d = json.loads(out)
    assert code == 0 and d["sigma_w2"][0] is None and d["q_star"][0] is None and d["errors"] == 1
    sw, q = d["sigma_w2"][1], d["q_star"][1]
    gauss = lambda f: mp.quad(lambda z: f(mp.sqrt(q) * z) * mp.npdf(z), [-mp.inf, 0, mp.inf])  # noqa: E731
    assert abs(sw * gauss(lambda u: (mp.erf(u) + 2 * u * mp.exp(-u * u) / mp.sqrt(mp.pi)) ** 2) - 1) < 1e-9
    assert abs(sw * gauss(lambda u: (u * mp.erf(u)) ** 2) + 0.1 - q) < 1e-9 * q


def test_json_is_strict_infinite_q_star_as_text(capsys):
    """relu's EOC is the line sigma_w2 = 2; for sigma_b2 > 0 q grows without bound (q* = inf): JSON
    has no Infinity token (json.loads with parse_constant rejecting it), inf is the string "inf"."""
    code, out, _ = _cli(capsys, "eoc-curve", "relu", "--sigma-b2", "0:0.1:2", "--json")
    d = json.loads(out, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert code == 0 and d["sigma_w2"] == [2.0, 2.0] and d["q_star"] == [0.0, "inf"] and d["errors"] == 0


def test_eoc_curve_dps_netcdf_satisfies_both_equations(tmp_path, capsys):
    xr = pytest.importorskip("xarray")
    path = tmp_path / "erf.nc"
    code, out, err = _cli(capsys, "eoc-curve", "erf", "--sigma-b2", "0.05:0.1:2", "--dps", "30", "-o", path)
    assert code == 0 and out == "" and err.strip() == f"data: {path}", err    # a status line: stderr
    with xr.open_dataset(path) as ds:
        assert json.loads(ds.attrs["params"])["dps"] == 30 and ds.attrs["activation"] == "erf"
        with mp.workdps(30):
            for b, w, q in zip(ds.sigma_b2.values, ds.sigma_w2_mp.values, ds.q_star_mp.values):
                w, q = mp.mpf(str(w)), mp.mpf(str(q))
                assert abs(w - mp.pi / 4 * mp.sqrt(1 + 4 * q)) < mp.mpf(10) ** -27      # chi1 = 1 (docs/theory.md s. 3)
                assert abs(w * _erf_V(q) + mp.mpf(repr(float(b))) - q) < mp.mpf(10) ** -27  # q* (floats read as decimals)


def test_neutrality_range_is_a_fixed_point_at_one_half(tmp_path, capsys):
    path = tmp_path / "n.npz"
    code, _, err = _cli(capsys, "neutrality", "erf", "--sigma-b2", "0.02:0.2:4", "-o", path)
    assert code == 0, err
    with np.load(path) as z:
        assert json.loads(str(z["params"]))["sigma_b2"] == "0.02:0.2:4"
        for b, w in zip(z["sigma_b2"], z["sigma_w2"]):
            q = mp.findroot(lambda x: w * _erf_V(x) + b - x, 1.0)         # q* (stable: erf is bounded)
            assert abs((w * _erf_C(q, q / 2) + b) / q - 0.5) < 1e-9       # c = 1/2 is a fixed point


def test_neutrality_single_point_and_none(capsys):
    code, out, _ = _cli(capsys, "neutrality", "tanh", "--sigma-b2", "0.1", "--json")
    assert code == 0 and abs(json.loads(out)["sigma_w2"][0] - sf.neutrality("tanh", 0.1)) == 0
    code, out, err = _cli(capsys, "neutrality", "relu", "--sigma-b2", "0.1")
    assert code == 2 and out == "" and "no neutrality line" in err and err.count("\n") == 1


# ---------------------------------------------------------------- propagate, phase, divergence
def test_propagate_csv_matches_the_arccos_recursion(tmp_path, capsys):
    path = tmp_path / "r.csv"
    code, _, err = _cli(capsys, "propagate", "relu", "--sigma-w2", "2.5", "--sigma-b2", "0.1", "--depth", "6", "-o", path)
    assert code == 0, err
    params, rows = _csv(path.read_text())
    assert params["sigma_w2"] == 2.5 and params["depth"] == 6 and params["residual"] is None
    q, qab = 2.6, 0.1                                         # layer 1 is linear
    for r in rows:
        assert abs(float(r["q"]) - q) < 1e-12 * q and abs(float(r["qab"]) - qab) < 1e-12 * q
        q, qab = 2.5 * q / 2 + 0.1, 2.5 * _relu_C(q, q, qab) + 0.1


def test_phase_netcdf_and_csv_hold_the_library_grid(tmp_path, capsys):
    xr = pytest.importorskip("xarray")
    sw, sb = np.linspace(0.5, 4, 6), np.linspace(0, 0.2, 4)
    pd = sf.phase_diagram("erf", sw, sb)
    for name in ("p.nc", "p.csv"):
        code, _, err = _cli(capsys, "phase", "erf", "--sigma-w2", "0.5:4:6", "--sigma-b2", "0:0.2:4", "-o", tmp_path / name)
        assert code == 0, err
    with xr.open_dataset(tmp_path / "p.nc") as ds:
        np.testing.assert_array_equal(ds.codes.values, pd.codes)
        np.testing.assert_array_equal(ds.neutrality.values, pd.neutrality)
        assert list(ds.phases.values) == list(symfield.theory.phases.PHASES) and ds.attrs["sigma_w2"] == "0.5:4:6"
    params, rows = _csv((tmp_path / "p.csv").read_text())
    assert params["activation"] == "erf" and len(rows) == 24
    assert [r["phase"] for r in rows] == pd.labels.ravel().tolist()


def test_phase_of_a_pooled_activation(tmp_path, capsys):
    png = tmp_path / "p.png"
    code, out, err = _cli(capsys, "phase", "relu", "--pool", "avg", "--k", "2", "--sigma-w2", "1:4:4",
                          "--sigma-b2", "0:0.2:3", "--json", "--plot", png)
    d = json.loads(out)
    assert code == 0 and d["activation"] == "relu+avg2" and png.read_bytes()[:4] == b"\x89PNG", err
    # relu+avg2: c -> 1 everywhere and chi1 = sigma_w2 E[relu'^2]/k = sigma_w2/4 (docs/theory.md section 4),
    # so sigma_w2 = 1, 2, 3 are ordered and sigma_w2 = 4 is the edge of chaos
    assert d["counts"]["ordered-deep-prejudice"] == 9 and d["counts"]["edge-of-chaos"] == 3


def test_divergence_rate_and_exponent(tmp_path, capsys):
    code, out, err = _cli(capsys, "divergence", "relu", "--sigma-w2", "1.5", "--sigma-b2", "0.1", "--json",
                          "-o", tmp_path / "g.csv")
    d = json.loads(out)
    assert code == 0 and d["kind"] == "exponential" and abs(d["rate"] - math.log(2 / 1.5)) < 1e-4, err
    params, rows = _csv((tmp_path / "g.csv").read_text())
    assert params["kind"] == "exponential" and len(rows) == 200
    assert float(rows[0]["gamma"]) == pytest.approx(0.1 / 1.5, rel=1e-14)   # layer 1: qab/(q - qab) = sb/sw
    code, out, _ = _cli(capsys, "divergence", "relu", "--sigma-w2", "2.5", "--sigma-b2", "0.1")
    text = dict(line.split(None, 1) for line in out.strip().splitlines())
    assert code == 0 and text["kind"] == "power-law" and abs(float(text["exponent"]) - 2) < 0.1


# ---------------------------------------------------------------- finite width
SIM = ("simulate", "erf", "--sigma-w2", "2", "--sigma-b2", "0.1", "--width", "1500", "--depth", "6",
       "--n-inputs", "30", "--n-networks", "2")


def test_simulate_table_has_theory_alongside_and_is_reproducible(tmp_path, capsys):
    code, out, err = _cli(capsys, *SIM)
    assert code == 0 and err == "", err
    params, rows = _csv(out)
    assert params["width"] == 1500 and params["seed"] == 0 and params["method"] == "gram"
    r = sf.propagate("erf", 2.0, 0.1, 6)
    for row, c, q in zip(rows, r.c, r.q):
        assert float(row["c_theory"]) == float(c) and float(row["q_theory"]) == float(q)
        assert abs(float(row["c"]) - float(c)) < 0.03 and abs(float(row["q"]) / float(q) - 1) < 0.03
        assert float(row["c05"]) < float(row["c50"]) < float(row["c95"])
    again = _cli(capsys, *SIM)[1]                  # same seed: the same bytes apart from the run's provenance
    p1, p2 = json.loads(out.split("\n", 1)[0][2:]), json.loads(again.split("\n", 1)[0][2:])
    assert p1.pop("provenance")["argv"] == p2.pop("provenance")["argv"] and p1 == p2
    assert again.split("\n", 1)[1] == out.split("\n", 1)[1]
    assert _cli(capsys, *SIM[:-1], "3")[1] != out


def test_simulate_npz_and_plot(tmp_path, capsys):
    code, _, err = _cli(capsys, *SIM, "-o", tmp_path / "s.npz", "--plot", tmp_path / "s.png")
    assert code == 0, err
    with np.load(tmp_path / "s.npz") as z:
        assert json.loads(str(z["params"]))["n_inputs"] == 30 and z["gamma_finite_data"].shape == (6,)
    assert (tmp_path / "s.png").stat().st_size > 10_000


def test_gradients_favour_one_class_in_the_chaotic_phase(tmp_path, capsys):
    code, out, err = _cli(capsys, "gradients", "relu", "--sigma-w2", "2.5", "--sigma-b2", "0.1", "--width", "100",
                          "--depth", "8", "--n-inputs", "20", "--n-networks", "3", "--json", "--plot", tmp_path / "g.png")
    d = json.loads(out)
    assert code == 0 and d["params"]["n_networks"] == 3 and len(d["g0"]) == 3, err
    assert all(f < u for f, u in zip(d["favoured"], d["unfavoured"]))
    assert (tmp_path / "g.png").stat().st_size > 10_000


# ---------------------------------------------------------------- bad input: one line, exit code 2
BAD = [
    (("eoc-curve", "tanh", "--sigma-b2", "0:1"), "--sigma-b2 must be a number or start:stop:num"),
    (("neutrality", "tanh", "--sigma-b2", "0.1:0.2:x"), "--sigma-b2 must be"),
    (("phase", "tanh", "--sigma-w2", "0:1"), "--sigma-w2 must be"),
    (("eoc-curve", "nosuchact"), "nosuchact"),
    (("divergence", "tanhh", "--sigma-w2", "1", "--sigma-b2", "0"), "Did you mean 'tanh'"),
    (("simulate", "nosuchact", "--sigma-w2", "1", "--sigma-b2", "0"), "nosuchact"),
    (("eoc-curve", "tanh", "-o", "/nonexistent/dir/out.csv"), "does not exist"),
    (("propagate", "relu", "--sigma-w2", "2", "--sigma-b2", "0", "-o", "/nonexistent/dir/out.csv"), "does not exist"),
    (("simulate", "tanh", "--sigma-w2", "1", "--sigma-b2", "0", "--plot", "/nonexistent/dir/p.png"), "does not exist"),
    (("gradients", "tanh", "--sigma-w2", "1", "--sigma-b2", "0", "-o", "out.txt"), "must end in one of"),
    (("derive", "tanh", "-o", "/nonexistent/dir/t.tex"), "cannot write"),
    (("propagate", "relu", "--sigma-w2", "2", "--sigma-b2", "0", "--depth", "-3"), "'depth' parameter"),
    (("simulate", "tanh", "--sigma-w2", "1", "--sigma-b2", "0", "--depth", "-1"), "'depth' parameter"),
    (("gradients", "tanh", "--sigma-w2", "1", "--sigma-b2", "0", "--depth", "0"), "'depth' parameter"),
    (("divergence", "relu", "--sigma-w2", "1", "--sigma-b2", "0", "--depth", "-5"), "'depth' parameter"),
    (("divergence", "relu", "--sigma-w2", "-1", "--sigma-b2", "0"), "'sigma_w2' parameter"),
    (("simulate", "tanh", "--sigma-w2", "1", "--sigma-b2", "0", "--width", "0"), "'width' parameter"),
    (("simulate", "tanh", "--sigma-w2", "x", "--sigma-b2", "0"), "invalid float value"),
    (("simulate", "tanh", "--sigma-b2", "0"), "--sigma-w2"),
    (("eoc-curve", "tanh", "--dps", "2"), "'dps' parameter"),
    (("nosuchcommand",), "invalid choice"),
]


@pytest.mark.parametrize("argv,msg", BAD, ids=[" ".join(a[:2]) + f"-{i}" for i, (a, _) in enumerate(BAD)])
def test_bad_input_one_line_exit_2(capsys, argv, msg):
    code, out, err = _cli(capsys, *argv)
    assert code == 2 and out == "", (out, err)
    assert err.startswith("symfield: error: ") and err.count("\n") == 1 and msg in err, err


def test_netcdf_without_xarray_is_a_clear_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "xarray", None)      # import xarray -> ImportError
    code, _, err = _cli(capsys, "eoc-curve", "tanh", "-o", tmp_path / "e.nc")
    assert code == 2 and "needs xarray" in err and err.count("\n") == 1


def test_unreachable_scheduler_fails_fast(tmp_path):
    r = subprocess.run([sys.executable, "-m", "symfield", "sweep", "eoc", "tanh", "--sigma-b2", "0.1", "-d",
                        str(tmp_path / "r"), "--scheduler", "tcp://127.0.0.1:1", "--connect-timeout", "2"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1
    assert "cannot reach the Dask scheduler" in r.stderr


# ---------------------------------------------------------------- entry points, help, progress bars
def test_console_script_and_help_with_examples():
    r = subprocess.run(["symfield", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    for cmd in ("eoc-curve", "neutrality", "divergence", "simulate", "gradients", "phase", "sweep", "bench"):
        assert f"symfield {cmd} " in r.stdout
    r = subprocess.run([sys.executable, "-m", "symfield", "divergence", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "examples:" in r.stdout and "symfield divergence relu" in r.stdout


def test_progress_bar_on_a_terminal_only():
    cmd = [sys.executable, "-m", "symfield", "eoc-curve", "tanh", "--sigma-b2", "0.01:0.2:40"]
    piped = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert piped.returncode == 0 and piped.stderr == ""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))   # a terminal 80 columns wide
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=slave) as p:
        os.close(slave)
        out, _ = p.communicate(timeout=60)
        err = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            err += chunk
    os.close(master)
    assert p.returncode == 0 and b"eoc-curve" in err and b"sigma_b2,sigma_w2" in out


def test_divergence_under_batchnorm(capsys):
    code, out, err = _cli(capsys, "divergence", "relu", "--sigma-w2", "2", "--sigma-b2", "0.1", "--depth", "30",
                          "--norm", "batch", "--batch", "8", "--json")
    d = json.loads(out)
    assert code == 0 and d["kind"] == "finite", err
    assert d["gamma_star"] == pytest.approx(sf.batchnorm("relu", 2.0, 0.1, 8).gamma, rel=1e-13)
