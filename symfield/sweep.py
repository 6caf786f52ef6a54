"""Distributed, resumable sweeps on Dask (a LocalCluster by default, or an existing scheduler).

    r = sweep("eoc", "tanh", "runs/tanh-eoc", sigma_b2=np.linspace(0.01, 0.3, 30), dps=30)
    r["sigma_w2"], r.mp("sigma_w2"), r.computed, r.reused

Kinds: "eoc", "neutrality", "phase" (tiles of the sigma_w2 x sigma_b2 grid) and "verify" (chunks of a
list of formulas); the ``symfield sweep`` command is symfield/cli/sweep.py.

The results directory holds ``manifest.json`` (kind, activation, parameters, chunk list and their hash),
one ``chunk-NNNNNN.npz`` per finished chunk (written atomically as each completes), ``log.jsonl`` and
``result.npz``, assembled from the chunk files only. A rerun into the same directory skips finished
chunks, so an interrupted sweep resumes with a byte-identical result; a directory holding a different
sweep is refused.
"""
from __future__ import annotations

from symfield.core.errors import InvalidType, InvalidValue, RunError, Unsupported
import hashlib
import json
import math
import os
import sys
import threading
import time
import uuid
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from symfield.core import validate as check
from symfield.core.dataset import ToXarray, build
from symfield.core.files import atomic_write, load_npz, npz_bytes, quarantine
from symfield.core.version import provenance
from symfield.core.progress import interactive, tqdm_class

if TYPE_CHECKING:
    from symfield.theory.phase_diagram import PhaseDiagram

KINDS = ("eoc", "neutrality", "phase", "verify")
FORMAT = "symfield-sweep/1"
LOCAL_ERRORS = (ValueError, ArithmeticError, NotImplementedError, TypeError)
_SERIAL = threading.Lock()  # mpmath precision is process-global: one chunk at a time per process


# ---------------------------------------------------------------- deterministic, atomic files
def _canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


# ---------------------------------------------------------------- mpmath numbers as exact text
def _mp_text(v, dps) -> str:
    """An mpmath number as text that reads back to the identical number at ``dps``."""
    import mpmath
    from mpmath import libmp
    v = mpmath.mpf(v) if not isinstance(v, mpmath.mpf) else v
    return libmp.to_str(v._mpf_, libmp.repr_dps(libmp.dps_to_prec(dps)))


def _mp_read(text, dps):
    import mpmath
    with mpmath.workdps(dps):
        return mpmath.mpf(str(text))


# ---------------------------------------------------------------- work done on the workers
def _rebuild(spec):
    import warnings

    from symfield.symbolic.activation import activation
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if spec["pool"] is None:
            return activation(spec["name"])
        return activation(spec["name"], pool=spec["pool"], k=spec["k"])


def _warm(kind, spec):
    """Derive the kernel once per worker process (run by Client.run, i.e. off the task threads)."""
    if kind != "verify":
        from symfield.symbolic.kernel import kernel
        with _SERIAL:
            kernel(_rebuild(spec))
    return True


def first_line(err) -> str:
    """The first line of an error's message (its type name when the message is empty)."""
    text = str(err).strip()
    return (text.splitlines()[0] if text else type(err).__name__)


def _line_chunk(kind, act, sb, dps):
    """sigma_w2 of the EOC or neutrality line at each sigma_b2; failing points -> NaN + message."""
    from symfield.theory.eoc import eoc_curve
    from symfield.theory.neutrality import neutrality
    fn = eoc_curve if kind == "eoc" else neutrality
    sb = np.asarray(sb, float)
    vals, errors, failed = None, [""] * sb.size, [False] * sb.size
    if dps is None:
        try:
            vals = list(np.asarray(fn(act, sb), float))
        except Exception:
            vals = None  # some point fails: redo point by point below
    if vals is None:
        vals = []
        for i, b in enumerate(sb):
            try:
                vals.append(fn(act, np.array([b]), dps=dps)[0])
            except Exception as err:   # recorded for this point; the sweep goes on
                vals.append(math.nan)
                errors[i] = _point_error(err)
                failed[i] = not isinstance(err, ValueError)   # ValueError: no line at this sigma_b2 (a result)
    out = {"sigma_w2": np.array([float(v) for v in vals], float), "error": np.array(errors, dtype=str),
           "failed": np.array(failed, bool)}
    if dps is not None:
        out["sigma_w2_mp"] = np.array(["nan" if e else _mp_text(v, dps) for v, e in zip(vals, errors)], dtype=str)
    return out


