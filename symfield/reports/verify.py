"""Check a new activation three ways before trusting its mean-field theory.

    report = verify("x*erf(x)")        # report.status, report.ok, report.table(), report.to_dict()

Steps, each recorded in the report: (1) the formula, parsed safely, with finite Gaussian moments; (2) how
each kernel map was obtained; (3) V, C, E[psi'^2] and E[psi] by the package, by an independent mpmath
quadrature from phi alone (symfield.reports.oracles) and by seeded Monte Carlo, within REL_TOL of the
natural scale and MC_SIGMAS standard errors; (4) the drift E[psi] of one layer; (5) edge-of-chaos points
(``sf.eoc``) re-checked with the mpmath integrals, an unstable EOC fixed point a warning; (6) the phase of
standard initialisations under ``phase_seconds``; (7) problems (divergent moments, overflow, disagreements).

Every check is "pass", "fail" or "inconclusive" (did not finish or could not run). ``report.status`` is
"fail" if any check failed, else "inconclusive" if any is, else "pass"; ``report.ok`` is True only for
"pass". ``symfield verify`` exits 0, 1, 3. docs/numerics.md section 10.
"""
from __future__ import annotations

from symfield.core.errors import InvalidType, Unsupported
import math
import time
from dataclasses import asdict, dataclass, field

import mpmath
import numpy as np
import sympy as sp

from symfield.core import validate
from symfield.core.timelimit import CPU_WALL_FACTOR, TimeLimitExceeded, call_with_cpu_limit
from symfield.reports.oracles import mc_expect, mp_expect1, mp_expect2
from symfield.symbolic.activation import activation, check_gaussian_moments
from symfield.symbolic.activation import kinks as find_kinks
from symfield.symbolic.formula import FormulaError, parse
from symfield.symbolic.formula import X as x
from symfield.symbolic.kernel import MAPS, kernel
from symfield.theory import eoc as eoc_mod
from symfield.theory import phases as phases_mod
from symfield.theory import maps

REL_TOL = 1e-9          # package vs mpmath, in the map's natural scale
MC_SIGMAS = 5.0         # package vs Monte Carlo: |diff| <= 5 standard errors
Q_POINTS = (0.25, 1.0, 4.0)
C_POINTS = ((1.0, 1.0, 0.5), (0.5, 2.0, -0.6))
SIGMA_B2 = (0.0, 0.05, 0.1)
INITS = (("PyTorch default", 1 / 3, 0.0), ("LeCun", 1.0, 0.0), ("He", 2.0, 0.0), ("He + bias", 2.0, 0.1))
PHASE_SECONDS = 15.0   # CPU seconds per phase check: the first one from an empty cache builds a table (~6 s)
PROBE = (-700.0, -300.0, -100.0, -40.0, -10.0, -1.0, -1e-3, 0.0, 1e-3, 1.0, 10.0, 40.0, 100.0, 300.0, 700.0)


PASS, FAIL, INCONCLUSIVE, NA = "pass", "fail", "inconclusive", "n/a"
EXIT_CODES = {PASS: 0, FAIL: 1, INCONCLUSIVE: 3}     # `symfield verify` exit status per report.status
# what an evaluation may raise when it cannot deliver a number (recorded as an inconclusive check)
EVAL_ERRORS = (ValueError, ArithmeticError, NotImplementedError, TypeError, TimeLimitExceeded)


@dataclass
class Check:
    """One quantity at one point, three ways; ``status`` "pass", "fail" or "inconclusive"."""
    quantity: str
    point: tuple
    package: float
    mpmath: float
    monte_carlo: float
    mc_stderr: float
    scale: float
    ok: bool
    note: str = ""
    status: str = ""


