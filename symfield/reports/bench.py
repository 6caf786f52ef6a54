"""Benchmark: symfield.propagate against the usual ways of computing the same recursion, in ONE run.

    (1) symfield   sf.propagate on the full grid (best of ``repeat``; compile/table build timed apart)
    (2) NumPy GH   vectorised Gauss-Hermite at the smallest node count n whose per-step map error
                   is <= ``target``; timed on a sub-grid
    (3) SciPy      adaptive scipy.integrate.quad (V) / dblquad (C), epsrel = 1e-12, on
                   ``scipy_samples`` cell-layers, extrapolated per cell-layer
    (4) floor      closed forms (relu, erf): a hand-written Numba loop of the same (stable) formula

Times are per cell-layer (one grid point advanced one layer). Accuracy: at ``n_check`` random
(cell, layer) points the mpmath maps are evaluated on symfield's own inputs of that layer (the error of
one step); ``n_traj`` whole trajectories are compared with propagate's quadrature path.
docs/numerics.md section 10.
"""
from __future__ import annotations

from symfield.core.errors import InvalidType, Unsupported
import math
import time
from dataclasses import dataclass, field

import numpy as np

from symfield.core import validate as check
from symfield.numeric.evaluate import NUMPY_MODULES, vectorised
from symfield.symbolic.formula import X
from symfield.symbolic.kernel import kernel
from symfield.theory.maps import C as Cmap
from symfield.theory.maps import V as Vmap
from symfield.theory.maps import q_map, qab_map
from symfield.theory.propagate import propagate

_F = "bench"


@dataclass
class BenchResult:
    """Numbers of one :func:`bench` run; ``report()`` prints them."""
    act: str
    grid: tuple
    depth: int
    method: str
    times: dict = field(default_factory=dict)        # seconds per cell-layer by contender
    notes: dict = field(default_factory=dict)        # how each contender was run
    accuracy: dict = field(default_factory=dict)     # symfield vs mpmath; GH and SciPy map errors
    setup: dict = field(default_factory=dict)        # first-call (compile/table) seconds etc.

    def ratios(self) -> dict:
        t = self.times.get("symfield")
        return {k: v / t for k, v in self.times.items() if k != "symfield" and t}

    def report(self) -> str:
        lines = [f"symfield bench: {self.act}, grid {self.grid[0]} x {self.grid[1]}, depth {self.depth} "
                 f"(propagate method: {self.method})"]
        for k, v in self.setup.items():
            lines.append(f"  setup {k}: {v}")
        lines.append(f"  {'contender':<12s} {'s/cell-layer':>13s} {'x symfield':>11s}  how")
        r = self.ratios()
        for k, v in self.times.items():
            lines.append(f"  {k:<12s} {v:13.3e} {('%.3g' % r[k]) if k in r else '1':>11s}  {self.notes.get(k, '')}")
        for k, v in self.accuracy.items():
            lines.append(f"  accuracy {k}: {v}")
        return "\n".join(lines)


def _grid(grid, sigma_w2, sigma_b2):
    sw = np.linspace(*sigma_w2, grid[0])[:, None]
    sb = np.linspace(*sigma_b2, grid[1])[None, :]
    return sw, sb


