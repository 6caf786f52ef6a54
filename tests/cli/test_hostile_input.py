"""Hostile input (issue 15): every CLI error is one line on stderr with exit 2 (never a traceback), sizes are
checked before allocating, formulas may start with '-', a non-finite number is never printed with exit 0,
and discontinuous or kinked activations get correct maps (or a clear refusal), never a NameError.

Oracles: exact moments (E[u^4] = 3 q^2, E[(-u)(-v)] = q12, relu V = q/2), and mpmath quadrature of the
defining integrals (V(q) = E[phi(sqrt(q) z)^2] and its q-derivative, the EOC equations).
"""
import importlib
import re

import mpmath as mp
import pytest
import sympy as sp

import symfield as sf
from symfield.numeric.evaluate import evaluate
from symfield.symbolic.gaussian import q as Q
from symfield.symbolic.kernel import kernel

cli = importlib.import_module("symfield.cli.main")   # the module (symfield.cli.main is also the function)


def _run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _one_line_error(code, err):
    assert code == 2
    assert err.startswith("symfield: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and "internal error" not in err, err


# ---------------------------------------------------------------- 1. jumps and kinks: no NameError
@pytest.mark.parametrize("formula", ["sign(x)", "step(x)", "heaviside(x)"])
def test_kernel_of_a_jump_says_chi1_is_infinite(capsys, formula):
    """phi jumps, so phi' holds a Dirac delta and E[phi'^2] diverges (chi1 = inf); V and C stay exact."""
    code, out, err = _run(capsys, "kernel", formula)
    assert code == 0, err
    assert "DiracDelta" not in out and "dpsi2" in out
    K = kernel(formula)
    assert K.dpsi2 == sp.oo and "infinite" in K.methods["dpsi2"]
    assert sp.simplify(K.V - (1 if formula == "sign(x)" else sp.Rational(1, 2))) == 0   # E[phi^2] exactly


def test_map_of_sign_prints_chi1_inf_and_exact_q_map(capsys):
    code, out, err = _run(capsys, "map", "sign(x)", "--q", "1", "--sigma-w2", "1.5", "--sigma-b2", "0.25")
    assert code == 0, err
    values = dict(line.split() for line in out.splitlines())
    assert float(values["q_map"]) == 1.75 and values["chi1"] == "inf"


def test_jump_without_closed_covariance_is_refused_in_one_line(capsys):
    code, _, err = _run(capsys, "kernel", "step(x) + x/2")
    _one_line_error(code, err)
    assert "jumps" in err


def _mp_V(g, kinks):
    pts = [-mp.inf, *kinks, mp.inf]
    return lambda s: mp.quad(lambda u: g(u) ** 2 * mp.npdf(u, 0, mp.sqrt(s)), pts)


@pytest.mark.parametrize("formula,g,kinks", [
    ("tanh(min(x,1))", lambda t: mp.tanh(min(t, 1)), [1]),
    pytest.param("min(x**2,1)", lambda t: min(t**2, 1), [-1, 1], marks=pytest.mark.slow),
    ("max(x, sqrt(2))", lambda t: max(t, mp.sqrt(2)), [mp.sqrt(2)]),
    ("tanh(max(x,-1))+1", lambda t: mp.tanh(max(t, -1)) + 1, [-1]),
])
def test_dV_of_kinked_activations_matches_the_derivative_of_the_defining_integral(formula, g, kinks):
    """dV = E[phi'^2 + phi phi''] where phi'' has Dirac masses at the kinks: against d/dq of mpmath's V(q)."""
    mp.mp.dps = 30
    K = kernel(formula)
    for qv in (0.3, 1.0, 4.0):
        ref = mp.diff(_mp_V(g, kinks), qv)
        assert abs(float(evaluate(K.dV, (Q,), (qv,), kinks=K.kinks)) - ref) < 1e-12 * max(1, abs(ref))


def test_eoc_of_a_kinked_activation_solves_both_equations(capsys):
    """eoc tanh(min(x,1)) crashed in phi''; the point must satisfy q = sw E[phi^2] + sb and sw E[phi'^2] = 1."""
    code, out, err = _run(capsys, "eoc", "tanh(min(x,1))", "--sigma-b2", "0.1")
    assert code == 0, err
    v = dict(line.split()[:2] for line in out.splitlines())
    sw, qs = float(v["sigma_w2"]), float(v["q_star"])
    mp.mp.dps = 20
    s = mp.sqrt(qs)
    V = mp.quad(lambda z: mp.tanh(min(s * z, 1)) ** 2 * mp.npdf(z), [-mp.inf, 1 / s, mp.inf])
    D = mp.quad(lambda z: (mp.sech(s * z) ** 4 if s * z < 1 else 0) * mp.npdf(z), [-mp.inf, 1 / s, mp.inf])
    assert abs(sw * V + 0.1 - qs) < 1e-8 and abs(sw * D - 1) < 1e-8


def test_derive_of_kinked_and_jump_activations_runs(capsys):
    for formula in ("tanh(min(x,1))", "sign(x)"):
        code, out, err = _run(capsys, "derive", formula)
        assert code == 0, err
        assert out.rstrip().endswith(r"\end{document}")
    code, out, err = _run(capsys, "derive", "-sign(x)")          # a downward jump: not monotone
    assert code == 0, err
    assert r"$\phi$ is not monotone." in out


# ---------------------------------------------------------------- 2. messages anyone can act on
def test_formula_that_is_complex_infinity_is_one_clear_error(capsys):
    code, _, err = _run(capsys, "kernel", "log(0*x)")
    _one_line_error(code, err)
    assert "'log(0*x)'" in err and "not finite" in err


def test_max_with_an_irrational_constant_works(capsys):
    """max(x, sqrt(2)) failed with 'sorted roots not supported over EX'."""
    code, out, err = _run(capsys, "map", "max(x, sqrt(2))", "--q", "1", "--sigma-w2", "1", "--dps", "20")
    assert code == 0, err
    mp.mp.dps = 25
    ref = _mp_V(lambda t: max(t, mp.sqrt(2)), [mp.sqrt(2)])(1)
    got = mp.mpf(dict(line.split() for line in out.splitlines())["q_map"])
    assert abs(got - ref) < mp.mpf(10) ** -17


def test_handler_prints_the_type_of_an_exception_without_message(capsys, monkeypatch):
    def boom(args):
        raise ValueError("")
    monkeypatch.setattr(cli, "command", lambda name: boom)
    code, _, err = _run(capsys, "list")
    assert code == 2 and err == "symfield: error: ValueError (no message)\n"


@pytest.mark.parametrize("exc", [MemoryError(), KeyError("k"), IndexError("list index out of range"),
                                 OverflowError("int too large to convert to float")])
def test_handler_catches_everything_in_one_line(capsys, monkeypatch, exc):
    def boom(args):
        raise exc
    monkeypatch.setattr(cli, "command", lambda name: boom)
    code, out, err = _run(capsys, "list")
    assert code == 2 and err.startswith("symfield: error: ") and err.count("\n") == 1 and out == ""
    assert type(exc).__name__ in err or isinstance(exc, (MemoryError, OverflowError))


# ---------------------------------------------------------------- 3. sizes checked before allocating
def test_propagate_refuses_a_huge_depth_up_front(capsys):
    with pytest.raises(ValueError, match=r"depth = 1000000000000.*grid points x 4 arrays x 8 bytes"):
        sf.propagate("relu", 2.0, 0.1, 10**12)
    code, _, err = _run(capsys, "propagate", "relu", "--sigma-w2", "2", "--sigma-b2", "0.1",
                        "--depth", "1000000000000")
    _one_line_error(code, err)
    assert "GiB" in err


def test_g0_sample_refuses_a_huge_size_up_front():
    with pytest.raises(ValueError, match=r"g0_sample .* size = 1000000000000"):
        sf.igb.g0_sample(10.0, size=10**12)


def test_simulate_refuses_a_huge_run_up_front(capsys):
    with pytest.raises(ValueError, match=r"width = 1000000000, n_inputs = 10000"):
        sf.simulate("tanh", 10**9, 50, 1.0, 0.0, 10**4)
    code, _, err = _run(capsys, "simulate", "tanh", "--sigma-w2", "1", "--sigma-b2", "0",
                        "--width", "1000000000", "--n-inputs", "10000")
    _one_line_error(code, err)


# ---------------------------------------------------------------- 4. a formula may start with '-'
def test_formula_starting_with_minus(capsys):
    code, out, err = _run(capsys, "kernel", "-x**2")
    assert code == 0, err
    assert "kernel of -x**2" in out and "3*q**2" in out          # E[u^4] = 3 q^2
    code, out, err = _run(capsys, "map", "-x", "--q", "2", "--q12", "-0.5", "--sigma-w2", "1", "--json")
    assert code == 0, err
    assert '"qab_map": -0.5' in out and '"q12": -0.5' in out    # E[(-u)(-v)] = q12


# ---------------------------------------------------------------- 5. non-finite results are not success
def test_qstar_nan_is_an_error(capsys):
    code, out, err = _run(capsys, "qstar", "tanh", "--sigma-w2", "1e308", "--sigma-b2", "1e308")
    _one_line_error(code, err)
    assert "nan" not in out.lower() and "NaN" in err and "--dps" in err


def test_map_overflow_is_an_error_and_dps_gives_the_exact_value(capsys):
    code, out, err = _run(capsys, "map", "relu", "--q", "1e308", "--sigma-w2", "4")
    _one_line_error(code, err)
    assert "q_map = inf" in err and out == ""
    code, out, err = _run(capsys, "map", "relu", "--q", "1e308", "--sigma-w2", "4", "--dps", "20")
    assert code == 0, err                                          # relu: V(q) = q/2, so q_map = 2e308
    assert mp.mpf(dict(line.split() for line in out.splitlines())["q_map"]) == 2 * mp.mpf("1e308")


# ---------------------------------------------------------------- issue 28 item 9: one short line
@pytest.mark.parametrize("formula, says", [
    ("tan(erf(3)*softplus(x))", "has a pole on the real line at x = 1.3378, a zero of cos("),
    ("sech(1e300)+tanh(x)", "the constant sech(1e+300) = 10^(-4.34294e+299) is outside the allowed magnitudes"),
    ("tan(10**30*softplus(x))", "has a pole on the real line at x = "),
])
def test_complex_and_huge_values_are_one_short_line(capsys, tmp_path, formula, says):
    """Was "Cannot convert complex to float" (solveset's image set of the poles holds complex members)
    and a 300-digit exponent inside the message."""
    calls = (sf.activation, sf.kernel, lambda f: sf.q_map(f, 1.5, 0.1, 1.0), lambda f: sf.propagate(f, 1.5, 0.1, 3))
    for call in calls:
        with pytest.raises(ValueError) as info:
            call(formula)
        msg = str(info.value)
        assert says in msg and repr(formula) in msg and "\n" not in msg, msg
        assert not re.search(r"\d{21}", msg), msg
    code, _, err = _run(capsys, "derive", formula, "-o", str(tmp_path / "d.tex"))
    _one_line_error(code, err)
    assert says in err and not re.search(r"\d{21}", err)


def test_exact_pole_of_a_composition_with_softplus():
    """x = log(e^(pi/(2 erf 3)) - 1), the real member of solveset's image set, is the pole."""
    with pytest.raises(ValueError) as info:
        sf.activation("tan(erf(3)*softplus(x))")
    at = float(re.search(r"x = ([-0-9.e]+)", str(info.value)).group(1))
    assert at == pytest.approx(float(mp.log(mp.exp(mp.pi / (2 * mp.erf(3))) - 1)), rel=1e-5)
