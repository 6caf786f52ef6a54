"""``symfield bench --suite cold``: the cold-start benchmark.

Every row is one user-facing call (a phase diagram, a propagation, ``sf.C``, a neutrality root, the
README's main command), run in a NEW Python process with a new empty ``SYMFIELD_CACHE`` (and
``NUMBA_CACHE_DIR``), so it pays what a new user pays; with ``warm=True`` the row runs again on the
cache the first run filled. ``Row.metric`` says what is timed ("wall", "call" or "per_call"). The
parent compares a few of the child's results with an oracle written from phi alone
(symfield.reports.oracles; for max-pool covariances an independent float64 tensor quadrature, below).
Timings are reported, never asserted: a row is "met", "missed", "timed out" or "failed".
docs/numerics.md section 10.
"""
from __future__ import annotations

from symfield.core.errors import InvalidValue
import json
import math
from functools import lru_cache
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import mpmath
import numpy as np

from symfield.core import validate as check
from symfield.core.files import atomic_write
from symfield.core.version import provenance
from symfield.reports.oracles import mp_expect1, mp_expect2


@dataclass
class Row:
    """One benchmark case: ``kind`` names the child's call, ``params`` its arguments."""
    name: str
    case: str
    kind: str
    params: dict
    target: float                       # seconds (per call for metric "per_call")
    warm_target: float | None = None
    metric: str = "wall"                # "wall" | "call" | "per_call"
    tol: float = 1e-9                   # max relative error counted as accurate
    timeout: float | None = None        # default max(3 target, 60) s

    def limit(self, override=None):
        """The child's time limit in seconds (an override must be a finite number > 0)."""
        if override is not None:
            return float(check.real("bench_cold.run", "timeout", override, lo=0, lo_open=True))
        return self.timeout if self.timeout is not None else max(3 * self.target, 60.0)


PHASE6 = ("gelu", "silu", "elu", "softplus", "mish", "sigmoid")
# the paper's axes, sigma_w2 = 0 included, for every distinct built-in (swish = silu, abrelu and polynomial at
# their defaults = relu and linear) and the pools of relu, tanh and gelu
PAPER = ("linear", "relu", "leaky_relu", "abs", "erf", "tanh", "sigmoid", "softplus", "silu", "gelu", "elu", "mish",
         "sin", "cos", "monomial", "relu+max2", "tanh+max2", "gelu+max2", "relu+avg2", "tanh+avg2")


def _rows() -> list[Row]:
    """The target table of the cold-start benchmark, in order."""
    rows = [Row(f"{a}-phase", f'phase_diagram("{a}") 101x51, sigma_w2 0.1..4 x sigma_b2 0..0.5', "phase_diagram",
                dict(act=a, grid=[101, 51], sw=[0.1, 4.0], sb=[0.0, 0.5]), 60.0, 1.5) for a in PHASE6]
    for spec in PAPER:
        a, _, pool = spec.partition("+")
        rows.append(Row(f"paper-{spec.replace('+', '-')}", f'phase_diagram("{spec}") 101x51, sigma_w2 0..4 x sigma_b2 0..0.2',
                        "phase_diagram", dict(act=a, grid=[101, 51], sw=[0.0, 4.0], sb=[0.0, 0.2],
                                              **(dict(pool=pool[:3], k=int(pool[3:])) if pool else {})), 60.0, 1.5))
    for a, t in (("relu", 20.0), ("tanh", 60.0)):
        rows.append(Row(f"{a}-max2-phase", f'phase_diagram("{a}", max2) 36x21, sigma_w2 0.5..4 x sigma_b2 0..0.2',
                        "phase_diagram", dict(act=a, pool="max", grid=[36, 21], sw=[0.5, 4.0], sb=[0.0, 0.2]), t))
    rows += [
        Row("elu-phase-point", 'phase("elu", 1.5, 0.0)', "phase", dict(act="elu", sw=1.5, sb=0.0), 20.0),
        Row("tanh-max2-propagate", 'propagate("tanh", max2) 64x64, depth 50', "propagate",
            dict(act="tanh", pool="max", grid=[64, 64], sw=[0.5, 4.0], sb=[0.0, 0.2], depth=50), 60.0),
        Row("gelu-propagate", 'propagate("gelu") 256x256, depth 100', "propagate",
            dict(act="gelu", grid=[256, 256], sw=[0.1, 4.0], sb=[0.0, 0.2], depth=100), 60.0),
        Row("tanh-max2-C-scalar", "tanh+max2 scalar C at unequal norms, per call once warm", "C_scalar",
            dict(act="tanh", pool="max", n=10), 1e-3, metric="per_call"),
        Row("relu-max2-C-array", "relu+max2 array C over 10^4 points (the call)", "C_array",
            dict(act="relu", pool="max", n=10_000), 1.0, metric="call"),
        Row("tanh-neutrality-dps30", 'neutrality("tanh", 0.1, dps=30)', "neutrality",
            dict(act="tanh", sb=0.1, dps=30), 20.0),
        Row("ntk-grid", 'propagate("erf", ntk=True) 256x256, depth 100', "ntk_grid",
            dict(act="erf", grid=[256, 256], sw=[0.1, 4.0], sb=[0.0, 0.2], depth=100), 60.0),
        Row("tanh-gram-residual", 'gram_fluctuations("tanh", 1.5, 0.05, 30, residual=0.5)', "gram",
            dict(act="tanh", sw=1.5, sb=0.05, depth=30, residual=0.5), 60.0),
        Row("gelu-gram", 'gram_fluctuations("gelu", 2.3, 0.05, 24)', "gram",
            dict(act="gelu", sw=2.3, sb=0.05, depth=24), 20.0),
        Row("gelu-diagnose", 'init.diagnose(24 recorded gelu layers, width 256, 4 inputs), the call', "diagnose",
            dict(act="gelu", sw=2.0, sb=0.05, depth=24, width=256, n=4), 5.0, metric="call"),
        Row("relu-jacobian", 'jacobian_spectrum("relu", 2, 0, 32)', "jacobian",
            dict(act="relu", sw=2.0, sb=0.0, depth=32), 10.0),
        Row("tanh-isometry", 'isometry_diagram("tanh") 50x50, depth 8', "isometry",
            dict(act="tanh", grid=[50, 50], sw=[0.5, 3.0], sb=[0.0, 0.2], depth=8), 10.0),
        Row("readme-main", "symfield phase tanh --plot phase.png (README)", "cli",
            dict(argv=["phase", "tanh", "--plot", "{tmp}/phase.png"]), 15.0, 2.5, tol=math.inf),
    ]
    return rows


