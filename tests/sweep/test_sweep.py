"""Distributed sweeps (symfield/sweep.py): resume after a process kill, agreement with direct
library calls, results-directory safety, CLI errors. Dask runs one in-process LocalCluster per
module (tcp, two single-threaded workers); the kill test's sweep is a separate process."""
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import mpmath
import numpy as np
import pytest

import symfield as sf
from symfield.sweep import SweepResult, read_log, sweep


@pytest.fixture(scope="module")
def cluster():
    from distributed import Client, LocalCluster
    cl = LocalCluster(processes=False, protocol="tcp://", n_workers=2, threads_per_worker=1,
                      dashboard_address=None, silence_logs=logging.ERROR)
    client = Client(cl, set_as_default=False)
    yield client
    client.close()
    cl.close()


def _same(a: SweepResult, b: SweepResult):
    assert sorted(a.data) == sorted(b.data)
    for k in a.data:
        assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k], equal_nan=a[k].dtype.kind == "f"), k


# ------------------------------------------------------------------ kill and resume
KILL_B2 = "0.02:0.16:6"      # 6 chunks of one tanh EOC point at dps=12: ~1 s of quadrature each


def _stat(p):
    st = p.stat()
    return st.st_ino, st.st_mtime_ns, p.read_bytes()


def _group_gone(pgid, seconds=20.0):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("where", ["scheduler", pytest.param("own-cluster", marks=pytest.mark.slow)])
def test_kill_midway_then_resume_equals_uninterrupted(tmp_path, cluster, where):
    """`python -m symfield sweep` in its own process group, on the module's LocalCluster (--scheduler;
    slow variant: its own LocalCluster, whose worker processes die with it), SIGKILLed once some but
    not all chunk files exist; then resumed and compared with an uninterrupted run."""
    n = 6
    killed = tmp_path / "killed"
    cmd = [sys.executable, "-m", "symfield", "sweep", "eoc", "tanh", "--sigma-b2", KILL_B2, "--dps", "12",
           "--chunk", "1", "-d", str(killed), "--no-progress"]
    cmd += ["--scheduler", cluster.scheduler.address] if where == "scheduler" else ["--workers", "2"]
    t0 = time.monotonic()
    with open(tmp_path / "out.txt", "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp_path)
    try:
        while len(list(killed.glob("chunk-*.npz"))) < 2:     # some, but not all, chunks finished
            assert proc.poll() is None, (tmp_path / "out.txt").read_text()
            assert time.monotonic() - t0 < 180, "the sweep wrote no chunk in 180 s"
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)                   # no clean stop: driver (and its cluster) die
        t_kill = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert _group_gone(proc.pid), "processes of the killed sweep survived"
    before = {int(p.stem[6:]): _stat(p) for p in killed.glob("chunk-*.npz")}
    assert 2 <= len(before) < n, sorted(before)
    assert not (killed / "result.npz").exists()
    killed_run = read_log(killed)[0]["run"]

    t1 = time.monotonic()
    sb = np.linspace(0.02, 0.16, n)     # what the CLI's KILL_B2 means
    resumed = sweep("eoc", "tanh", killed, sigma_b2=sb, dps=12, chunk=1, scheduler=cluster.scheduler.address)
    t_resume = time.monotonic() - t1
    missing = sorted(set(range(n)) - set(before))
    # (a) chunk files written before the kill are untouched (same inode, mtime and bytes)
    assert {i: _stat(killed / f"chunk-{i:06d}.npz") for i in before} == before
    # (b) the resumed run computed exactly the missing chunks, the killed run only ones it saved
    assert sorted(resumed.computed) == missing and sorted(resumed.reused) == sorted(before)
    log = read_log(killed)
    runs = {e["run"] for e in log if e["event"] == "start"}
    assert len(runs) == 2 and killed_run in runs
    per_run = {r: sorted(e["chunk"] for e in log if e["event"] == "chunk" and e["run"] == r) for r in runs}
    assert set(per_run[killed_run]) <= set(before)
    assert [per_run[r] for r in runs - {killed_run}] == [missing]
    assert not any(e["event"] == "finish" and e["run"] == killed_run for e in log)

    t2 = time.monotonic()
    fresh = sweep("eoc", "tanh", tmp_path / "fresh", sigma_b2=sb, dps=12, chunk=1, scheduler=cluster)
    t_fresh = time.monotonic() - t2
    assert sorted(fresh.computed) == list(range(n)) and fresh.reused == ()
    # (c) identical to an uninterrupted run: every array, and the result file byte for byte
    _same(resumed, fresh)
    assert (killed / "result.npz").read_bytes() == (tmp_path / "fresh" / "result.npz").read_bytes()
    # and to the library itself at one point, all digits
    direct = sf.eoc("tanh", sb[missing[0]], dps=12).sigma_w2
    assert resumed.mp()[missing[0]] == direct and resumed.mp()[0] == fresh.mp()[0]
    assert not resumed["error"].any()
    print(f"\n[{where}] killed after {t_kill:.1f} s with {len(before)}/{n} chunks saved; resume {t_resume:.1f} s "
          f"({len(missing)} chunks); uninterrupted run {t_fresh:.1f} s")