def _point_error(err) -> str:
    """The message recorded for a failed point: first line, with the type for errors that are not
    plain bad-input/numerical ones (a bug shows as 'KeyError: ...')."""
    return first_line(err) if isinstance(err, LOCAL_ERRORS) else f"{type(err).__name__}: {first_line(err)}"


PHASE_FLOATS = ("q_star", "c_star", "gamma_star", "slope")


def _phase_chunk(act, sw, sb, depth, eoc_tol, sw_max=None):
    """One tile of the phase diagram; a tile that raises is recorded (codes -1, NaN values, ``error``
    on every point of the tile) and the sweep goes on. The neutrality line is drawn up to ``sw_max``
    (the whole grid's largest sigma_w2), as the whole diagram draws it."""
    from symfield.symbolic.kernel import kernel
    from symfield.theory.phase_diagram import neutrality_drawn, phase_diagram
    sw, sb = np.asarray(sw, float), np.asarray(sb, float)
    names = PHASE_FLOATS + (("c_depth", "gamma_depth") if depth is not None else ())
    try:
        pd = phase_diagram(act, sw, sb, depth=depth, eoc_tol=eoc_tol)
    except Exception as err:
        out = {"codes": np.full((sw.size, sb.size), -1), **{k: np.full((sw.size, sb.size), np.nan) for k in names},
               "eoc": np.full(sb.size, np.nan), "neutrality": np.full(sb.size, np.nan)}
        out["error"] = np.full((sw.size, sb.size), _point_error(err), dtype=str)
        out["failed"] = np.ones((sw.size, sb.size), bool)
        return out
    out = {k: np.asarray(getattr(pd, k)) for k in ("codes", "eoc", "neutrality") + names}
    if sw_max is not None and sw_max != sw.max():
        out["neutrality"] = neutrality_drawn(kernel(act), sb, float(sw_max))
    out["error"] = np.full((sw.size, sb.size), "", dtype=str)
    out["failed"] = np.zeros((sw.size, sb.size), bool)
    return out


def _untimed(obj):
    """A verify report without its wall-clock fields ("timings", "seconds"), which differ per run."""
    if isinstance(obj, dict):
        return {k: _untimed(v) for k, v in obj.items() if k not in ("timings", "seconds")}
    return [_untimed(v) for v in obj] if isinstance(obj, list) else obj


def _verify_chunk(formulas):
    """verify(f) for each formula: ok flag and the report as JSON without wall-clock fields."""
    from symfield.reports.verify import verify
    ok, reports, errors = [], [], []
    for f in formulas:
        try:
            d = verify(f).to_dict()
        except Exception as err:   # recorded for this formula; the sweep goes on
            ok.append(False)
            reports.append("")
            errors.append(_point_error(err))
            continue
        d = _untimed(d)
        ok.append(bool(d.get("ok")))
        reports.append(json.dumps(d, sort_keys=True, default=str))
        errors.append("")
    return {"ok": np.array(ok, bool), "report": np.array(reports, dtype=str), "error": np.array(errors, dtype=str),
            "failed": np.array([bool(e) for e in errors], bool)}


def compute_chunk(kind, spec, payload):
    """Compute one chunk (runs on a Dask worker; also callable directly). Returns
    (arrays, seconds, worker address or None)."""
    with _SERIAL:
        t0 = time.perf_counter()
        if kind == "verify":
            out = _verify_chunk(payload["formulas"])
        else:
            act = _rebuild(spec)
            if kind == "phase":
                out = _phase_chunk(act, payload["sigma_w2"], payload["sigma_b2"], payload["depth"],
                                   payload["eoc_tol"], payload.get("sw_max"))
            else:
                out = _line_chunk(kind, act, payload["sigma_b2"], payload["dps"])
        seconds = time.perf_counter() - t0
    try:
        from distributed import get_worker
        where = get_worker().address
    except (ImportError, ValueError):
        where = None
    return out, seconds, where