ROWS = _rows()


def select(names=None) -> list[Row]:
    """The rows named in ``names`` (a comma-separated string or a list; None: all)."""
    if names is None:
        return list(ROWS)
    wanted = [n.strip() for n in (names.split(",") if isinstance(names, str) else names) if n.strip()]
    known = {r.name: r for r in ROWS}
    bad = [n for n in wanted if n not in known]
    if bad or not wanted:
        raise InvalidValue(f"The 'rows' parameter of bench --suite cold must name rows among {', '.join(known)}. "
                         f"Got {', '.join(map(repr, bad)) if bad else repr(names)} instead.")
    return [known[n] for n in wanted]


# ---------------------------------------------------------------- the child process
def _act(p):
    from symfield.symbolic.activation import activation
    return activation(p["act"], pool=p["pool"], k=p.get("k", 2)) if p.get("pool") else activation(p["act"])


def _spread(n, m=5):
    """m indices spread over range(n)."""
    return sorted(set(np.linspace(0, n - 1, min(m, n)).round().astype(int).tolist())) if n else []


def _child_phase_diagram(p, sf):
    W, B = np.linspace(*p["sw"], p["grid"][0]), np.linspace(*p["sb"], p["grid"][1])
    t0 = time.perf_counter()
    pd = sf.phase_diagram(_act(p), W, B)
    call = time.perf_counter() - t0
    ww, bb = np.meshgrid(W, B, indexing="ij")
    ok = np.flatnonzero((np.isfinite(pd.q_star) & (pd.q_star > 0) & (pd.q_star < 1e6) & (bb > 0)
                         & np.isfinite(pd.slope)).ravel())
    pick = ok[_spread(ok.size)]
    pts = [dict(sw=float(ww.flat[i]), sb=float(bb.flat[i]), q=float(pd.q_star.flat[i]),
                slope=float(pd.slope.flat[i])) for i in pick]
    return call, dict(points=pts, counts=pd.counts())


def _child_phase(p, sf):
    t0 = time.perf_counter()
    ph = sf.phase(_act(p), p["sw"], p["sb"], full=True)
    call = time.perf_counter() - t0
    return call, dict(points=[dict(sw=p["sw"], sb=p["sb"], q=ph.q_star, slope=ph.slope)], label=ph.label)


def _child_propagate(p, sf):
    W, B = np.linspace(*p["sw"], p["grid"][0])[:, None], np.linspace(*p["sb"], p["grid"][1])
    L = p["depth"]
    t0 = time.perf_counter()
    r = sf.propagate(_act(p), W, B, L, layers=[L - 1, L])
    call = time.perf_counter() - t0
    ww, bb = np.broadcast_to(W, r.q.shape[1:]), np.broadcast_to(B, r.q.shape[1:])
    good = (r.status == 0) & np.isfinite(r.q[1]) & (r.q[0] < 1e6)
    if p.get("pool") == "max":      # the argmax oracle (max2_C) resolves correlations up to RHO_MAX only
        good &= r.qab[0] <= RHO_MAX * r.q[0]
    ok = np.flatnonzero(good.ravel())
    pts = [dict(sw=float(ww.flat[i]), sb=float(bb.flat[i]), q_prev=float(r.q[0].flat[i]),
                qab_prev=float(r.qab[0].flat[i]), q=float(r.q[1].flat[i]), qab=float(r.qab[1].flat[i]))
           for i in ok[_spread(ok.size)]]
    return call, dict(points=pts)


def _pairs(n, seed):
    """n (q1, q2, q12) at unequal norms, |c| <= 0.9."""
    rng = np.random.default_rng(seed)
    q1 = rng.uniform(0.3, 3.0, n)
    q2 = q1 * rng.uniform(1.2, 3.0, n)
    return q1, q2, rng.uniform(-0.9, 0.9, n) * np.sqrt(q1 * q2)