@dataclass
class Report:
    """``status``: "pass" (every check ran and held; ``ok`` True), "fail" (a check failed; the
    reasons in ``failures``) or "inconclusive" (nothing failed, but a check did not finish or could
    not run; the reasons in ``inconclusive``). ``warnings``: findings that are not failures (an
    unstable edge-of-chaos point)."""
    formula: str
    activation: str = ""
    ok: bool = True
    status: str = PASS
    moments_finite: bool = True
    methods: dict = field(default_factory=dict)
    closed_form: bool = False
    checks: list = field(default_factory=list)
    mean: dict = field(default_factory=dict)
    eoc: list = field(default_factory=list)
    phases: list = field(default_factory=list)
    problems: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    failures: list = field(default_factory=list)
    inconclusive: list = field(default_factory=list)
    timings: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)

    def fail(self, why):
        """A check ran and did not hold."""
        self.ok, self.status = False, FAIL
        self.failures.append(why)

    def undetermined(self, why):
        """A check did not finish or could not run: never counted as passed."""
        self.ok = False
        if self.status != FAIL:
            self.status = INCONCLUSIVE
        self.inconclusive.append(why)

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
def verify(formula: str, *, seed: int = 0, n_mc: int = 200_000, dps: int = 20,
           phase_seconds: float | None = PHASE_SECONDS) -> Report:
    """Check an activation (a formula in x or a built-in name) three ways; see the module docstring.

    Raises FormulaError (a ValueError) when ``formula`` is not a formula; every other finding is
    recorded in the returned report.

    Parameters
    ----------
    formula : str
        A formula in x or a built-in name.
    seed, n_mc : int
        Seed and sample count of the Monte Carlo check.
    dps : int
        mpmath digits of the high-precision check.
    phase_seconds : float, optional
        Limit per phase check in CPU seconds of the computing thread (> 0, or None for no limit; a
        busy machine does not spend it; a wall-clock cap of 10x stops a check that waits); a phase
        not determined in time makes the report inconclusive, never passed.

    Returns
    -------
    Report
        ``status`` "pass" / "fail" / "inconclusive"; ``ok`` True only for "pass".

    Examples
    --------
    >>> sf.verify("x*erf(x)").status      # doctest: +SKIP
    'pass'
    """
    if not isinstance(formula, str):
        raise InvalidType(f"The 'formula' parameter of verify must be a str. Got {formula!r} instead.")
    seed = validate.integer("verify", "seed", seed, lo=0)
    n_mc = validate.integer("verify", "n_mc", n_mc, lo=1000, hi=10**8)
    dps = validate.integer("verify", "dps", dps, lo=15, hi=50)
    if phase_seconds is not None:
        phase_seconds = float(validate.real("verify", "phase_seconds", phase_seconds, lo=0, lo_open=True))
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
    def sq(which):
        f = phi.f(which)
        return lambda t: f(t) ** 2

    def v_mp(q):                    # V(q) by mpmath, the scale of E[psi] and C
        return float(mp_expect1(sq("phi"), q, phi.kinks, 15))

    jumps = _jumps(phi)
    for qv in Q_POINTS:
        for name, key, which in (("V", "V", "phi"), ("chi1 (sigma_w2 = 1)", "dpsi2", "dphi")):
            if key == "dpsi2" and jumps:
                _jump_check(rep, name, (qv,), lambda: maps.map_value(act, key, qv), jumps)
                continue
            _leg(rep, name, (qv,), lambda: maps.map_value(act, key, qv),
                 lambda: mp_expect1(sq(which), qv, phi.kinks, dps),
                 lambda: mc_expect(phi.vf(which), phi.vf(which), zz, qv), abs)
    _leg(rep, "E[psi]", (1.0,), lambda: maps.map_value(act, "mean", 1.0),
         lambda: mp_expect1(phi.f("phi"), 1.0, phi.kinks, dps),
         lambda: mc_expect(phi.vf("phi"), None, zz, 1.0), lambda ref: math.sqrt(v_mp(1.0)))
    for a, b, c in C_POINTS:
        _leg(rep, "C", (a, b, c), lambda: maps.map_value(act, "C", a, b, c),
             lambda: mp_expect2(phi.f("phi"), phi.f("phi"), a, b, c, phi.kinks),
             lambda: mc_expect(phi.vf("phi"), phi.vf("phi"), zz, a, b, c),
             lambda ref: math.sqrt(v_mp(a) * v_mp(b)))


