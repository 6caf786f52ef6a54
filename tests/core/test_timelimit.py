"""Budgets on many threads at once: no interrupt outlives its budget, one watchdog thread per process,
and a spent outer budget surfaces as the outer's error through the inner budgets it interrupts.

Each check is a function of the timelimit module, so the same logic can be run against another
implementation of it (the old thread-per-call one failed all three)."""
import random
import sys
import threading
import time

from symfield.core import timelimit

WORKERS = 4


def _spin(seconds):
    """Pure-Python busy loop (an async exception lands at its next bytecode)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        sum(range(50))
    return "finished"


def _quiet(seconds):
    """Spin ``seconds`` outside every budget; the exception that arrives meanwhile (a stray), else None."""
    try:
        _spin(seconds)
    except BaseException as err:   # noqa: B036 - exactly what must not happen
        return err
    return None


def _on_threads(job, n=WORKERS):
    """``job(rng)`` on ``n`` threads at once; the list of what escaped them (strings)."""
    errors = []

    def run(seed):
        try:
            job(random.Random(seed))
        except BaseException as err:   # noqa: B036 - any escape is a failure
            errors.append(f"{type(err).__name__}: {err}")
    threads = [threading.Thread(target=run, args=(seed,), daemon=True) for seed in range(n)]
    for t in threads:
        t.start()
    end = time.monotonic() + 60
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    assert not any(t.is_alive() for t in threads), f"a budgeted thread hung; escaped: {errors}"
    return errors


def stray_interrupts(tl, rounds=40):
    """Outer budgets of 2-30 ms around loops of inner budgets (2-100 ms) of work up to 1 ms: every
    call ends with its own error or a value, and nothing arrives after it (past REFIRE_SECONDS and
    every inner deadline)."""
    def job(rng):
        for _ in range(rounds):
            def inner_loop():
                for _ in range(rng.randint(1, 300)):
                    try:
                        tl.bounded("inner", "f", _spin, rng.uniform(0, 0.001),
                                   seconds=rng.choice([0.002, 0.05, 0.1]), memory=0)
                    except tl.TooExpensive:
                        pass
            try:
                tl.call_with_time_limit(rng.uniform(0.002, 0.03), inner_loop)
            except tl.TimeLimitExceeded:
                pass
            stray = _quiet(0.002)
            assert stray is None, f"stray {type(stray).__name__} after a budgeted call"
        stray = _quiet(0.1 + tl.REFIRE_SECONDS + 0.1)
        assert stray is None, f"stray {type(stray).__name__} after all budgeted calls"
    return _on_threads(job)


def thread_growth(tl, depth=3, rounds=20):
    """Most threads alive inside ``depth`` nested budgets on WORKERS threads, minus those before."""
    before = threading.active_count()
    peak = [0]

    def nest(level):
        if level == depth:
            peak[0] = max(peak[0], threading.active_count())
            return _spin(0.001)
        return tl.call_with_time_limit(10.0, nest, level + 1)

    def job(rng):
        for _ in range(rounds):
            nest(0)
    errors = _on_threads(job)
    assert not errors, errors
    return peak[0] - before


def outer_surfaces(tl, rounds=40):
    """A spent outer budget (5-30 ms) interrupting inner budgets of 10 s entered and left in a loop:
    each round ends with the outer's TimeLimitExceeded, within 2 s; the list of what else happened."""
    def job(rng):
        for _ in range(rounds):
            def many_inner():
                while True:
                    tl.bounded("inner", "f", _spin, rng.uniform(0, 0.002), seconds=10.0)
            t0 = time.perf_counter()
            try:
                tl.call_with_time_limit(rng.uniform(0.005, 0.03), many_inner)
                raise AssertionError("the outer budget never fired")
            except tl.TimeLimitExceeded:
                pass
            assert time.perf_counter() - t0 < 2.0, "the outer budget fired late"
            stray = _quiet(0.002)
            assert stray is None, f"stray {type(stray).__name__} after a budgeted call"
        stray = _quiet(tl.REFIRE_SECONDS + 0.1)
        assert stray is None, f"stray {type(stray).__name__} after all budgeted calls"
    return _on_threads(job)


