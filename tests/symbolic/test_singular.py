"""Real singularities of user formulas are refused before any integration, and the float64 Gaussian
quadrature refuses (QuadratureError) what it cannot resolve instead of returning a number.

Oracles: the singular points named in the messages are checked to be zeros of the named quantity by
mpmath at 30 digits (independent of SymPy); accepted formulas' E[phi(z)^2] against mpmath.quad of the
defining integral; the near-pole family E[1/(x^2 + a^2)] against its closed form
sqrt(pi/2)/(a s) e^{b^2/2} erfc(b/sqrt 2) / s (b = a/s, s = sqrt q), and E[sin(x)^2] = (1 - e^{-2q})/2.
"""
import math
import re
import subprocess
import sys

import mpmath
import numpy as np
import pytest
import sympy as sp

import symfield as sf
from symfield.numeric.evaluate import NUMPY_MODULES, vectorised
from symfield.numeric.quadrature import QuadratureError, expect1, expect2
from symfield.symbolic.activation import kinks
from symfield.symbolic.formula import X, FormulaError

POLE = r"has a pole on the real line at x = {}, a zero of {}: it is not finite there"
REFUSED = [
    ("tan(x)", POLE.format(r"pi/2 = 1\.5708", r"cos\(x\)")),
    ("1/cos(x)", POLE.format(r"pi/2 = 1\.5708", r"cos\(x\)")),
    ("1/sin(x)", POLE.format("0", r"sin\(x\)")),
    ("1/tan(x)", POLE.format(r"pi/2 = 1\.5708", r"cos\(x\)")),
    ("1/tanh(x)", POLE.format("0", r"tanh\(x\)")),
    ("1/x", POLE.format("0", "x")),
    ("x**-1", POLE.format("0", "x")),
    ("1/(x - 1)", POLE.format("1", "x - 1")),
    ("1/(exp(x) - 2)", POLE.format(r"log\(2\) = 0\.693147", r"exp\(x\) - 2")),
    ("1/(x**2 - 1)", POLE.format("1", r"x\*\*2 - 1")),
    ("1/(1 + cos(x))", POLE.format(r"pi = 3\.14159", r"cos\(x\) \+ 1")),
    ("log(x)", r"takes log\(x\), which is not real-valued at x = -1, where x < 0"),
    ("log(x**2)", r"takes log\(x\*\*2\), which is not finite at x = 0, where x\*\*2 = 0"),
    ("log(abs(x))", r"takes log\(Abs\(x\)\), which is not finite at x = 0"),
    ("x**0.5", r"takes sqrt\(x\), a fractional power of x, and x < 0 at x = -1: it is not real-valued there"),
    ("sqrt(x)", r"takes sqrt\(x\), a fractional power of x, and x < 0 at x = -1: it is not real-valued there"),
    ("x**(1/3)", r"a fractional power of x, and x < 0 at x = -1"),
    ("sqrt(x**2 - 1e-8)", r"a fractional power of x\*\*2 - 1/100000000, and .* < 0 at x = 0"),
    ("x**x", r"a variable power of x, and x < 0 at x = -1"),
    ("abs(x)**(-0.5)", r"a negative power of Abs\(x\), which is not finite at x = 0, where Abs\(x\) = 0"),
    ("abs(x)**0.5", r"The derivative phi'\(x\) = .*not finite at x = 0.*chi1 = sigma_w2 E\[phi'"),
    ("sqrt(abs(x))", r"The derivative phi'\(x\) = .*not finite at x = 0.*is infinite"),
    ("cot(x)", r"the function 'cot' is not allowed"),
]
ACCEPTED = ["sqrt(1 + x**2)", "log(1 + exp(x))", "abs(x)**1.5", "x/(1 + x**2)", "1/(1 + exp(-x))", "tanh(x)",
            "x*erf(x)", "log(cosh(x))", "log(1 + x**2)", "sech(x)", "1/(2 + cos(x))", "max(x, 0)**2",
            "1/sqrt(1 + x**2)", "x**2/(1 + abs(x))"]


@pytest.mark.parametrize("text, match", REFUSED)
def test_singular_formulas_refused_by_activation_and_q_map(text, match):
    with pytest.raises(FormulaError, match=match) as err:
        sf.activation(text)
    assert isinstance(err.value, ValueError) and "\n" not in str(err.value)
    if text != "cot(x)":
        assert "symfield needs phi(x) and phi'(x) finite and real-valued at every real x" in str(err.value)
    with pytest.raises(ValueError, match=match):
        sf.q_map(text, 1.0, 1.0, 0.0)




