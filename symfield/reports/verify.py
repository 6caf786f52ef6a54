"""Check a new activation three ways before trusting its mean-field theory.

    report = verify("x*erf(x)")        # report.ok, report.table(), report.to_dict()

Steps (each recorded in the report):

1. Formula: parsed by the safe allow-list parser (not a formula -> FormulaError, nothing else runs);
   Gaussian moments must be finite (log|phi|, log|phi'| = o(x^2)); a divergent formula gives a
   report with ``ok = False`` and the reason, and no further checks.
2. Closed forms: how each kernel map was obtained (``Kernel.methods``).
3. V(q), C(q1, q2, q12) and E[psi'^2](q) (= chi1 at sigma_w2 = 1), and E[psi](q), three ways:
   the package (closed form, or its quadrature), an independent mpmath quadrature of the defining
   integral from phi alone (symfield.reports.oracles: ``mpmath.quad`` on panels split at the kinks,
   nested for C in the conditional form v | u), and a seeded Monte Carlo estimate with its standard error.
   Pass: |package - mpmath| <= REL_TOL * scale and |package - MC| <= MC_SIGMAS * SE + REL_TOL * scale,
   scale = |V|, |E psi'^2|, sqrt(V) for E[psi], sqrt(V(q1) V(q2)) for C (Cauchy-Schwarz).
4. Drift: E[psi] != 0 means one layer with sigma_b2 = 0 turns centred inputs into drifting ones
   (gamma^(2) = E[psi]^2/(V - E[psi]^2) at q = sigma_w2).
5. Edge of chaos at a few sigma_b2 (``sf.eoc``), each point re-checked with the mpmath integrals:
   sigma_w2 E[psi'^2](q*) = 1 and sigma_w2 V(q*) + sigma_b2 = q*. Positively homogeneous activations
   have no EOC curve; that is reported, not failed.
6. Phase of standard initialisations (``sf.phase``), each under a time budget.
7. Problems: divergent moments, non-differentiable points, float64 overflow or cancellation in the
   formula itself, disagreements between the three evaluations.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import mpmath
import numpy as np
import sympy as sp

from symfield.core import validate
from symfield.core.timelimit import TimeLimitExceeded, call_with_time_limit
from symfield.reports.oracles import mc_expect, mp_expect1, mp_expect2
from symfield.symbolic.activation import activation, check_gaussian_moments
from symfield.symbolic.activation import kinks as find_kinks
from symfield.symbolic.formula import FormulaError, parse
from symfield.symbolic.formula import X as x
from symfield.symbolic.kernel import MAPS, kernel
from symfield.theory import fixedpoint as fp
from symfield.theory import maps

REL_TOL = 1e-9          # package vs mpmath, in the map's natural scale
MC_SIGMAS = 5.0         # package vs Monte Carlo: |diff| <= 5 standard errors
Q_POINTS = (0.25, 1.0, 4.0)
C_POINTS = ((1.0, 1.0, 0.5), (0.5, 2.0, -0.6))
SIGMA_B2 = (0.0, 0.05, 0.1)
INITS = (("PyTorch default", 1 / 3, 0.0), ("LeCun", 1.0, 0.0), ("He", 2.0, 0.0), ("He + bias", 2.0, 0.1))
PHASE_SECONDS = 5.0
PROBE = (-700.0, -300.0, -100.0, -40.0, -10.0, -1.0, -1e-3, 0.0, 1e-3, 1.0, 10.0, 40.0, 100.0, 300.0, 700.0)


@dataclass
class Check:
    """One quantity at one point, three ways."""
    quantity: str
    point: tuple
    package: float
    mpmath: float
    monte_carlo: float
    mc_stderr: float
    scale: float
    ok: bool
    note: str = ""


@dataclass
class Report:
    formula: str
    activation: str = ""
    ok: bool = True
    moments_finite: bool = True
    methods: dict = field(default_factory=dict)
    closed_form: bool = False
    checks: list = field(default_factory=list)
    mean: dict = field(default_factory=dict)
    eoc: list = field(default_factory=list)
    phases: list = field(default_factory=list)
    problems: list = field(default_factory=list)
    failures: list = field(default_factory=list)
    timings: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)

    def fail(self, why):
        self.ok = False
        self.failures.append(why)

    def to_dict(self) -> dict:
        """Plain JSON-ready data (non-finite floats as the strings 'inf', '-inf', 'nan')."""
        return _jsonable(asdict(self))

    def table(self) -> str:
        return _table(self)


def _jsonable(o):
    if isinstance(o, dict):
        return {k: _jsonable(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_jsonable(v) for v in o]
    if isinstance(o, (float, np.floating)):
        f = float(o)
        return f if math.isfinite(f) else ("nan" if math.isnan(f) else ("inf" if f > 0 else "-inf"))
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.bool_,)):
        return bool(o)
    return o


# ---------------------------------------------------------------- independent evaluations of phi
class _Phi:
    """phi and phi' from the SymPy expression: mpmath and numpy callables, kinks."""

    def __init__(self, expr):
        d1 = sp.diff(expr, x)
        # the a.e. derivative: DiracDelta terms (from sign'/Heaviside') vanish off the kinks
        d1 = d1.replace(lambda e: isinstance(e, sp.DiracDelta), lambda e: sp.Integer(0))
        mods = [{"Heaviside": lambda a, h=0.5: np.heaviside(a, h)}, "scipy", "numpy"]
        self.mp = sp.lambdify(x, expr, modules="mpmath")
        self.dmp = sp.lambdify(x, d1, modules="mpmath")
        self.np = sp.lambdify(x, expr, modules=mods)
        self.dnp = sp.lambdify(x, d1, modules=mods)
        self.kinks = tuple(find_kinks(expr))

    def f(self, which):
        return self.mp if which == "phi" else self.dmp

    def vec(self, which, arr):
        fn = self.np if which == "phi" else self.dnp
        with np.errstate(all="ignore"):
            out = np.asarray(fn(arr), dtype=float)
        return np.broadcast_to(out, np.shape(arr))

    def vf(self, which):
        """phi or phi' (``which`` "phi" / "dphi") as a vectorised NumPy function."""
        return lambda arr: self.vec(which, arr)


