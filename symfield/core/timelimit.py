"""Time and memory budgets for slow calls (sympy steps, a phase under a verify budget), on any thread.

A watchdog thread waits beside the call. When the wall-clock budget is spent, or the resident set
size of the process (``/proc/self/statm``) has grown by more than the memory budget since the call
started, it raises an exception in the working thread with ``PyThreadState_SetAsyncExc``. Python
code (all of SymPy, most of mpmath) sees it at its next bytecode; one long C call (a huge integer
power) is not interrupted, which is why the formula parser bounds numbers before SymPy sees them.

The injected exception derives from BaseException (so ``except Exception`` inside SymPy does not
swallow it), is private to one call (so nested budgets do not steal each other's interrupts) and is
re-raised every :data:`REFIRE_SECONDS` until the call has unwound. At the call boundary it becomes
:class:`TimeLimitExceeded` (:func:`call_with_time_limit`) or :class:`TooExpensive` (:func:`bounded`).
"""
from __future__ import annotations

import ctypes
import os
import threading
import time

STEP_SECONDS = 60.0              # default wall-clock budget of one symbolic step (bounded())
STEP_MEMORY = 2 * 1024**3        # default budget of RSS growth during one step, bytes
POLL_SECONDS = 0.05              # how often the watchdog reads the RSS
REFIRE_SECONDS = 0.2             # an interrupt swallowed by the callee is raised again after this


class TimeLimitExceeded(Exception):
    """The call ran longer than its time limit."""


class TooExpensive(ValueError):
    """A symbolic step ran past its time or memory budget (one line: step, formula, budget)."""


class _Interrupt(BaseException):
    """Raised asynchronously in the working thread; one subclass per budgeted call."""


def _rss() -> int:
    """Resident set size of this process in bytes (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class _Watchdog:
    """Interrupts thread ``tid`` with its own _Interrupt subclass past ``seconds`` or ``memory`` bytes."""

    def __init__(self, seconds, memory):
        self.seconds, self.memory = seconds, memory
        self.exc = type("_Interrupt", (_Interrupt,), {})
        self.tid = threading.get_ident()
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.reason = None
        self.thread = threading.Thread(target=self._watch, name="symfield-budget", daemon=True)

    def start(self):
        self.start_rss = _rss()
        self.deadline = time.monotonic() + self.seconds if self.seconds else None
        self.thread.start()

    def _watch(self):
        fired = None
        while not self.done.wait(POLL_SECONDS):
            now = time.monotonic()
            if self.reason is None:
                if self.deadline is not None and now >= self.deadline:
                    self.reason = f"{self.seconds:g} s"
                elif self.memory and _rss() - self.start_rss > self.memory:
                    self.reason = f"{self.memory / 1024**2:.0f} MB of memory"
            if self.reason is not None and (fired is None or now - fired >= REFIRE_SECONDS):
                with self.lock:
                    if self.done.is_set():
                        return
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.tid), ctypes.py_object(self.exc))
                fired = now

    def stop(self):
        """Stop the watchdog and clear an interrupt it set but the thread has not yet seen."""
        with self.lock:
            self.done.set()
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.tid), None)


def _run(seconds, memory, fn, args, kwargs):
    """(True, fn(...)) or (False, reason) when the budget ran out."""
    dog = _Watchdog(seconds, memory)
    try:
        try:
            dog.start()
            return True, fn(*args, **kwargs)
        finally:
            dog.stop()
    except dog.exc:
        while True:   # an interrupt may land inside the except clause before stop() took the lock
            try:
                dog.stop()
                break
            except dog.exc:
                continue
        return False, dog.reason


def call_with_time_limit(seconds, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, stopped with :class:`TimeLimitExceeded` after ``seconds`` of wall time.

    ``seconds`` None or <= 0: no limit (``fn`` runs to the end). Works on any thread."""
    if seconds is None or seconds <= 0:
        return fn(*args, **kwargs)
    ok, value = _run(seconds, None, fn, args, kwargs)
    if not ok:
        raise TimeLimitExceeded(f"time limit of {seconds:g} s exceeded")
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