def bench(act: str = "tanh", grid: tuple[int, int] = (256, 256), depth: int = 100,
          sigma_w2: tuple[float, float] = (0.1, 4.0), sigma_b2: tuple[float, float] = (0.0, 0.2), repeat: int = 3,
          gh_grid: tuple[int, int] = (8, 8), gh_nodes: tuple[int, ...] = (16, 32, 64, 128, 192, 256, 320, 360),
          target: float = 1e-10, scipy_samples: int = 4, n_check: int = 20, check_dps: int = 30, n_traj: int = 4,
          seed: int = 0, verbose: bool = False) -> BenchResult:
    """Run the benchmark (see the module docstring) and return a :class:`BenchResult`.

    Parameters
    ----------
    act : str
        Activation.
    grid, depth, repeat : tuple of int, int, int
        (n_w, n_b) points of sigma_w2 x sigma_b2, layers, timing repeats.
    sigma_w2, sigma_b2 : tuple of float
        The closed intervals of the grid.
    gh_grid, gh_nodes, target : tuple of int, tuple of int, float
        Sub-grid (taken evenly from the grid) on which GH runs, node counts tried (numpy's hermegauss
        overflows beyond n = 360), per-step accuracy GH must reach (if no tried count reaches it,
        the most accurate one is timed and reported as such).
    scipy_samples, n_check, check_dps, n_traj : int
        Cell-layers timed with QUADPACK; mpmath checks at check_dps digits; cells whose whole
        trajectories are compared with the quadrature path (table path only); 0 skips each.
    seed, verbose : int, bool
        Seed of the sampled cells; print as it goes.

    Returns
    -------
    BenchResult
        Timings and accuracies of each path.

    Examples
    --------
    Small values run in seconds:

    >>> sf.bench(grid=(16, 16), depth=10, n_check=2, check_dps=15)   # doctest: +SKIP
    """
    grid = tuple(check.integer(_F, "grid", g, lo=1) for g in _pair(grid, "grid"))
    gh_grid = tuple(check.integer(_F, "gh_grid", g, lo=1) for g in _pair(gh_grid, "gh_grid"))
    depth = check.integer(_F, "depth", depth, lo=2)
    repeat = check.integer(_F, "repeat", repeat, lo=1)
    scipy_samples = check.integer(_F, "scipy_samples", scipy_samples, lo=0)
    n_check = check.integer(_F, "n_check", n_check, lo=0)
    n_traj = check.integer(_F, "n_traj", n_traj, lo=0)
    check_dps = check.dps(_F, check_dps)
    sigma_w2 = tuple(float(v) for v in check.real(_F, "sigma_w2", _pair(sigma_w2, "sigma_w2"), lo=0))
    sigma_b2 = tuple(float(v) for v in check.real(_F, "sigma_b2", _pair(sigma_b2, "sigma_b2"), lo=0))
    target = float(check.real(_F, "target", target, lo=0, lo_open=True))
    K = kernel(act)
    say = print if verbose else (lambda *a, **k: None)
    sw, sb = _grid(grid, sigma_w2, sigma_b2)

    r, res = _time_symfield(K, sw, sb, depth, repeat)                  # (1)
    say(res.report())
    rng = np.random.default_rng(seed)
    states = _states(r, sw, sb, rng, max(n_check, 12))
    _time_gauss_hermite(res, K, r, sw, sb, states, gh_grid, gh_nodes, target)   # (2)
    say(res.report())
    if scipy_samples:                                                   # (3)
        ts, errs = _scipy(K, states[:scipy_samples])
        res.times["scipy-quad"] = ts
        res.notes["scipy-quad"] = (f"quad (V) + dblquad (C), epsrel 1e-12, mean of {scipy_samples} cell-layers; "
                                   f"per-step error {max(errs):.1e}")
    _time_floors(res, K, r, sw, sb, repeat)                             # (4)
    say(res.report())
    if n_traj and r.method.startswith("numba-table"):
        _check_trajectories(res, K, r, sw, sb, rng, n_traj)
    if n_check:   # accuracy vs mpmath, one step on symfield's own inputs
        res.accuracy.update(_mp_check(K, r, sw, sb, states[:n_check], check_dps))
    say(res.report())
    return res


def _time_symfield(K, sw, sb, depth, repeat):
    """(1) sf.propagate on the grid: the first call (code generation/compile, table build) timed apart,
    then the best of ``repeat`` warm calls. Returns (its result, a new BenchResult)."""
    t0 = time.perf_counter()
    r = propagate(K.act, sw, sb, depth, method="table")
    first = time.perf_counter() - t0
    best = math.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        r = propagate(K.act, sw, sb, depth, method="table")
        best = min(best, time.perf_counter() - t0)
    cells = sw.size * sb.size
    res = BenchResult(K.act.name, (sw.size, sb.size), depth, r.method)
    res.setup["first call s (compile, table build/load)"] = round(first, 3)
    if r.error:
        res.setup["table certified per-step bound"] = {k: float(f"{v:.2e}") for k, v in r.error.items()}
    res.times["symfield"] = best / (cells * depth)
    res.notes["symfield"] = f"sf.propagate, best of {repeat}: {best:.3f} s for {cells} cells x {depth} layers"
    return r, res


