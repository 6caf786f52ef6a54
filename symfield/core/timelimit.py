"""Time and memory budgets for slow calls (sympy steps, a phase under a verify budget), on any thread.

One daemon watchdog thread per process serves a registry of active budgets (thread, deadline, memory
budget). When a wall-clock budget is spent, or the process's resident set has grown by more than the
memory budget, it raises an exception in the working thread with ``PyThreadState_SetAsyncExc``; Python
code sees it at its next bytecode, one long C call is not interrupted. The exception derives from
BaseException, is private to one call, is re-raised every :data:`REFIRE_SECONDS` while the call is
active, and never outlives its budget. At the call boundary it becomes :class:`TimeLimitExceeded`
(:func:`call_with_time_limit`) or :class:`TooExpensive` (:func:`bounded`). docs/numerics.md section 9.
"""
from __future__ import annotations

import ctypes
import itertools
import os
import threading
import time

from symfield.core.errors import TimeLimitExceeded, TooExpensive  # noqa: F401 (raised here, named here)

STEP_SECONDS = 60.0              # default wall-clock budget of one symbolic step (bounded())
STEP_MEMORY = 2 * 1024**3        # default budget of RSS growth during one step, bytes
POLL_SECONDS = 0.05              # how often the watchdog reads the RSS
REFIRE_SECONDS = 0.2             # an interrupt swallowed by the callee is raised again after this


class _Interrupt(BaseException):
    """Raised asynchronously in the working thread; one subclass per budgeted call."""


_lock = threading.Lock()          # guards the registry, the watchdog and every PyThreadState_SetAsyncExc
_wake = threading.Condition(_lock)
_active = {}                      # serial number (nesting order) -> _Budget
_serial = itertools.count()
_watchdog = None
_SET_ASYNC = ctypes.pythonapi.PyThreadState_SetAsyncExc
_STARTING = getattr(threading, "_limbo", {})   # threading's threads started but not yet running (in place)
_ran_out = 0                      # budgets of this process that ran out (see :func:`ran_out`)


CPU_WALL_FACTOR = 10.0           # a CPU budget's wall-clock cap, in multiples of its seconds


def _thread_clock():
    """The calling thread's CPU-time clock id, or None where the platform has none (wall clock then)."""
    try:
        return time.pthread_getcpuclockid(threading.get_ident())
    except (AttributeError, OSError):
        return None


