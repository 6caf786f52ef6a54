"""Bounded parsing and symbolic work: parser limits before SymPy, budgets on any thread, bounded probes."""
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import mpmath
import numpy as np
import pytest
import sympy as sp
from sympy.core.cache import clear_cache

from symfield.core import timelimit
from symfield.symbolic import activation as A
from symfield.symbolic import formula as F
from symfield.symbolic import kernel as K

x = F.X


def _spin(seconds, swallow=False):
    """Pure-Python busy loop; with swallow, every Exception inside is caught (like much of SymPy)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        try:
            sum(range(200))
        except Exception:
            if not swallow:
                raise
    return "finished"


@pytest.mark.parametrize("text,limit", [
    ("exp(exp(exp(x-7)))", "nested exp"),
    ("exp(exp(exp(x)))", "nested exp"),
    ("x+((((10**30)**64)**64)**64)**64", "1e300"),
    ("max(2**-11**-44, x)", "q <= 10000"),
    ("x+exp(exp(467071))", "1e300"),
    ("(((x**64)**64)**64)**64", "degree in x above 64"),
    ("x**64*x**2", "degree in x above 64"),
    ("(x**64+1)**64", "degree in x above 64"),
    ("x+1e301", "1e300"),
    ("x*1e-301", "1e-300"),
    ("sqrt(-2)*x", "not real"),
    ("2**0.123456789*x", "q <= 10000"),
    ("x" + "+sin(x" * 41 + ")" * 41, "nested more than 40"),
    ("-" * 3000 + "x", "longer than 2000"),
])
def test_parser_refuses_before_sympy(text, limit):
    t0 = time.perf_counter()
    with pytest.raises(F.FormulaError) as err:
        F.parse(text)
    assert time.perf_counter() - t0 < 1.0
    msg = str(err.value)
    assert limit in msg and "\n" not in msg and text[:20] in msg


@pytest.mark.parametrize("text,expected", [
    ("x**(1/3)", x ** sp.Rational(1, 3)), ("abs(x)**1.5", sp.Abs(x) ** sp.Rational(3, 2)),
    ("x**64", x**64), ("x**-64", x**-64), ("exp(-exp(x))", sp.exp(-sp.exp(x))),
    ("x*1e-20 + 1e300", x / 10**20 + 10**300), ("-(-(x))", x), ("max(pi, e, x)", sp.Max(sp.pi, sp.E, x)),
])
def test_parser_keeps_formulas_within_the_limits(text, expected):
    assert sp.simplify(F.parse(text) - expected) == 0


def test_time_limit_works_off_the_main_thread():
    def job():
        t0 = time.perf_counter()
        with pytest.raises(timelimit.TimeLimitExceeded):
            timelimit.call_with_time_limit(0.3, _spin, 10)
        return time.perf_counter() - t0
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(job).result() < 2.0


def test_interrupt_is_not_swallowed_and_not_left_pending():
    t0 = time.perf_counter()
    with pytest.raises(timelimit.TimeLimitExceeded):
        timelimit.call_with_time_limit(0.3, _spin, 10, swallow=True)
    assert time.perf_counter() - t0 < 2.0
    assert timelimit.call_with_time_limit(5, _spin, 0.05) == "finished"
    assert _spin(0.5) == "finished"   # no interrupt arrives after the call has returned


def test_nested_budgets_keep_their_own_interrupts():
    def inner():
        try:
            return timelimit.call_with_time_limit(10, _spin, 5)
        except timelimit.TimeLimitExceeded:
            return "inner swallowed the outer limit"
    t0 = time.perf_counter()
    with pytest.raises(timelimit.TimeLimitExceeded):
        timelimit.call_with_time_limit(0.4, inner)
    assert time.perf_counter() - t0 < 2.0


def test_memory_budget_stops_a_growing_step():
    def grow():
        chunks = []
        while True:
            chunks.append(bytearray(8 * 1024**2))   # zero-filled: resident at once
    with pytest.raises(timelimit.TooExpensive, match=r"too expensive: growth of 'f' exceeded 200 MB of memory"):
        timelimit.bounded("growth", "f", grow, seconds=30, memory=200 * 1024**2)
    assert isinstance(timelimit.TooExpensive("m"), ValueError)


def test_kernel_step_budget_gives_one_clean_error(monkeypatch):
    # V is the first budgeted step, so a budget far below its cost must stop it there. SymPy's own
    # global cache (sympy.core.cache) survives symfield's caches.clear(): after other tests derived
    # x*erf(x), V of x*erf(x)/3 took 0.028 s (0.057 s from an empty SymPy cache, dpsi2 0.072 s), so a
    # 0.05 s budget let V through and stopped dpsi2. Empty SymPy's cache and budget 0.005 s.
    clear_cache()
    monkeypatch.setattr(K, "STEP_SECONDS", 0.005)
    act = A.activation("x*erf(x)/3")   # the stein reduction and its simplification: ~0.06 s from cold
    with pytest.raises(timelimit.TooExpensive,
                       match=r"^too expensive: the expectation V of 'x\*erf\(x\)/3' exceeded 0.005 s$"):
        K.kernel(act)
    monkeypatch.undo()
    assert K.kernel(act).methods["V"] == "stein"   # not cached as failed: the next call derives it


def test_probes_are_bounded_even_past_the_parser():
    # a tower the parser refuses, handed straight to the probes: refused, not MemoryError / hours of work
    t0 = time.perf_counter()
    with pytest.raises(F.FormulaError, match="refused rather than probed|diverge"):
        A.check_gaussian_moments(sp.exp(sp.exp(sp.exp(x - 7))), "exp(exp(exp(x-7)))")
    assert time.perf_counter() - t0 < 5.0
    f = A.mp_function(sp.exp(sp.exp(x)) + sp.Abs(x) ** sp.Rational(1, 2))
    with mpmath.workdps(A.PROBE_DPS), pytest.raises(OverflowError):
        f(mpmath.mpf(3000))
    with mpmath.workdps(A.PROBE_DPS):   # below the limits the value is the ordinary one
        assert mpmath.almosteq(f(mpmath.mpf(2)), mpmath.exp(mpmath.exp(2)) + mpmath.sqrt(2), 1e-25)


def test_budget_threads_do_not_accumulate():
    before = threading.active_count()
    for _ in range(20):
        timelimit.call_with_time_limit(1.0, sum, range(10))
    time.sleep(0.3)
    assert threading.active_count() <= before + 1


# ---------------------------------------------------------------- issue 28 item 0b: the expm1 rewrite is bounded
def _xsig_dV_integrand():
    """x phi phi' of x*sigmoid(1.702 x), expanded as the kernel's dV integrand: SymPy's expm1 rewrite
    factors it as a polynomial of degree 851 in exp(x/500) (ran for hours)."""
    phi = A.activation("x*sigmoid(1.702*x)").expr
    return sp.expand(x * phi * sp.diff(phi, x))


def test_the_factoring_rewrite_runs_under_its_budget_and_the_fallback_is_accurate():
    from symfield.numeric import evaluate as EV
    f = _xsig_dV_integrand()
    with pytest.raises(timelimit.TooExpensive, match="too expensive: the expm1/log1p rewrite"):
        EV._factored_rewrite(f)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no cancellation near 0 here: no warning
        fn = EV.vectorised(f, EV.NUMPY_MODULES)
    exact = sp.lambdify(x, f, modules="mpmath")
    pts = [-30.0, -2.5, -1e-9, 0.0, 1e-12, 0.7, 4.0, 40.0]
    got = fn(np.array(pts))
    with mpmath.workdps(30):
        for p, g in zip(pts, got):
            want = exact(mpmath.mpf(p))
            # 1e-13: exp's argument (51 at x = -30) rounded in float64 is the only loss (condition number 51)
            assert abs(g - want) <= 1e-13 * abs(want) + 1e-300, (p, g, want)


def test_the_fallback_rewrite_flags_a_cancellation_it_does_not_remove(monkeypatch):
    from symfield.numeric import evaluate as EV

    def too_slow(f):
        raise timelimit.TooExpensive("too expensive: the expm1/log1p rewrite of 'f' exceeded 2 s")
    monkeypatch.setattr(EV, "_factored_rewrite", too_slow)
    fn = EV.vectorised(sp.exp(x) - 1, EV.NUMPY_MODULES)   # as written: expm1, accurate at 1e-14
    assert fn(np.array([1e-14]))[0] == pytest.approx(1e-14, rel=1e-13)
    with pytest.warns(RuntimeWarning, match=r"loses digits near x = 1e-12"):   # (e^x - 1)^2 expanded
        EV.vectorised(sp.exp(2 * x) - 2 * sp.exp(x) + 1, EV.NUMPY_MODULES)


def test_derive_and_activation_of_the_reported_formula_finish(tmp_path):
    """symfield derive "x*sigmoid(1.702*x)" ran 180 s (no output) on the unbounded rewrite."""
    from symfield.cli.main import main
    assert str(A.activation("x*sigmoid(1.702*x)").expr) == "x/(1 + exp(-851*x/500))"
    assert main(["derive", "x*sigmoid(1.702*x)", "-o", str(tmp_path / "d.tex")]) == 0
    assert (tmp_path / "d.tex").stat().st_size > 1000


# ---------------------------------------------------------------- no 300-digit exact constants
@pytest.mark.parametrize("text", ["softplus(tanh(x)-1e-300)", "1e-29**10*x+tanh(x)", "tanh(x)+10**30*10**30*x"])
def test_constants_beyond_30_digits_are_floats(text):
    """1e-300 was the exact 1/10^300: SymPy's gcd in a series of the propagate tables ran for hours."""
    expr = F.parse(text)
    assert all(abs(r.p) <= F.MAX_EXACT and r.q <= F.MAX_EXACT for r in expr.atoms(sp.Rational)), expr
    assert expr.atoms(sp.Float) or text.startswith("softplus")   # exp(-1e-300) evaluates to 1.0
    value = float(expr.subs(x, sp.Rational(1, 3)))
    with mpmath.workdps(40):   # the value is that of the exact formula
        t = mpmath.tanh(mpmath.mpf(1) / 3)
        exact = {"softplus(tanh(x)-1e-300)": mpmath.log(1 + mpmath.exp(t - mpmath.mpf("1e-300"))),
                 "1e-29**10*x+tanh(x)": mpmath.mpf("1e-290") / 3 + t,
                 "tanh(x)+10**30*10**30*x": t + mpmath.mpf(10) ** 60 / 3}[text]
        assert abs(value - exact) <= 1e-15 * abs(exact)


@pytest.mark.slow
def test_propagate_of_a_tiny_constant_formula_finishes():
    import symfield as sf
    a = sf.propagate("softplus(tanh(x)-1e-300)", 1.5, 0.1, 3)
    b = sf.propagate("softplus(tanh(x))", 1.5, 0.1, 3)
    assert a.q == pytest.approx(b.q, rel=1e-12)