# ------------------------------------------------------------------ agreement with direct library calls
def test_eoc_float64_uneven_chunks_equal_eoc_curve(tmp_path, cluster):
    sb = np.linspace(0.01, 0.3, 11)
    r = sweep("eoc", "tanh", tmp_path / "r", sigma_b2=sb, chunk=4, scheduler=cluster)
    assert len(r.computed) == 3
    assert np.array_equal(r["sigma_w2"], sf.eoc_curve("tanh", sb)) and np.array_equal(r["sigma_b2"], sb)
    assert (r["error"] == "").all()


def test_eoc_and_neutrality_dps_equal_direct_mpmath(tmp_path, cluster):
    sb = [0.0, 0.05, 0.1]
    r = sweep("eoc", "erf", tmp_path / "e", sigma_b2=sb, dps=40, scheduler=cluster)
    for b, v in zip(sb, r.mp()):
        ref = sf.eoc("erf", b, dps=40).sigma_w2
        assert isinstance(v, mpmath.mpf) and v == ref
    assert r["sigma_w2"].tolist() == [float(sf.eoc("erf", b, dps=40).sigma_w2) for b in sb]
    r = sweep("neutrality", "erf", tmp_path / "n", sigma_b2=sb[1:], dps=30, chunk=2, scheduler=cluster)
    assert list(r.mp()) == list(sf.neutrality("erf", np.array(sb[1:]), dps=30))
    r64 = sweep("neutrality", "erf", tmp_path / "n64", sigma_b2=sb[1:], scheduler=cluster)
    assert np.array_equal(r64["sigma_w2"], sf.neutrality("erf", np.array(sb[1:])))
    with pytest.raises(ValueError, match="float64"):
        r64.mp()


def test_points_without_a_line_are_recorded_not_fatal(tmp_path, cluster):
    # x^2 (monomial): E[psi'^2] = 4q -> 0, no EOC at sigma_b2 = 0; at 0.1 q* = 4 sigma_b2, sigma_w2 = 1/(16 sigma_b2)
    r = sweep("eoc", "monomial", tmp_path / "r", sigma_b2=[0.0, 0.1], chunk=2, scheduler=cluster)
    assert np.isnan(r["sigma_w2"][0]) and r["sigma_w2"][1] == pytest.approx(0.625, rel=1e-12)
    with pytest.raises(ValueError) as err:
        sf.eoc("monomial", 0.0)
    assert r["error"].tolist() == [str(err.value).splitlines()[0], ""]


def test_phase_tiles_equal_phase_diagram_and_netcdf(tmp_path, cluster):
    sw, sb = np.linspace(0.5, 4, 13), np.linspace(0, 0.2, 9)
    out = tmp_path / "erf.nc"
    r = sweep("phase", "erf", tmp_path / "p", sigma_w2=sw, sigma_b2=sb, chunk=(5, 4), scheduler=cluster,
              output=out)
    assert len(r.computed) == 3 * 3
    pd = sf.phase_diagram("erf", sw, sb)
    for k in ("codes", "q_star", "c_star", "gamma_star", "slope", "eoc", "neutrality"):
        assert np.array_equal(r[k], getattr(pd, k), equal_nan=True), k
    assert r.phase_diagram().counts() == pd.counts() and (r.phase_diagram().labels == pd.labels).all()
    with np.load(r.path) as z:   # parameters recorded inside the result
        params = json.loads(str(z["params"]))
        assert params["kind"] == "phase" and params["params"]["sigma_w2"] == sw.tolist()
        assert np.array_equal(z["codes"], pd.codes)
    try:
        import xarray as xr
    except ImportError:      # netCDF is optional: without xarray the output must be refused clearly
        assert not out.exists()
        return
    with xr.open_dataset(out) as ds:
        assert np.array_equal(ds["c_star"].values, pd.c_star, equal_nan=True)
        assert np.array_equal(ds["neutrality"].values, pd.neutrality, equal_nan=True)
        assert json.loads(ds.attrs["params"]) == params