def _child_C_scalar(p, sf):
    act, n = _act(p), p["n"]
    for a, b, c in zip(*_pairs(n, 1)):          # first use: whatever gets built or compiled
        sf.C(act, float(a), float(b), float(c))
    q1, q2, q12 = _pairs(n, 2)
    vals, t0 = [], time.perf_counter()
    for a, b, c in zip(q1, q2, q12):
        vals.append(float(sf.C(act, float(a), float(b), float(c))))
    per = (time.perf_counter() - t0) / n
    pts = [dict(q1=float(q1[i]), q2=float(q2[i]), q12=float(q12[i]), C=vals[i]) for i in _spread(n)]
    return per, dict(points=pts)


def _child_C_array(p, sf):
    act = _act(p)
    q1, q2, q12 = _pairs(p["n"], 3)
    t0 = time.perf_counter()
    out = np.asarray(sf.C(act, q1, q2, q12), float)
    call = time.perf_counter() - t0
    pts = [dict(q1=float(q1[i]), q2=float(q2[i]), q12=float(q12[i]), C=float(out[i])) for i in _spread(q1.size)]
    return call, dict(points=pts)


def _child_ntk_grid(p, sf):
    W, B = np.linspace(*p["sw"], p["grid"][0])[:, None], np.linspace(*p["sb"], p["grid"][1])
    L = p["depth"]
    t0 = time.perf_counter()
    r = sf.propagate(_act(p), W, B, L, layers=[L], ntk=True)
    call = time.perf_counter() - t0
    ww, bb = np.broadcast_to(W, r.q.shape[1:]), np.broadcast_to(B, r.q.shape[1:])
    ok = np.flatnonzero(((r.status == 0) & np.isfinite(r.theta_aa[0]) & np.isfinite(r.theta_ab[0])).ravel())
    pts = [dict(sw=float(ww.flat[i]), sb=float(bb.flat[i]), depth=L, q0=float(r.params["q0"]),
                qab0=float(r.params["qab0"]), taa=float(r.theta_aa[0].flat[i]), tab=float(r.theta_ab[0].flat[i]))
           for i in ok[_spread(ok.size)]]
    return call, dict(points=pts)


def _child_gram(p, sf):
    t0 = time.perf_counter()
    g = sf.gram_fluctuations(_act(p), p["sw"], p["sb"], p["depth"], residual=p.get("residual"))
    return time.perf_counter() - t0, dict(points=[], status=np.asarray(g.status).tolist())


def _child_diagnose(p, sf):
    import sympy as sp
    act = sf.activation(p["act"])
    phi = sp.lambdify(next(iter(act.expr.free_symbols)), act.expr, ["scipy", "numpy"])
    rng = np.random.default_rng(0)
    n, width, sw, sb = p["n"], p["width"], p["sw"], p["sb"]
    x = rng.standard_normal((n, width))
    hs, h = [], x
    for layer in range(p["depth"]):              # a seeded numpy network (untimed): h = W phi(h) + b
        a = x if layer == 0 else phi(h)
        h = a @ rng.standard_normal((width, width)) * math.sqrt(sw / width) + rng.standard_normal(width) * math.sqrt(sb)
        hs.append(h)
    t0 = time.perf_counter()
    d = sf.init.diagnose(hs, p["act"], sw, sb)
    return time.perf_counter() - t0, dict(points=[], ok=bool(d.ok))


def _child_jacobian(p, sf):
    t0 = time.perf_counter()
    r = sf.jacobian_spectrum(_act(p), p["sw"], p["sb"], p["depth"])
    return time.perf_counter() - t0, dict(points=[dict(sw=p["sw"], depth=p["depth"], mean=float(r.moments[0]))])


def _child_isometry(p, sf):
    W, B = np.linspace(*p["sw"], p["grid"][0]), np.linspace(*p["sb"], p["grid"][1])
    t0 = time.perf_counter()
    sf.isometry_diagram(_act(p), W, B, p["depth"])
    return time.perf_counter() - t0, dict(points=[])


def _child_neutrality(p, sf):
    t0 = time.perf_counter()
    sw = sf.neutrality(_act(p), p["sb"], dps=p["dps"])
    call = time.perf_counter() - t0
    with mpmath.workdps(p["dps"]):
        text = mpmath.nstr(sw, p["dps"])
    return call, dict(points=[dict(sw=text, sb=p["sb"])])


_CHILD = {"phase_diagram": _child_phase_diagram, "phase": _child_phase, "propagate": _child_propagate,
          "C_scalar": _child_C_scalar, "C_array": _child_C_array, "neutrality": _child_neutrality,
          "ntk_grid": _child_ntk_grid, "gram": _child_gram, "diagnose": _child_diagnose,
          "jacobian": _child_jacobian, "isometry": _child_isometry}
_VALUES = {"phase_diagram": ("q", "slope"), "phase": ("q", "slope"), "propagate": ("q", "qab"),
           "C_scalar": ("C",), "C_array": ("C",), "neutrality": (), "ntk_grid": ("taa", "tab"), "gram": (),
           "diagnose": (), "jacobian": ("mean",), "isometry": ()}


