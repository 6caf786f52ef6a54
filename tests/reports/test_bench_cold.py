"""`symfield bench --suite cold` (symfield/reports/bench_cold.py): correctness only, never timings.

A tiny row (a 3x3 relu phase diagram) runs in a child process on an empty cache and its JSON report is
read back; a row whose child reports values perturbed by 1e-6 must show an error of that size (so the
error column is a real comparison with the mpmath oracle); a row killed by its time limit must be
reported as timed out, not met. The float64 max2 covariance oracle is checked against the exact linear
max2 map C = q12/2 + sqrt(q1 q2) (sqrt(1 - rho^2) + rho asin rho)/pi (max = mean + |difference|/2).
"""
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from symfield.cli.main import main
from symfield.reports import bench_cold as bc

ROOT = Path(__file__).resolve().parents[2]


def tiny(**extra):
    params = dict(act="relu", grid=[3, 3], sw=[0.5, 4.0], sb=[0.0, 0.2], **extra)
    return bc.Row("tiny-relu-phase", "3x3 relu phase diagram", "phase_diagram", params, 600.0, 600.0)


def test_tiny_row_cold_and_warm_json(tmp_path):
    res = bc.run([tiny()], warm=True, progress=False, root=tmp_path)
    out = tmp_path / "cold.json"
    bc.write_json(res, out)
    data = json.loads(out.read_text())
    assert data["suite"] == "cold" and len(data["rows"]) == 1
    row = data["rows"][0]
    assert {"name", "case", "metric", "target", "measured", "wall", "error", "oracle", "verdict", "warm"} <= set(row)
    assert row["verdict"] == "met" and row["measured"] == row["wall"] > 0
    assert "mpmath" in row["oracle"] and 0 <= row["error"] < 1e-12      # q* and chi1 of relu: closed forms
    assert row["warm"]["verdict"] == "met" and row["warm"]["error"] < 1e-12
    assert list(tmp_path.iterdir()) == [out]          # the per-row cache directory is removed afterwards


def test_perturbed_value_is_a_large_error(tmp_path):
    (r,) = bc.run([tiny(perturb=1e-6)], progress=False, root=tmp_path)
    assert 5e-7 < r.error < 2e-6
    assert r.verdict == "missed" and "error" in r.note


def test_error_of_sees_a_wrong_covariance():
    row = bc.select("relu-max2-C-array")[0]
    q1, q2, q12 = 1.0, 2.5, 0.6
    exact = bc.max2_C(lambda t: np.maximum(t, 0), q1, q2, q12)
    good, _ = bc.error_of(row, dict(points=[dict(q1=q1, q2=q2, q12=q12, C=exact)]))
    bad, _ = bc.error_of(row, dict(points=[dict(q1=q1, q2=q2, q12=q12, C=exact + 1e-4)]))
    assert good < 1e-14 and 1e-5 < bad < 1e-3


@pytest.mark.parametrize("q1,q2,q12", [(1.0, 2.0, 0.5), (0.5, 3.0, -1.1), (2.0, 2.5, 2.0)])
def test_max2_oracle_linear_exact(q1, q2, q12):
    rho = q12 / math.sqrt(q1 * q2)
    exact = q12 / 2 + math.sqrt(q1 * q2) * (math.sqrt(1 - rho * rho) + rho * math.asin(rho)) / math.pi
    assert bc.max2_C(lambda t: t, q1, q2, q12) == pytest.approx(exact, abs=1e-13)


def test_timed_out_row_is_not_passed(tmp_path):
    row = tiny()
    row.timeout = 0.5                 # the child cannot even import symfield in that time
    (r,) = bc.run([row], warm=True, progress=False, root=tmp_path)
    assert r.verdict == "timed out" and r.measured is None and r.error is None and r.warm is None
    assert "killed" in r.note and "timed out" in bc.table([r])