def _jumps(phi):
    """Kinks where phi itself jumps, found from phi alone: |phi(k + h) - phi(k - h)| > 1e-6 at
    h = 1e-30 (40 digits). There phi' has a Dirac mass and E[phi'^2] is infinite, which quadrature
    and Monte Carlo of phi' almost everywhere cannot see."""
    f, out = phi.f("phi"), []
    with mpmath.workdps(40):
        h = mpmath.mpf(10) ** -30
        for k in phi.kinks:
            try:
                if abs(f(mpmath.mpf(k) + h) - f(mpmath.mpf(k) - h)) > 1e-6:
                    out.append(float(k))
            except (*EVAL_ERRORS, ZeroDivisionError):
                continue
    return out


def _jump_check(rep, name, point, package, jumps):
    """chi1 of a phi that jumps: the package must say infinite (the only correct value)."""
    try:
        pkg = float(package())
    except EVAL_ERRORS as err:
        return _undetermined(rep, name, point, f"the package raised {type(err).__name__}: {_line(err)}")
    ok = pkg == math.inf
    where = ", ".join(f"{k:g}" for k in jumps)
    note = f"phi jumps at x = {where}: E[phi'^2] is infinite (phi' has a Dirac mass)"
    inf = math.inf
    chk = Check(name, point, pkg, inf, inf, 0.0, 1.0, ok, note if ok else note + f"; the package says {pkg:.6g}",
                PASS if ok else FAIL)
    rep.checks.append(chk)
    if not ok:
        rep.fail(f"{name}{point}: {chk.note}")
    return None


def _leg(rep, name, point, package, oracle, monte_carlo, scale):
    """Evaluate the three legs (callables, run here) and record the check; a leg that raises or an
    oracle that is not finite makes the check inconclusive (the package is not blamed)."""
    try:
        pkg = float(package())
    except EVAL_ERRORS as err:
        return _undetermined(rep, name, point, f"the package raised {type(err).__name__}: {_line(err)}")
    try:
        ref = float(oracle())
        mc, se = (float(v) for v in monte_carlo())
        sc = float(scale(ref))
    except (*EVAL_ERRORS, ZeroDivisionError) as err:
        return _undetermined(rep, name, point, f"an oracle raised {type(err).__name__}: {_line(err)}", pkg)
    if not all(math.isfinite(v) for v in (ref, mc, se, sc)):
        return _undetermined(rep, name, point, f"an oracle is not finite (mpmath {ref:.6g}, Monte Carlo "
                                               f"{mc:.6g} +- {se:.2g}, scale {sc:.6g})", pkg)
    _record(rep, name, point, pkg, ref, mc, se, sc)
    return None


def _line(err):
    return (str(err).splitlines() or [""])[0]


def _undetermined(rep, name, point, why, pkg=math.nan):
    nan = math.nan
    rep.checks.append(Check(name, point, pkg, nan, nan, nan, nan, False, "could not run: " + why, INCONCLUSIVE))
    rep.undetermined(f"{name}{point}: {why}")


def _record(rep, name, point, pkg, ref, mc, se, scale):
    scale = max(scale, 1e-300)
    ok_mp = math.isfinite(pkg) and abs(pkg - ref) <= REL_TOL * scale
    ok_mc = math.isfinite(pkg) and abs(pkg - mc) <= MC_SIGMAS * se + REL_TOL * scale
    note = []
    if not ok_mp:
        note.append(f"package vs mpmath differ by {abs(pkg - ref) / scale:.2g} (relative to scale)")
    if not ok_mc:
        note.append(f"package vs Monte Carlo differ by {abs(pkg - mc) / max(se, 1e-300):.2g} standard errors")
    ok = ok_mp and ok_mc
    status = PASS if ok else FAIL
    if ok_mp and not ok_mc and abs(mc - ref) > MC_SIGMAS * se + REL_TOL * scale:
        # package and mpmath agree; Monte Carlo is the odd one out (a heavy tail its sample never
        # reached, so its sample standard error understates its error): the package is not blamed,
        # but the check is not a pass either
        status = INCONCLUSIVE
        note = [f"Monte Carlo disagrees with both the package and mpmath by {abs(mc - ref) / max(se, 1e-300):.2g} "
                f"standard errors (its sample misses the integrand's tail); package vs mpmath agree"]
    chk = Check(name, point, pkg, ref, mc, se, scale, ok, "; ".join(note), status)
    rep.checks.append(chk)
    if status == INCONCLUSIVE:
        rep.undetermined(f"{name}{point}: {chk.note}")
    elif not chk.ok:
        rep.fail(f"{name}{point}: {chk.note}")


