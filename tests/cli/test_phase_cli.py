"""`symfield phase`: the grid it writes is the library's, the plot is written, bad input exits 2."""
import json
import subprocess
import sys

import numpy as np
import pytest

import symfield as sf


def _run(*args):
    return subprocess.run([sys.executable, "-m", "symfield", *args], capture_output=True, text=True, timeout=300)


def test_phase_writes_npz_and_png_matching_the_library(tmp_path):
    out, png = tmp_path / "d.npz", tmp_path / "d.png"
    r = _run("phase", "erf", "--sigma-w2", "0.5:4:15", "--sigma-b2", "0:0.2:9", "-o", str(out), "--plot", str(png))
    assert r.returncode == 0, r.stderr
    d = np.load(out)
    pd = sf.phase_diagram("erf", np.linspace(0.5, 4, 15), np.linspace(0, 0.2, 9))
    np.testing.assert_array_equal(d["codes"], pd.codes)
    np.testing.assert_array_equal(d["c_star"], pd.c_star)
    assert json.loads(str(d["params"]))["activation"] == "erf"
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


def test_phase_json_counts_and_lines():
    r = _run("phase", "relu", "--sigma-w2", "1:3:5", "--sigma-b2", "0:0.1:3", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["counts"]["ordered-deep-prejudice"] == 6 and d["counts"]["chaotic-deep-prejudice"] == 6
    assert d["eoc"] == [2.0, 2.0, 2.0] and d["counts"]["edge-of-chaos"] == 3   # relu: sigma_w2 = 2 at every sigma_b2


@pytest.mark.parametrize("args,msg", [
    (("phase", "relu", "--sigma-w2", "1:3:x"), "--sigma-w2 must be"),
    (("phase", "relu", "--sigma-b2", "0:1"), "--sigma-b2 must be"),
    (("phase", "nosuchact"), "nosuchact"),
    (("phase", "relu", "--plot", "/nonexistent-dir/p.png"), "does not exist"),
    (("phase", "relu", "-o", "out.txt"), "must end in one of"),
    (("phase", "relu", "--sigma-w2=-1:2:3"), "sigma_w2"),
])
def test_phase_bad_input_one_line_exit_2(args, msg):
    r = _run(*args)
    assert r.returncode == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