# ---------------------------------------------------------------- verify
def verify(formula, *, seed=0, n_mc=200_000, dps=20, phase_seconds=PHASE_SECONDS) -> Report:
    """Check an activation (a formula in x or a built-in name) three ways; see the module docstring.

    Raises FormulaError (a ValueError) when ``formula`` is not a formula; every other finding is
    recorded in the returned :class:`Report` (``ok`` False when a check fails)."""
    if not isinstance(formula, str):
        raise TypeError(f"The 'formula' parameter of verify must be a str. Got {formula!r} instead.")
    seed = validate.integer("verify", "seed", seed, lo=0)
    n_mc = validate.integer("verify", "n_mc", n_mc, lo=1000, hi=10**8)
    dps = validate.integer("verify", "dps", dps, lo=15, hi=50)
    rep = Report(formula=formula, settings=dict(seed=seed, n_mc=n_mc, dps=dps, rel_tol=REL_TOL, mc_sigmas=MC_SIGMAS,
                                                phase_seconds=phase_seconds))
    t0 = time.perf_counter()
    try:
        expr = parse(formula)
    except FormulaError:
        act = activation(formula)           # a built-in name, or the formula error
        expr = act.expr
    else:
        try:
            check_gaussian_moments(expr, formula)
        except FormulaError as err:
            rep.moments_finite = False
            rep.fail(f"Gaussian moments: {err}")
            rep.problems.append("divergent Gaussian moments: no mean-field map exists, nothing else was checked")
            return rep
        act = activation(formula)
    rep.activation = act.name
    K = kernel(act)
    rep.methods = {n: K.methods[n] for n in MAPS}
    rep.closed_form = K.closed_form
    rep.timings["kernel"] = time.perf_counter() - t0
    phi = _Phi(expr)
    if phi.kinks:
        rep.problems.append(f"not differentiable at x = {', '.join(f'{k:g}' for k in phi.kinks)}: phi' is used "
                            f"almost everywhere (phi'' has a Dirac mass there)")
    _float64_problems(rep, phi)

    t = time.perf_counter()
    rng = np.random.default_rng(seed)
    zz = rng.standard_normal((2, n_mc))
    _three_way(rep, act, phi, zz, dps)
    rep.timings["three_way"] = time.perf_counter() - t

    t = time.perf_counter()
    _drift(rep, act, K)
    _eoc(rep, act, phi, dps)
    rep.timings["eoc"] = time.perf_counter() - t
    t = time.perf_counter()
    _phases(rep, act, phase_seconds)
    rep.timings["phases"] = time.perf_counter() - t
    rep.timings["total"] = time.perf_counter() - t0
    return rep