def _child(spec_path, out_path, sf):
    """Run one row (a JSON spec) in this process through ``sf``, the ``symfield`` facade the launching script
    imported, as a user does (lazy: a row loads what its call needs); write {call, out} as JSON to ``out_path``."""
    spec = json.loads(Path(spec_path).read_text())
    p = spec["params"]
    call, out = _CHILD[spec["kind"]](p, sf)
    bump = p.get("perturb", 0.0)                 # only to show that the error column sees a wrong value
    for pt in out["points"]:
        for k in _VALUES[spec["kind"]]:
            pt[k] *= 1 + bump
    atomic_write(out_path, json.dumps(dict(call=call, out=out), default=str))


# ---------------------------------------------------------------- oracles (parent side, untimed)
def _phi_mp(act):
    """(phi, phi', kinks) of the single-node activation as mpmath callables (a.e. derivative)."""
    import sympy as sp

    from symfield.symbolic.activation import kinks
    x = sp.Symbol("x", real=True)
    expr = act.single.expr
    xs = next(iter(expr.free_symbols), x)
    d1 = sp.diff(expr, xs).replace(lambda e: isinstance(e, sp.DiracDelta), lambda e: sp.Integer(0))
    return sp.lambdify(xs, expr, "mpmath"), sp.lambdify(xs, d1, "mpmath"), tuple(kinks(expr))


@lru_cache(maxsize=None)
def _valley(act):
    """(m, t0) of a phi with one valley (decreasing, then increasing; e.g. gelu, silu, mish): its minimum m
    and the t0 > m where phi(t0) = phi(-inf) (the sublevel set stops being bounded below), from a sampled
    sign change of phi' refined in mpmath. InvalidValue for any other non-monotone phi."""
    phi, dphi, _ = _phi_mp(act)
    xs = np.linspace(-20.0, 20.0, 4001)
    d = np.array([float(dphi(mpmath.mpf(x))) for x in xs])
    xs, d = xs[d != 0], d[d != 0]       # phi' underflows to 0 far out
    flips = np.nonzero(np.diff(np.sign(d)) != 0)[0]
    if flips.size != 1 or not d[flips[0]] < 0 < d[flips[0] + 1]:
        raise InvalidValue(f"The cold-suite oracle of a max-pool needs phi monotone or with one valley. "
                           f"Got {act.name!r} instead.")
    m = mpmath.findroot(dphi, (mpmath.mpf(xs[flips[0]]), mpmath.mpf(xs[flips[0] + 1])), solver="anderson")
    low = phi(mpmath.mpf(-60))
    t0 = mpmath.findroot(lambda x: phi(x) - low, (m, mpmath.mpf(60)), solver="anderson") if phi(mpmath.mpf(60)) > low else None
    return m, t0


def _weight(act, q):
    """Density factor of the pooled node: k G(phi(t))^(k-1) for max-k, G(a) = P(phi(u) <= a), u ~ N(0, q):
    Phi(t/sqrt q) for a non-decreasing phi; for a phi with one valley (:func:`_valley`) the sublevel set
    [l, r] with one end t and the other the mirror point on the other branch (mpmath root); 1 unpooled."""
    if act.pool == "max":
        from symfield.symbolic.activation import is_monotone
        s = mpmath.sqrt(q)
        if is_monotone(act.single.expr):
            return lambda t: act.k * mpmath.ncdf(t / s) ** (act.k - 1)
        phi, _, _ = _phi_mp(act)
        m, _ = _valley(act)
        B = 60 * (s + 1)
        lo_end, hi_end = phi(-B), phi(B)

        def mirror(a, lo, hi):      # bisection on a monotone branch: phi(lo) - a and phi(hi) - a differ in sign
            up = phi(hi) > phi(lo)
            for _ in range(4 * mpmath.mp.prec):
                mid = (lo + hi) / 2
                if (phi(mid) < a) == up:
                    lo = mid
                else:
                    hi = mid
                if hi - lo <= mpmath.eps * (1 + abs(mid)):
                    break
            return (lo + hi) / 2

        def w(t):
            a = phi(t)
            if t >= m:
                l, r = (-mpmath.inf if a >= lo_end else mirror(a, -B, m)), t
            else:
                l, r = t, (mpmath.inf if a >= hi_end else mirror(a, m, B))
            return act.k * (mpmath.ncdf(r / s) - mpmath.ncdf(l / s)) ** (act.k - 1)
        return w
    if act.pool is None:
        return lambda t: 1
    raise InvalidValue(f"The 'act' parameter of the cold-suite oracle must be unpooled or max-pooled. Got {act.name!r} instead.")


def _valley_kinks(act):
    """Where the max-pool weight of a one-valley phi is not smooth: its minimum and t0 (:func:`_valley`)."""
    if act.pool != "max":
        return ()
    from symfield.symbolic.activation import is_monotone
    if is_monotone(act.single.expr):
        return ()
    return tuple(float(x) for x in _valley(act) if x is not None)


