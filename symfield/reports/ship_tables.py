"""Build, validate and write the tables shipped in ``symfield/data`` (symfield.numeric.shipped).

    python -m symfield.reports.ship_tables [--budget SECONDS] [NAME ...]

For each built-in in SHIP (or the NAMEs given): the certified (q, theta) table is built panel by panel
over [0, 2^Q_CAP_EXP] until the time budget is spent (later panels are built lazily by users who need
them), the 1-D tables of V and E[psi'^2] where those are integrals; every panel passes the builder's
own certificate (held-out points, mpmath spot checks). Then each table is checked at VALIDATE random
points against quadrature of the defining integral written from phi alone (mpmath
:func:`symfield.reports.oracles.mp_expect1` / ``mp_expect2``; max-pool covariances by the independent
float64 argmax decomposition of symfield.reports.bench_cold), and written, with its sha256, sizes and
the measured errors, to ``data/MANIFEST.json``. A table worse than its 1e-12 promise is not shipped.
A max-pool of a non-monotone phi (gelu+max2) ships its 1-D tables only (its covariance is not tabulated),
checked against the cold suite's sublevel-set oracle (tanh-sinh across the weight's power singularity).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import time

import numpy as np
import sympy as sp

from symfield.core.files import atomic_write
from symfield.numeric import shipped, table1d, tables
from symfield.numeric.maps import maps
from symfield.reports.bench_cold import C_oracle, dpsi2_mp, V_mp
from symfield.symbolic.activation import activation
from symfield.symbolic.kernel import kernel

SHIP = ("tanh", "gelu", "silu", "softplus", "mish", "sigmoid", "elu", "relu+max2", "tanh+max2", "gelu+max2")
VALIDATE = 5
PROMISE = 1e-12
MANIFEST = "MANIFEST.json"


def kernel_of(spec):
    """Kernel of 'name' or 'name+max2' / 'name+avg3'."""
    name, _, pool = spec.partition("+")
    return kernel(activation(name, pool=pool[:3], k=int(pool[3:])) if pool else activation(name))


def build(K, budget):
    """Build K's tables (panels while the budget lasts); returns the engine's maps holding them."""
    t0 = time.perf_counter()
    M = maps(K, method="table")
    T = M.table
    if T is not None and T.kind != "homogeneous":
        for e in range(tables.E0, tables.Q_CAP_EXP + 1):
            T.ensure(0.0, 2.0 ** e * 0.99)
            if time.perf_counter() - t0 > budget:
                break
    return M


def validate(K, M, n=VALIDATE, seed=0):
    """Max errors of the tables against the oracles at n seeded random points (q in the table's range,
    at most 4; C at a random correlation), in each map's natural scale."""
    act = K.act
    rng = np.random.default_rng(seed)
    T = M.table
    qhi = 4.0 if T is None or T.kind == "homogeneous" else min(4.0, T.q_range[1])
    qs = np.exp(rng.uniform(math.log(2.0 ** -6), math.log(qhi), n))
    cs = rng.uniform(-0.99, 0.99, n)
    err = dict(V=0.0, dpsi2=0.0, **({} if T is None else dict(C=0.0)))    # C only where a 2-D table is shipped
    for q, c in zip(qs.tolist(), cs.tolist()):
        v = float(V_mp(act, q, 20))
        err["V"] = max(err["V"], abs(float(M.V(q)) - v) / v)
        d = float(dpsi2_mp(act, q, 20))
        err["dpsi2"] = max(err["dpsi2"], abs(float(M.dpsi2(q)) - d) / d)
        if T is not None:
            ref, _ = C_oracle(act, q, q, c * q)
            err["C"] = max(err["C"], abs(float(T.C(q, q, c * q)) - float(ref)) / v)
    return err


def write(spec, K, M, err, seconds):
    """Write K's tables into the package data; returns the manifest entries."""
    entries = {}
    T = M.table
    if T is not None:
        path = shipped.path("tables", tables.ship_name(K))
        path.parent.mkdir(parents=True, exist_ok=True)
        tables.save(T, path)
        entries[f"tables/{path.name}"] = dict(kind=T.kind, panels=sorted(T.panels), q_range=list(T.q_range),
                                              cells=sum(len(p.cells) for p in T.panels.values()))
    for what in ("V", "dpsi2"):
        tab = M.table1d(what) if K[what].has(sp.Integral) else None
        if tab is not None:
            path = shipped.path("tables1d", table1d.ship_name(tab.ship))
            path.parent.mkdir(parents=True, exist_ok=True)
            tab.save(path)
            entries[f"tables1d/{path.name}"] = dict(kind=f"1-D {what}", panels=int(tab.lo.size), error=tab.error)
    for rel, e in entries.items():
        data = (shipped.DATA / rel).read_bytes()
        e.update(act=spec, bytes=len(data), sha256=hashlib.sha256(data).hexdigest(), oracle_errors=err,
                 build_seconds=round(seconds, 1))
    return entries


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m symfield.reports.ship_tables", description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", help=f"built-ins to ship (default: {' '.join(SHIP)})")
    ap.add_argument("--budget", type=float, default=300.0, help="seconds of panel building per activation")
    a = ap.parse_args(argv)
    mpath = shipped.DATA / MANIFEST
    manifest = json.loads(mpath.read_text()) if mpath.exists() else {}
    for spec in a.names or SHIP:
        t0 = time.perf_counter()
        K = kernel_of(spec)
        M = build(K, a.budget)
        err = validate(K, M)
        seconds = time.perf_counter() - t0
        worst = max(err.values())
        print(f"{spec:12s} {seconds:7.1f} s  oracle errors " + ", ".join(f"{k} {v:.1e}" for k, v in err.items()),
              flush=True)
        if not worst <= PROMISE:
            print(f"{spec}: NOT shipped (worse than {PROMISE:g})", flush=True)
            continue
        manifest = {k: v for k, v in manifest.items() if v.get("act") != spec}
        manifest.update(write(spec, K, M, err, seconds))
        atomic_write(mpath, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    total = sum(v["bytes"] for v in manifest.values())
    print(f"{len(manifest)} files, {total / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
