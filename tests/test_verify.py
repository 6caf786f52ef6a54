"""sf.verify / `symfield verify`: the three-way checks are right (against closed forms from the
literature), fail when the package is wrong, and the command reports and exits as documented."""
import json
import math
import subprocess
import sys
from pathlib import Path

import mpmath as mp
import pytest

import symfield.theory.maps
from symfield import cli
from symfield.symbolic.formula import FormulaError
from symfield.reports.oracles import mp_expect1, mp_expect2
from symfield.reports.verify import MC_SIGMAS, REL_TOL, verify

from oracles import REGISTRY, _acos_relu

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def leaky():
    return verify("max(x, 0.2*x)", phase_seconds=5)


def test_piecewise_linear_report_matches_the_arc_cosine_kernel(leaky):
    """max(x, 0.2x) = 0.2 min(x,0) + max(x,0): every leg against the arc-cosine closed forms."""
    ref = _acos_relu(mp.mpf("0.2"), 1)
    assert leaky.ok and leaky.closed_form and not leaky.failures
    names = {c.quantity for c in leaky.checks}
    assert names == {"V", "chi1 (sigma_w2 = 1)", "E[psi]", "C"}
    for c in leaky.checks:
        exact = {"V": lambda p: ref["V"](p[0]), "chi1 (sigma_w2 = 1)": lambda p: ref["dpsi2"](p[0]),
                 "E[psi]": lambda p: ref["mean"](p[0]), "C": lambda p: ref["C"](*p)}[c.quantity](c.point)
        assert abs(c.mpmath - float(exact)) <= 1e-12 * c.scale, c
        assert abs(c.package - float(exact)) <= 1e-12 * c.scale, c
        assert c.mc_stderr > 0 and abs(c.monte_carlo - float(exact)) <= MC_SIGMAS * c.mc_stderr, c
    assert any("not differentiable at x = 0" in p for p in leaky.problems)
    # homogeneous: EOC only at sigma_b2 = 0, sigma_w2 = 2/(1 + 0.2^2); reported, not failed
    rows = {r["sigma_b2"]: r for r in leaky.eoc}
    assert abs(rows[0.0]["sigma_w2"] - 2 / 1.04) < 1e-12
    assert rows[0.05]["sigma_w2"] is None and "homogeneous" in rows[0.05]["note"]
    # phases: chi1 = sigma_w2 (1 + a^2)/2 exactly; c* = 1 for every ReLU-like init
    for r in leaky.phases:
        assert r["phase"] is not None and abs(r["chi1"] - r["sigma_w2"] * 0.52) < 1e-12
        want = "chaotic-deep-prejudice" if r["sigma_w2"] * 0.52 > 1 else "ordered-deep-prejudice"
        assert r["phase"] == want and r["c_star"] == 1.0
    assert leaky.mean["creates_drift"] and abs(leaky.mean["value_q1"] - 0.8 / math.sqrt(2 * math.pi)) < 1e-14


def test_report_renders_and_serialises(leaky):
    text = leaky.table()
    assert "RESULT: PASS" in text and "chaotic-deep-prejudice" in text and "Monte Carlo" in text
    d = json.loads(json.dumps(leaky.to_dict()))
    assert d["ok"] is True and len(d["checks"]) == 9 and d["settings"]["mc_sigmas"] == MC_SIGMAS


def test_mpmath_legs_against_literature_values():
    """The independent quadratures themselves: erf arcsine kernel, sin closed forms."""
    erf = REGISTRY["erf"]
    f = lambda t: mp.erf(t)  # noqa: E731
    assert abs(mp_expect1(lambda t: f(t) ** 2, 0.7, (), 20) - erf["V"](mp.mpf(0.7))) < 1e-14
    got = mp_expect2(f, f, 0.5, 2.0, -0.6)
    assert abs(got - erf["C"](mp.mpf("0.5"), mp.mpf(2), mp.mpf("-0.6"))) < 1e-13
    s = REGISTRY["sin"]
    assert abs(mp_expect2(mp.sin, mp.sin, 1.5, 0.5, 0.3) - s["C"](1.5, 0.5, 0.3)) < 1e-13
    relu = REGISTRY["relu"]   # kink at 0 in both variables, strong negative correlation
    rl = lambda t: max(t, 0)  # noqa: E731
    assert abs(mp_expect2(rl, rl, 1.0, 3.0, -1.5, (0,)) - relu["C"](1, 3, -1.5)) < 1e-13