def _drift(rep, act, K):
    """E[psi] and the drift of one layer (a report, not a check; inconclusive if it cannot be computed)."""
    rep.mean = dict(exact_zero=None, value_q1=None, creates_drift=None, gamma2_sigma_w2_1=None, reason="")
    try:
        exact_zero = sp.simplify(K.mean) == 0 if not K.mean.has(sp.Integral) else \
            sp.expand(act.expr + act.expr.subs(x, -x)) == 0 and act.pool in (None, "avg")
        m = float(maps.map_value(act, "mean", 1.0))
        V = float(maps.map_value(act, "V", 1.0))
    except EVAL_ERRORS as err:
        rep.mean["reason"] = f"not determined: {_line(err)}"
        rep.undetermined(f"drift: E[psi] or V at q = 1 raised {type(err).__name__}: {_line(err)}")
        return
    se = next((c.mc_stderr for c in rep.checks if c.quantity == "E[psi]" and c.status != INCONCLUSIVE), 0.0)
    creates = not exact_zero and abs(m) > max(MC_SIGMAS * se, 1e-12 * math.sqrt(V))
    gamma2 = 0.0 if exact_zero else m * m / (V - m * m)
    why = ("E[psi] = 0 identically" + (" (odd phi)" if not K.mean.has(sp.Integral) or exact_zero else "")) \
        if exact_zero else f"E[psi](q=1) = {m:.6g}"
    rep.mean = dict(exact_zero=bool(exact_zero), value_q1=m, creates_drift=bool(creates),
                    gamma2_sigma_w2_1=gamma2, reason=why)


def _eoc(rep, act, phi, dps):
    """sf.eoc at each sigma_b2 of SIGMA_B2, re-checked with the mpmath integrals (:func:`_eoc_point`)."""
    for sb in SIGMA_B2:
        row = dict(sigma_b2=sb, sigma_w2=None, q_star=None, q_slope=None, stable=None, status=NA, note="")
        try:
            e = eoc_mod.eoc(act, sb)
        except ArithmeticError as err:
            row.update(status=FAIL, note=f"root finding failed: {_line(err)}")
            rep.fail(f"EOC at sigma_b2 = {sb:g}: {_line(err)}")
            rep.problems.append(f"numerical instability in the EOC root finder at sigma_b2 = {sb:g}")
        except ValueError as err:       # sf.eoc states that no EOC exists here, and why
            row["note"] = _line(err) if "homogeneous" not in str(err) else \
                "positively homogeneous: no EOC curve for sigma_b2 > 0 (see sf.eoc)"
        except (Unsupported, TimeLimitExceeded) as err:
            row.update(status=INCONCLUSIVE, note=f"not determined: {_line(err)}")
            rep.undetermined(f"EOC at sigma_b2 = {sb:g}: {_line(err)}")
        else:
            try:
                _eoc_point(rep, row, e, act, phi, dps)
            except (*EVAL_ERRORS, ZeroDivisionError) as err:
                row.update(status=INCONCLUSIVE, note=f"the mpmath re-check could not run: {_line(err)}")
                rep.undetermined(f"EOC at sigma_b2 = {sb:g}: the mpmath re-check raised {type(err).__name__}: "
                                 f"{_line(err)}")
        rep.eoc.append(row)


