"""sf.verify / `symfield verify`: the three-way checks are right (against closed forms from the
literature), fail when the package is wrong, and the command reports and exits as documented."""
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import mpmath as mp
import pytest

import symfield.theory.maps
from symfield import cli
from symfield.symbolic.formula import FormulaError
from symfield.reports.oracles import mp_expect1, mp_expect2
from symfield.reports.verify import MC_SIGMAS, REL_TOL, verify

from oracles import REGISTRY, _acos_relu

ROOT = Path(__file__).resolve().parents[2]


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
    # homogeneous: chi1 = sigma_w2 (1 + 0.2^2)/2 at every q, so the EOC is sigma_w2 = 2/1.04 at every
    # sigma_b2 (q* = 0 at sigma_b2 = 0, q* = inf beyond, where q grows by sigma_b2 per layer)
    rows = {r["sigma_b2"]: r for r in leaky.eoc}
    assert all(abs(r["sigma_w2"] - 2 / 1.04) < 1e-12 and r["status"] == "pass" for r in leaky.eoc)
    assert rows[0.0]["q_star"] == 0 and rows[0.05]["q_star"] == math.inf and "homogeneous" in rows[0.05]["note"]
    assert leaky.status == "pass" and not leaky.inconclusive and not leaky.warnings
    # phases: chi1 = sigma_w2 (1 + a^2)/2 exactly; c* = 1 for every ReLU-like init
    for r in leaky.phases:
        assert r["status"] == "pass" and abs(r["chi1"] - r["sigma_w2"] * 0.52) < 1e-12
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
    assert "RESULT: FAIL" in rep.table() and rep.status == "fail"


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
    rep = verify("erf(x)", phase_seconds=60, n_mc=20_000)
    assert rep.ok and rep.status == "pass" and rep.mean["exact_zero"] and not rep.mean["creates_drift"]
    row = rep.eoc[0]
    assert row["sigma_b2"] == 0 and abs(row["sigma_w2"] - math.pi / 4) < 1e-12    # docs/theory.md: erf EOC pi/4
    assert all(r["residuals"][0] < 1e-7 for r in rep.eoc[1:])
    # erf is bounded: V'(q) = (4/pi)/((1 + 2q) sqrt(1 + 4q)) and sigma_w2 V'(q*) < 1, a stable q*
    for r in rep.eoc[1:]:
        dV = 4 / math.pi / ((1 + 2 * r["q_star"]) * math.sqrt(1 + 4 * r["q_star"]))
        assert r["stable"] is True and abs(r["q_slope"] - r["sigma_w2"] * dV) < 1e-9 and r["q_slope"] < 1
    assert not rep.warnings and "unstable" not in rep.table()
    assert all(r["status"] == "pass" and r["phase"] for r in rep.phases) and "RESULT: PASS" in rep.table()


# ---------------------------------------------------------------- statuses: pass / fail / inconclusive
@pytest.fixture(scope="module")
def xerf_fast():
    """x erf(x) with a phase budget far below what its phases take (1e-5 CPU seconds: 0.01 s became enough for
    one of them once the phase got fast, a timing-dependent check)."""
    return verify("x*erf(x)", phase_seconds=1e-5, n_mc=20_000)


def test_timed_out_phases_are_inconclusive_not_passed(xerf_fast):
    rep = xerf_fast
    assert all(c.status == "pass" for c in rep.checks) and not rep.failures
    timed_out = [r for r in rep.phases if r["status"] == "inconclusive"]
    assert timed_out and all("1e-05 CPU seconds" in r["note"] and r["phase"] is None for r in timed_out)
    assert rep.status == "inconclusive" and rep.ok is False and len(rep.inconclusive) == len(timed_out)
    text = rep.table()
    assert "RESULT: PASS" not in text and "RESULT: INCONCLUSIVE" in text and "--phase-seconds" in text
    d = json.loads(json.dumps(rep.to_dict()))
    assert d["status"] == "inconclusive" and d["ok"] is False and d["settings"]["phase_seconds"] == 1e-5


def _v_mp(q):
    """V(q) = E[(u erf u)^2], u ~ N(0, q), by mpmath quadrature of the defining integral."""
    with mp.workdps(30):
        return mp.quad(lambda z: (mp.sqrt(q) * z * mp.erf(mp.sqrt(q) * z)) ** 2 * mp.npdf(z), [-mp.inf, 0, mp.inf])


def test_unstable_eoc_point_is_flagged(xerf_fast):
    """x erf(x) at sigma_b2 = 0.05: sigma_w2 V'(q*) > 1 (V' by a central difference of mpmath quadratures)."""
    row = next(r for r in xerf_fast.eoc if r["sigma_b2"] == 0.05)
    h = mp.mpf("1e-6")
    with mp.workdps(30):
        slope = row["sigma_w2"] * (_v_mp(row["q_star"] + h) - _v_mp(row["q_star"] - h)) / (2 * h)
    assert slope > 1.1 and abs(row["q_slope"] - float(slope)) < 1e-6
    assert row["stable"] is False and row["status"] == "pass" and "UNSTABLE" in row["note"]
    warn = [w for w in xerf_fast.warnings if "sigma_b2 = 0.05" in w]
    assert len(warn) == 1 and "unstable fixed point" in warn[0] and "not at the edge of chaos" in warn[0]
    assert "warnings" in xerf_fast.table() and "unstable EOC point at sigma_b2 = 0.05" in xerf_fast.table()