# ---------------------------------------------------------------- plan: validated parameters and chunks
def _spec_of(act):
    """A picklable spec {name, pool, k} that rebuilds ``act`` exactly."""
    from symfield.symbolic.activation import Activation, activation
    a = act if isinstance(act, Activation) else activation(act)
    spec = {"name": a.single.name, "pool": a.pool, "k": a.k if a.pool else 1}
    if _rebuild(spec) != a:
        raise InvalidValue(f"The 'act' parameter of sweep must be rebuildable from its name; {a.name!r} is not "
                         f"(pass a built-in name or a formula string).")
    return spec, a.name


def _axis(name, values, lo_open=False):
    arr = check.real("sweep", name, values, lo=0, lo_open=lo_open)
    if arr.ndim > 1 or arr.size == 0:
        check.fail("sweep", name, "a non-empty 1-D array of values >= 0", values)
    return np.atleast_1d(arr).astype(float)


def _chunk_arg(chunk, default, two_d):
    """chunk -> (rows, cols) for phase, int otherwise."""
    if chunk is None:
        return default
    if two_d and isinstance(chunk, (tuple, list)):
        if len(chunk) != 2:
            check.fail("sweep", "chunk", "an integer >= 1 or a pair (rows, cols) of them", chunk)
        return tuple(check.integer("sweep", "chunk", c, lo=1) for c in chunk)
    n = check.integer("sweep", "chunk", chunk, lo=1)
    return (default[0], n) if two_d else n


def _unused(kind, **given):
    for name, value in given.items():
        if value is not None:
            raise InvalidValue(f"The '{name}' parameter of sweep is not used by kind {kind!r}; got {value!r}.")