def _eoc_point(rep, row, e, act, phi, dps):
    """Re-check one EOC record with mpmath: chi1 = sigma_w2 E[psi'^2](q*) = 1 and q* = sigma_w2 V(q*) +
    sigma_b2 (q* finite > 0); sigma_w2 E[psi'^2] = 1 at q = 1 (q* = inf, positively homogeneous psi);
    q = 0 a fixed point (q* = 0). Flags an unstable q* (q-map slope sigma_w2 V'(q*) > 1)."""
    sb = row["sigma_b2"]
    sw, qs, slope = float(e.sigma_w2), float(e.q_star), float(getattr(e, "q_slope", math.nan))
    row.update(sigma_w2=sw, q_star=qs, q_slope=slope, status=PASS,
               stable=None if math.isnan(slope) else bool(slope <= 1))
    row["note"] = _line(getattr(e, "note", "") or "").split(";")[0]     # e.g. "... is positively homogeneous: ..."
    dpsi2 = lambda q: float(mp_expect1(lambda t: phi.f("dphi")(t) ** 2, q, phi.kinks, dps))  # noqa: E731
    V = lambda q: float(mp_expect1(lambda t: phi.f("phi")(t) ** 2, q, phi.kinks, dps))  # noqa: E731
    if math.isinf(qs):     # chi1 does not depend on q: check it at q = 1
        r1 = abs(sw * dpsi2(1.0) - 1)
        row["residuals"] = [r1]
        if r1 > 1e-7:
            row.update(status=FAIL, note="EOC point fails the mpmath re-check")
            rep.fail(f"EOC at sigma_b2 = {sb:g}: chi1 - 1 = {r1:.2g} at q = 1 (mpmath)")
    elif qs > 0:
        r1, r2 = abs(sw * dpsi2(qs) - 1), abs(sw * V(qs) + sb - qs) / qs
        row["residuals"] = [r1, r2]
        if max(r1, r2) > 1e-7:
            row.update(status=FAIL, note="EOC point fails the mpmath re-check")
            rep.fail(f"EOC at sigma_b2 = {sb:g}: chi1 - 1 = {r1:.2g}, q* residual = {r2:.2g} (mpmath)")
    else:
        _eoc_at_zero(rep, row, act, phi, dps)
    if 0 <= qs < math.inf and slope > 1 + 1e-9:
        row.update(stable=False, note=f"UNSTABLE q* (q-map slope {slope:.4g} > 1)")
        rep.warnings.append(
            f"unstable EOC point at sigma_b2 = {sb:g} (sigma_w2 = {sw:.6g}, q* = {qs:.6g}): the variance map's "
            f"slope sigma_w2 V'(q*) = {slope:.4g} > 1, so q* is an unstable fixed point. The layer recursion "
            f"does not reach it (q runs away from q*), so a network at this sigma_w2 is not at the edge of "
            f"chaos: chi1 = 1 holds only at q*, not at the q the network has.")


def _eoc_at_zero(rep, row, act, phi, dps):
    """q* = 0: q = 0 must be a fixed point, and sigma_w2 = 1/phi'(0)^2 for a smooth unpooled phi."""
    sb, sw = row["sigma_b2"], row["sigma_w2"]
    d0 = float(phi.f("dphi")(mpmath.mpf(0)) ** 2)
    row["note"] = "q* = 0: sigma_w2 = 1/E[psi'^2](0+)"
    v0 = float(mp_expect1(lambda t: phi.f("phi")(t) ** 2, 1e-12, phi.kinks, dps))
    if sw * v0 + sb > 1e-9:   # q = 0 must be a fixed point: sigma_w2 V(0+) + sigma_b2 = 0
        row.update(status=FAIL, note="inconsistent: q = 0 is not a fixed point")
        rep.fail(f"EOC at sigma_b2 = {sb:g}: sf.eoc returns sigma_w2 = {sw:.6g} with q* = 0, but q = 0 is "
                 f"not a fixed point (sigma_w2 V(0+) + sigma_b2 = {sw * v0 + sb:.6g}, phi(0) = "
                 f"{float(phi.f('phi')(mpmath.mpf(0))):.6g} != 0)")
    if act.pool is None and not phi.kinks and abs(sw * d0 - 1) > 1e-9:
        row["status"] = FAIL
        rep.fail(f"EOC at sigma_b2 = 0: sigma_w2 phi'(0)^2 = {sw * d0:.6g}, expected 1")


