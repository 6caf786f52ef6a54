"""Progress of one-time work (table builds), so nothing slow is ever silent on a terminal.

:func:`bar` is a tqdm bar on stderr; if the work is still running after DELAY seconds, one line names
it and the bar is drawn from the next step on. On a terminal only (piped output and captured stderr
stay clean)."""
from __future__ import annotations

import sys
import threading
from contextlib import contextmanager

DELAY = 2.0   # seconds before anything is shown


@contextmanager
def bar(total: int, desc: str, unit: str, cached: bool = True):
    """A tqdm bar of ``total`` steps with a one-line notice after DELAY seconds (terminal only);
    ``cached``: the work is one-time (the notice says so)."""
    from tqdm.auto import tqdm
    show = sys.stderr.isatty()
    what = f"{desc} (one-time, then cached)" if cached else desc
    timer = threading.Timer(DELAY, lambda: print(f"symfield: {what} ...", file=sys.stderr, flush=True))
    timer.daemon = True
    if show:
        timer.start()
    try:
        with tqdm(total=total, desc=desc, unit=unit, delay=DELAY, leave=False, file=sys.stderr,
                  disable=not show) as b:
            yield b
    finally:
        timer.cancel()