def _rss() -> int:
    """Resident set size of this process in bytes (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _set_async(tid, exc):
    """Arm ``exc`` in thread ``tid`` (None: cancel a pending one); False when the thread is gone."""
    return _SET_ASYNC(ctypes.c_ulong(tid), None if exc is None else ctypes.py_object(exc)) > 0


def _fire(tid, exc):
    """Arm ``exc`` in thread ``tid`` unless a thread is starting: True (armed), None (try again), False (gone).

    CPython gives a new thread's state its creator's id until the new thread runs, and the call arms
    the first state with the id: the starting thread would die of it and its creator wait in
    Thread.start for ever. Check and call run without a bytecode between them that could switch threads."""
    args = ctypes.c_ulong(tid), ctypes.py_object(exc)
    n = None if _STARTING else _SET_ASYNC(*args)
    return None if n is None else n > 0


class _Budget:
    """One budgeted call: its thread, deadline, memory budget and private _Interrupt subclass.

    ``cpu``: ``seconds`` counts the working thread's CPU time (where the platform has per-thread CPU
    clocks), so a machine busy with other work does not shrink the budget; a wall-clock cap of
    CPU_WALL_FACTOR x seconds still stops a thread that waits instead of working."""

    def __init__(self, seconds, memory, cpu=False):
        self.seconds, self.memory = seconds, memory
        self.exc = type("_Interrupt", (_Interrupt,), {})
        self.tid = threading.get_ident()
        self.key = self.deadline = self.deadline_wall = self.reason = self.fired = None
        self.start_rss = 0
        self.leaving = False      # set first thing on exit: the watchdog no longer fires it
        self.clock = _thread_clock() if cpu and seconds else None
        self.cpu_start = time.clock_gettime(self.clock) if self.clock is not None else 0.0

    def cpu_left(self):
        """CPU seconds left (None: a wall-clock budget); a lower bound on the wall time until it is spent."""
        if self.clock is None:
            return None
        try:
            return self.seconds - (time.clock_gettime(self.clock) - self.cpu_start)
        except OSError:           # the thread has ended
            return 0.0

    def spent(self, now, rss):
        """The reason the budget is spent ("0.5 s", "5 s of CPU", "200 MB of memory"), else None."""
        left = self.cpu_left()
        if left is not None and left <= 0:
            return f"{self.seconds:g} s of CPU"
        if self.deadline is not None and now >= self.deadline:
            return f"{self.seconds:g} s" if self.clock is None else f"{self.deadline_wall:g} s of wall time"
        if self.memory and rss - self.start_rss > self.memory:
            return f"{self.memory / 1024**2:.0f} MB of memory"
        return None


def _spent_outermost(tid):
    """The outermost spent budget of thread ``tid`` still running (the one to fire), else None."""
    for key in sorted(_active):
        b = _active[key]
        if b.tid == tid and b.reason is not None and not b.leaving:
            return b
    return None


def _tick(now):
    """Fire what is due (lock held); seconds until the next look (None: nothing to watch)."""
    rss = _rss() if any(b.memory and not b.leaving for b in _active.values()) else 0
    wait = None
    for b in list(_active.values()):
        if b.reason is None and not b.leaving:
            b.reason = b.spent(now, rss)
        if b.reason is None and not b.leaving:
            left = b.cpu_left()
            until = min(b.deadline - now if b.deadline is not None else POLL_SECONDS,
                        POLL_SECONDS if b.memory else float("inf"),
                        max(left, POLL_SECONDS) if left is not None else float("inf"))
            wait = until if wait is None else min(wait, until)
    for tid in {b.tid for b in _active.values()}:
        b = _spent_outermost(tid)
        if b is None:
            continue
        if b.fired is None or now - b.fired >= REFIRE_SECONDS:
            armed = _fire(tid, b.exc)
            if armed is None:                    # a thread is starting: again in a moment
                wait = 0.001
                continue
            if not armed:                        # the thread ended without leaving: forget it
                for key in [k for k, x in _active.items() if x.tid == tid]:
                    del _active[key]
                continue
            b.fired = now
        until = b.fired + REFIRE_SECONDS - now
        wait = until if wait is None else min(wait, until)
    return None if wait is None else max(wait, 0.001)


def _watch():
    """The watchdog thread: sleeps until the next deadline, poll or re-fire."""
    with _wake:
        while True:
            _wake.wait(_tick(time.monotonic()))


def _enter(budget):
    """Register ``budget`` (starting the watchdog if this process has none running)."""
    global _watchdog
    if budget.memory:
        budget.start_rss = _rss()
    with _lock:
        for key in [k for k, b in _active.items() if b.tid == budget.tid and b.leaving]:
            del _active[key]   # left by an exit that an outer interrupt cut short
        if _watchdog is None or not _watchdog.is_alive():
            _watchdog = threading.Thread(target=_watch, name="symfield-budget", daemon=True)
            _watchdog.start()
        budget.deadline_wall = budget.seconds * (CPU_WALL_FACTOR if budget.clock is not None else 1) \
            if budget.seconds else None
        budget.deadline = time.monotonic() + budget.deadline_wall if budget.seconds else None
        budget.key = next(_serial)
        _active[budget.key] = budget
        _wake.notify()


def _leave(budget):
    """Unregister ``budget`` and the budgets nested in it; cancel a pending interrupt of the thread
    and re-arm the one of a spent outer budget (so that one still propagates)."""
    with _lock:
        if budget.key is None:
            return
        for key in [k for k, b in _active.items() if b.tid == budget.tid and k >= budget.key]:
            del _active[key]
        budget.key = None
        _set_async(budget.tid, None)
        outer = _spent_outermost(budget.tid)
        if outer is not None:
            outer.fired = time.monotonic()
            _set_async(budget.tid, outer.exc)


def _after_fork():
    """In a forked child: a fresh lock, only the forking thread's budgets, a new watchdog when needed."""
    global _lock, _wake, _watchdog
    _lock = threading.Lock()
    _wake = threading.Condition(_lock)
    me = threading.get_ident()
    for key in [k for k, b in _active.items() if b.tid != me]:
        del _active[key]
    _watchdog = None
    if _active:
        _watchdog = threading.Thread(target=_watch, name="symfield-budget", daemon=True)
        _watchdog.start()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _run(seconds, memory, fn, args, kwargs, cpu=False):
    """(True, fn(...)) or (False, reason) when the budget ran out."""
    budget = _Budget(seconds, memory, cpu)
    try:
        try:
            _enter(budget)
            return True, fn(*args, **kwargs)
        finally:
            budget.leaving = True   # a plain store: no interrupt can land before it
            _leave(budget)
    except budget.exc:   # at most one more can arrive (set before `leaving`): it lands here or above
        global _ran_out
        _leave(budget)
        _ran_out += 1
        return False, budget.reason


def ran_out() -> int:
    """How many budgets of this process have run out so far, on any thread: a result computed after one did may
    hold a fallback taken for lack of time (directly or from a memo table), and so depend on the machine's speed."""
    return _ran_out


def call_with_time_limit(seconds, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, stopped with :class:`TimeLimitExceeded` after ``seconds`` of wall time.

    ``seconds`` None or <= 0: no limit (``fn`` runs to the end). Works on any thread."""
    if seconds is None or seconds <= 0:
        return fn(*args, **kwargs)
    ok, value = _run(seconds, None, fn, args, kwargs)
    if not ok:
        raise TimeLimitExceeded(f"time limit of {seconds:g} s exceeded")
    return value


def call_with_cpu_limit(seconds, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, stopped with :class:`TimeLimitExceeded` after ``seconds`` of the calling
    thread's CPU time (wall time where the platform has no thread CPU clock), or after
    ``CPU_WALL_FACTOR * seconds`` of wall time. A budget of work done: other load on the machine does not
    spend it. ``seconds`` None or <= 0: no limit."""
    if seconds is None or seconds <= 0:
        return fn(*args, **kwargs)
    ok, value = _run(seconds, None, fn, args, kwargs, cpu=True)
    if not ok:
        raise TimeLimitExceeded(f"time limit of {value} exceeded")
    return value


def bounded(step, formula, fn, *args, seconds=None, memory=None, **kwargs):
    """``fn(*args, **kwargs)`` under a time and memory budget (defaults :data:`STEP_SECONDS`,
    :data:`STEP_MEMORY`; 0 switches one off), else :class:`TooExpensive` naming ``step`` and ``formula``."""
    seconds = STEP_SECONDS if seconds is None else seconds
    memory = STEP_MEMORY if memory is None else memory
    if not seconds and not memory:
        return fn(*args, **kwargs)
    ok, value = _run(seconds or None, memory or None, fn, args, kwargs)
    if not ok:
        raise TooExpensive(f"too expensive: {step} of {formula!r} exceeded {value}")
    return value
