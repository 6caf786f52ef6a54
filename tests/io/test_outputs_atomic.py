"""Outputs are atomic, non-finite results are not success, a failing sweep point does not stop the
sweep, and every CLI failure (Ctrl-C included) is one stderr line with a documented exit code."""
import json
import logging
import os

import numpy as np
import pytest

from symfield.cli.common import INCOMPLETE, INTERRUPTED
from symfield.cli.main import main
from symfield.core import files
from symfield.io.output import save


def _cli(capsys, *argv):
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def _leftovers(d, keep):
    return sorted(p.name for p in d.iterdir() if p.name not in keep)


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


def _write_then_interrupt(path, *args, **kwargs):
    """A writer cut short: half a file on disk at the path it was given, then Ctrl-C."""
    with open(path, "wb") as fh:
        fh.write(b"partial")
    raise KeyboardInterrupt


TABLE = ({"q": np.arange(4.0)}, {"layer": np.arange(4)}, {"command": "test"})


# ---------------------------------------------------------------- 1. an interrupted write keeps the old file
@pytest.mark.parametrize("suffix", [".csv", ".npz", ".nc"])
def test_interrupted_save_keeps_the_earlier_file_and_leaves_no_temp(tmp_path, monkeypatch, suffix):
    if suffix == ".nc":
        xr = pytest.importorskip("xarray")
    path = tmp_path / f"t{suffix}"
    save(path, *TABLE)
    good = path.read_bytes()
    bigger = ({"q": np.arange(4.0) + 7}, *TABLE[1:])
    if suffix == ".nc":
        monkeypatch.setattr(xr.Dataset, "to_netcdf", lambda self, p, *a, **k: _write_then_interrupt(p))
    else:   # the bytes reach the temp file, then Ctrl-C before the rename
        monkeypatch.setattr(files.os, "fsync", _interrupt)
    with pytest.raises(KeyboardInterrupt):
        save(path, *bigger)
    assert path.read_bytes() == good and _leftovers(tmp_path, {path.name}) == []
    monkeypatch.undo()
    save(path, *bigger)          # and an uninterrupted write does replace it
    assert path.read_bytes() != good and _leftovers(tmp_path, {path.name}) == []


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_interrupted_plot_keeps_the_earlier_file(tmp_path, monkeypatch, suffix):
    from matplotlib.figure import Figure

    from symfield.io import plots
    path = tmp_path / f"g{suffix}"
    plots.g0_densities(path=path)
    good = path.read_bytes()
    monkeypatch.setattr(Figure, "savefig", lambda self, p, *a, **k: _write_then_interrupt(p))
    with pytest.raises(KeyboardInterrupt):
        plots.g0_densities(gammas=(0.5,), path=path)
    assert path.read_bytes() == good and _leftovers(tmp_path, {path.name}) == []


def test_output_file_mode_follows_the_umask(tmp_path):
    path = tmp_path / "t.nc"
    pytest.importorskip("xarray")
    mask = os.umask(0o027)
    try:
        save(path, *TABLE)
    finally:
        os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o640


# ---------------------------------------------------------------- 4. Ctrl-C and other failures at the CLI
def test_ctrl_c_during_propagate_exit_130_earlier_output_intact(tmp_path, capsys, monkeypatch):
    path = tmp_path / "big.npz"
    argv = ("propagate", "relu", "--sigma-w2", "2", "--sigma-b2", "0.1", "--depth", "5", "-o", path)
    assert _cli(capsys, *argv)[0] == 0
    good = path.read_bytes()
    monkeypatch.setattr(files.os, "fsync", _interrupt)      # Ctrl-C while the output is being written
    code, out, err = _cli(capsys, *argv[:-4], "--depth", "9", "-o", path)
    assert code == INTERRUPTED and err == "symfield: error: interrupted\n" and out == ""
    assert path.read_bytes() == good and _leftovers(tmp_path, {path.name}) == []


def test_ctrl_c_during_derive_leaves_no_tex(tmp_path, capsys, monkeypatch):
    path = tmp_path / "r.tex"
    monkeypatch.setattr(files.os, "fsync", _interrupt)
    code, _, err = _cli(capsys, "derive", "relu", "-o", path)
    assert code == INTERRUPTED and err.count("\n") == 1 and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("exc", [RuntimeError(), KeyError("boom"), OSError("")])