def _float64_problems(rep, phi):
    """Overflow or loss of accuracy of the formula itself in float64 (the package re-evaluates
    non-finite values in mpmath, but not values that are finite and wrong)."""
    for which, name in (("phi", "phi"), ("dphi", "phi'")):
        f = phi.f(which)
        vals = phi.vec(which, np.array(PROBE))
        over, bad = [], []
        with mpmath.workdps(30):
            for p, got in zip(PROBE, vals):
                try:
                    ref = mpmath.mpmathify(f(mpmath.mpf(p)))
                    ref = float(mpmath.re(ref))
                except (ValueError, ZeroDivisionError, OverflowError, TypeError):
                    continue
                if not math.isfinite(ref):
                    continue
                if not math.isfinite(got):
                    over.append(p)
                elif abs(got - ref) > 1e-8 * (1 + abs(ref)):
                    bad.append((p, got, ref))
        if over:
            rep.problems.append(f"float64 overflow: {name}(x) is not finite at x = {', '.join(f'{p:g}' for p in over)}"
                                f" (the package recomputes such points in mpmath; a stable form avoids it)")
        for p, got, ref in bad[:2]:
            rep.problems.append(f"float64 cancellation: {name}({p:g}) evaluates to {got:.6g}, exact {ref:.6g}")


def _three_way(rep, act, phi, zz, dps):
    V = {}
    for qv in Q_POINTS:
        for name, which in (("V", "phi"), ("chi1 (sigma_w2 = 1)", "dphi")):
            key = "V" if name == "V" else "dpsi2"
            pkg = float(maps.map_value(act, key, qv))
            ref = float(mp_expect1(lambda t, f=phi.f(which): f(t) ** 2, qv, phi.kinks, dps))
            mc, se = mc_expect(phi.vf(which), phi.vf(which), zz, qv)
            if key == "V":
                V[qv] = ref
            _record(rep, name, (qv,), pkg, ref, mc, se, abs(ref))
    for qv in (1.0,):
        pkg = float(maps.map_value(act, "mean", qv))
        ref = float(mp_expect1(phi.f("phi"), qv, phi.kinks, dps))
        mc, se = mc_expect(phi.vf("phi"), None, zz, qv)
        _record(rep, "E[psi]", (qv,), pkg, ref, mc, se, math.sqrt(V[qv]))
    for a, b, c in C_POINTS:
        pkg = float(maps.map_value(act, "C", a, b, c))
        ref = float(mp_expect2(phi.f("phi"), phi.f("phi"), a, b, c, phi.kinks))
        mc, se = mc_expect(phi.vf("phi"), phi.vf("phi"), zz, a, b, c)
        va = float(mp_expect1(lambda t: phi.f("phi")(t) ** 2, a, phi.kinks, 15))
        vb = float(mp_expect1(lambda t: phi.f("phi")(t) ** 2, b, phi.kinks, 15))
        _record(rep, "C", (a, b, c), pkg, ref, mc, se, math.sqrt(va * vb))


def _record(rep, name, point, pkg, ref, mc, se, scale):
    scale = max(scale, 1e-300)
    ok_mp = math.isfinite(pkg) and abs(pkg - ref) <= REL_TOL * scale
    ok_mc = math.isfinite(pkg) and abs(pkg - mc) <= MC_SIGMAS * se + REL_TOL * scale
    note = []
    if not ok_mp:
        note.append(f"package vs mpmath differ by {abs(pkg - ref) / scale:.2g} (relative to scale)")
    if not ok_mc:
        note.append(f"package vs Monte Carlo differ by {abs(pkg - mc) / max(se, 1e-300):.2g} standard errors")
    chk = Check(name, point, pkg, ref, mc, se, scale, ok_mp and ok_mc, "; ".join(note))
    rep.checks.append(chk)
    if not chk.ok:
        rep.fail(f"{name}{point}: {chk.note}")