def V_mp(act, q, dps, extra=()):
    phi, _, kk = _phi_mp(act)
    kk = tuple(sorted(set(kk) | set(extra) | set(_valley_kinks(act))))
    if act.pool == "avg":       # psi = mean of k iid phi(u_j): V = (E[phi^2] + (k - 1) E[phi]^2)/k
        m = mp_expect1(phi, q, kk, dps)
        return (mp_expect1(lambda t: phi(t) ** 2, q, kk, dps) + (act.k - 1) * m * m) / act.k
    w = _weight(act, q)
    return mp_expect1(lambda t: phi(t) ** 2 * w(t), q, kk, dps, method=_method(act))


def _method(act):
    """mpmath.quad's rule for the pooled weight: tanh-sinh where phi has a valley. There the weight has a power
    singularity at t0 (gelu: t0 = 0, F ~ N(t/s) - c |t|^(1/q) as t -> 0-, the mirror end running to -inf),
    which Gauss-Legendre panels ending at t0 resolve only algebraically (E[psi'^2] of gelu+max2 off by 3e-9 at
    q = 4); tanh-sinh clusters its nodes at the panel ends. Gauss-Legendre otherwise."""
    return "tanh-sinh" if _valley_kinks(act) else "gauss-legendre"


def dpsi2_mp(act, q, dps):
    _, dphi, kk = _phi_mp(act)
    kk = tuple(sorted(set(kk) | set(_valley_kinks(act))))
    if act.pool == "avg":       # sum_j (phi'(u_j)/k)^2: E[phi'^2]/k
        return mp_expect1(lambda t: dphi(t) ** 2, q, kk, dps) / act.k
    w = _weight(act, q)
    return mp_expect1(lambda t: dphi(t) ** 2 * w(t), q, kk, dps, method=_method(act))


def _qstar_mp(act, sw, sb, q0, dps=18):
    """q* re-solved in mpmath (secant from the package's q0) on q = sw V(q) + sb."""
    with mpmath.workdps(dps):
        sw, sb = mpmath.mpf(sw), mpmath.mpf(sb)
        return mpmath.findroot(lambda q: sw * V_mp(act, q, dps) + sb - q, mpmath.mpf(q0), tol=mpmath.mpf(10) ** (4 - dps))


def _rel(a, b, scale=None):
    return abs(float(a) - float(b)) / max(abs(float(scale if scale is not None else b)), 1e-300)


def _check_fixed_point(act, points):
    """Max relative error of q* and chi1 = sw E[psi'^2](q*) against mpmath."""
    err = 0.0
    for pt in points:
        q = _qstar_mp(act, pt["sw"], pt["sb"], pt["q"])
        slope = pt["sw"] * dpsi2_mp(act, q, 18)
        err = max(err, _rel(pt["q"], q), _rel(pt["slope"], slope))
    return err


RIDGE = 2.9          # max2_C needs sqrt(1 - rho^2) >= RIDGE/nodes: the density ridge spans a few nodes
RHO_MAX = math.sqrt(1 - (RIDGE / 12) ** 2)   # 0.970 at 12 nodes (2.6e-15 against 24 nodes; 1.9e-8 at 0.99)


def max2_C(g, q1, q2, q12, nodes=12, L=9.0):
    """E[g(max(u1, u2)) g(max(v1, v2))] for iid pairs (u_j, v_j) ~ N(0, [[q1, q12], [q12, q2]]), g nondecreasing,
    in float64 by the argmax decomposition: 2 E[g(u) g(v) F(u, v)] (argmaxes paired) + 2 int int g(a) g(b)
    F_a F_b (crossed), F the bivariate normal CDF (itself a Gauss-Legendre integral); tensor Gauss-Legendre on
    unit panels over [-L, L] in standard units, split at 0 (the kinks of relu-like g)."""
    from scipy.special import ndtr
    s1, s2 = math.sqrt(q1), math.sqrt(q2)
    rho = q12 / (s1 * s2)
    if 1 - rho * rho < (RIDGE / nodes) ** 2:   # the density's ridge would fall between the unit-panel nodes
        raise ValueError(f"max2_C with {nodes} nodes resolves |rho| <= {math.sqrt(1 - (RIDGE / nodes) ** 2):.4f} "
                         f"only, got rho = {float(rho)!r}")
    r = math.sqrt(1 - rho * rho)
    t0, w0 = np.polynomial.legendre.leggauss(nodes)
    edges = np.arange(-L, L + 0.5)
    x = ((edges[1:] + edges[:-1])[:, None] + t0[None, :]) / 2
    w = np.broadcast_to(w0 / 2, x.shape).ravel()
    x = x.ravel()
    X, Y = np.meshgrid(x, x, indexing="ij")
    WW = np.outer(w, w)
    phi = np.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    G = np.outer(g(s1 * x), g(s2 * x))
    crossed = (G * np.outer(phi, phi) * ndtr((Y - rho * X) / r) * ndtr((X - rho * Y) / r) * WW).sum()
    dens = np.exp(-(X * X - 2 * rho * X * Y + Y * Y) / (2 * r * r)) / (2 * math.pi * r)
    tg, wg = np.polynomial.legendre.leggauss(64)
    F = np.zeros_like(X)
    for tk, wk in zip(tg, wg):                        # F(x, y) = int_{-L}^{x} phi(t) Phi((y - rho t)/r) dt
        t = (X + L) / 2 * tk + (X - L) / 2
        F += wk * (X + L) / 2 * np.exp(-t * t / 2) / math.sqrt(2 * math.pi) * ndtr((Y - rho * t) / r)
    paired = (G * F * dens * WW).sum()
    return 2 * paired + 2 * crossed