def _phases(rep, act, seconds):
    """sf.phase at each of INITS under a time limit; a phase not determined is inconclusive."""
    for label, sw, sb in INITS:
        row = dict(init=label, sigma_w2=sw, sigma_b2=sb, phase=None, c_star=None, chi1=None, q_star=None,
                   seconds=None, status=INCONCLUSIVE, note="")
        where = f"phase at {label} (sigma_w2 = {sw:.4g}, sigma_b2 = {sb:g})"
        t = time.perf_counter()
        try:
            p = call_with_cpu_limit(seconds, phases_mod.phase, act, sw, sb, 1e-6, True)
        except TimeLimitExceeded:
            row["note"] = f"not determined within {seconds:g} CPU seconds"
            rep.undetermined(f"{where}: not determined within {seconds:g} CPU seconds of its thread "
                             f"(wall cap {CPU_WALL_FACTOR * seconds:g} s; raise it with --phase-seconds / phase_seconds)")
        except (ValueError, ArithmeticError, Unsupported) as err:
            row["note"] = f"not determined: {_line(err)}"
            rep.undetermined(f"{where}: {type(err).__name__}: {_line(err)}")
        else:
            row.update(phase=p.label, c_star=float(p.c_star), chi1=float(p.slope), q_star=float(p.q_star),
                       status=PASS)
        row["seconds"] = time.perf_counter() - t
        rep.phases.append(row)


# ---------------------------------------------------------------- terminal table
def _fmt(v, w=12):
    if v is None:
        return "-".rjust(w)
    if isinstance(v, float):
        return f"{v:.{w - 6}g}".rjust(w)
    return str(v).rjust(w)


MARK = {PASS: "ok", FAIL: "FAIL", INCONCLUSIVE: "INCONCLUSIVE", NA: "n/a"}


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
          f"  {'quantity':20s} {'point':18s} {'package':>14s} {'mpmath':>14s} {'Monte Carlo':>14s} {'SE':>9s}  status"]
    for c in rep.checks:
        pt = ",".join(f"{p:g}" for p in c.point)
        L.append(f"  {c.quantity:20s} {pt:18s} {c.package:14.10g} {c.mpmath:14.10g} {c.monte_carlo:14.6g} "
                 f"{c.mc_stderr:9.2g}  {MARK[c.status]}")
        if c.note:
            L.append(f"      {c.note}")
    m = rep.mean
    drift = "not determined" if m["creates_drift"] is None else \
        ("one layer creates drift" if m["creates_drift"] else "no drift from one layer")
    g2 = "" if m["gamma2_sigma_w2_1"] is None else f"; gamma^(2) at sigma_w2 = 1: {m['gamma2_sigma_w2_1']:.6g}"
    L += ["", f"drift (IGB)         {drift}: {m['reason']}{g2}", "",
          "edge of chaos       sigma_b2    sigma_w2          q*  status"]
    for r in rep.eoc:
        L.append(f"  {'':18s}{r['sigma_b2']:8g} {_fmt(r['sigma_w2'])} {_fmt(r['q_star'])}  {MARK[r['status']]:4s}"
                 f"  {r['note']}")
    L += ["", "phases              init               sigma_w2 sigma_b2  phase                    c*        chi1"
              "  status"]
    for r in rep.phases:
        L.append(f"  {'':18s}{r['init']:18s} {r['sigma_w2']:8.4g} {r['sigma_b2']:8g}  {str(r['phase'] or '-'):24s}"
                 f"{_fmt(r['c_star'], 10)}{_fmt(r['chi1'], 10)}  {MARK[r['status']]}  {r['note']}")
    L.append("")
    L.append("problems            " + ("none" if not rep.problems else ""))
    L += [f"  - {p}" for p in rep.problems]
    for title, items in (("warnings", rep.warnings), ("failures", rep.failures),
                         ("inconclusive (did not finish or could not run; not counted as passed)", rep.inconclusive)):
        if items:
            L += ["", title] + [f"  - {f}" for f in items]
    tm = rep.timings
    L += ["", "time                " + ", ".join(f"{k} {v:.1f} s" for k, v in tm.items()), "", _result_line(rep)]
    return "\n".join(L)


def _result_line(rep):
    """RESULT: PASS (every check ran and held) / FAIL / INCONCLUSIVE (nothing failed, some checks did not finish)."""
    if rep.status == PASS:
        return "RESULT: PASS"
    if rep.status == FAIL:
        return f"RESULT: FAIL ({len(rep.failures)} failed" + \
            (f", {len(rep.inconclusive)} inconclusive)" if rep.inconclusive else ")")
    hint = "; a longer --phase-seconds may let them finish" if any("CPU seconds" in w for w in rep.inconclusive) else ""
    return f"RESULT: INCONCLUSIVE (nothing failed, but {len(rep.inconclusive)} check(s) did not finish or could not run{hint})"