@pytest.mark.parametrize("text, base", [
    ("1/(cos(x) + x/10)", "cos(x) + x/10"),            # SymPy: ConditionSet -> the numeric scan
    ("1/(x + exp(x))", "x + exp(x)"),                   # ConditionSet (the root is -W(1))
    ("1/(x**3 - x + 0.3)", "x**3 - x + 0.3"),           # real root of a cubic
    ("1/(2 + sin(x) + x*cos(x)/100)", "2 + sin(x) + x*cos(x)/100"),   # first real zero near x = 173
])
def test_pole_point_is_a_zero(text, base):
    """The point the message names is a real zero of the denominator (mpmath at the printed digits)."""
    with pytest.raises(FormulaError, match="has a pole on the real line") as err:
        sf.activation(text)
    point = float(re.search(r"at x = (?:[^,=]* = )?(-?[0-9.e+-]+),", str(err.value)).group(1))
    fn = sp.lambdify(sp.Symbol("x"), sp.sympify(base), "mpmath")
    with mpmath.workdps(30):
        root = mpmath.findroot(fn, point)
    assert abs(root - point) <= 1e-5 * max(1, abs(point)), (point, root)


@pytest.mark.parametrize("text", ACCEPTED)
def test_regular_formulas_accepted(text):
    act = sf.activation(text)
    fn = sp.lambdify(X, act.expr, "mpmath")
    with mpmath.workdps(20):
        ref = mpmath.quad(lambda z: fn(z) ** 2 * mpmath.npdf(z), [-mpmath.inf, -1, 0, 1, mpmath.inf])
    assert abs(sf.q_map(act, 1.0, 1.0, 0.0) - float(ref)) <= 1e-10 * float(ref)


def _check_cli(args, code, out, err):
    assert code == 2, (args, out, err)
    assert out == "" and err.count("\n") == 1 and err.startswith("symfield: error: "), (args, err)
    assert "Traceback" not in err
    if args[1] in ("tan(x)", "1/cos(x)"):
        assert "pole on the real line at x = pi/2 = 1.5708, a zero of cos(x)" in err
    if args[1] == "1/(x**2 + 1e-12)":   # no real pole: the quadrature's error estimate refuses it
        assert "the float64 quadrature cannot resolve the integrand" in err


