"""Bounded parsing and symbolic work: parser limits before SymPy, budgets on any thread, bounded probes."""
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import mpmath
import pytest
import sympy as sp

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
    monkeypatch.setattr(K, "STEP_SECONDS", 0.05)
    act = A.activation("x*erf(x)/3")   # the stein reduction and its simplification: far longer than 0.05 s
    with pytest.raises(timelimit.TooExpensive,
                       match=r"^too expensive: the expectation V of 'x\*erf\(x\)/3' exceeded 0.05 s$"):
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