def _drift(rep, act, K):
    exact_zero = sp.simplify(K.mean) == 0 if not K.mean.has(sp.Integral) else \
        sp.expand(act.expr + act.expr.subs(x, -x)) == 0 and act.pool in (None, "avg")
    m = float(maps.map_value(act, "mean", 1.0))
    V = float(maps.map_value(act, "V", 1.0))
    mc = next(c for c in rep.checks if c.quantity == "E[psi]")
    creates = not exact_zero and abs(m) > max(MC_SIGMAS * mc.mc_stderr, 1e-12 * math.sqrt(V))
    gamma2 = 0.0 if exact_zero else m * m / (V - m * m)
    why = ("E[psi] = 0 identically" + (" (odd phi)" if not K.mean.has(sp.Integral) or exact_zero else "")) \
        if exact_zero else f"E[psi](q=1) = {m:.6g}"
    rep.mean = dict(exact_zero=bool(exact_zero), value_q1=m, creates_drift=bool(creates),
                    gamma2_sigma_w2_1=gamma2, reason=why)


def _eoc(rep, act, phi, dps):
    for sb in SIGMA_B2:
        row = dict(sigma_b2=sb, sigma_w2=None, q_star=None, note="")
        try:
            e = fp.eoc(act, sb)
        except ArithmeticError as err:
            row["note"] = f"root finding failed: {err}"
            rep.fail(f"EOC at sigma_b2 = {sb:g}: {err}")
            rep.problems.append(f"numerical instability in the EOC root finder at sigma_b2 = {sb:g}")
        except (ValueError, NotImplementedError) as err:
            row["note"] = str(err).splitlines()[0] if "homogeneous" not in str(err) else \
                "positively homogeneous: no EOC curve for sigma_b2 > 0 (see sf.eoc)"
        else:
            sw, qs = float(e.sigma_w2), float(e.q_star)
            row.update(sigma_w2=sw, q_star=qs)
            if qs > 0:  # re-check the point with the independent mpmath integrals
                d = float(mp_expect1(lambda t: phi.f("dphi")(t) ** 2, qs, phi.kinks, dps))
                v = float(mp_expect1(lambda t: phi.f("phi")(t) ** 2, qs, phi.kinks, dps))
                r1, r2 = abs(sw * d - 1), abs(sw * v + sb - qs) / qs
                row["residuals"] = [r1, r2]
                if max(r1, r2) > 1e-7:
                    row["note"] = "EOC point fails the mpmath re-check"
                    rep.fail(f"EOC at sigma_b2 = {sb:g}: chi1 - 1 = {r1:.2g}, q* residual = {r2:.2g} (mpmath)")
            else:
                d0 = float(phi.f("dphi")(mpmath.mpf(0)) ** 2)
                row["note"] = "q* = 0: sigma_w2 = 1/E[psi'^2](0+)"
                v0 = float(mp_expect1(lambda t: phi.f("phi")(t) ** 2, 1e-12, phi.kinks, dps))
                if sw * v0 + sb > 1e-9:   # q = 0 must be a fixed point: sigma_w2 V(0+) + sigma_b2 = 0
                    row["note"] = "inconsistent: q = 0 is not a fixed point"
                    rep.fail(f"EOC at sigma_b2 = {sb:g}: sf.eoc returns sigma_w2 = {sw:.6g} with q* = 0, but q = 0 is "
                             f"not a fixed point (sigma_w2 V(0+) + sigma_b2 = {sw * v0 + sb:.6g}, phi(0) = "
                             f"{float(phi.f('phi')(mpmath.mpf(0))):.6g} != 0)")
                if act.pool is None and not phi.kinks and abs(sw * d0 - 1) > 1e-9:
                    rep.fail(f"EOC at sigma_b2 = 0: sigma_w2 phi'(0)^2 = {sw * d0:.6g}, expected 1")
        rep.eoc.append(row)


