"""Grammar fuzzer: random formulas over the allow-list through ``symfield kernel``, in-process.

Each formula must end in one of two ways within a wall budget: rc 0 (a kernel), or rc 2 with
exactly one stderr line that is a clean refusal (no traceback, no "internal error"). The symbolic
budgets are lowered for the run so that the wall budget can hold every example; what is checked
is that the budgets (and the parser bounds before them) really bound the work.
"""
import contextlib
import io
import time
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from symfield.cli.main import main
from symfield.symbolic import activation as A
from symfield.symbolic import kernel as K
from symfield.symbolic.formula import ARITY, FUNCTIONS

WALL_SECONDS = 20.0
NUMBERS = ["0", "1", "2", "3", "0.5", "1.37", "7", "64", "65", "467071", "1e30", "10**30", "1e300", "1e-300",
           "1e-20", "1e400", "11**-44", "2**-11**-44", "(10**30)**64", "pi", "e"]


def formulas():
    """Random formula text: numbers (tiny, huge), x, + - * / **, unary minus, allowed functions, nesting."""
    leaf = st.one_of(st.just("x"), st.sampled_from(NUMBERS),
                     st.floats(-1e6, 1e6, allow_nan=False).map(repr), st.integers(-10**6, 10**6).map(str))

    def extend(inner):
        binop = st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "**"]), inner).map(
            lambda t: f"({t[0]}){t[1]}({t[2]})")
        unary = inner.map(lambda a: f"-({a})")
        call = st.sampled_from(sorted(FUNCTIONS)).flatmap(
            lambda name: st.lists(inner, min_size=ARITY.get(name, (1, 1))[0],
                                  max_size=ARITY.get(name, (1, 1))[0] + (1 if name in ARITY else 0)).map(
                lambda args: f"{name}({', '.join(args)})"))
        return st.one_of(binop, unary, call)
    return st.recursive(leaf, extend, max_leaves=10)


def outcome(text):
    """'ok' | 'refused' after checking the CLI's contract for one formula; AssertionError otherwise."""
    out, err = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["kernel", text])
    seconds = time.perf_counter() - t0
    lines = err.getvalue().splitlines()
    assert seconds < WALL_SECONDS, f"{text!r}: {seconds:.1f} s"
    assert rc in (0, 2), (text, rc, err.getvalue())
    assert "Traceback" not in err.getvalue(), (text, err.getvalue())
    if rc == 0:
        assert out.getvalue().startswith("kernel of "), (text, out.getvalue())
        return "ok"
    assert len(lines) == 1 and lines[0].startswith("symfield: error:"), (text, err.getvalue())
    assert "internal error" not in lines[0], (text, lines[0])
    return "too expensive" if "too expensive" in lines[0] else "refused"


def _fuzz(monkeypatch, examples):
    monkeypatch.setattr(K, "KERNEL_SECONDS", 8.0)
    monkeypatch.setattr(K, "STEP_SECONDS", 5.0)
    monkeypatch.setattr(A, "CHECK_SECONDS", 4.0)
    monkeypatch.setattr(A, "PROBE_SECONDS", 3.0)
    stats = Counter()

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(formulas())
    def run(text):
        stats[outcome(text)] += 1
    run()
    print(f"fuzz: {sum(stats.values())} examples, {dict(stats)}, crashes 0")
    return stats


def test_fuzzed_formulas_work_or_fail_cleanly(monkeypatch):
    stats = _fuzz(monkeypatch, 30)
    assert stats["ok"] > 0 and stats["refused"] > 0, stats   # the grammar reaches both outcomes


@pytest.mark.slow
def test_fuzzed_formulas_many(monkeypatch):
    _fuzz(monkeypatch, 400)


@pytest.mark.parametrize("text", ["exp(exp(exp(x-7)))", "exp(exp(exp(x)))", "x+((((10**30)**64)**64)**64)**64",
                                  "max(2**-11**-44, x)", "x+exp(exp(467071))", "(((x**64)**64)**64)**64"])
def test_reported_formulas_are_refused_in_one_line_at_once(text):
    """Refused before any expensive work: a CPU-time guard against runaway work (not a speed claim)."""
    t0 = time.process_time()
    assert outcome(text) == "refused"
    assert time.process_time() - t0 < 2.0