def _g_np(act):
    """The single-node phi as a NumPy function."""
    import sympy as sp
    expr = act.single.expr
    xs = next(iter(expr.free_symbols))
    return sp.lambdify(xs, expr, [{"Heaviside": lambda a, h=0.5: np.heaviside(a, h)}, "scipy", "numpy"])


def C_oracle(act, q1, q2, q12):
    """(C, oracle name) for the pair: float64 argmax quadrature for max2, mp_expect2 otherwise."""
    if act.pool == "max" and act.k == 2:
        return max2_C(_g_np(act), q1, q2, q12), "float64 argmax quadrature"
    phi, _, kk = _phi_mp(act)
    return mp_expect2(phi, phi, q1, q2, q12, kk, dps=15), "mp_expect2"


LOCAL = (-30.0, -10.0, -3.0, -1.0, 0.0, 1.0, 3.0, 10.0, 30.0)   # breakpoints at phi's own scale, for large q


def C_nested(act, q, q12, n=20):
    """C(q, q, q12) of an unpooled phi as E_v[phi(v) E[phi(u) | v]], u | v ~ N(c v, q (1 - c^2)), in float64 by
    nested Gauss-Legendre (n points per panel) on panels split at phi's kinks and at LOCAL (argument units) at
    both levels, so the features of phi at its own scale are resolved however large q is (the 2-D mpmath rule
    of C_oracle misses them at q ~ 1e6 by ~1e-7)."""
    g = _g_np(act)
    t, w = np.polynomial.legendre.leggauss(n)
    sq, c = math.sqrt(q), q12 / q
    s = math.sqrt(max(q * (1 - c) * (1 + c), 0.0))
    bps = sorted(set(map(float, _phi_mp(act)[2])) | set(LOCAL))

    def panels(edges, lo, hi):
        e = np.unique(np.clip(np.asarray(edges, float), lo, hi))
        h, m = np.diff(e)[:, None] / 2, (e[1:] + e[:-1])[:, None] / 2
        return (m + h * t).ravel(), (h * w).ravel()
    v, wv = panels(bps + [k * sq for k in (-12, -8, -4, -2, -1, -0.5, 0.5, 1, 2, 4, 8, 12)], -12 * sq, 12 * sq)
    inner = np.empty_like(v)
    for i, vi in enumerate(v):
        if s == 0:
            inner[i] = g(c * vi)
            continue
        z, wz = panels([(b - c * vi) / s for b in bps] + list(range(-10, 11)), -10.0, 10.0)
        inner[i] = np.dot(wz, g(c * vi + s * z) * np.exp(-z * z / 2)) / math.sqrt(2 * math.pi)
    return float(np.dot(wv, g(v) * inner * np.exp(-v * v / (2 * q)))) / (sq * math.sqrt(2 * math.pi))


def _check_propagate(act, points):
    """Max relative error of one layer step q' = sw V(q) + sb, q12' = sw C(q, q, q12) + sb (scale q')."""
    err = 0.0
    for pt in points:
        big = pt["q_prev"] > 2.0 ** 10 and act.pool is None
        v = V_mp(act, pt["q_prev"], 18, LOCAL if big else ())
        c, _ = (C_nested(act, pt["q_prev"], pt["qab_prev"]), None) if big else \
            C_oracle(act, pt["q_prev"], pt["q_prev"], pt["qab_prev"])
        q, qab = pt["sw"] * v + pt["sb"], pt["sw"] * float(c) + pt["sb"]
        err = max(err, _rel(pt["q"], q), _rel(pt["qab"], qab, q))
    return err


def _check_C(act, points):
    """Max error of C in the scale sqrt(V(q1) V(q2))."""
    err = 0.0
    for pt in points:
        c, _ = C_oracle(act, pt["q1"], pt["q2"], pt["q12"])
        scale = math.sqrt(float(V_mp(act, pt["q1"], 15)) * float(V_mp(act, pt["q2"], 15)))
        err = max(err, _rel(pt["C"], c, scale))
    return err


def _check_ntk(act, points):
    """Max relative error of Theta_aa, Theta_ab at the last layer against erf's NTK recursion in mpmath (dps 30):
    K' = sw (2/pi) asin(2 K_ab/sqrt((1 + 2 K_aa)(1 + 2 K_bb))) + sb, Theta' = K' + sw Tdot(K) Theta,
    Tdot = (4/pi)/sqrt((1 + 2 K_aa)(1 + 2 K_bb) - 4 K_ab^2) (docs/theory.md section 13)."""
    if act.name != "erf":
        raise InvalidValue(f"The NTK oracle of the cold suite is erf's closed form. Got {act.name!r} instead.")
    err = 0.0
    with mpmath.workdps(30):
        for pt in points:
            sw, sb = mpmath.mpf(pt["sw"]), mpmath.mpf(pt["sb"])
            kaa, kab = sw * mpmath.mpf(pt["q0"]) + sb, sw * mpmath.mpf(pt["qab0"]) + sb
            taa, tab = kaa, kab
            for _ in range(pt["depth"] - 1):
                den = 1 + 2 * kaa
                daa, dab = 4 / (mpmath.pi * mpmath.sqrt(den ** 2 - 4 * kaa ** 2)), 4 / (mpmath.pi * mpmath.sqrt(den ** 2 - 4 * kab ** 2))
                kaa, kab = (sw * 2 / mpmath.pi * mpmath.asin(2 * k / den) + sb for k in (kaa, kab))
                taa, tab = kaa + sw * daa * taa, kab + sw * dab * tab
            err = max(err, _rel(pt["taa"], taa), _rel(pt["tab"], tab, taa))
    return err


