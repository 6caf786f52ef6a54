"""One-time work is never silently slow on a terminal (symfield.core.progress): a notice after 2 s,
nothing when stderr is not a terminal (captured or piped)."""
import os
import subprocess
import sys

CODE = ("import time\n"
        "from symfield.core.progress import bar\n"
        "with bar(3, 'building the table of demo', 'step') as b:\n"
        "    for _ in range(3):\n"
        "        time.sleep({})\n"
        "        b.update()\n")


def _on_terminal(pause):
    master, slave = os.openpty()
    try:
        p = subprocess.run([sys.executable, "-c", CODE.format(pause)], stderr=slave, stdout=subprocess.DEVNULL,
                           timeout=60)
        os.close(slave)
        slave = None
        chunks = []
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        return p.returncode, b"".join(chunks).decode(errors="replace")
    finally:
        if slave is not None:
            os.close(slave)
        os.close(master)


def test_slow_work_on_a_terminal_is_announced():
    rc, err = _on_terminal(1.0)
    assert rc == 0 and "symfield: building the table of demo (one-time, then cached)" in err


def test_quick_work_on_a_terminal_shows_nothing():
    rc, err = _on_terminal(0.01)
    assert rc == 0 and "building" not in err


def test_slow_work_with_captured_stderr_shows_nothing():
    p = subprocess.run([sys.executable, "-c", CODE.format(1.0)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stderr == ""


def test_bars_are_shown_in_a_jupyter_kernel_and_not_when_piped(monkeypatch):
    """In a notebook stderr is not a tty, yet a person is watching: a kernel's shell class is
    ZMQInteractiveShell (IPython's name for it); a plain IPython terminal or none at all is not."""
    import sys
    import types

    from symfield.core import progress

    class ZMQInteractiveShell:
        pass

    class TerminalInteractiveShell:
        pass
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    fake = types.ModuleType("IPython")
    monkeypatch.setitem(sys.modules, "IPython", fake)
    fake.get_ipython = lambda: ZMQInteractiveShell()
    assert progress.interactive()
    fake.get_ipython = lambda: TerminalInteractiveShell()
    assert not progress.interactive()
    fake.get_ipython = lambda: None
    assert not progress.interactive()
    monkeypatch.delitem(sys.modules, "IPython")
    assert not progress.interactive()


def test_slow_work_off_a_terminal_is_logged():
    """Off a terminal (a log, a notebook's subprocess) the notice and the elapsed time reach the 'symfield'
    logger at INFO, or stderr with SYMFIELD_PROGRESS=stderr; quick work stays silent either way."""
    logged = "import logging; logging.basicConfig(level=logging.INFO, format='%(name)s %(message)s')\n"
    p = subprocess.run([sys.executable, "-c", logged + CODE.format(1.0)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "symfield symfield: building the table of demo (one-time, then cached) ..." in p.stderr
    assert "building the table of demo: done in" in p.stderr and "\r" not in p.stderr, p.stderr
    env = {**os.environ, "SYMFIELD_PROGRESS": "stderr"}
    p = subprocess.run([sys.executable, "-c", CODE.format(1.0)], capture_output=True, text=True, timeout=60, env=env)
    assert p.stderr.splitlines()[0] == "symfield: building the table of demo (one-time, then cached) ..."
    assert " s" in p.stderr.splitlines()[-1] and "done in" in p.stderr.splitlines()[-1]
    p = subprocess.run([sys.executable, "-c", CODE.format(0.01)], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0 and p.stderr == ""