def test_a_wrong_package_value_fails_the_check(monkeypatch):
    """verify must not just echo the package: perturb map_value by 1e-7 relative and it fails."""
    real = symfield.theory.maps.map_value

    def off(act, name, *args, **kw):
        v = real(act, name, *args, **kw)
        return v * (1 + 1e-7) if name == "C" else v
    monkeypatch.setattr(symfield.theory.maps, "map_value", off)
    rep = verify("max(x, 0.2*x)", phase_seconds=0.01)
    assert not rep.ok
    bad = [c for c in rep.checks if not c.ok]
    assert bad and all(c.quantity == "C" for c in bad) and "mpmath" in bad[0].note
    assert "RESULT: FAIL" in rep.table()


def test_divergent_formula_fails_with_the_reason():
    rep = verify("exp(x**2)")
    assert not rep.ok and not rep.moments_finite and not rep.checks
    assert "diverge" in rep.failures[0] and "o(x^2)" in rep.failures[0]
    assert "RESULT: FAIL" in rep.table()


def test_not_a_formula_is_refused():
    with pytest.raises(FormulaError, match="not a formula"):
        verify("import os")
    with pytest.raises(TypeError):
        verify(None)
    with pytest.raises(ValueError, match="n_mc"):
        verify("x", n_mc=10)


def test_odd_activation_creates_no_drift_and_has_eoc_one():
    rep = verify("erf(x)", phase_seconds=0.01, n_mc=20_000)
    assert rep.ok and rep.mean["exact_zero"] and not rep.mean["creates_drift"]
    row = rep.eoc[0]
    assert row["sigma_b2"] == 0 and abs(row["sigma_w2"] - math.pi / 4) < 1e-12    # docs/theory.md: erf EOC pi/4
    assert all(r["residuals"][0] < 1e-7 for r in rep.eoc[1:])


def _main(argv, capsys):
    try:
        code = cli.main(argv)
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("argv", [["verify", "import os"], ["verify"], ["verify", "x", "--n-mc", "abc"],
                                  ["verify", "x", "--n-mc", "5"], ["verify", "x", "--seed", "-1"],
                                  ["verify", "relu(x, 2)"]])
def test_cli_verify_bad_input_is_one_line_exit_2(argv, capsys):
    code, out, err = _main(argv, capsys)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("symfield: error: ")


def test_cli_verify_divergent_exits_1_with_explanation(capsys):
    code, out, err = _main(["verify", "exp(x**2)"], capsys)
    assert code == 1 and "diverge" in out and "RESULT: FAIL" in out and err == ""
    code, out, err = _main(["verify", "exp(x**2)", "--json"], capsys)
    d = json.loads(out)
    assert code == 1 and d["ok"] is False and d["moments_finite"] is False


def test_an_inconsistent_eoc_point_fails(monkeypatch):
    """q* = 0 returned for phi(0) != 0 is not a fixed point: verify re-checks and fails."""
    import symfield.theory.fixedpoint as fp
    monkeypatch.setattr(fp, "eoc", lambda act, sb, dps=None: fp.EOC(sigma_b2=sb, sigma_w2=1.0, q_star=0.0))
    rep = verify("tanh(x) + 0.5", phase_seconds=0.01, n_mc=20_000)
    assert not rep.ok and all(c.ok for c in rep.checks)
    assert any("not a fixed point" in f for f in rep.failures)


@pytest.mark.slow
@pytest.mark.parametrize("formula", ["x*erf(x)", "log(1+exp(x))", "x*tanh(log(1+exp(x)))", "max(x, 0.2*x)"])
def test_cli_verify_issue_formulas_pass(formula):
    r = subprocess.run([sys.executable, "-m", "symfield", "verify", formula, "--json"], capture_output=True,
                       text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    d = json.loads(r.stdout)
    assert d["ok"] and d["moments_finite"] and len(d["checks"]) == 9
    assert all(c["ok"] for c in d["checks"]) and len(d["eoc"]) == 3 and len(d["phases"]) == 4
    for c in d["checks"]:
        assert abs(c["package"] - c["mpmath"]) <= REL_TOL * c["scale"]
