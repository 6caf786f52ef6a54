"""Building and certifying a table: theta-cells fitted to node values, held-out and mpmath checks.

Every cell is evaluated at held-out points -- the second-kind Chebyshev points cos(pi k/n), k = 0..n, where
T_n peaks, ends included -- against the same node evaluator (:mod:`.nodes`; the full tensor grid for a fast
evaluator, a diagonal set for the slow one), and MP_CHECKS random points per build at q <= MP_QMAX against
mpmath (the defining integral at MP_DPS digits; none for max-pool covariances). A panel worse than ACCEPT
is refused (NotCertified; callers then use quadrature). The bound reported is 2x (4x for diagonal sets) the
largest held-out error plus the largest mpmath discrepancy (plus QUAD_FLOOR or RULE_FLOOR for nodes by
quadrature or the max-pool rule, which held-out points cannot see); V is relative, C against
sqrt(V(q1) V(q2)) (C_rel relative to |C| for odd psi), D relative to D. (docs/numerics.md section 3.)
"""
from __future__ import annotations

import math

import numpy as np

from symfield.core.errors import NoRule, NotCertified
from symfield.numeric import chebyshev as cheb
from symfield.numeric.evaluate import evaluate
from symfield.numeric.kernels import table_maps
from symfield.numeric.pool.maxrule import Rule
from symfield.numeric.tables.geometry import N_T, N_TH, Panel, initial_cells, panel_q
from symfield.numeric.tables.nodes import Evaluator, rule_distance, shifted
from symfield.numeric.tables.polar import Polar2, polar_distance
from symfield.symbolic.gaussian import q as Q
from symfield.symbolic.gaussian import q1 as Q1
from symfield.symbolic.gaussian import q2 as Q2
from symfield.symbolic.gaussian import q12 as Q12

ACCEPT = 1e-11          # a panel whose held-out error exceeds this is refused (NotCertified)
TAIL = 4e-15            # resolved: the last three Chebyshev coefficients are below TAIL x scale
MAX_CELLS = 64          # theta-cells per q-panel before giving up
MP_CHECKS = 2           # random mpmath spot checks per build call (when a dps path exists) ...
MP_QMAX = 2.0           # ... at q <= MP_QMAX (mpmath's 2-D quadrature costs ~2 s at q = 1, ~1 min at q = 8)
MP_DPS = 15
QUAD_FLOOR = 1e-12      # error of symfield.quadrature's 2-D rules (max_expect2: measured ~4e-13 against an
#                         independent argmax decomposition, tests/numeric/test_tables.py), added to C's bound
RULE_FLOOR = 1e-13      # error of symfield.maxrule's rule (measured <= 1e-14, tests/numeric/test_pool_monotone.py), added to C's bound
SLOW = "symfield.numeric quadrature"
D_DIFF = "difference of C (loses digits as c -> 1)"   # info["D"] when no cancellation-free rule exists
D_POLAR = "polar rule: sum_m P_m (sin(m theta/2)/sin(theta/2))^2"
D_RULE = "max-pool h_k rule with t - s without cancellation (piecewise-linear phi)"
RULE = "max-pool h_k rule (symfield.maxrule)"