def _time_gauss_hermite(res, K, r, sw, sb, states, gh_grid, gh_nodes, target):
    """(2) NumPy Gauss-Hermite at equal per-step accuracy, timed on an evenly spaced sub-grid."""
    if not (K.act.pool in (None, "avg") or K.act.k == 1):
        res.notes["numpy-GH"] = "n/a: pooled psi (2k-dimensional GH)"
        return
    depth = res.depth
    gh = _gh_choose(K, states, gh_nodes, target)
    rows = np.linspace(0, sw.size - 1, gh_grid[0]).round().astype(int)
    colsb = np.linspace(0, sb.size - 1, gh_grid[1]).round().astype(int)
    sws, sbs = sw[rows], sb[:, colsb]
    t0 = time.perf_counter()
    ghq, ghqab = _gh_recursion(K, sws, sbs, depth, gh["n"])
    tgh = time.perf_counter() - t0
    res.times["numpy-GH"] = tgh / (gh_grid[0] * gh_grid[1] * depth)
    reached = "reaches" if gh["err"] <= target else "CANNOT reach"
    res.notes["numpy-GH"] = (f"n = {gh['n']} nodes (2-D: n^2), {reached} {target:.0e}: per-step error "
                             f"{gh['err']:.1e} (errors by n: {gh['table']}); {gh_grid[0]}x{gh_grid[1]} sub-grid")
    sub = r.q[:, rows][:, :, colsb]
    res.accuracy["numpy-GH vs symfield, whole trajectories (max |dq|/q)"] = float(
        f"{np.nanmax(np.abs(ghq - sub) / sub):.1e}")


def _time_floors(res, K, r, sw, sb, repeat):
    """(4) The compute floor for closed forms: hand-written Numba loops (best of ``repeat``) and
    their agreement with symfield on the whole grid."""
    depth = res.depth
    for key, fname in (("numba-floor", K.act.name), ("numba-asin", K.act.name + "_asin")):
        floor = _floor(fname)
        if floor is None:
            continue
        W, B = (np.ascontiguousarray(np.broadcast_to(a, (sw.size, sb.size))).ravel() for a in (sw, sb))
        oq, oqab = np.empty((depth, W.size)), np.empty((depth, W.size))
        floor(W[:2], B[:2], depth, oq[:, :2], oqab[:, :2])
        tb = math.inf
        for _ in range(repeat):
            t0 = time.perf_counter()
            floor(W, B, depth, oq, oqab)
            tb = min(tb, time.perf_counter() - t0)
        res.times[key] = tb / (W.size * depth)
        dq = float(np.nanmax(np.abs(r.q.reshape(depth, -1) - oq) / np.abs(oq)))
        dqab = float(np.nanmax(np.abs(r.qab.reshape(depth, -1) - oqab) / np.abs(oq)))
        what = "the same (stable) formula" if key == "numba-floor" else "the textbook arcsin formula"
        res.notes[key] = f"hand-written numba loop of {what} (prange over points), best of {repeat}"
        res.accuracy[f"{key} vs symfield (max |dq|/q, |dqab|/q)"] = (float(f"{dq:.1e}"), float(f"{dqab:.1e}"))


def _check_trajectories(res, K, r, sw, sb, rng, n_traj):
    """Whole trajectories (all layers) of ``n_traj`` random cells against the quadrature path
    (maps by symfield.numeric, no table)."""
    cells_t = [(int(i), int(j)) for i, j in zip(rng.integers(0, sw.size, n_traj), rng.integers(0, sb.size, n_traj))]
    t0 = time.perf_counter()
    quad = propagate(K.act, np.array([sw[i, 0] for i, _ in cells_t]), np.array([sb[0, j] for _, j in cells_t]),
                     res.depth, method="quadrature")
    got_q = np.stack([r.q[:, i, j] for i, j in cells_t], axis=1)
    got_qab = np.stack([r.qab[:, i, j] for i, j in cells_t], axis=1)
    res.accuracy[f"symfield vs quadrature path, {n_traj} whole trajectories (max |dq|/q, |dqab|/q)"] = (
        float(f"{np.nanmax(np.abs(got_q - quad.q) / quad.q):.1e}"),
        float(f"{np.nanmax(np.abs(got_qab - quad.qab) / quad.q):.1e}"))
    res.accuracy["quadrature path seconds"] = round(time.perf_counter() - t0, 1)


def _pair(v, name):
    v = tuple(v) if isinstance(v, (tuple, list)) else None
    if v is None or len(v) != 2:
        raise InvalidType(f"The '{name}' parameter of {_F} must be a pair of numbers. Got {v!r} instead.")
    return v


def _states(r, sw, sb, rng, n):
    """n random (cell, layer >= 2) with the layer's input (q, q12 of layer - 1) and output."""
    depth = r.q.shape[0]
    out = []
    shape = r.q.shape[1:]
    for _ in range(n):
        i, j = rng.integers(shape[0]), rng.integers(shape[1])
        l = int(rng.integers(2, depth + 1))
        out.append(dict(cell=(int(i), int(j)), layer=l, sw=float(sw[i, 0]), sb=float(sb[0, j]),
                        q_in=float(r.q[l - 2, i, j]), qab_in=float(r.qab[l - 2, i, j]),
                        q=float(r.q[l - 1, i, j]), qab=float(r.qab[l - 1, i, j])))
    return out