def test_any_exception_is_one_line_traceback_only_with_debug(capsys, monkeypatch, exc):
    import sys
    cli_main = sys.modules[main.__module__]

    def broken(args):
        raise exc
    monkeypatch.setattr(cli_main, "command", lambda name: broken)
    code, out, err = _cli(capsys, "list")
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("symfield: error: ")
    assert len(err.strip()) > len("symfield: error:") and "Traceback" not in err
    code, _, err = _cli(capsys, "--debug", "list")
    assert code == 2 and "Traceback" in err and err.strip().splitlines()[-1].startswith("symfield: error: ")
    code, _, err = _cli(capsys, "list", "--debug")          # accepted after the command too
    assert code == 2 and "Traceback" in err


def test_help_documents_exit_codes(capsys):
    code, out, _ = _cli(capsys, "--help")
    assert code == 0
    for line in ("0    success", "2    error", f"{INCOMPLETE}    incomplete", f"{INTERRUPTED}  interrupted"):
        assert line in out


# ---------------------------------------------------------------- 2. non-finite results are not success
def test_propagate_overflow_writes_status_and_exits_nonzero(tmp_path, capsys):
    path = tmp_path / "relu.npz"     # q multiplies by 5e199 per layer: beyond float64 at layer 2
    code, _, err = _cli(capsys, "propagate", "relu", "--sigma-w2", "1e200", "--sigma-b2", "1", "--depth", "6",
                        "-o", path)
    with np.load(path) as z:
        q, params = z["q"], json.loads(str(z["params"]))
    bad_layers = int((~np.isfinite(q)).sum())
    said = [line for line in err.splitlines() if line.startswith("symfield")]   # besides the status line "data: ..."
    assert code == INCOMPLETE and len(said) == 1 and params["status"] == 1 and bad_layers > 0
    assert f"status 1 ({params['status_text']})" in said[0] and f"of {q.size} layers" in said[0]


def test_propagate_finite_exits_zero(capsys):
    code, _, err = _cli(capsys, "propagate", "relu", "--sigma-w2", "1.5", "--sigma-b2", "0.05", "--depth", "10")
    assert code == 0 and err == ""


def test_simulate_one_input_is_refused(tmp_path, capsys):
    path = tmp_path / "s.csv"
    code, out, err = _cli(capsys, "simulate", "tanh", "--sigma-w2", "1", "--sigma-b2", "0", "--n-inputs", "1",
                          "--width", "8", "--depth", "2", "-o", path)
    assert code == 2 and out == "" and err.count("\n") == 1 and "--n-inputs" in err and ">= 2" in err
    assert "got 1" in err and not path.exists()


def test_gradients_overflow_exits_nonzero(capsys):
    code, out, err = _cli(capsys, "gradients", "relu", "--sigma-w2", "1e200", "--sigma-b2", "0", "--width", "8",
                          "--depth", "4", "--n-inputs", "4", "--n-networks", "1", "--json")
    d = json.loads(out)
    n_bad = sum(1 for v in d["all"] if not isinstance(v, float))      # null / "inf" in strict JSON
    assert code == INCOMPLETE and n_bad > 0 and err.count("\n") == 1 and "non-finite" in err


# ---------------------------------------------------------------- 3. a failing sweep point is recorded
@pytest.fixture(scope="module")
def cluster():
    from distributed import Client, LocalCluster
    cl = LocalCluster(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None,
                      silence_logs=logging.ERROR)
    client = Client(cl, set_as_default=False)
    yield client
    client.close()
    cl.close()


def _flaky_eoc_curve(real):
    def eoc_curve(act, sb, dps=None):
        if np.any(np.asarray(sb) == 0.2):
            raise KeyError("a bug at sigma_b2 = 0.2")
        return real(act, sb, dps=dps)
    return eoc_curve