def test_verify_kind_matches_verify(tmp_path, cluster):
    from symfield.reports.verify import verify
    forms = ["relu", "exp(x**2)", "no_such_activation"]
    r = sweep("verify", forms, tmp_path / "v", chunk=2, scheduler=cluster)
    assert r["formulas"].tolist() == forms and len(r.computed) == 2
    for f, ok, rep in zip(forms[:2], r["ok"], r.reports()):
        ref = json.loads(json.dumps(verify(f).to_dict(), default=str))
        del ref["timings"]
        for row in ref["phases"]:   # wall-clock seconds differ between any two runs
            del row["seconds"]
        assert ok == ref["ok"] and rep == ref
    assert r["ok"].tolist() == [True, False, False] and r.reports()[2] is None
    assert "no_such_activation" in r["error"][2]


# ------------------------------------------------------------------ results directory safety (no cluster needed)
def test_refuses_a_directory_holding_another_sweep(tmp_path, cluster):
    d = tmp_path / "r"
    first = sweep("eoc", "erf", d, sigma_b2=[0.1, 0.2], dps=20, scheduler=cluster)
    with pytest.raises(ValueError, match=r"holds a different sweep \(differs in params.dps\)"):
        sweep("eoc", "erf", d, sigma_b2=[0.1, 0.2], dps=30)
    with pytest.raises(ValueError, match="differs in activation"):
        sweep("eoc", "tanh", d, sigma_b2=[0.1, 0.2], dps=20)
    with pytest.raises(ValueError, match="differs in kind"):
        sweep("neutrality", "erf", d, sigma_b2=[0.1, 0.2], dps=20)
    again = sweep("eoc", "erf", d, sigma_b2=[0.1, 0.2], dps=20)   # all chunks exist: no cluster is started
    assert again.computed == () and sorted(again.reused) == [0, 1]
    _same(first, again)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty and has no manifest"):
        sweep("eoc", "erf", tmp_path / "other", sigma_b2=[0.1])


def test_refuses_a_directory_in_use(tmp_path):
    import fcntl
    d = tmp_path / "r"
    d.mkdir()
    with open(d / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ValueError, match="in use by another running sweep"):
            sweep("eoc", "erf", d, sigma_b2=[0.1])


def test_unreadable_or_foreign_chunk_is_reported(tmp_path, cluster):
    d = tmp_path / "r"
    sweep("eoc", "erf", d, sigma_b2=[0.1, 0.2], scheduler=cluster, chunk=1)
    (d / "chunk-000001.npz").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="chunk-000001.npz' is unreadable"):
        sweep("eoc", "erf", d, sigma_b2=[0.1, 0.2], chunk=1)
    sweep("eoc", "erf", tmp_path / "s", sigma_b2=[0.1, 0.3], scheduler=cluster, chunk=1)
    os.replace(tmp_path / "s" / "chunk-000001.npz", d / "chunk-000001.npz")
    with pytest.raises(ValueError, match="belongs to another sweep"):
        sweep("eoc", "erf", d, sigma_b2=[0.1, 0.2], chunk=1)


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(kind="eocs", act="tanh", sigma_b2=[0.1]), ValueError, "'kind' parameter of sweep must be one of"),
    (dict(kind="eoc", act="tanh"), ValueError, "needs sigma_b2"),
    (dict(kind="eoc", act="tanh", sigma_b2=[0.1], sigma_w2=[1.0]), ValueError, "'sigma_w2' parameter .* not used"),
    (dict(kind="eoc", act="tanh", sigma_b2=[-0.1]), ValueError, "'sigma_b2' parameter of sweep must be"),
    (dict(kind="neutrality", act="tanh", sigma_b2=[0.0]), ValueError, "> 0"),
    (dict(kind="eoc", act="tanh", sigma_b2=[0.1], dps=3), ValueError, "'dps' parameter"),
    (dict(kind="eoc", act="tanh", sigma_b2=[0.1], chunk=0), ValueError, "'chunk' parameter"),
    (dict(kind="phase", act="tanh", sigma_b2=[0.1]), ValueError, "needs sigma_w2 and sigma_b2"),
    (dict(kind="phase", act="tanh", sigma_w2=[1], sigma_b2=[0.1], dps=20), ValueError, "'dps' parameter .* not used"),
    (dict(kind="phase", act="tanh", sigma_w2=[1], sigma_b2=[0.1], chunk=(1, 2, 3)), ValueError, "'chunk'"),
    (dict(kind="eoc", act="tanhh", sigma_b2=[0.1]), ValueError, "Did you mean 'tanh'"),
    (dict(kind="verify", act=[]), TypeError, "'act' parameter of sweep"),
    (dict(kind="eoc", act="tanh", sigma_b2=[0.1], output="x.txt"), ValueError, r"\.npz or \.nc"),
    (dict(kind="eoc", act="tanh", sigma_b2=[0.1], scheduler=3.5), TypeError, "'scheduler' parameter"),
])
def test_bad_input_one_clear_error(tmp_path, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        sweep(results_dir=tmp_path / "r", **kwargs)


def _silent_server():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)          # accepts connections (kernel backlog) and never answers
    return srv