# --------------------------------------------------------------------------- Gauss-Hermite baseline
def _gh_rule(n):
    z, w = np.polynomial.hermite_e.hermegauss(n)
    return z, w / math.sqrt(2 * math.pi)


def _phi_numpy(K):
    return vectorised(K.act.expr, NUMPY_MODULES)


def _gh_maps(K, n):
    """V(q), C(q, q, q12) by GH for arrays (single node; avg-pool by its moment identity)."""
    phi = _phi_numpy(K)
    z, w = _gh_rule(n)
    Z1, Z2 = np.meshgrid(z, z, indexing="ij")
    Z1, Z2 = Z1.ravel(), Z2.ravel()
    k = K.act.k if K.act.pool == "avg" else 1

    def V(q):
        s = np.sqrt(q)[:, None]
        f = phi(s * z[None, :])
        v, m = (f * f) @ w, f @ w
        return v / k + (1 - 1 / k) * m * m

    def C(q, q12):
        s = np.sqrt(q)
        c = np.clip(q12 / q, -1, 1)
        r = np.sqrt(np.maximum((1 - c) * (1 + c), 0.0))
        out = np.empty(q.size)
        m = (phi(s[:, None] * z[None, :]) @ w) if k > 1 else 0.0
        step = max(1, (1 << 20) // Z1.size)   # cells x n^2 nodes per vectorised block (~8 MB)
        for i in range(0, q.size, step):
            sl = slice(i, i + step)
            u = phi((s[sl, None] * z[None, :]).ravel()).reshape(-1, n)          # phi(u): n values per cell
            v = phi((s[sl, None] * (c[sl, None] * Z1[None, :] + r[sl, None] * Z2[None, :])).ravel())
            out[sl] = ((v.reshape(-1, n, n) @ w) * u) @ w                        # sum_a w_a u_a sum_b w_b v_ab
        return out / k + ((1 - 1 / k) * m * m if k > 1 else 0.0)
    return V, C


def _gh_choose(K, states, nodes, target):
    """Smallest n whose per-step map error (V relative, C against V) on the states is <= target."""
    q = np.array([s["q_in"] for s in states])
    q12 = np.array([s["qab_in"] for s in states])
    Vref, Cref = Vmap(K.act, q), Cmap(K.act, q, q, q12)
    table, best = {}, None
    for n in nodes:
        Vg, Cg = _gh_maps(K, int(n))
        err = float(max(np.max(np.abs(Vg(q) - Vref) / Vref), np.max(np.abs(Cg(q, q12) - Cref) / Vref)))
        table[int(n)] = float(f"{err:.1e}")
        if best is None or err < best[1]:
            best = (int(n), err)
        if err <= target:
            return dict(n=int(n), err=err, table=table)
    return dict(n=best[0], err=best[1], table=table)


def _gh_recursion(K, sw, sb, depth, n):
    V, C = _gh_maps(K, n)
    S, B = (np.ascontiguousarray(np.broadcast_to(a, np.broadcast_shapes(sw.shape, sb.shape))).ravel() for a in (sw, sb))
    q, qab = S + B, B.copy()
    out_q, out_qab = np.empty((depth, S.size)), np.empty((depth, S.size))
    out_q[0], out_qab[0] = q, qab
    for l in range(1, depth):
        q, qab = S * V(q) + B, S * C(q, qab) + B
        out_q[l], out_qab[l] = q, qab
    shape = (depth,) + np.broadcast_shapes(sw.shape, sb.shape)
    return out_q.reshape(shape), out_qab.reshape(shape)


# --------------------------------------------------------------------------- SciPy adaptive baseline
def _scipy(K, states):
    """Seconds per cell-layer of quad (V) + dblquad (C) and their per-step errors."""
    import scipy.integrate as si
    if K.act.pool is not None and K.act.k > 1:
        raise Unsupported("the SciPy baseline covers single-node activations")
    import sympy as sp
    phi = sp.lambdify(X, K.act.expr, modules=["math", "mpmath"])
    npdf = lambda t: math.exp(-0.5 * t * t) / math.sqrt(2 * math.pi)
    total, errs = 0.0, []
    for s in states:
        q, q12 = s["q_in"], s["qab_in"]
        sq = math.sqrt(q)
        c = max(-1.0, min(1.0, q12 / q))
        r = math.sqrt(max((1 - c) * (1 + c), 0.0))
        t0 = time.perf_counter()
        Vq = si.quad(lambda z: phi(sq * z) ** 2 * npdf(z), -math.inf, math.inf, epsabs=0, epsrel=1e-12, limit=200)[0]
        Cq = si.dblquad(lambda z2, z1: phi(sq * z1) * phi(sq * (c * z1 + r * z2)) * npdf(z1) * npdf(z2),
                        -math.inf, math.inf, -math.inf, math.inf, epsabs=0, epsrel=1e-12)[0]
        total += time.perf_counter() - t0
        Vr, Cr = float(Vmap(K.act, q)), float(Cmap(K.act, q, q, q12))
        errs += [abs(Vq - Vr) / Vr, abs(Cq - Cr) / Vr]
    return total / len(states), errs


# --------------------------------------------------------------------------- hand-written floors
_FLOORS = {}


def _floor(name):
    """A hand-written parallel Numba loop of the closed-form recursion (relu, erf), else None."""
    if name not in ("relu", "erf", "erf_asin"):
        return None
    if name not in _FLOORS:
        from numba import njit, prange

        @njit(parallel=True, cache=True)
        def relu_loop(sw, sb, depth, oq, oqab):
            for i in prange(sw.size):
                w, b = sw[i], sb[i]
                q, qab = w + b, b
                oq[0, i], oqab[0, i] = q, qab
                for l in range(1, depth):
                    root = math.sqrt(max(q * q - qab * qab, 0.0))
                    qab = w * (root + qab * (math.pi - math.atan2(root, qab))) / (2 * math.pi) + b
                    q = w * q / 2 + b
                    oq[l, i], oqab[l, i] = q, qab

        @njit(parallel=True, cache=True)
        def erf_loop(sw, sb, depth, oq, oqab):
            # the stable form symfield derives (docs/theory.md section 3): atan/atan2, not arcsin near |c| = 1
            for i in prange(sw.size):
                w, b = sw[i], sb[i]
                q, qab = w + b, b
                oq[0, i], oqab[0, i] = q, qab
                for l in range(1, depth):
                    qab = w * 2 * math.atan2(2 * qab, math.sqrt(max(4 * q * q + 4 * q + 1 - 4 * qab * qab, 0.0))) / math.pi + b
                    q = w * 2 * math.atan(2 * q / math.sqrt(4 * q + 1)) / math.pi + b
                    oq[l, i], oqab[l, i] = q, qab

        @njit(parallel=True, cache=True)
        def erf_asin_loop(sw, sb, depth, oq, oqab):
            # the textbook arcsin form: cheaper, but ill-conditioned as c -> 1
            for i in prange(sw.size):
                w, b = sw[i], sb[i]
                q, qab = w + b, b
                oq[0, i], oqab[0, i] = q, qab
                for l in range(1, depth):
                    d = 1.0 + 2.0 * q
                    qab = w * (2 / math.pi) * math.asin(2.0 * qab / d) + b
                    q = w * (2 / math.pi) * math.asin(2.0 * q / d) + b
                    oq[l, i], oqab[l, i] = q, qab
        _FLOORS.update(relu=relu_loop, erf=erf_loop, erf_asin=erf_asin_loop)
    return _FLOORS[name]


# --------------------------------------------------------------------------- accuracy vs mpmath
def _mp_check(K, r, sw, sb, states, dps):
    """One-step errors of symfield against sf.q_map/qab_map(dps) on symfield's own layer inputs."""
    import mpmath
    eq, eqab, eqab_q, worst = 0.0, 0.0, 0.0, None
    t0 = time.perf_counter()
    for s in states:
        mq = q_map(K.act, s["q_in"], s["sw"], s["sb"], dps=dps)
        mqab = qab_map(K.act, s["q_in"], s["q_in"], s["qab_in"], s["sw"], s["sb"], dps=dps)
        with mpmath.workdps(dps):
            e1 = float(abs(mpmath.mpf(s["q"]) - mq) / mq)
            d = abs(mpmath.mpf(s["qab"]) - mqab)
            e2 = float(d / abs(mqab)) if mqab != 0 else (0.0 if s["qab"] == 0 else math.inf)
            e3 = float(d / mq)
        if max(e1, e2) > max(eq, eqab):
            worst = dict(s, err_q=e1, err_qab=e2)
        eq, eqab, eqab_q = max(eq, e1), max(eqab, e2), max(eqab_q, e3)
    return {f"symfield vs mpmath (dps {dps}) one step at {len(states)} (cell, layer): max |dq|/q": float(f"{eq:.2e}"),
            "max |dqab|/|qab|": float(f"{eqab:.2e}"), "max |dqab|/q": float(f"{eqab_q:.2e}"),
            "worst point": {k: v for k, v in (worst or {}).items() if k in ("cell", "layer", "q", "qab")},
            "mpmath seconds": round(time.perf_counter() - t0, 1)}