def test_cli_refuses_singular_formulas_in_one_line():
    """`python -m symfield ...` (subprocesses, run side by side): exit 2, one line on stderr, no traceback."""
    cases = [["map", "tan(x)", "--q", "1"], ["map", "1/cos(x)", "--q", "1"], ["map", "x**0.5", "--q", "1"],
             ["phase", "1/cos(x)"]]
    procs = [subprocess.Popen([sys.executable, "-m", "symfield", *a], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for a in cases]
    for args, p in zip(cases, procs):
        out, err = p.communicate(timeout=300)
        _check_cli(args, p.returncode, out, err)


@pytest.mark.parametrize("text", ["1/sin(x)", "1/x", "cot(x)", "log(x)", "sqrt(x)", "1/(x**2 + 1e-12)"])
def test_cli_main_refuses_singular_formulas(text, capsys):
    """The same through symfield.cli.main.main in this process."""
    from symfield.cli.main import main
    args = ["map", text, "--q", "1"]
    code = main(args)
    cap = capsys.readouterr()
    _check_cli(args, code, cap.out, cap.err)


# ---------------------------------------------------------------- float64 quadrature error estimate
def lorentz_exact(a, q):
    """E[1/(x^2 + a^2)], x ~ N(0, q)."""
    with mpmath.workdps(40):
        a, s = mpmath.mpf(a), mpmath.sqrt(q)
        b = a / s
        return float(mpmath.sqrt(mpmath.pi / 2) / b * mpmath.exp(b * b / 2) * mpmath.erfc(b / mpmath.sqrt(2)) / q)


def spike(x):
    return 1 / (x * x + 1e-12)


def test_quadrature_raises_on_a_spike():
    with pytest.raises(QuadratureError, match=r"E\[spike\(x\)\].*cannot resolve the integrand"):
        expect1(spike, 1.0, name="spike")
    with pytest.raises(ArithmeticError, match="cannot resolve"):
        expect2(spike, np.tanh, 1.0, 1.0, 0.5)
    with pytest.raises(ArithmeticError, match="cannot resolve"):
        expect2(np.tanh, spike, 1.0, 2.0, 0.5)
    with pytest.raises(ArithmeticError, match="cannot resolve"):   # a pole that slipped through
        expect1(np.tan, 1.0)


def test_quadrature_never_silently_wrong_on_near_poles():
    """1/(x^2 + a^2): either the value is within 1e-10 of the exact one (E|f| = the value) or QuadratureError;
    the wide ones (a >= 1) are accepted, the narrow ones (a <= 1e-3) refused."""
    for q in (1e-2, 1.0, 1e2):
        for a in np.geomspace(1e-6, 10, 15):
            try:
                val = expect1(lambda x: 1 / (x * x + a * a), q)
            except QuadratureError:
                assert a < 1, (q, a)
                continue
            assert a > 1e-3, (q, a)
            ref = lorentz_exact(a, q)
            assert abs(val - ref) <= 1e-10 * ref, (q, a, val, ref)


def test_quadrature_refuses_unresolved_oscillation():
    """sin^2 at q = 1e3: the panels beyond |x| = 40 are one sd wide (the old rule returned 0.4824 for 0.5)."""
    assert abs(expect1(lambda x: np.sin(x) ** 2, 10.0) - (1 - math.exp(-20)) / 2) <= 1e-14
    with pytest.raises(QuadratureError):
        expect1(lambda x: np.sin(x) ** 2, 1e3)


SMOOTH_BUILTINS = ["relu", "leaky_relu", "abs", "tanh", "erf", "sigmoid", "softplus", "silu", "gelu", "mish", "elu",
                   "linear"]


@pytest.mark.parametrize("name", SMOOTH_BUILTINS)
def test_quadrature_estimate_quiet_on_builtins(name):
    """The float64 rules themselves on phi, phi^2, phi'^2 of non-oscillating built-ins, q in [1e-8, 1e4]
    (1-D) and on (phi, phi), (phi', phi') for c = +-0.999999, +-0.3, q in {1e-8, 1, 1e3} (2-D; at 1e4 the
    overflowing exp of softplus/mish is redone node by node in mpmath: slow): no QuadratureError, and the
    1-D value of phi'^2 agrees with mpmath.quad (1e-10 relative)."""
    expr = sf.activation(name).expr
    d = sp.diff(expr, X).replace(sp.DiracDelta, lambda *a: sp.S.Zero)
    K = kinks(expr)
    f, df = vectorised(expr, NUMPY_MODULES), vectorised(d, NUMPY_MODULES)
    for q in np.geomspace(1e-8, 1e4, 7):
        expect1(f, q, kinks=K)
        expect1(lambda t: f(t) ** 2, q, kinks=K)
        expect1(lambda t: df(t) ** 2, q, kinks=K)
    for q, cs in ((1e-8, (-0.999999, 0.3, 0.999999)), (1.0, (-0.999999, 0.3, 0.999999)), (1e3, (-0.999999, 0.3))):
        for c in cs:
            expect2(f, f, q, 2 * q, c * q * math.sqrt(2), kinks=K)
            expect2(df, df, q, q, -c * q, kinks=K)
    dm = sp.lambdify(X, d.rewrite(sp.Piecewise) if d.has(sp.Heaviside, sp.sign) else d, "mpmath")
    with mpmath.workdps(20):
        ref = mpmath.quad(lambda z: dm(2 * z) ** 2 * mpmath.npdf(z), [-mpmath.inf, -1, 0, 1, mpmath.inf])
    assert abs(expect1(lambda t: df(t) ** 2, 4.0, kinks=K) - float(ref)) <= 1e-10 * float(ref)


@pytest.mark.slow
@pytest.mark.parametrize("pool", [None, "max", "avg"])
def test_builtin_maps_quiet_over_q_range(pool):
    """q_map, chi1 and qab_map of every built-in of the list (and its max2/avg2 pool), q in [1e-8, 1e4]:
    finite numbers, no QuadratureError.  Left out (not the quadrature; measured 2026-12-01): sin/cos+max2
    (level-set code: MemoryError, a 80 GB array) and elu+avg2 (~6 min)."""
    for name in SMOOTH_BUILTINS + ["sin", "cos"]:
        if (name, pool) in (("sin", "max"), ("cos", "max"), ("elu", "avg")):
            continue
        act = sf.activation(name, pool=pool, k=2) if pool else sf.activation(name)
        for q in (1e-8, 1e-2, 1.0, 1e2, 1e4):
            assert math.isfinite(sf.q_map(act, q, 1.0, 0.0)) and math.isfinite(sf.chi1(act, 1.0, 0.0, q=q))
        for q in (1e-8, 1.0, 1e4):
            assert math.isfinite(sf.qab_map(act, q, q, 0.5 * q, 1.0, 0.0))
