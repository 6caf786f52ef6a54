"""The command line prints the library's numbers: float64 as repr, dps results to all digits."""
import subprocess
import sys

import mpmath as mp

import symfield as sf


def _run(*args):
    r = subprocess.run([sys.executable, "-m", "symfield", *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return dict(line.split(None, 1) for line in r.stdout.strip().splitlines())


def test_qstar_prints_plain_floats():
    out = _run("qstar", "relu", "--sigma-w2", "1.5", "--sigma-b2", "0.1")
    assert out["chi1"] == "0.75" and float(out["q_star"]) == sf.q_star("relu", 1.5, 0.1)


def test_dps_digits_survive_printing():
    out = _run("map", "erf", "--q", "1", "--q12", "0.5", "--sigma-w2", "1.5", "--sigma-b2", "0.1", "--dps", "30")
    ref = sf.qab_map("erf", 1.0, 1.0, 0.5, 1.5, 0.1, dps=30)
    with mp.workdps(30):
        assert abs(mp.mpf(out["qab_map"]) - ref) < mp.mpf(10) ** -28