def test_failing_point_recorded_sweep_goes_on(tmp_path, capsys, monkeypatch, cluster):
    import symfield.theory.eoc as fp
    from symfield.sweep import sweep
    monkeypatch.setattr(fp, "eoc_curve", _flaky_eoc_curve(fp.eoc_curve))
    sb = [0.1, 0.2, 0.3]
    r = sweep("eoc", "erf", tmp_path / "r", sigma_b2=sb, chunk=3, scheduler=cluster)
    direct = fp.eoc_curve("erf", np.array([0.1, 0.3]))
    assert r.failed == 1 and r["error"][1] == "KeyError: 'a bug at sigma_b2 = 0.2'" and np.isnan(r["sigma_w2"][1])
    assert r["error"][0] == r["error"][2] == "" and np.array_equal(r["sigma_w2"][[0, 2]], direct)
    code, _, err = _cli(capsys, "sweep", "eoc", "erf", "--sigma-b2", "0.1:0.3:3", "-d", tmp_path / "c",
                          "--scheduler", cluster.scheduler.address, "--chunk", "3")
    said = [line for line in err.splitlines() if line.startswith("symfield")]   # besides the status lines
    assert code == INCOMPLETE and len(said) == 1 and "1 of 3 points failed" in said[0], err


def test_failing_verify_formula_does_not_stop_the_sweep(tmp_path, monkeypatch, cluster):
    import symfield.reports.verify as v
    from symfield.sweep import sweep
    real = v.verify
    monkeypatch.setattr(v, "verify", lambda f, **k: (_ for _ in ()).throw(IndexError()) if f == "sin(x)"
                        else real(f, **k))
    r = sweep("verify", ["sin(x)", "x**"], tmp_path / "r", scheduler=cluster)
    assert r.failed == 2 and r["error"][0] == "IndexError: IndexError" and r["error"][1] != ""
    assert r["ok"].tolist() == [False, False]


def test_empty_chunk_file_is_moved_aside_and_recomputed(tmp_path, cluster):
    from symfield.sweep import sweep
    d = tmp_path / "r"
    first = sweep("eoc", "erf", d, sigma_b2=[0.1, 0.2], chunk=1, scheduler=cluster)
    (d / "chunk-000001.npz").write_bytes(b"")
    with pytest.warns(files.CacheWarning, match="empty sweep chunk file"):
        again = sweep("eoc", "erf", d, sigma_b2=[0.1, 0.2], chunk=1, scheduler=cluster)
    assert again.computed == (1,) and again.reused == (0,)
    assert (d / "result.npz").read_bytes() == first.path.read_bytes()
    assert any(p.name.startswith("chunk-000001.npz.bad-") for p in d.iterdir())


@pytest.mark.slow
@pytest.mark.parametrize("delay", [10.0, 20.0])   # after the imports (~4 s on a loaded machine)
def test_sigint_during_a_long_propagate_output(tmp_path, delay):
    """A real Ctrl-C at some moment of a long `propagate -o`: whenever it lands, the file is the earlier
    good one (exit 130, one stderr line) or the complete new one (exit 0), and no temp file is left."""
    import signal
    import subprocess
    import sys
    import time
    path = tmp_path / "big.npz"
    base = [sys.executable, "-m", "symfield", "propagate", "relu", "--sigma-w2", "2", "--sigma-b2", "0.1", "-o",
            str(path)]
    subprocess.run(base + ["--depth", "3"], check=True, capture_output=True)
    good = path.read_bytes()
    p = subprocess.Popen(base + ["--depth", "3000000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert _leftovers(tmp_path, {path.name}) == []
    if p.returncode == INTERRUPTED:
        assert err == "symfield: error: interrupted\n" and path.read_bytes() == good
    else:
        assert p.returncode == 0, err
        with np.load(path) as z:
            assert z["q"].size == 3000000 and set(z.files) >= {"c", "gamma", "layer", "q"}   # a superset


def test_table_merges_take_turns_under_a_file_lock(tmp_path):
    """symfield.core.files.locked: a second process's read-modify-write of a table file waits until the first
    has written (parallel workers once merged panels with no lock, so one could overwrite the other's)."""
    import subprocess
    import sys
    import time

    from symfield.core.files import locked
    target = tmp_path / "sf_table_demo_c.npz"
    code = ("import sys, time; from symfield.core.files import locked\n"
            f"with locked({str(target)!r}):\n    print('held', flush=True); time.sleep(1.5)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        start = time.monotonic()
        with locked(target) as got:
            waited = time.monotonic() - start
        assert got is True and waited > 0.8, waited
    finally:
        child.wait(timeout=60)
    start = time.monotonic()
    with locked(target):                      # free again: no wait
        assert time.monotonic() - start < 0.5
