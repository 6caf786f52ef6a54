"""Progress of slow work, so nothing slow is ever silent on a terminal or in a notebook.

:func:`bar` is a tqdm bar on stderr; if the work is still running after DELAY seconds, one line names
it and the bar is drawn from the next step on. Shown where :func:`interactive` says a person is
watching: a terminal, or a Jupyter kernel (a widget bar when ipywidgets is installed, else text).
Off a terminal the same notice, and a closing line with the elapsed time, go to the ``symfield``
logger at INFO (``logging.basicConfig(level=logging.INFO)`` shows them in a log or a notebook's
subprocess), or straight to stderr when the environment sets SYMFIELD_PROGRESS=stderr; by default
piped output and captured stderr stay clean."""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
from contextlib import contextmanager

LOG = logging.getLogger("symfield")

DELAY = 2.0   # seconds before anything is shown


def interactive() -> bool:
    """True on a terminal (stderr is a tty) or inside a Jupyter kernel."""
    if sys.stderr.isatty():
        return True
    ipython = sys.modules.get("IPython")
    try:
        shell = ipython.get_ipython() if ipython is not None else None
    except Exception:       # a half-initialised IPython: no kernel to draw in
        return False
    return type(shell).__name__ == "ZMQInteractiveShell"


def tqdm_class():
    """tqdm.auto's class in a notebook with ipywidgets, the text bar otherwise (no widget warning)."""
    try:
        import ipywidgets  # noqa: F401
        from tqdm.auto import tqdm
    except ImportError:
        from tqdm import tqdm
    return tqdm


def _offline_notice(line: str) -> None:
    """A notice off a terminal: a stderr line when SYMFIELD_PROGRESS=stderr, else the symfield logger (INFO)."""
    if os.environ.get("SYMFIELD_PROGRESS", "").lower() == "stderr":
        print(line, file=sys.stderr, flush=True)
    else:
        LOG.info(line)


@contextmanager
def bar(total: int, desc: str, unit: str, cached: bool = True):
    """A tqdm bar of ``total`` steps with a one-line notice after DELAY seconds (terminal or notebook);
    off a terminal the notice and a closing line with the elapsed time go to :func:`_offline_notice`.
    ``cached``: the work is one-time (the notice says so)."""
    tqdm = tqdm_class()
    show = interactive()
    what = f"{desc} (one-time, then cached)" if cached else desc
    start, fired = time.monotonic(), threading.Event()

    def notice():
        fired.set()
        line = f"symfield: {what} ..."
        print(line, file=sys.stderr, flush=True) if show else _offline_notice(line)

    timer = threading.Timer(DELAY, notice)
    timer.daemon = True
    timer.start()
    try:
        with tqdm(total=total, desc=desc, unit=unit, delay=DELAY, leave=False, file=sys.stderr,
                  disable=not show) as b:
            yield b
    finally:
        timer.cancel()
        if fired.is_set() and not show:
            _offline_notice(f"symfield: {desc}: done in {time.monotonic() - start:.1f} s")