def _check_jacobian_mean(act, points):
    """Relative error of the mean eigenvalue of J J^T: sw^L E[psi'^2]^(L-1), with E[relu'^2] = 1/2 exactly."""
    if act.name != "relu":
        raise InvalidValue(f"The Jacobian oracle of the cold suite is relu's. Got {act.name!r} instead.")
    pt = points[0]
    return _rel(pt["mean"], mpmath.mpf(pt["sw"]) ** pt["depth"] / mpmath.mpf(2) ** (pt["depth"] - 1))


def _check_neutrality(act, points):
    """|c-map(1/2) - 1/2| relative to q*/2 at the returned sigma_w2: 0 exactly on the neutrality line (dps 20)."""
    pt = points[0]
    with mpmath.workdps(20):
        sw = mpmath.mpf(pt["sw"])
        q = _qstar_mp(act, sw, pt["sb"], 1.0, 20)
        phi, _, kk = _phi_mp(act)
        c = mp_expect2(phi, phi, q, q, q / 2, kk, dps=20)
        return float(abs((sw * c + pt["sb"]) / (q / 2) - 1))


_ORACLE = {"phase_diagram": (_check_fixed_point, "q* and chi1 re-solved in mpmath (mp_expect1)"),
           "phase": (_check_fixed_point, "q* and chi1 re-solved in mpmath (mp_expect1)"),
           "propagate": (_check_propagate, "one layer step: mp_expect1 V, mp_expect2 / argmax-quadrature C "
                                     "(max-pools: points with c <= 0.97, where that quadrature resolves the density)"),
           "C_scalar": (_check_C, "float64 argmax-decomposition quadrature (independent of symfield)"),
           "C_array": (_check_C, "float64 argmax-decomposition quadrature (independent of symfield)"),
           "neutrality": (_check_neutrality, "relative residual of c* = 1/2 with mpmath q* and C (dps 20)"),
           "ntk_grid": (_check_ntk, "erf's closed-form NTK recursion in mpmath (dps 30) at the last layer"),
           "jacobian": (_check_jacobian_mean, "mean eigenvalue sw^L (1/2)^(L-1), exact")}


def error_of(row: Row, out: dict):
    """(max relative error, oracle description) of a child's output; (None, why) when there is nothing to check."""
    if row.kind not in _ORACLE:
        return None, "no numeric output (a figure)" if row.kind == "cli" else "speed row: its accuracy is held by the tests"
    fn, what = _ORACLE[row.kind]
    if not out["points"]:
        return None, "no point with a finite fixed point to check"
    act = _act(row.params)
    return float(fn(act, out["points"])), what


# ---------------------------------------------------------------- the parent: run, time, check, report
@dataclass
class Result:
    """One row's outcome (times in seconds; ``measured`` is what ``metric`` times)."""
    name: str
    case: str
    metric: str
    target: float
    measured: float | None = None
    wall: float | None = None
    call: float | None = None
    error: float | None = None
    oracle: str = ""
    verdict: str = ""
    note: str = ""
    warm: dict | None = field(default=None)


def _launch(row: Row, cache: Path, limit: float):
    """Run ``row`` in a new process on the cache directory ``cache``: (wall, child json | None, note)."""
    env = dict(os.environ, SYMFIELD_CACHE=str(cache / "symfield"), NUMBA_CACHE_DIR=str(cache / "numba"))
    work = Path(tempfile.mkdtemp(prefix="run-", dir=cache))
    out = work / "out.json"
    if row.kind == "cli":
        argv = [sys.executable, "-m", "symfield"] + [a.replace("{tmp}", str(work)) for a in row.params["argv"]]
    else:
        spec = work / "spec.json"
        spec.write_text(json.dumps(dict(kind=row.kind, params=row.params)))
        argv = [sys.executable, "-c", "import sys, symfield; from symfield.reports.bench_cold import _child; "
                "_child(sys.argv[1], sys.argv[2], symfield)", str(spec), str(out)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)      # the child and anything it started
        proc.communicate()
        return time.perf_counter() - t0, None, f"killed after {limit:g} s"
    except BaseException:                        # Ctrl-C or an error here: no child outlives the run
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        last = [ln for ln in err.strip().splitlines() if ln.strip()][-1:] or [f"exit code {proc.returncode}"]
        return wall, None, f"child failed: {last[0][:200]}"
    return wall, (json.loads(out.read_text()) if out.exists() else {}), ""


def _verdict(row, measured, error, target):
    if target is None:
        return "-"
    fast = measured is not None and measured <= target
    accurate = error is None or error <= row.tol
    return "met" if fast and accurate else "missed"