def _phases(rep, act, seconds):
    for label, sw, sb in INITS:
        row = dict(init=label, sigma_w2=sw, sigma_b2=sb, phase=None, c_star=None, chi1=None, seconds=None, note="")
        t = time.perf_counter()
        try:
            p = call_with_time_limit(seconds, fp.phase, act, sw, sb, 1e-6, True)
        except TimeLimitExceeded:
            row["note"] = f"not determined within {seconds:g} s"
            rep.problems.append(f"slow: the phase at {label} (sigma_w2 = {sw:.4g}, sigma_b2 = {sb:g}) was not "
                                f"determined within {seconds:g} s")
        except (ValueError, ArithmeticError, NotImplementedError) as err:
            row["note"] = str(err).splitlines()[0]
            rep.problems.append(f"phase at {label}: {row['note']}")
        else:
            row.update(phase=p.label, c_star=float(p.c_star), chi1=float(p.slope), q_star=float(p.q_star))
        row["seconds"] = time.perf_counter() - t
        rep.phases.append(row)


# ---------------------------------------------------------------- terminal table
def _fmt(v, w=12):
    if v is None:
        return "-".rjust(w)
    if isinstance(v, float):
        return f"{v:.{w - 6}g}".rjust(w)
    return str(v).rjust(w)


def _table(rep: Report) -> str:
    L = [f"symfield verify {rep.formula!r}" + (f"  (activation {rep.activation})" if rep.activation else ""), ""]
    if not rep.moments_finite:
        L += ["Gaussian moments    FAIL", "  " + rep.failures[0], "", "RESULT: FAIL"]
        return "\n".join(L)
    L.append("closed forms        " + ("yes, for every map" if rep.closed_form else "no (some maps are integrals)"))
    for n, m in rep.methods.items():
        L.append(f"  {n:6s} {m}")
    L += ["", f"three-way checks (pass: |pkg - mpmath| <= {REL_TOL:g} x scale, |pkg - MC| <= {MC_SIGMAS:g} SE; "
              f"MC n = {rep.settings['n_mc']}, seed {rep.settings['seed']})",
          f"  {'quantity':20s} {'point':18s} {'package':>14s} {'mpmath':>14s} {'Monte Carlo':>14s} {'SE':>9s}  ok"]
    for c in rep.checks:
        pt = ",".join(f"{p:g}" for p in c.point)
        L.append(f"  {c.quantity:20s} {pt:18s} {c.package:14.10g} {c.mpmath:14.10g} {c.monte_carlo:14.6g} "
                 f"{c.mc_stderr:9.2g}  {'ok' if c.ok else 'FAIL'}")
        if c.note:
            L.append(f"      {c.note}")
    m = rep.mean
    L += ["", f"drift (IGB)         {'one layer creates drift' if m['creates_drift'] else 'no drift from one layer'}: "
              f"{m['reason']}; gamma^(2) at sigma_w2 = 1: {m['gamma2_sigma_w2_1']:.6g}", "",
          "edge of chaos       sigma_b2    sigma_w2          q*"]
    for r in rep.eoc:
        L.append(f"  {'':18s}{r['sigma_b2']:8g} {_fmt(r['sigma_w2'])} {_fmt(r['q_star'])}  {r['note']}")
    L += ["", "phases              init               sigma_w2 sigma_b2  phase                    c*        chi1"]
    for r in rep.phases:
        L.append(f"  {'':18s}{r['init']:18s} {r['sigma_w2']:8.4g} {r['sigma_b2']:8g}  {str(r['phase'] or '-'):24s}"
                 f"{_fmt(r['c_star'], 10)}{_fmt(r['chi1'], 10)}  {r['note']}")
    L.append("")
    L.append("problems            " + ("none" if not rep.problems else ""))
    L += [f"  - {p}" for p in rep.problems]
    if rep.failures:
        L += ["", "failures"] + [f"  - {f}" for f in rep.failures]
    tm = rep.timings
    L += ["", "time                " + ", ".join(f"{k} {v:.1f} s" for k, v in tm.items()), "",
          "RESULT: " + ("PASS" if rep.ok else "FAIL")]
    return "\n".join(L)