def threads_started_under_budgets(tl, rounds=60):
    """Outer budgets of 2-30 ms around a loop that starts and joins threads: each round ends with
    TimeLimitExceeded, no started thread dies of the interrupt and no Thread.start hangs."""
    died = []

    def job(rng):
        for _ in range(rounds):
            def starter():
                while True:
                    t = threading.Thread(target=sum, args=(range(10),))
                    t.start()
                    t.join()
            try:
                tl.call_with_time_limit(rng.uniform(0.002, 0.03), starter)
                raise AssertionError("the budget never fired")
            except tl.TimeLimitExceeded:
                pass
    hooks = threading.excepthook, sys.unraisablehook
    threading.excepthook = sys.unraisablehook = lambda args: died.append(args.exc_type.__name__)
    try:
        errors = _on_threads(job, 2)
    finally:
        threading.excepthook, sys.unraisablehook = hooks
    return errors + died


def test_no_interrupt_outlives_its_budget():
    assert stray_interrupts(timelimit) == []


def test_one_watchdog_thread_however_deep_the_nesting():
    # WORKERS job threads, plus at most the one watchdog (if no budget ran before in this process)
    assert thread_growth(timelimit) <= WORKERS + 1


def test_spent_outer_budget_surfaces_through_inner_budgets():
    assert outer_surfaces(timelimit) == []


def test_budgeted_code_may_start_threads():
    assert threads_started_under_budgets(timelimit) == []


def test_outer_error_not_converted_by_an_active_inner_budget():
    """The inner budget (30 s) is active when the outer one (0.2 s) fires: the caller sees the outer's
    TimeLimitExceeded, not the inner's TooExpensive, and nothing arrives afterwards."""
    seen = []

    def inner():
        try:
            return timelimit.bounded("inner", "f", _spin, 5.0, seconds=30.0)
        except timelimit.TooExpensive as err:   # must not happen: the inner budget is not spent
            seen.append(err)
            raise
    t0 = time.perf_counter()
    try:
        timelimit.call_with_time_limit(0.2, inner)
        raise AssertionError("the outer budget never fired")
    except timelimit.TimeLimitExceeded as err:
        assert "0.2 s" in str(err)
    assert time.perf_counter() - t0 < 2.0 and seen == []
    assert _quiet(timelimit.REFIRE_SECONDS + 0.1) is None


# ---- CPU-time budgets (verify's phase checks): work done, not wall time
def test_cpu_budget_stops_work_after_its_cpu_seconds():
    t0 = time.perf_counter()
    try:
        timelimit.call_with_cpu_limit(0.3, _spin, 30.0)
    except timelimit.TimeLimitExceeded as err:
        assert "0.3 s of CPU" in str(err)
    else:
        raise AssertionError("a CPU budget of 0.3 s let 30 s of work finish")
    assert time.perf_counter() - t0 < 10.0


def test_cpu_budget_is_not_spent_by_waiting_or_by_other_threads():
    """A call that waits 1 s (no CPU of its own) while another thread burns CPU finishes under a 0.4 s CPU
    budget (a wall-clock budget would stop it); its wall-clock cap (10x) still stops one that waits longer."""
    burner = threading.Thread(target=_quiet, args=(1.5,), daemon=True)
    burner.start()
    assert timelimit.call_with_cpu_limit(0.4, lambda: (time.sleep(1.0), "waited")[1]) == "waited"
    burner.join()
    def waits():
        for _ in range(200):
            time.sleep(0.05)
    try:
        timelimit.call_with_cpu_limit(0.1, waits)
    except timelimit.TimeLimitExceeded as err:
        assert "1 s of wall time" in str(err)
    else:
        raise AssertionError("the wall-clock cap of a CPU budget did not fire")