def _one(row: Row, cache: Path, limit: float, target, check=True):
    """(fields of a Result) for one run of ``row`` on ``cache``."""
    wall, child, note = _launch(row, cache, limit)
    if child is None:
        return dict(wall=wall, measured=None, call=None, error=None, oracle="",
                    verdict="timed out" if note.startswith("killed") else "failed", note=note)
    call = child.get("call")
    measured = wall if row.metric == "wall" else call
    error, oracle = (None, "")
    if check and row.kind != "cli":
        try:
            error, oracle = error_of(row, child["out"])
        except Exception as exc:          # an oracle that cannot run is reported, not fatal
            oracle = f"oracle failed: {type(exc).__name__}: {exc}"[:200]
    elif row.kind == "cli":
        oracle = "no numeric output (a figure)"
    v = _verdict(row, measured, error, target)
    if v == "missed" and error is not None and error > row.tol:
        note = f"error {error:.1e} > {row.tol:g}"
    return dict(wall=wall, measured=measured, call=call, error=error, oracle=oracle, verdict=v, note=note)


def run_row(row: Row, *, timeout=None, warm=False, root=None) -> Result:
    """Run ``row`` cold (new process, empty cache) and, with ``warm``, again on the cache it filled."""
    limit = row.limit(timeout)                # a bad timeout is refused before any directory is made
    cache = Path(tempfile.mkdtemp(prefix=f"cold-{row.name}-", dir=root))
    res = Result(row.name, row.case, row.metric, row.target, **_one(row, cache, limit, row.target))
    try:
        if warm and res.verdict not in ("timed out", "failed"):
            w = _one(row, cache, limit, row.warm_target)
            res.warm = dict(target=row.warm_target, **w)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return res


def run(rows=None, *, timeout=None, warm=False, progress=True, root=None) -> list[Result]:
    """Run the selected rows (names or Row objects; None: all) one after another; a line per row on stderr."""
    chosen = rows if rows and all(isinstance(r, Row) for r in rows) else select(rows)
    out = []
    for i, row in enumerate(chosen, 1):
        r = run_row(row, timeout=timeout, warm=warm, root=root)
        out.append(r)
        if progress:
            print(f"[{i}/{len(chosen)}] {_line(r)}", file=sys.stderr, flush=True)
    return out


def _fmt_t(v, metric="wall"):
    if v is None:
        return "-"
    return f"{v * 1e3:.3g} ms" if metric != "wall" and v < 1 else f"{v:.3g} s"


def _line(r: Result) -> str:
    err = "-" if r.error is None else f"{r.error:.1e}"
    warm = ""
    if r.warm is not None:
        warm = f" | warm {_fmt_t(r.warm['measured'], r.metric)} ({r.warm['verdict']})"
    return (f"{r.name}: {_fmt_t(r.measured, r.metric)} (target {_fmt_t(r.target, r.metric)}), "
            f"error {err}, {r.verdict}{warm}{' -- ' + r.note if r.note else ''}")


def table(results: list[Result]) -> str:
    """The suite's report as an aligned text table."""
    warm = any(r.warm is not None for r in results)
    head = ["case", "target", "measured", "wall", "max error", "verdict"] + (["warm", "warm target", "warm verdict"] if warm else [])
    rows = [head]
    for r in results:
        cells = [r.name, _fmt_t(r.target, r.metric), _fmt_t(r.measured, r.metric), _fmt_t(r.wall),
                 "-" if r.error is None else f"{r.error:.1e}", r.verdict]
        if warm:
            w = r.warm or {}
            cells += [_fmt_t(w.get("measured"), r.metric), _fmt_t(w.get("target"), r.metric), w.get("verdict", "-")]
        rows.append(cells)
    widths = [max(len(str(c[i])) for c in rows) for i in range(len(head))]
    lines = ["  ".join(str(c).ljust(wd) for c, wd in zip(cells, widths)).rstrip() for cells in rows]
    notes = [f"  {r.name}: {r.case}; oracle: {r.oracle or '-'}{'; ' + r.note if r.note else ''}" for r in results]
    return "\n".join(lines[:1] + ["-" * len(lines[0])] + lines[1:] + ["", "rows:"] + notes)


def to_dict(results: list[Result]) -> dict:
    """The suite's report as plain JSON-ready data (times in seconds, errors relative)."""
    from symfield.core.version import __version__
    return dict(suite="cold", version=__version__, python=platform.python_version(), machine=platform.machine(),
                cpus=os.cpu_count(), rows=[asdict(r) for r in results])


def write_json(results: list[Result], path) -> Path:
    """Write :func:`to_dict` to ``path`` atomically, with its provenance (argv, UTC time, versions)."""
    record = {**jsonable(to_dict(results)), "provenance": provenance()}
    return atomic_write(path, json.dumps(record, indent=2, allow_nan=False) + "\n")


def jsonable(o):
    """JSON-safe copy: non-finite floats as the strings "nan"/"inf"."""
    if isinstance(o, dict):
        return {k: jsonable(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [jsonable(v) for v in o]
    if isinstance(o, float) and not math.isfinite(o):
        return str(o)
    return o
