"""One wall-clock time limit for slow calls (sympy.integrate, a phase under a verify budget).

The limit is a SIGALRM timer (``signal.setitimer(ITIMER_REAL, seconds)``), so it can only be set on
the main thread of the main interpreter: elsewhere (a Dask worker thread, a thread pool) the call runs
without a limit, and :func:`available` tells a caller that prefers to skip the slow step instead.
The previous SIGALRM handler is restored and the timer cleared when the call returns or raises.
"""
from __future__ import annotations

import signal
import threading


class TimeLimitExceeded(Exception):
    """The call ran longer than its time limit (raised inside it by the SIGALRM handler)."""


def available() -> bool:
    """True when a time limit can be set here (the main thread, where SIGALRM is delivered)."""
    return threading.current_thread() is threading.main_thread()


def call_with_time_limit(seconds, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, interrupted with :class:`TimeLimitExceeded` after ``seconds`` of wall time.

    ``seconds`` None or <= 0, or not on the main thread: no limit (``fn`` runs to the end)."""
    if seconds is None or seconds <= 0 or not available():
        return fn(*args, **kwargs)

    def handler(signum, frame):
        raise TimeLimitExceeded(f"time limit of {seconds:g} s exceeded")

    old = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return fn(*args, **kwargs)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