class TableBuilder:
    """The building and certification half of :class:`symfield.numeric.tables.table.Table`."""

    @property
    def error(self) -> dict:
        """Certified bounds: V (relative), C (against sqrt(V(q1) V(q2))), C_rel (odd psi: relative to |C|),
        D (relative to D; inf when D is the difference of C, see info["D"])."""
        out = self._error_VC()
        if self.panels:
            out["D"] = self._error_D(out)
        return out

    def _error_D(self, out):
        if self.info.get("D") in (None, D_DIFF):
            return math.inf
        vals = [(4.0 if pn.err.get("diag") else 2.0) * pn.err.get("D", math.inf) for pn in self.panels.values()]
        e = max(vals)
        if self.info.get("D") == D_RULE:
            e += RULE_FLOOR
        e += max((c.get("err_D", 0.0) for c in self.info["mp_checks"]), default=0.0)
        if self.parity == 1:   # theta > pi/2: D = V + V - 2C with C <= 0, D >= 2 sqrt(V(q1) V(q2))
            e = max(e, out.get("V", 0.0) + out.get("C", 0.0))
        return e

    def _error_VC(self):
        out = {}
        for key in ("V", "C", "C_rel"):
            vals = [(4.0 if pn.err.get("diag") else 2.0) * pn.err[key] for pn in self.panels.values() if key in pn.err]
            if vals:
                out[key] = max(vals)
        if self.info.get("evaluator") == SLOW and "C" in out:
            out["C"] += QUAD_FLOOR   # nodes by quadrature: its own (measured, not re-checked here) error
        if self.info.get("evaluator") == RULE and "C" in out:
            out["C"] += RULE_FLOOR
        mp = [c["err"] for c in self.info["mp_checks"]]
        if mp:
            out["C"] = out.get("C", 0.0) + max(mp)
            if "C_rel" in out:
                out["C_rel"] += max(c.get("err_rel", 0.0) for c in self.info["mp_checks"])
        return out

    @property
    def bound(self) -> float:
        """max(V, C) of :attr:`error`: per application of a map, in its natural scale."""
        e = self.error
        return max(e.get("V", 0.0), e.get("C", 0.0))

    def evaluator(self):
        if self._ev is None:
            self._ev = Evaluator(self.K, self.parity)
            self._mr = self._ev.maxrule
            if self.kind == "homogeneous" and self._ev.maxrule is not None:
                # one q: the quadrature's ~130 nodes (~3 s) beat the rule's graded cells (~25 s, measured)
                self._ev.maxrule, self._ev.fast = None, False
            self.info["evaluator"] = (RULE if self._ev.maxrule else
                                      "polar Chebyshev-Fourier rule" if self._ev.fast else SLOW)
            self._distance_rule(self._ev)
        return self._ev

    def _distance_rule(self, ev):
        """Set ev.R(q, theta) = (V - C)/(q s2), s2 = sin^2(theta/2) (homogeneous: unit q), evaluated without
        cancellation, or leave it None (D then is V + V - 2C, info["D"] = D_DIFF). Checked once at a large
        theta against (V - C)/(q s2) from the node evaluator (1e-12 of V)."""
        pol = ev.single
        scale = 1.0
        if pol is None and self.K.act.pool == "avg" and len(ev.polars) == 1:
            pol, scale = ev.polars[0], 1.0 / self.K.act.k   # V - C = (V_phi - C_phi)/k at equal norms
        how = None
        if pol is not None and pol.expr is not None and float(pol.f(np.zeros(1))[0]) != 0.0:
            h = shifted(pol.expr, pol.f)       # phi(0) != 0: the modes m >= 1 of phi - phi(0)
            pol = Polar2(h, h, pol.parity) if h is not None else pol
        if pol is not None and pol.f is pol.g:
            def R(q, th):
                out = np.empty(np.shape(q))
                for qq in np.unique(q):
                    sel = q == qq
                    out[sel] = 2.0 * scale * polar_distance(pol.coefficients(qq, qq), th[sel]) / qq
                return out
            how = D_POLAR
        elif self.kind == "homogeneous" and self.degree == 1 and self._mr is not None and self._mr[0] is self._mr[1]:
            R, how = rule_distance(*self._mr[::2]), D_RULE
        if how is not None:
            q0 = 1.0 if self.kind == "homogeneous" else 0.5
            th0 = np.array([1.2 if self.parity else 2.0])
            s2 = math.sin(0.6 if self.parity else 1.0) ** 2
            V0 = float(ev.V(np.array([q0]))[0])
            C0 = float(ev.C(q0, q0, q0 * math.cos(th0[0])))
            got = float(R(np.array([q0]), th0)[0])
            if not abs(got * q0 * s2 - (V0 - C0)) <= 1e-12 * V0:
                how = None   # the identity behind the rule does not hold for this kernel
        ev.R = R if how is not None else None
        self.info["D"] = how or D_DIFF

    # ---------------------------------------------------------------- building

    def _g(self, ev, q, th):
        """Tabulated g at arrays q, theta (same shape), from node values of C."""
        c = np.cos(th)
        if ev.maxrule is not None:   # one rule per theta, all q at once
            f, g, k = ev.maxrule
            C = np.empty(np.shape(q))
            for tv in np.unique(th):
                sel = th == tv
                C[sel] = Rule(math.cos(tv), k, q[sel].max()).expect(f, g, q[sel], q[sel])
            if self.kind == "homogeneous" or self.psi0sq != 0:
                return C / c if self.parity == 1 else C
            return C / (q * c) if self.parity == 1 else C / q
        if self.kind == "homogeneous":
            C = ev.C(np.ones_like(q), np.ones_like(q), c)
            return C / c if self.parity == 1 else C
        if self.parity == 1 and self.psi0sq == 0:
            G = ev.C_over_cos(q, th)
            if G is not None:
                return G / q
        C = ev.C(q, q, q * c)
        if self.psi0sq != 0:
            return C
        return C / (q * c) if self.parity == 1 else C / q

    def _C_from_g(self, q, th, g):
        c = np.cos(th)
        if self.kind == "homogeneous":
            return g * c if self.parity == 1 else g
        if self.psi0sq != 0:
            return g
        return q * (c if self.parity == 1 else 1.0) * g

    def _build_cells(self, ev, qs, qh, Vh, heldout_full, xh=None):
        """Adaptive theta-cells for q-nodes qs (1 for homogeneous) + held-out errors at qh."""
        cells, tail_q = self._fit_cells(ev, qs)
        full = heldout_full or qs.size == 1
        errC, errR = self._heldout(ev, cells, qs.size, qh, Vh, full, xh)
        err = {"C": errC, "diag": not full, "tail_q": tail_q}
        if self.parity == 1:
            err["C_rel"] = errR
        return cells, err

    def _fit_cells(self, ev, qs, gfun=None, graded=None, tail=None):
        """theta-cells [(a, b, coef[nt, N_TH])] with tensor coefficients from node values at q-nodes qs,
        bisected until the theta-tail (last three coefficients) is below the tail tolerance x max|g|;
        also the largest q-tail (relative), for the record. gfun(q, theta): the tabulated function
        (default: g from C)."""
        nt = qs.size
        gfun = gfun or (lambda q, th: self._g(ev, q, th))
        pending = initial_cells(qs.max() if self.kind == "general" else 1.0, self.theta_max, self.parity,
                                 graded=ev.fast if graded is None else graded)
        tn = cheb.nodes(N_TH)
        cells, scale, tail_q = [], None, 0.0
        # the quadrature's nodes carry ~QUAD_FLOOR noise: a tail at that level is noise, not resolution
        if tail is None:
            tail = (4 * TAIL if ev.maxrule else TAIL) if ev.fast else QUAD_FLOOR
        while pending:
            if len(cells) + len(pending) > MAX_CELLS:
                raise NotCertified(f"{self.name}: theta-cells did not converge (more than {MAX_CELLS} cells)")
            ths = np.concatenate([cheb.to_panel(a, b, tn) for a, b in pending])
            G = gfun(np.repeat(qs, ths.size), np.tile(ths, nt)).reshape(nt, -1)
            if not np.all(np.isfinite(G)):
                raise NotCertified(f"{self.name}: non-finite node values")
            if scale is None:
                scale = max(np.abs(G).max(), 1e-300)
            nxt = []
            for j, (a, b) in enumerate(pending):
                vals = G[:, j * N_TH:(j + 1) * N_TH]
                coef = cheb.coefficients2d(vals)
                tail_th = cheb.tail(coef, axis=1)
                tail_t = cheb.tail(coef, axis=0) if nt > 1 else 0.0
                tail_q = max(tail_q, tail_t / scale)
                if tail_th > tail * scale and b - a > 1e-6:
                    nxt += [(a, 0.5 * (a + b)), (0.5 * (a + b), b)]
                else:
                    cells.append((a, b, coef.reshape(nt, N_TH)))
            pending = nxt
        cells.sort(key=lambda c: c[0])
        return cells, tail_q

    def _build_rcells(self, ev, qs, qh, full, xh):
        """theta-cells of R = (V - C)/(q s2) (node values ev.R) and their held-out error relative to R."""
        slow = self.info.get("D") == D_RULE
        cells, _ = self._fit_cells(ev, qs, ev.R, graded=not slow, tail=4 * TAIL if slow else TAIL)
        full = full or qs.size == 1
        th_h = cheb.second_kind(N_TH)
        err = 0.0
        for a, b, coef in cells:
            ths = cheb.to_panel(a, b, th_h)
            if full:
                XQ, YT = np.meshgrid(np.arange(qh.size), np.arange(ths.size), indexing="ij")
            else:
                k = max(qh.size, ths.size)
                XQ, YT = (np.arange(k) % qh.size)[None, :], ((np.arange(k) * 5) % ths.size)[None, :]
            xq = (cheb.second_kind(qs.size) if xh is None else xh)[XQ] if qs.size > 1 else np.zeros(XQ.shape)
            ref = ev.R(qh[XQ].ravel(), ths[YT].ravel()).reshape(XQ.shape)
            got = cheb.chebval2d(coef, xq, th_h[YT])
            err = max(err, cheb.max_error(got, ref, np.abs(ref)))
        return cells, err

    def _heldout(self, ev, cells, nt, qh, Vh, full, xh):
        """(C error, C_rel error) at held-out points: second-kind points in theta (and q: all pairs when
        ``full``, else a diagonal set), against fresh node values; C against its Cauchy-Schwarz scale."""
        th_h = cheb.second_kind(N_TH)
        errC, errR = 0.0, 0.0
        Vref = Vh if self.kind == "general" else np.array([self.V1])
        for a, b, coef in cells:
            yh = th_h
            ths = cheb.to_panel(a, b, yh)
            if full:
                XQ, YT = np.meshgrid(np.arange(qh.size), np.arange(ths.size), indexing="ij")
            else:  # diagonal: every held-out q once, every held-out theta once
                k = max(qh.size, ths.size)
                XQ, YT = (np.arange(k) % qh.size)[None, :], ((np.arange(k) * 7) % ths.size)[None, :]
            xq = (cheb.second_kind(nt) if xh is None else xh)[XQ] if nt > 1 else np.zeros(XQ.shape)
            qq, tt = qh[XQ], ths[YT]
            ref_g = self._g(ev, qq.ravel(), tt.ravel()).reshape(qq.shape)
            got_g = cheb.chebval2d(coef, xq, yh[YT])
            ref_C = self._C_from_g(qq, tt, ref_g)
            got_C = self._C_from_g(qq, tt, got_g)
            scaleC = Vref[XQ] * (qq ** self.degree if self.kind == "homogeneous" else 1.0)
            errC = max(errC, cheb.max_error(got_C, ref_C, scaleC))
            if self.parity == 1:   # relative error of C = q12 g (where the reference g itself is clean)
                ok = np.ones(tt.shape, bool) if ev.single is not None else np.cos(tt) >= 1e-3
                rel = np.abs(got_g - ref_g) / np.maximum(np.abs(ref_g), 1e-300)
                errR = max(errR, float(np.max(rel[ok], initial=0.0)))
        return errC, errR

    def _vfit(self, q, V):
        """Tabulated v: (V - 0)/q when psi(0) = 0 (relative accuracy as q -> 0), else V itself."""
        return V / q if self.psi0sq == 0 else V

    def _build_panel(self, ev, p):
        xs, xh = cheb.nodes(N_T), cheb.second_kind(N_T)
        if p == 0:
            xh[-1] = -1 + 1e-12          # q ~ 1e-27 rather than q = 0 (relative errors there)
        qs, qh = panel_q(p, xs), panel_q(p, xh)
        Vs, Vh = ev.V(qs), ev.V(qh)
        vcoef = cheb.coefficients(self._vfit(qs, Vs))
        got = cheb.chebval(xh, vcoef)
        got = got * qh if self.psi0sq == 0 else got
        errV = cheb.max_error(got, Vh, np.abs(Vh))
        cells, err = self._build_cells(ev, qs, qh, Vh, ev.fast, xh)
        err["V"] = errV
        rcells = []
        if ev.R is not None:
            rcells, err["D"] = self._build_rcells(ev, qs, qh, ev.fast, xh)
        return Panel(vcoef, cells, err, rcells)

    def _build_theta_table(self, ev):
        """The one panel of the homogeneous kind: theta-cells at q = 1 (and V1 = V(1))."""
        self.V1 = float(ev.V(np.array([1.0]))[0])
        cells, err = self._build_cells(ev, np.array([1.0]), np.array([1.0]), None, True)
        rcells = []
        if ev.R is not None:
            rcells, err["D"] = self._build_rcells(ev, np.array([1.0]), np.array([1.0]), True, None)
        return Panel(np.zeros(0), cells, err, rcells)

    def _mp_checks(self, built, n=None):
        """Random points in the new panels against mpmath (dps quadrature of the defining integral)."""
        n = MP_CHECKS if n is None else n
        if not n or self.K.act.pool == "max":   # max-pool C in mpmath costs minutes: checked in the tests instead
            return
        rng = np.random.default_rng(len(self.info["mp_checks"]) + 17)
        cand = [p for p in built if self.kind == "homogeneous" or panel_q(p, -1.0) < MP_QMAX]
        for _ in range(n if cand else 0):
            p = int(rng.choice(cand))
            if self.kind == "homogeneous":
                q = 1.0
            else:
                hi = min(MP_QMAX, float(panel_q(p, 1.0)))
                lo = float(panel_q(p, -1.0))
                q = float(rng.uniform(lo, hi)) if p else float(rng.uniform(0.05, 1.0) * hi)
            th = float(rng.uniform(0.0, math.pi))
            q12 = q * math.cos(th)
            try:
                ref = float(evaluate(self.K.C, (Q1, Q2, Q12), (q, q, q12), self.K.kinks, MP_DPS))
                Vq = float(evaluate(self.K.V, (Q,), (q,), self.K.kinks, MP_DPS))
            except NoRule:
                return   # no dps path (max-pool covariance): held-out checks only
            M = self.arrays()    # the table maps as plain Python: no numba compilation during a build
            got = table_maps.C(M, q, q, q12)
            rec = dict(q=q, theta=th, err=abs(got - ref) / Vq)
            if self.parity == 1 and ref != 0:
                rec["err_rel"] = abs(got - ref) / abs(ref)
            Dref = 2.0 * (Vq - ref)   # the reference's own error (~1e-15 V) is small against D >= V/10
            if self.info.get("D") not in (None, D_DIFF) and Dref >= 0.1 * Vq:
                rec["err_D"] = abs(table_maps.D(M, q, q, q12, 4.0 * q * math.sin(0.5 * th) ** 2) - Dref) / Dref
            self.info["mp_checks"].append(rec)

    # ---------------------------------------------------------------- run time


def accept(T, p, pn):
    vals = [v for k, v in pn.err.items() if k in ("V", "C", "D")]
    worst = math.nan if any(v != v for v in vals) else max(vals)
    if not worst <= ACCEPT:
        raise NotCertified(f"{T.name}: panel {p} reaches only {worst:.1e} at held-out points (required {ACCEPT:.0e})")
    return pn