def test_cli_rows_timeout_and_json(tmp_path):
    out = tmp_path / "b.json"
    run = subprocess.run([sys.executable, "-m", "symfield", "bench", "--suite", "cold", "--rows",
                          "relu-max2-C-array,elu-phase-point", "--timeout", "0.3", "-o", str(out)],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [r["name"] for r in rows] == ["relu-max2-C-array", "elu-phase-point"]
    assert all(r["verdict"] == "timed out" for r in rows)
    assert run.stderr.count("timed out") == 2 and "relu-max2-C-array" in run.stdout   # progress + table


def test_cli_list(capsys):
    assert main(["bench", "--suite", "cold", "--rows", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(bc.ROWS) == 41 and lines[0].startswith("gelu-phase")
    assert {f"paper-{a}" for a in ("relu", "tanh-max2", "tanh-avg2", "gelu")} <= {ln.split()[0] for ln in lines}


@pytest.mark.parametrize("argv,needle", [(["--suite", "cold", "--rows", "gelu-phase,nope"], "Got 'nope' instead"),
                                         (["--warm"], "--warm"),
                                         (["--suite", "cold", "--timeout", "-1"], "-1")])
def test_cli_bad_input(argv, needle, capsys):
    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("value", ["inf", "nan", "0"])
def test_cli_timeout_must_be_finite(value, capsys, tmp_path):
    """--timeout inf once failed with "cannot convert float infinity to integer" after launching a child."""
    assert main(["bench", "--suite", "cold", "--rows", "elu-phase-point", "--timeout", value]) == 2
    err = capsys.readouterr().err
    assert "'--timeout' option of bench must be a finite number of seconds > 0" in err and value in err
    assert len(err.strip().splitlines()) == 1
    with pytest.raises(ValueError, match="'timeout' parameter of bench_cold.run must be a finite float > 0"):
        bc.run_row(tiny(), timeout=float(value), root=tmp_path)
    assert list(tmp_path.iterdir()) == []       # refused before any child or cache directory


def test_cli_output_directory_must_exist(capsys, tmp_path):
    out = tmp_path / "missing" / "cold.json"
    assert main(["bench", "--suite", "cold", "--rows", "elu-phase-point", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and len(err.strip().splitlines()) == 1 and not out.parent.exists()


def test_max2_oracle_refuses_correlations_it_cannot_resolve():
    """The argmax oracle's density ridge has width sqrt(1 - rho^2): at rho = 1 - 4.4e-7 it returned C = 12.98
    for tanh+max2 (V = 0.308), which the cold suite reported as a propagate error of 29."""
    g = bc._g_np(bc._act(dict(act="tanh", pool="max")))
    with pytest.raises(ValueError, match="rho"):
        bc.max2_C(g, 0.6, 0.6, 0.6 * 0.999)
    rho = bc.RHO_MAX
    assert bc.max2_C(g, 0.7, 0.7, 0.7 * rho) == pytest.approx(
        bc.max2_C(g, 0.7, 0.7, 0.7 * rho, nodes=24), rel=1e-13)


@pytest.mark.slow        # ~30 s of mpmath quadrature
def test_valley_oracle_of_gelu_max2_resolves_the_power_singularity_at_zero():
    """E[psi'^2] of gelu+max2 at q = 4, where the pooled weight 2 F(phi(t)) has the singularity |t|^(1/q) at t = 0-
    (the sublevel set's mirror end runs to -inf): the oracle (dpsi2_mp) against the same integral split at
    m (phi's minimum) and 0, with the singular part int_m^0 phi'(t)^2 N(l(t)/s) n_s(t) dt moved to the mirror
    variable l in (-inf, m) (dt = phi'(l) dl/phi'(t)), where it is smooth."""
    import mpmath as mp
    from symfield.symbolic.activation import activation
    q, dps = 4, 20
    with mp.workdps(dps + 5):
        phi, dphi = (lambda x: x * mp.ncdf(x)), (lambda x: mp.ncdf(x) + x * mp.npdf(x))
        m, s = mp.findroot(dphi, -0.75), mp.sqrt(q)
        ns = lambda t: mp.npdf(t / s) / s

        def mirror(a):       # t in (m, 0) with phi(t) = a (phi increases there): bisection, then Newton
            lo, hi = m, mp.mpf(0)
            for _ in range(60):
                lo, hi = ((lo + hi) / 2, hi) if phi((lo + hi) / 2) < a else (lo, (lo + hi) / 2)
            t = (lo + hi) / 2
            for _ in range(4):
                t -= (phi(t) - a) / dphi(t)
            return t
        left = [-12 * s - 5, -10, -5, -3, -2, -1.5, m]
        smooth = mp.quad(lambda t: dphi(t) ** 2 * mp.ncdf(t / s) * ns(t), [m, 0, 1, 3, 10 * s, mp.inf])
        moved = mp.quad(lambda l: dphi(mirror(phi(l))) * -dphi(l) * mp.ncdf(l / s) * ns(mirror(phi(l))), left)
        far = mp.quad(lambda t: dphi(t) ** 2 * (mp.ncdf(mirror(phi(t)) / s) - mp.ncdf(t / s)) * ns(t), left)
        ref = 2 * (smooth - moved + far)
    got = bc.dpsi2_mp(activation("gelu", pool="max", k=2), q, dps)
    assert abs(got - ref) <= mp.mpf(10) ** -18 * ref