def _plan(kind, act, sigma_w2, sigma_b2, dps, chunk, depth, eoc_tol):
    """Validate everything and return (manifest without hash, payload per chunk, activation name)."""
    if kind not in KINDS:
        raise InvalidValue(f"The 'kind' parameter of sweep must be one of {', '.join(KINDS)}. Got {kind!r} instead.")
    if kind == "verify":
        _unused(kind, sigma_w2=sigma_w2, sigma_b2=sigma_b2, dps=dps, depth=depth)
        formulas = [act] if isinstance(act, str) else list(act) if isinstance(act, (list, tuple)) else None
        if not formulas or not all(isinstance(f, str) and f.strip() for f in formulas):
            check.fail("sweep", "act", "a formula (str) or a non-empty list of them for kind 'verify'", act, TypeError)
        try:
            import symfield.reports.verify  # noqa: F401  (workers import it lazily; fail here, clearly)
        except ImportError:
            raise Unsupported("sweep kind 'verify' needs symfield.verify, which this installation "
                                      "lacks.") from None
        n = _chunk_arg(chunk, 1, False)
        bounds = [[i, min(i + n, len(formulas))] for i in range(0, len(formulas), n)]
        payloads = [{"formulas": formulas[a:b]} for a, b in bounds]
        manifest = {"kind": kind, "activation": None, "params": {"formulas": formulas}, "chunks": bounds}
        return manifest, payloads, f"{len(formulas)} formula{'s' * (len(formulas) != 1)}"
    spec, name = _spec_of(act)
    if kind in ("eoc", "neutrality"):
        _unused(kind, sigma_w2=sigma_w2, depth=depth)
        if sigma_b2 is None:
            raise InvalidValue(f"sweep kind {kind!r} needs sigma_b2 (an array of bias variances).")
        sb = _axis("sigma_b2", sigma_b2, lo_open=(kind == "neutrality"))
        dps = check.dps("sweep", dps)
        n = _chunk_arg(chunk, 1 if dps is not None else 16, False)
        bounds = [[i, min(i + n, sb.size)] for i in range(0, sb.size, n)]
        payloads = [{"sigma_b2": sb[a:b], "dps": dps} for a, b in bounds]
        params = {"sigma_b2": sb.tolist(), "dps": dps}
    else:
        _unused(kind, dps=dps)
        if sigma_w2 is None or sigma_b2 is None:
            raise InvalidValue("sweep kind 'phase' needs sigma_w2 and sigma_b2 (1-D grid axes).")
        sw, sb = _axis("sigma_w2", sigma_w2), _axis("sigma_b2", sigma_b2)
        if depth is not None:
            depth = check.integer("sweep", "depth", depth, lo=1)
        eoc_tol = float(check.real("sweep", "eoc_tol", eoc_tol, lo=0))
        rows, cols = _chunk_arg(chunk, (sw.size, max(1, 4096 // sw.size)), True)
        bounds = [[i, min(i + rows, sw.size), j, min(j + cols, sb.size)]
                  for i in range(0, sw.size, rows) for j in range(0, sb.size, cols)]
        payloads = [{"sigma_w2": sw[a:b], "sigma_b2": sb[c:d], "depth": depth, "eoc_tol": eoc_tol,
                     "sw_max": float(sw.max())} for a, b, c, d in bounds]
        params = {"sigma_w2": sw.tolist(), "sigma_b2": sb.tolist(), "depth": depth, "eoc_tol": eoc_tol}
    manifest = {"kind": kind, "activation": spec, "params": params, "chunks": bounds}
    return manifest, payloads, name


def _hashed(manifest):
    from symfield.core.version import __version__
    m = {"format": FORMAT, "symfield": __version__, **manifest}
    m["hash"] = hashlib.sha256(_canonical(m).encode()).hexdigest()
    return m


def _differences(old, new):
    keys = sorted(set(old) | set(new))
    diff = [k for k in keys if k not in ("hash", "params") and old.get(k) != new.get(k)]
    po, pn = old.get("params") or {}, new.get("params") or {}
    diff += [f"params.{k}" for k in sorted(set(po) | set(pn)) if po.get(k) != pn.get(k)]
    return diff or ["hash"]


# ---------------------------------------------------------------- the results directory
class _Store:
    """Manifest, chunk files, log and lock of one results directory."""

    def __init__(self, root, manifest):
        self.root = Path(root)
        if self.root.exists() and not self.root.is_dir():
            raise InvalidValue(f"results directory {str(self.root)!r} exists and is not a directory")
        self.root.mkdir(parents=True, exist_ok=True)
        if not os.access(self.root, os.W_OK):
            raise InvalidValue(f"results directory {str(self.root)!r} is not writable")
        self._lock()
        try:
            self._open(manifest)
        except BaseException:
            self.close()
            raise

    def _open(self, manifest):
        mpath = self.root / "manifest.json"
        if mpath.exists():
            try:
                old = json.loads(mpath.read_text())
            except (OSError, ValueError) as err:
                raise InvalidValue(f"{str(mpath)!r} is not a readable sweep manifest ({first_line(err)})") from None
            if old.get("hash") != manifest["hash"]:
                raise InvalidValue(f"results directory {str(self.root)!r} holds a different sweep (differs in "
                                 f"{', '.join(_differences(old, manifest))}); use a new directory to start "
                                 f"this one, or rerun the original parameters to resume")
        else:
            if any(p.name != ".lock" for p in self.root.iterdir()):
                raise InvalidValue(f"results directory {str(self.root)!r} is not empty and has no manifest.json; "
                                 f"refusing to write a sweep into it")
            atomic_write(mpath, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
        for stale in self.root.glob(".chunk-*.tmp"):
            stale.unlink()   # left by a killed run (we hold the lock: nobody else is writing)
        self.manifest = manifest

    def _lock(self):
        import fcntl
        self._fh = open(self.root / ".lock", "w")
        try:
            fcntl.flock(self._fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._fh.close()
            raise InvalidValue(f"results directory {str(self.root)!r} is in use by another running sweep") from None

    def close(self):
        self._fh.close()

    def chunk_path(self, i):
        return self.root / f"chunk-{i:06d}.npz"

    def done(self):
        """Chunks whose files exist; an empty (0-byte) chunk file -- a write cut short -- is moved
        aside (one CacheWarning) and its chunk recomputed."""
        found = []
        for i in range(len(self.manifest["chunks"])):
            path = self.chunk_path(i)
            if path.exists() and path.stat().st_size == 0:
                quarantine(path, "empty sweep chunk file")
            elif path.exists():
                found.append(i)
        return found

    def save(self, i, arrays):
        atomic_write(self.chunk_path(i), npz_bytes({**arrays, "manifest_hash": np.array(self.manifest["hash"])}))

    def load(self, i):
        path = self.chunk_path(i)
        try:
            arrays = load_npz(path)
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
            raise InvalidValue(f"chunk file {str(path)!r} is unreadable ({first_line(err)}); delete it to "
                             f"recompute that chunk") from None
        if str(arrays.pop("manifest_hash", "")) != self.manifest["hash"]:
            raise InvalidValue(f"chunk file {str(path)!r} belongs to another sweep; delete it to recompute that chunk")
        return arrays

    def log(self, **event):
        with open(self.root / "log.jsonl", "a") as fh:
            fh.write(json.dumps(event, sort_keys=True) + "\n")


def read_log(results_dir) -> list:
    """The events of ``log.jsonl`` (start / chunk / finish, each with its run id)."""
    path = Path(results_dir) / "log.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


# ---------------------------------------------------------------- Dask
def _connect(scheduler, n_workers, timeout):
    """(client, cluster we own or None, close client?) for scheduler None | address | Client | cluster."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise Unsupported("sf.sweep needs Dask: pip install 'dask[distributed]'") from None
    if isinstance(scheduler, Client):
        return scheduler, None, False
    if scheduler is None:
        import logging
        n = n_workers or max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())
        try:
            cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None,
                                   silence_logs=logging.ERROR)
        except Exception as err:
            raise RunError(f"cannot start a local Dask cluster ({type(err).__name__}: {first_line(err)}); "
                               f"scripts must guard the call with if __name__ == '__main__':") from err
        return Client(cluster, set_as_default=False), cluster, True
    address = getattr(scheduler, "scheduler_address", scheduler)
    if n_workers is not None:
        raise InvalidValue("The 'n_workers' parameter of sweep sizes the local cluster; it cannot be used with "
                         "an existing scheduler.")
    _probe(address, timeout)
    try:
        client = Client(address, timeout=timeout, set_as_default=False)
    except Exception as err:
        raise ConnectionError(f"cannot connect to the Dask scheduler at {address!r} "
                              f"({type(err).__name__}: {first_line(err)})") from None
    return client, None, True


def _probe(address, timeout):
    """ConnectionError unless a Dask scheduler answers at ``address`` within ``timeout`` s (a silent
    or foreign server would otherwise hang Client()); runs in its own thread and event loop."""
    import asyncio

    from distributed.core import rpc
    answer = {}

    async def ask():
        async with rpc(address, timeout=timeout) as r:
            return await r.identity()

    def run():
        try:
            answer["info"] = asyncio.run(asyncio.wait_for(ask(), timeout))
        except BaseException as err:  # refused, timed out, malformed address, garbage frames
            answer["error"] = err

    worker = threading.Thread(target=run, daemon=True, name="symfield-sweep-probe")
    worker.start()
    worker.join(timeout + 2)
    info = answer.get("info")
    if not isinstance(info, dict) or info.get("type") != "Scheduler":
        err = answer.get("error")
        if info is not None:
            why = "the server there is not a Dask scheduler"
        elif err is None or isinstance(err, (TimeoutError, asyncio.TimeoutError)):
            why = "no answer"
        elif isinstance(err, (OSError, ValueError)):
            why = first_line(err)
        else:
            why = f"the server there does not speak the Dask protocol: {type(err).__name__}"
        raise ConnectionError(f"cannot reach the Dask scheduler at {address!r} within {timeout:g} s ({why})")


def _wait_workers(client, timeout):
    try:
        client.wait_for_workers(1, timeout=timeout)
    except (TimeoutError, OSError):
        raise ConnectionError(f"the Dask scheduler at {client.scheduler.address} has no workers "
                              f"(waited {timeout:g} s)") from None


# ---------------------------------------------------------------- result
@dataclass(frozen=True)
class SweepResult(ToXarray):
    """Arrays of a finished sweep (``r[name]``), where they live, and what this run computed.

    ``to_xarray()`` (and the ``output=FILE.nc``): kind "phase" over (sigma_w2, sigma_b2) with ``codes``
    carrying CF flag_values/flag_meanings (-1 "failed" when a tile failed), eoc/neutrality over
    (sigma_b2,), verify over (formula,); ``attrs["params"]`` is ``record`` (format, version, kind,
    activation, parameters, hash) as JSON text."""
    kind: str
    act: str
    params: dict
    data: dict = field(repr=False)
    results_dir: Path
    path: Path
    computed: tuple
    reused: tuple
    seconds: float
    record: dict = field(default_factory=dict, repr=False)

    def dataset_parts(self) -> dict:
        """The arrays, coordinates, dims and parameters of :meth:`to_xarray` (for symfield.io.output.save)."""
        return _dataset_parts(self.kind, self.data, self.record or {"kind": self.kind, "params": self.params},
                              self.act)

    def __getitem__(self, name):
        return self.data[name]

    def mp(self, name: str = "sigma_w2") -> np.ndarray:
        """``name`` as an object array of mpmath numbers (sweeps run with dps)."""
        dps = self.params.get("dps")
        if dps is None or f"{name}_mp" not in self.data:
            raise InvalidValue(f"{name!r} has no mpmath values: this {self.kind} sweep ran in float64")
        return np.array([_mp_read(t, dps) for t in self.data[f"{name}_mp"]], dtype=object)

    def phase_diagram(self) -> PhaseDiagram:
        """The assembled grid as a :class:`symfield.PhaseDiagram` (kind 'phase')."""
        if self.kind != "phase":
            raise InvalidValue(f"phase_diagram() needs a 'phase' sweep; this one is {self.kind!r}")
        from symfield.theory.phase_diagram import PhaseDiagram
        d = self.data
        return PhaseDiagram(act=self.act, sigma_w2=d["sigma_w2"], sigma_b2=d["sigma_b2"], codes=d["codes"],
                            q_star=d["q_star"], c_star=d["c_star"], gamma_star=d["gamma_star"], slope=d["slope"],
                            eoc=d["eoc"], neutrality=d["neutrality"], eoc_tol=self.params["eoc_tol"],
                            depth=self.params["depth"], c_depth=d.get("c_depth"), gamma_depth=d.get("gamma_depth"))

    @property
    def failed(self) -> int:
        """Number of points (sigma_b2 values, grid points or formulas) whose computation failed (their
        message is in ``r['error']``; a sigma_b2 without an EOC / neutrality point is a result, not a failure)."""
        return int(np.count_nonzero(self.data["failed"])) if "failed" in self.data else 0

    def reports(self) -> list[dict | None]:
        """Verify reports as dicts (None where verify raised; see ``r['error']``)."""
        return [json.loads(t) if t else None for t in self.data["report"]]


def _assemble(store, kind):
    m = store.manifest
    chunks = [store.load(i) for i in range(len(m["chunks"]))]
    p = m["params"]
    if kind == "verify":
        data = {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}
        data["formulas"] = np.array(p["formulas"], dtype=str)
    elif kind in ("eoc", "neutrality"):
        data = {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}
        data["sigma_b2"] = np.array(p["sigma_b2"], float)
    else:
        from symfield.theory.phases import PHASES
        sw, sb = np.array(p["sigma_w2"], float), np.array(p["sigma_b2"], float)
        data = {"sigma_w2": sw, "sigma_b2": sb, "phases": np.asarray(PHASES)}
        for (a, b, c, d), arr in zip(m["chunks"], chunks):
            for k, v in arr.items():
                if k in ("eoc", "neutrality"):
                    if a == 0:
                        data.setdefault(k, np.full(sb.shape, np.nan, v.dtype))[c:d] = v
                else:
                    dtype = object if v.dtype.kind == "U" else v.dtype   # text of any width
                    data.setdefault(k, np.zeros((sw.size, sb.size), dtype))[a:b, c:d] = v
        if "error" in data:
            data["error"] = data["error"].astype(str)
    return data


def _record(m):
    return {k: m[k] for k in ("format", "symfield", "kind", "activation", "params", "hash")}


def _dataset_parts(kind, data, params, act):
    """build()'s arguments for a sweep's data (:meth:`SweepResult.dataset_parts`, the .nc output)."""
    if kind == "phase":
        grid = ("sigma_w2", "sigma_b2")
        dims = {k: grid if np.ndim(v) == 2 else ("sigma_b2",) for k, v in data.items()
                if k not in ("sigma_w2", "sigma_b2", "phases")}
        coords = {"sigma_w2": data["sigma_w2"], "sigma_b2": data["sigma_b2"]}
    else:
        axis = "formula" if kind == "verify" else "sigma_b2"
        dims = {k: (axis,) for k in data if k not in ("sigma_b2", "formulas")}
        coords = {axis: data["formulas" if kind == "verify" else "sigma_b2"]}
    attrs = {"kind": kind, "activation": act}
    if kind == "phase":
        attrs["phases"] = ", ".join(np.asarray(data["phases"]).tolist())
    return dict(data={k: data[k] for k in dims}, coords=coords, dims=dims, params=params, attrs=attrs,
                phases=np.asarray(data["phases"]).tolist() if kind == "phase" else None)


def _write_netcdf(path, kind, data, params, act, prov):
    try:
        import xarray  # noqa: F401
    except ImportError:
        raise Unsupported("netCDF output needs xarray (pip install xarray); use .npz") from None
    from symfield.io.output import netcdf_provenance
    parts = _dataset_parts(kind, data, params, act)
    parts["attrs"].update(netcdf_provenance(prov))
    ds = build(**parts)
    from symfield.core.files import replacing
    with replacing(path) as tmp:
        ds.to_netcdf(tmp)


def _write_output(output, kind, data, params, act):
    path = Path(output)
    if path.suffix.lower() not in (".npz", ".nc"):
        raise InvalidValue(f"The 'output' parameter of sweep must end in .npz or .nc; got {str(output)!r}")
    prov = provenance()      # the output file records it; result.npz does not (it stays byte-identical)
    if path.suffix.lower() == ".npz":
        atomic_write(path, npz_bytes({**data, "params": np.array(_canonical(params)),
                                      "provenance": np.array(_canonical(prov))}))
    else:
        _write_netcdf(path, kind, data, params, act, prov)
    return path


# ---------------------------------------------------------------- the sweep
def sweep(kind: Literal["eoc", "neutrality", "phase", "verify"], act: str | list[str], results_dir: str | os.PathLike,
          sigma_w2: ArrayLike | None = None, sigma_b2: ArrayLike | None = None, dps: int | None = None,
          chunk: int | tuple[int, int] | None = None, scheduler: Any = None, n_workers: int | None = None,
          progress: bool | None = None, depth: int | None = None, eoc_tol: float = 1e-6,
          output: str | os.PathLike | None = None, connect_timeout: float = 10.0) -> SweepResult:
    """Run (or resume) a sweep on Dask, writing each finished chunk to ``results_dir``.

    kind "eoc" / "neutrality": ``sigma_b2`` array, optional ``dps``; ``chunk`` points per chunk
    (default 1 with dps, else 16). kind "phase": ``sigma_w2`` x ``sigma_b2`` grid, optional
    ``depth`` and ``eoc_tol``; ``chunk`` = columns per tile (full sigma_w2 columns, so the EOC and
    neutrality lines are computed once) or a (rows, cols) tile. kind "verify": ``act`` is a
    formula or a list of them; ``chunk`` formulas per chunk (default 1).
    ``scheduler``: None (a LocalCluster with ``n_workers`` single-threaded processes), an address
    'tcp://host:port' (unreachable within ``connect_timeout`` s -> ConnectionError), a
    distributed.Client or a cluster. ``progress``: tqdm bar (default: on a terminal or in a notebook).
    ``output``: also write FILE.npz or FILE.nc (xarray).

    Parameters
    ----------
    kind : {'eoc', 'neutrality', 'phase', 'verify'}
        What to compute.
    act : str or list of str
        Activation (formulas for kind 'verify').
    results_dir : str or path
        Chunk store; a rerun resumes from it.
    sigma_w2, sigma_b2 : array_like, optional
        Axes, as above.
    dps, depth, eoc_tol
        As in :func:`symfield.eoc` and :func:`symfield.phase_diagram`.
    chunk, scheduler, n_workers, progress, output, connect_timeout
        As above.

    Returns
    -------
    SweepResult
        The assembled arrays (``r[name]``), ``failed`` and the chunks ``computed`` and ``reused``.

    Examples
    --------
    >>> r = sf.sweep("eoc", "tanh", "results/eoc", sigma_b2=np.linspace(0, 0.2, 33))   # doctest: +SKIP
    """
    t0 = time.perf_counter()
    manifest, payloads, name = _plan(kind, act, sigma_w2, sigma_b2, dps, chunk, depth, eoc_tol)
    manifest = _hashed(manifest)
    timeout = float(check.real("sweep", "connect_timeout", connect_timeout, lo=0, lo_open=True))
    if n_workers is not None:
        n_workers = check.integer("sweep", "n_workers", n_workers, lo=1)
    if not (scheduler is None or isinstance(scheduler, str) or hasattr(scheduler, "scheduler_address")
            or hasattr(scheduler, "submit")):
        raise InvalidType(f"The 'scheduler' parameter of sweep must be an address such as 'tcp://host:8786', a "
                        f"distributed.Client or a cluster. Got {scheduler!r} instead.")
    if output is not None and Path(output).suffix.lower() not in (".npz", ".nc"):
        raise InvalidValue(f"The 'output' parameter of sweep must end in .npz or .nc; got {str(output)!r}")
    if progress is not None and not isinstance(progress, bool):
        check.fail("sweep", "progress", "True, False or None (a bar when stderr is a terminal)", progress, TypeError)
    store = _Store(results_dir, manifest)
    try:
        reused = store.done()
        todo = sorted(set(range(len(payloads))) - set(reused))
        computed = []
        if todo:
            computed = _run(store, kind, manifest["activation"], payloads, todo, reused, scheduler, n_workers,
                            timeout, progress)
        data = _assemble(store, kind)
        params = _record(manifest)
        path = store.root / "result.npz"
        atomic_write(path, npz_bytes({**data, "params": np.array(_canonical(params))}))
        if output is not None:
            _write_output(output, kind, data, params, name)
    finally:
        store.close()
    return SweepResult(kind, name, dict(manifest["params"]), data, store.root, path, tuple(computed),
                       tuple(reused), time.perf_counter() - t0, _record(manifest))


def _run(store, kind, spec, payloads, todo, reused, scheduler, n_workers, timeout, progress):
    """Submit the missing chunks; save each as it completes. Returns the chunk indices computed."""
    tqdm = tqdm_class()
    run = uuid.uuid4().hex[:12]
    t0 = time.perf_counter()
    client, cluster, close = _connect(scheduler, n_workers, timeout)
    computed, futures = [], {}
    bar = tqdm(total=len(payloads), initial=len(reused), unit="chunk", desc=f"sweep {kind}", file=sys.stderr,
               disable=not (interactive() if progress is None else progress))
    try:
        from distributed import as_completed
        _wait_workers(client, timeout)
        store.log(event="start", run=run, pid=os.getpid(), todo=todo, reused=reused,
                  scheduler=client.scheduler.address)
        if kind != "verify":
            client.run(_warm, kind, spec)
        for i in todo:
            futures[client.submit(compute_chunk, kind, spec, payloads[i], key=f"symfield-sweep-{run}-{i}",
                                  pure=False)] = i
        for fut in as_completed(list(futures), loop=client.loop):
            i = futures[fut]
            try:
                arrays, seconds, where = fut.result()
            except LOCAL_ERRORS as err:
                raise type(err)(f"sweep chunk {i}: {first_line(err)}") from err
            except Exception as err:   # e.g. KilledWorker: the chunk crashed its workers
                raise RunError(f"sweep chunk {i} failed: {type(err).__name__}: {first_line(err)}") from err
            store.save(i, arrays)
            store.log(event="chunk", run=run, chunk=i, seconds=round(seconds, 4), worker=where)
            computed.append(i)
            bar.update(1)
        store.log(event="finish", run=run, seconds=round(time.perf_counter() - t0, 3))
    finally:
        bar.close()
        for fut in futures:
            fut.cancel()
        if close:
            client.close()
        if cluster is not None:
            cluster.close()
    return computed
