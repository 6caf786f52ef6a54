"""sf.bench / `symfield bench` at small sizes: every contender runs, the numbers are consistent.

The mpmath check inside bench is the accuracy oracle (sf.q_map/qab_map with dps on symfield's own
layer inputs); the hand-written Numba floor is an independent implementation of the relu recursion,
so its agreement with propagate is checked too.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from symfield.reports.bench import bench

ROOT = Path(__file__).resolve().parents[2]


def test_bench_tanh_small():
    res = bench("tanh", grid=(4, 4), depth=5, sigma_w2=(0.3, 1.0), gh_grid=(2, 2), gh_nodes=(16, 64),
                scipy_samples=1, n_check=1, check_dps=15, repeat=1, n_traj=1)
    assert res.method == "numba-table"
    assert set(res.times) == {"symfield", "numpy-GH", "scipy-quad"}
    assert all(v > 0 for v in res.times.values()) and all(v > 0 for v in res.ratios().values())
    acc = {k.split(":")[-1].strip(): v for k, v in res.accuracy.items()}
    assert acc["max |dq|/q"] <= 1e-10 and acc["max |dqab|/q"] <= 1e-10
    dq, dqab = res.accuracy["symfield vs quadrature path, 1 whole trajectories (max |dq|/q, |dqab|/q)"]
    assert dq <= 1e-12 and dqab <= 1e-12
    assert "n = " in res.notes["numpy-GH"] and "per-step error" in res.notes["numpy-GH"]
    assert "symfield" in res.report() and "table certified per-step bound" in res.report()


def test_bench_relu_floor_agrees():
    res = bench("relu", grid=(8, 8), depth=6, gh_grid=(2, 2), gh_nodes=(16,), scipy_samples=0,
                n_check=2, check_dps=20, repeat=1)
    assert res.method == "numba-generated" and "numba-floor" in res.times
    dq, dqab = res.accuracy["numba-floor vs symfield (max |dq|/q, |dqab|/q)"]
    assert dq <= 1e-15 and dqab <= 1e-14
    # relu GH cannot reach 1e-10 with 16 nodes (the kink): bench must say so rather than pretend
    assert "CANNOT reach" in res.notes["numpy-GH"]


def test_bench_cli_json_and_bad_input():
    r = subprocess.run([sys.executable, "-m", "symfield", "bench", "erf", "--grid", "3x3", "--depth", "3",
                        "--gh-grid", "1x1", "--scipy-samples", "0", "--n-check", "1", "--dps", "15",
                        "--repeat", "1", "--json"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["method"] == "numba-generated" and "numba-floor" in out["times"]
    prov = out["provenance"]         # where the numbers came from: the command, when, and with which versions
    assert "bench" in prov["argv"] and prov["time"].endswith("+00:00") and prov["versions"]["symfield"]
    bad = subprocess.run([sys.executable, "-m", "symfield", "bench", "--grid", "3by3"], capture_output=True,
                         text=True, cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and "--grid" in bad.stderr and "256x256" in bad.stderr
    with pytest.raises(ValueError, match="'depth' parameter of bench must be an integer >= 2"):
        bench("tanh", depth=1)
    with pytest.raises(TypeError, match="'grid' parameter of bench must be a pair"):
        bench("tanh", grid=16)


@pytest.mark.parametrize("name,needle", [("missing/x.json", "does not exist"), ("x.txt", "must end in one of .json")])
def test_bench_output_is_checked_like_every_command(tmp_path, capsys, name, needle):
    """`bench --quick -o /no/such/dir/x.json` once created the directories (and ran the benchmark first);
    now it is refused before any work, as every other command refuses it (symfield.io.output.writable)."""
    from symfield.cli.main import main
    out = tmp_path / name
    assert main(["bench", "--quick", "-o", str(out)]) == 2
    captured = capsys.readouterr()
    assert needle in captured.err and len(captured.err.strip().splitlines()) == 1 and captured.out == ""
    assert not out.exists() and (out.parent == tmp_path or not out.parent.exists())