def test_unreachable_or_silent_scheduler_fails_fast(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]        # nothing listens here once closed
    srv = _silent_server()
    try:
        for address in (f"tcp://127.0.0.1:{closed}", f"tcp://127.0.0.1:{srv.getsockname()[1]}"):
            t0 = time.monotonic()
            with pytest.raises(ConnectionError, match="cannot reach the Dask scheduler"):
                sweep("eoc", "erf", tmp_path / "r", sigma_b2=[0.1], scheduler=address, connect_timeout=1)
            assert time.monotonic() - t0 < 8
    finally:
        srv.close()


# ------------------------------------------------------------------ command line
def _cli(capsys, *argv):
    from symfield.cli.main import main
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_json_summary_with_scheduler(tmp_path, capsys, cluster):
    code, out, err = _cli(capsys, "sweep", "eoc", "monomial", "--sigma-b2", "0:0.1:3", "-d", str(tmp_path / "r"),
                          "--scheduler", cluster.scheduler.address, "--json", "-o", str(tmp_path / "monomial.npz"))
    assert code == 0, err
    s = json.loads(out)
    # x^2: chi1 = 4 sigma_w2 q = 1 and q = 3 sigma_w2 q^2 + sigma_b2 give q* = 4 sigma_b2, sigma_w2 = 1/(16 sigma_b2);
    # no EOC at sigma_b2 = 0 (an error row, not fatal)
    assert s["chunks"] == 1 and s["computed"] == 1 and s["errors"] == 1 and s["sigma_w2"][0] is None
    assert s["sigma_w2"][1:] == pytest.approx([1.25, 0.625], rel=1e-15)    # a float64 root: to the last bit or so
    with np.load(tmp_path / "monomial.npz") as z:
        assert z["sigma_w2"][2] == pytest.approx(0.625, rel=1e-15) and json.loads(str(z["params"]))["params"]["sigma_b2"] == [0.0, 0.05, 0.1]
    assert err == ""       # stderr is not a terminal: no progress bar
    code, out, err = _cli(capsys, "sweep", "eoc", "monomial", "--sigma-b2", "0:0.1:3", "-d", str(tmp_path / "r"))
    assert code == 0 and "0 computed, 1 reused" in err and "sigma_b2" in out   # status on stderr, values on stdout


def test_progress_bar_when_asked(tmp_path, capsys, cluster):
    sweep("eoc", "erf", tmp_path / "r", sigma_b2=[0.1, 0.2], chunk=1, scheduler=cluster, progress=True)
    err = capsys.readouterr().err
    assert "sweep eoc" in err and "2/2" in err


@pytest.mark.parametrize("argv, match", [
    (["sweep", "eoc", "tanh"], "needs --sigma-b2"),
    (["sweep", "eoc", "tanh", "erf", "--sigma-b2", "0.1"], "exactly one activation"),
    (["sweep", "eoc", "tanh", "--sigma-b2", "0:1"], "--sigma-b2 must be a number or start:stop:num"),
    (["sweep", "phase", "tanh", "--chunk", "3x"], "--chunk must be N or ROWSxCOLS"),
    (["sweep", "eoc", "tanh", "--sigma-b2", "0.1", "--dps", "2"], "'dps' parameter"),
    (["sweep", "verify"], "needs formulas"),
    (["sweep", "verify", "--formulas", "/nonexistent/list.txt"], "cannot read"),
    (["sweep", "eoc", "tanh", "--sigma-b2", "0.1", "-o", "/nonexistent/x.npz"], "does not exist"),
    (["sweep", "eoc", "tanh", "--sigma-b2", "0.1", "--scheduler", "tcp://127.0.0.1:{port}", "--connect-timeout", "1"],
     "cannot reach the Dask scheduler"),
])
def test_cli_errors_are_one_line_exit_2(tmp_path, capsys, argv, match):
    srv = _silent_server()
    try:
        argv = [a.format(port=srv.getsockname()[1]) for a in argv] + ["-d", str(tmp_path / "r")]
        code, out, err = _cli(capsys, *argv)
    finally:
        srv.close()
    assert code == 2 and out == ""
    assert err.startswith("symfield: error: ") and err.count("\n") == 1 and match in err, err


@pytest.mark.slow
def test_phase_with_depth_equals_phase_diagram(tmp_path, cluster):
    sw, sb = np.linspace(0.5, 3, 6), np.linspace(0, 0.2, 5)
    r = sweep("phase", "erf", tmp_path / "p", sigma_w2=sw, sigma_b2=sb, depth=20, chunk=(3, 2), scheduler=cluster)
    pd = sf.phase_diagram("erf", sw, sb, depth=20)
    for k in ("codes", "c_star", "c_depth", "gamma_depth"):
        assert np.array_equal(r[k], getattr(pd, k), equal_nan=True), k