def test_a_failure_outranks_inconclusive(monkeypatch):
    """A failed check with phases that cannot finish: status fail (not inconclusive), both recorded."""
    import symfield.theory.phases as fp
    real = symfield.theory.maps.map_value
    monkeypatch.setattr(symfield.theory.maps, "map_value",
                        lambda act, name, *a, **kw: real(act, name, *a, **kw) * (1.001 if name == "V" else 1))
    monkeypatch.setattr(fp, "phase", lambda *a, **kw: time.sleep(2))
    rep = verify("max(x, 0.2*x)", phase_seconds=0.05, n_mc=20_000)
    assert rep.status == "fail" and not rep.ok and len(rep.inconclusive) == 4
    assert {c.quantity for c in rep.checks if c.status == "fail"} == {"V"}
    assert "RESULT: FAIL (3 failed, 4 inconclusive)" in rep.table()


def test_an_evaluation_that_raises_is_inconclusive(monkeypatch):
    real = symfield.theory.maps.map_value

    def broken(act, name, *a, **kw):
        if name == "C":
            raise ArithmeticError("could not certify C")
        return real(act, name, *a, **kw)
    monkeypatch.setattr(symfield.theory.maps, "map_value", broken)
    rep = verify("max(x, 0.2*x)", phase_seconds=5, n_mc=20_000)
    bad = [c for c in rep.checks if c.quantity == "C"]
    assert len(bad) == 2 and all(c.status == "inconclusive" and "could not certify C" in c.note for c in bad)
    assert rep.status == "inconclusive" and not rep.ok and not rep.failures


@pytest.mark.parametrize("value", [0, -1.0, math.nan])
def test_phase_seconds_must_be_positive(value):
    with pytest.raises(ValueError, match="'phase_seconds' parameter of verify"):
        verify("x", phase_seconds=value)


def _main(argv, capsys):
    try:
        code = cli.main(argv)
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("argv", [["verify", "import os"], ["verify"], ["verify", "x", "--n-mc", "abc"],
                                  ["verify", "x", "--n-mc", "5"], ["verify", "x", "--seed", "-1"],
                                  ["verify", "relu(x, 2)"], ["verify", "x", "--phase-seconds", "0"],
                                  ["verify", "x", "--phase-seconds", "abc"], ["verify", "x", "--phase-seconds=-2"]])
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


def test_cli_verify_inconclusive_exits_3(capsys):
    """Phases that cannot finish in --phase-seconds: exit 3, never 'RESULT: PASS' (text or JSON). The budget is
    1e-5 CPU seconds: 0.01 s was once enough to be too little, until the phase of x*erf(x) got fast enough to
    finish in it on a warm process (a timing-dependent test)."""
    code, out, err = _main(["verify", "x*erf(x)", "--phase-seconds", "1e-5", "--n-mc", "20000"], capsys)
    assert code == 3 and err == "" and "RESULT: PASS" not in out and "RESULT: INCONCLUSIVE" in out
    assert "not determined within 1e-05 CPU seconds" in out and "unstable EOC point" in out


def test_cli_verify_failed_check_exits_1(monkeypatch, capsys):
    real = symfield.theory.maps.map_value
    monkeypatch.setattr(symfield.theory.maps, "map_value",
                        lambda act, name, *a, **kw: real(act, name, *a, **kw) * (1 + 1e-6 if name == "dpsi2" else 1))
    code, out, err = _main(["verify", "max(x, 0.2*x)", "--n-mc", "20000"], capsys)
    assert code == 1 and err == "" and "RESULT: FAIL" in out
    assert "chi1 (sigma_w2 = 1)" in out.split("failures")[1]


def test_cli_verify_pass_exits_0_and_help_documents_exit_codes(capsys):
    code, out, _ = _main(["verify", "max(x, 0.2*x)", "--n-mc", "20000", "--phase-seconds", "30"], capsys)
    assert code == 0 and out.rstrip().endswith("RESULT: PASS")
    code, out, _ = _main(["verify", "--help"], capsys)
    out = " ".join(out.split())
    assert code == 0 and "--phase-seconds S" in out and "default 15" in out
    for line in ("0 PASS", "1 FAIL", "2 bad input", "3 INCONCLUSIVE"):
        assert line in out
    from symfield.reports.verify import EXIT_CODES, PHASE_SECONDS
    assert PHASE_SECONDS == 15 and EXIT_CODES == {"pass": 0, "fail": 1, "inconclusive": 3}


def test_an_inconsistent_eoc_point_fails(monkeypatch):
    """q* = 0 returned for phi(0) != 0 is not a fixed point: verify re-checks and fails."""
    import symfield.theory.eoc as fp
    monkeypatch.setattr(fp, "eoc", lambda act, sb, dps=None: fp.EOC(sigma_b2=sb, sigma_w2=1.0, q_star=0.0))
    rep = verify("tanh(x) + 0.5", phase_seconds=0.01, n_mc=20_000)
    assert not rep.ok and all(c.ok for c in rep.checks)
    assert any("not a fixed point" in f for f in rep.failures)


@pytest.mark.slow
@pytest.mark.parametrize("formula", ["x*erf(x)", "log(1+exp(x))", "x*tanh(log(1+exp(x)))", "max(x, 0.2*x)"])
def test_cli_verify_issue_formulas_pass(formula):
    """Every check runs to the end (a phase budget long enough for x erf(x)'s He phases) and holds."""
    r = subprocess.run([sys.executable, "-m", "symfield", "verify", formula, "--json", "--phase-seconds", "300"],
                       capture_output=True, text=True, timeout=1800, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    d = json.loads(r.stdout)
    assert d["ok"] and d["status"] == "pass" and d["moments_finite"] and len(d["checks"]) == 9
    assert all(p["status"] == "pass" and p["phase"] for p in d["phases"]) and d["inconclusive"] == []
    assert all(c["ok"] for c in d["checks"]) and len(d["eoc"]) == 3 and len(d["phases"]) == 4
    for c in d["checks"]:
        assert abs(c["package"] - c["mpmath"]) <= REL_TOL * c["scale"]
