"""Fast maps without a closed form: certified piecewise-Chebyshev tables of V and C.

V(q) and C(q1, q2, q12) do not depend on sigma_w2, sigma_b2, so each activation psi gets ONE table,
built once, checked, cached on disk, and evaluated inside the compiled recursion
(:mod:`symfield.codegen`). Two kinds:

``homogeneous``  psi(t u) = t^n psi(u) (t > 0; relu + max-pool, leaky relu + max-pool, ...):
                 V = q^n V(1),  C(q1, q2, q12) = (q1 q2)^(n/2) g(theta): a 1-D table in
                 theta = arccos c, valid for ANY q1, q2 (also q_aa != q_bb).
``general``      the equal-norm maps, tabulated as V(q) = q v(q), C(q, q, q cos theta) = q w(theta) g(q, theta)
                 when psi(0) = 0 (relative accuracy as q -> 0; w = cos(theta) for odd psi, so C(q, q, 0)
                 = 0 exactly and C stays relative-accurate near c = 0), else V = v, C = g themselves.
                 Panels in q: p = 0 is [0, 2^E0] in the variable sqrt(q); p >= 1 is [2^(E0+p-1), 2^(E0+p)]
                 in log2 q (16 Chebyshev nodes each). Each q-panel has theta-cells (graded towards
                 theta = 0 and pi, where the kernel's scale is ~ 1/sqrt(q), and bisected until the
                 Chebyshev tail is below TAIL) with 16 x 16 tensor Chebyshev interpolants in (x(q), theta).
                 Built lazily: only the q-panels a grid reaches (symfield.propagate extends the table
                 when points leave it, up to q = 2^Q_CAP_EXP; beyond, the quadrature path takes over).
                 Unequal norms (q_aa != q_bb) are not tabulated: propagate uses quadrature there.

Distance map D(q1, q2, d) = E[(psi(u) - psi(v))^2], d = q1 + q2 - 2 q12 (= V + V - 2C, but relative-accurate
as c -> 1, down to d/q ~ 1e-300): a second set of theta-cells per panel tabulates
    R(q, theta) = (V(q) - C(q, q, q cos theta))/(q s2),   s2 = sin^2(theta/2) = d/(4q)
(homogeneous: at q = 1), so D = 2 q s2 R (homogeneous, any norms: D = V1 (q1^(n/2) - q2^(n/2))^2
+ 2 (q1 q2)^(n/2) s2 R, s2 = (d - (sqrt q1 - sqrt q2)^2)/(4 sqrt(q1 q2))); theta from d, not from c.
R(0) = 2 E[psi'^2]. For theta > pi/2: odd psi D = V + V - 2C (C <= 0), even psi R at pi - theta.
Node values of R without cancellation: the polar rule's sum_m P_m (sin(m theta/2)/sin(theta/2))^2 (P_m >= 0;
avg-pools: R_phi/k), or for max-pools of relu-like phi (homogeneous, degree 1) the h_k rule with t - s
carried exactly (maxrule.Rule.dt). Other kinds (kinked phi, general-kind max-pools): D = V + V - 2C,
info["D"] = D_DIFF and error["D"] = inf (the caller flags it). error["D"] is relative to D.

Variables: in theta the large-q limit of tanh, (2/pi) arcsin c = 1 - 2 theta/pi, is linear and the
kinks' (1 - c^2)^(n/2) are powers of sin(theta); for odd or even psi only theta in [0, pi/2] is
tabulated (C(pi - theta) = -C(theta) resp. C(theta)).

Node values (the reference the table is built from and checked against):
- each Integral E[f(u) g(v)] with smooth f, g (tanh, softplus, sigmoid, silu, gelu, mish, and the
  avg-pools of these): the polar Chebyshev-Fourier rule :func:`polar_coefficients`, which gives
  C(q1, q2, sqrt(q1 q2) cos theta) for ALL theta at once from one set of coefficients (~1-50 ms per q;
  for odd psi also C/cos(theta) without cancellation, :func:`polar_eval_over_cos`);
- max-pools of a monotone phi smooth except at x = 0 (tanh, sigmoid, softplus, erf; relu, leaky relu):
  one :class:`symfield.maxrule.Rule` per theta (the h_k law depends on c only), evaluated at all the
  q-nodes of a panel at once (~50-100 ms per theta for 16-33 q); its error (RULE_FLOOR, measured in
  tests/test_pool_monotone.py against the exact linear max2 map and mpmath) is added to C's bound;
- everything else (kinked activations, other max-pools): symfield.numeric's quadrature (~20-400 ms per point).

Fit and certification (nodes, DCT coefficients, tails, held-out points: symfield.numeric.chebyshev):
every cell is also evaluated at held-out points -- the second-kind Chebyshev points
cos(pi k/n), k = 0..n (T_n peaks there; ends included) -- against the same node evaluator (full
tensor grid for the fast evaluator, a diagonal set for the slow one), and MP_CHECKS random points per
build at q <= MP_QMAX against mpmath (``dps`` quadrature of the defining integral by
symfield.numeric.evaluate; unavailable for max-pool covariances). A panel worse than ACCEPT is refused
(TableError; propagate then uses quadrature).
The reported bound is 2 x (4 x for diagonal sets) the largest held-out error plus the largest mpmath
discrepancy (plus QUAD_FLOOR for C when the nodes come from the slow quadrature, which the held-out
points cannot see); errors are measured like everywhere in symfield: V relative, C against
sqrt(V(q1) V(q2)) (its Cauchy-Schwarz scale), and for odd psi also C relative to |C| (``C_rel``).
"""
from __future__ import annotations

from symfield.core.errors import InvalidValue, NotTabulable
import hashlib
import json
import math
import re
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import sympy as sp

from symfield.core.files import cache_dir, load_checked_npz, quarantine, save_checked_npz, warn
from symfield.core.progress import bar
from symfield.core.version import __version__
from symfield.numeric import chebyshev as cheb
from symfield.numeric import codegen, shipped
from symfield.numeric import evaluate as N
from symfield.numeric import quadrature as QD
from symfield.numeric.evaluate import evaluate
from symfield.numeric.maxrule import Rule
from symfield.symbolic.formula import X as x
from symfield.symbolic.gaussian import homogeneous
from symfield.symbolic.gaussian import q as Q
from symfield.symbolic.gaussian import q1 as Q1
from symfield.symbolic.gaussian import q2 as Q2
from symfield.symbolic.gaussian import q12 as Q12
from symfield.symbolic.integrals import Kind, integrals, kinds
from symfield.symbolic.kernel import Kernel, kernel
from symfield.core import caches

TABLE_VERSION = 4
E0 = -8                 # panel 0 is q in [0, 2^E0] (tanh's V is Gevrey, not analytic, at q = 0)
Q_CAP_EXP = 16          # tables never extend beyond q = 2^16
N_T = 16                # Chebyshev nodes per q-panel (fixed: the compiled evaluation is unrolled)
N_TH = N_T              # Chebyshev nodes per theta-cell (the compiled evaluation is square)
ACCEPT = 1e-11          # a panel whose held-out error exceeds this is refused (TableError)
TAIL = 4e-15            # resolved: the last three Chebyshev coefficients are below TAIL x scale
MAX_CELLS = 64          # theta-cells per q-panel before giving up
MP_CHECKS = 2           # random mpmath spot checks per build call (when a dps path exists) ...
MP_QMAX = 2.0           # ... at q <= MP_QMAX (mpmath's 2-D quadrature costs ~2 s at q = 1, ~1 min at q = 8)
MP_DPS = 15
QUAD_FLOOR = 1e-12      # error of symfield.quadrature's 2-D rules (max_expect2: measured ~4e-13 against an
#                         independent argmax decomposition, tests/test_tables.py), added to C's bound
RULE_FLOOR = 1e-13      # error of symfield.maxrule's rule (measured <= 1e-14, tests/test_pool_monotone.py), added to C's bound
_SLOW = "symfield.numeric quadrature"
D_DIFF = "difference of C (loses digits as c -> 1)"   # info["D"] when no cancellation-free rule exists
_D_POLAR = "polar rule: sum_m P_m (sin(m theta/2)/sin(theta/2))^2"
_D_RULE = "max-pool h_k rule with t - s without cancellation (piecewise-linear phi)"
_RULE = "max-pool h_k rule (symfield.maxrule)"


def q_top():
    """The largest q a table is asked to cover: 1% below the cap 2^Q_CAP_EXP."""
    return 2.0 ** Q_CAP_EXP * 0.99


class TableError(ArithmeticError):
    """A table could not be built to the required accuracy (the caller falls back to quadrature)."""


# ----------------------------------------------------------------------------- polar rule
_GLT, _GLW = np.polynomial.legendre.leggauss(12)
R_MAX = 10.0


def _radial_rule(qmax):
    """Nodes/weights of int_0^R_MAX r e^(-r^2/2) h(r) dr: panels graded geometrically towards 0 from
    r0 = pi/(4 sqrt(qmax)) (h's singularities lie on the imaginary axis at |r| >= pi/(2 sqrt(q)) for
    tanh-like phi), unit panels above 1; 12 Gauss-Legendre points each."""
    r0 = min(1.0, math.pi / (4.0 * math.sqrt(qmax)))
    edges = [0.0]
    r = r0
    while r < 0.75:
        edges.append(r)
        r *= 2.0
    edges += [float(k) for k in range(1, int(R_MAX) + 1)]
    e = np.asarray(edges)
    a, b = e[:-1, None], e[1:, None]
    rr = (a + 0.5 * (b - a) * (1 + _GLT)).ravel()
    w = (0.5 * (b - a) * _GLW).ravel() * rr * np.exp(-0.5 * rr * rr)
    return rr, w


def _angular(f, rho, parity):
    """A[i, m] = (1/2 pi) int f(rho_i cos a) e^(-i m a) da, m = 0..K (DCT-I on K + 1 Chebyshev points,
    K doubled until the last quarter of the coefficients is below 1e-15 of the largest)."""
    K = 32
    while True:
        xs = cheb.second_kind(K, symmetric=True)     # exactly antisymmetric: x_(K-j) = -x_j
        F = f((rho[:, None] * xs[None, :]).ravel()).reshape(rho.size, K + 1)
        A = cheb.cos_coefficients(F, axis=1)
        top = np.abs(A).max(initial=0.0)
        if np.abs(A[:, 3 * K // 4:]).max(initial=0.0) <= 1e-15 * top or top == 0:
            break
        K *= 2
        if K > 2 ** 17:
            raise TableError(f"polar rule: the angular series of the activation at radius {rho.max():.3g} "
                             f"needs more than 2^17 terms")
    if parity == 1:
        A[:, 0::2] = 0.0
    elif parity == 2:
        A[:, 1::2] = 0.0
    return A


def polar_coefficients(f, g, q1, q2, parity=0):
    """Cosine coefficients P_m of C(theta) = E[f(u) g(v)] = sum_m P_m cos(m theta), where
    u = sqrt(q1) r cos(a), v = sqrt(q2) r cos(a - theta) (the standard construction in polar
    coordinates of (z1, z2)): with A_m(rho) the Chebyshev coefficients of f(rho x) on [-1, 1],
        P_m = (2 - [m = 0]) int_0^inf r e^(-r^2/2) A_m(sqrt(q1) r) B_m(sqrt(q2) r) dr.
    f, g: vectorised float64 callables; parity 1 (odd) / 2 (even) zeroes the vanishing modes."""
    r, w = _radial_rule(max(q1, q2, 1e-300))
    parts = []
    # radii in chunks (one panel of 12 each): small radii need few angular terms
    for i in range(0, r.size, _GLT.size):
        sl = slice(i, i + _GLT.size)
        A = _angular(f, math.sqrt(q1) * r[sl], parity)
        B = A if (g is f and q1 == q2) else _angular(g, math.sqrt(q2) * r[sl], parity)
        m = min(A.shape[1], B.shape[1])
        parts.append((w[sl, None] * A[:, :m] * B[:, :m]).sum(0))
    P = np.zeros(max(p.size for p in parts))
    for p in parts:
        P[:p.size] += p
    P[1:] *= 2.0
    return P


def polar_eval(P, theta):
    """sum_m P_m cos(m theta) at an array of theta."""
    theta = np.asarray(theta, dtype=float)
    m = np.arange(P.size)
    out = np.empty(theta.size)
    for i in range(0, theta.size, 256):
        out[i:i + 256] = np.cos(np.outer(theta.ravel()[i:i + 256], m)) @ P
    return out.reshape(theta.shape)


def polar_eval_over_cos(P, theta):
    """C(theta)/cos(theta) for odd C (odd modes only): with d = pi/2 - theta,
    cos(m theta)/cos(theta) = (-1)^((m-1)/2) sin(m d)/sin(d) -- no cancellation as theta -> pi/2."""
    theta = np.asarray(theta, dtype=float)
    m = np.arange(1, P.size, 2)
    coef = P[1::2] * np.where(((m - 1) // 2) % 2 == 0, 1.0, -1.0)
    d = (0.5 * math.pi - theta).ravel()
    out = np.empty(d.size)
    for i in range(0, d.size, 256):
        dd = d[i:i + 256]
        sd = np.sin(dd)
        S = np.where(sd[:, None] != 0, np.sin(np.outer(dd, m)) / np.where(sd == 0, 1.0, sd)[:, None], m[None, :])
        out[i:i + 256] = S @ coef
    return out.reshape(theta.shape)


def polar_distance(P, theta):
    """sum_(m>=1) P_m U_(m-1)(cos t)^2, t = theta/2, U_(m-1)(cos t) = sin(m t)/sin(t) (-> m at t = 0):
    (V - C(theta))/(2 sin^2(theta/2)) for C = sum_m P_m cos(m theta), since 1 - cos(m theta) = 2 sin^2(m t).
    For f = g, q1 = q2 every P_m >= 0: a sum of positive terms, no cancellation as theta -> 0."""
    t = 0.5 * np.asarray(theta, dtype=float).ravel()
    m = np.arange(1, P.size)
    out = np.empty(t.size)
    for i in range(0, t.size, 256):
        tt = t[i:i + 256]
        st = np.sin(tt)
        S = np.where(st[:, None] != 0, np.sin(np.outer(tt, m)) / np.where(st == 0, 1.0, st)[:, None], m[None, :])
        out[i:i + 256] = (S * S) @ P[1:]
    return out.reshape(np.shape(theta))


# ----------------------------------------------------------------------------- node evaluator
class _Polar2:
    """Vectorised E[f(u) g(v)] at arrays (q1, q2, q12) via polar_coefficients (cached per (q1, q2))."""

    def __init__(self, f, g, parity, expr=None):
        self.f, self.g, self.parity, self.cache = f, g, parity, {}
        self.expr = expr     # f's SymPy expression (f = g), when known

    def coefficients(self, q1, q2):
        k = (float(q1), float(q2))
        if k not in self.cache:
            if len(self.cache) > 256:
                self.cache.clear()
            self.cache[k] = polar_coefficients(self.f, self.g, *k, parity=self.parity)
        return self.cache[k]

    def __call__(self, a, b, c):
        a, b, c = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (a, b, c)))
        out = np.empty(a.shape)
        flat = [v.ravel() for v in (a, b, c)]
        res = out.reshape(-1)
        keys = np.stack(flat[:2], axis=1)
        for key in np.unique(keys, axis=0):
            sel = np.all(keys == key, axis=1)
            k = (float(key[0]), float(key[1]))
            P = self.coefficients(*k)
            sq = math.sqrt(k[0]) * math.sqrt(k[1])
            cc = np.clip(flat[2][sel] / sq, -1.0, 1.0)
            th = np.arctan2(np.sqrt(np.maximum((1 - cc) * (1 + cc), 0.0)), cc)
            res[sel] = polar_eval(P, th)
        return out


class Evaluator:
    """Float64 node values of V(q) and C(q1, q2, q12) for the table builder.

    ``fast`` is True when every 2-D integral in C goes through the polar rule (then C at many
    theta for one q costs about as much as one theta)."""

    def __init__(self, K, parity):
        self.K = K
        if K.act.pool is None or K.act.k == 1:   # E[phi^2] by quadrature (also where V's closed form cancels)
            f2 = N.vectorised(K.act.expr ** 2, N.NUMPY_MODULES)
            self.V = lambda qv: QD.expect1_vec(f2, qv, kinks=tuple(K.kinks))
        else:
            self.V = N.evaluator(K.V, (Q,), tuple(K.kinks), None)
        impls, repl, fast = {}, {}, True
        self.R = None     # R(q, theta) = (V - C)/(q sin^2(theta/2)) without cancellation (set by Table)
        for i, I in enumerate(integrals(K.C)):
            spec = I.integrand
            name = f"_quad{i}"
            if spec.kind is Kind.NORMAL2 and not K.kinks:
                f = N.vectorised(spec.f, N.NUMPY_MODULES)
                g = f if spec.g == spec.f else N.vectorised(spec.g, N.NUMPY_MODULES)
                # parity of the pair: both odd -> odd modes only, both even -> even modes only
                impls[name] = _Polar2(f, g, parity if spec.f == spec.g else 0, spec.f if spec.g == spec.f else None)
            else:
                impls[name] = N.integral_rule(spec, tuple(K.kinks), None)
                fast = False
            repl[I] = sp.Function(name)(*((I.scale(),) if spec.kind.dims == 1 else (Q1, Q2, Q12)))
        self.fast = fast
        self.polars = [v for v in impls.values() if isinstance(v, _Polar2) and v.f is v.g]
        self.maxrule = None
        atoms_ = integrals(K.C)
        if len(atoms_) == 1 and K.C == atoms_[0]:
            spec = atoms_[0].integrand
            if spec.kind is Kind.MAX2 and set(float(v) for v in K.kinks) <= {0.0}:
                f = N.vectorised(spec.f, N.NUMPY_MODULES)
                g = f if spec.g == spec.f else N.vectorised(spec.g, N.NUMPY_MODULES)
                self.maxrule, self.fast = (f, g, spec.k), True
        atoms = list(K.C.atoms(sp.Integral))
        # C is one polar integral (single-node phi): C/cos(theta) directly for odd psi
        self.single = impls["_quad0"] if len(atoms) == 1 and K.C == atoms[0] and isinstance(impls.get("_quad0"), _Polar2) else None
        fn = sp.lambdify((Q1, Q2, Q12), K.C.xreplace(repl), modules=[impls] + N.NUMPY_MODULES)

        def C(a, b, c):
            with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
                out = np.asarray(fn(a, b, c), dtype=float)
            return np.broadcast_to(out, np.broadcast(a, b, c).shape).copy()
        self.C = C

    def C_over_cos(self, q, th):
        """C(q, q, q cos theta)/cos(theta) at arrays q, theta, for odd single-node phi (else None)."""
        if self.single is None:
            return None
        out = np.empty(np.shape(q))
        for qq in np.unique(q):
            sel = q == qq
            out[sel] = polar_eval_over_cos(self.single.coefficients(qq, qq), th[sel])
        return out


def _shifted(expr, f, z0=1e-2, order=14):
    """h(z) = phi(z) - phi(0) on float64 arrays (f: phi vectorised, expr: its SymPy expression) without
    cancellation near 0 (its Taylor polynomial for |z| < z0, truncation ~ z0^order; f(z) - phi(0) above),
    or None if SymPy gives no series. The modes m >= 1
    of the polar rule (all that V - C needs) are those of h; from phi itself they lose digits as q -> 0
    (a constant of size phi(0) under a variation of size sqrt(q))."""
    try:
        ser = sp.series(expr, x, 0, order).removeO()
        coeffs = [float(ser.coeff(x, k)) for k in range(1, order)]
        f0 = float(expr.subs(x, 0))
    except Exception:
        return None

    def h(z):
        z = np.asarray(z, dtype=float)
        out = np.asarray(f(z), dtype=float) - f0
        small = np.abs(z) < z0
        if small.any():
            zs, acc = z[small], np.zeros(int(small.sum()))
            for c in reversed(coeffs):
                acc = (acc + c) * zs
            out[small] = acc
        return out
    return h


def _rule_distance(f, k):
    """R(theta) = E[(psi(S) - psi(T))^2]/(2 s2) at unit q for psi = phi(max_j u_j), phi homogeneous of
    degree 1 (piecewise linear, kink at 0): on a common piece phi(s) - phi(t) = slope (s - t) with
    s - t = -Rule.dt (no cancellation); R(0) = 2 E[psi'^2] = 2 (a1^2 (1 - 2^-k) + a0^2 2^-k)."""
    a1, a0 = float(f(np.array([1.0]))[0]), -float(f(np.array([-1.0]))[0])

    def one(tv):
        if tv == 0.0:
            return 2.0 * (a1 * a1 * (1.0 - 0.5 ** k) + a0 * a0 * 0.5 ** k)
        s2 = math.sin(0.5 * tv) ** 2
        r = Rule(math.cos(tv), k, 1.0, omc=2.0 * s2)
        s, t = r.s, r.t
        diff = np.where((s > 0) & (t > 0), -a1 * r.dt, np.where((s < 0) & (t < 0), -a0 * r.dt, f(s) - f(t)))
        return float(np.dot(r.w, diff * diff)) / (2.0 * s2)

    def R(q, th):
        th = np.asarray(th, dtype=float)
        return np.array([one(float(tv)) for tv in th.ravel()]).reshape(th.shape)
    return R


# ----------------------------------------------------------------------------- analysis
def _phi(K):
    return (K.base.act.expr if K.base is not None else K.act.expr), K.act.pool, K.act.k


def analyse(K):
    """(kind, degree, parity, psi(0)^2) of a kernel, or raise NotTabulable (not tabulable)."""
    phi, pool, k = _phi(K)
    if Kind.LEVEL2 in kinds(K.C):
        raise NotTabulable(f"{K.act.name}: max-pool of a non-monotone activation is not tabulated "
                                  f"(the accuracy of its float64 rule is not certified here); quadrature is used")
    odd = sp.simplify(phi.subs(x, -x) + phi) == 0
    even = sp.simplify(phi.subs(x, -x) - phi) == 0
    parity = 2 if even else (1 if odd and (pool in (None, "avg") or k == 1) else 0)
    h = homogeneous(phi)
    phi0 = float(sp.N(phi.subs(x, 0), 30))
    if h is not None and h[0] >= 1:
        return "homogeneous", int(h[0]), parity, 0.0
    return "general", 0, parity, phi0 * phi0


def _panel_q(p, xs):
    """q at panel coordinates x in [-1, 1] of q-panel p."""
    xs = np.asarray(xs, dtype=float)
    if p == 0:
        return (0.5 * (xs + 1) * 2.0 ** (E0 / 2)) ** 2
    return 2.0 ** (E0 + p - 1 + 0.5 * (xs + 1))


def panel_of(q):
    """Index of the q-panel containing q >= 0 (same rule as the compiled lookup)."""
    if q < 2.0 ** E0:
        return 0
    return math.frexp(q)[1] - E0


def _initial_cells(qhi, tmax, parity, graded=True):
    """theta-cells: [pi/4, pi/2] (and its mirror), graded by halving towards 0 (and pi) down to
    ~1/(4 sqrt q) (graded=False: no grading; bisection refines where the Chebyshev tail asks)."""
    lo = [math.pi / 4]
    while graded and lo[-1] > 1.0 / (4.0 * math.sqrt(qhi)) and lo[-1] > 1e-3:
        lo.append(lo[-1] / 2)
    edges = sorted({0.0, math.pi / 2, *lo})
    if tmax > math.pi / 2 + 1e-12:
        edges = sorted(set(edges) | {math.pi - e for e in edges})
    edges[-1] = tmax
    return [(a, b) for a, b in zip(edges[:-1], edges[1:])]


@dataclass
class Panel:
    """One q-panel (or the single theta-table of a homogeneous kind)."""
    vcoef: np.ndarray                       # Chebyshev coefficients of v(x) (empty for homogeneous)
    cells: list                             # [(theta_lo, theta_hi, coef[nt, nth])]
    err: dict = field(default_factory=dict)  # held-out errors: V, C, C_rel, D, and 'diag' flag
    rcells: list = field(default_factory=list)  # [(theta_lo, theta_hi, coef)] of R (distance map D)


class Table:
    """The table of one activation; see the module docstring. Build with :func:`table`."""

    def __init__(self, K):
        self.K = K
        self.kind, self.degree, self.parity, self.psi0sq = analyse(K)
        self.panels: dict[int, Panel] = {}
        self.V1 = None
        self.info = dict(build_seconds=0.0, mp_checks=[], evaluator=None)
        self._ev = None
        self._mr = None
        self._packed = None      # (V1, [(p, panel), ...], M): the panels M was packed from (see arrays)

    # ---------------------------------------------------------------- properties
    @property
    def name(self):
        return self.K.act.name

    @property
    def theta_max(self):
        return math.pi / 2 if self.parity else math.pi

    @property
    def q_range(self):
        """(q_lo, q_hi) covered (homogeneous: (0, inf))."""
        if self.kind == "homogeneous":
            return (0.0, math.inf)
        if not self.panels:
            return (math.nan, math.nan)
        lo, hi = min(self.panels), max(self.panels)
        return (0.0 if lo == 0 else 2.0 ** (E0 + lo - 1), 2.0 ** (E0 + hi))

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
        if self.info.get("D") == _D_RULE:
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
        if self.info.get("evaluator") == _SLOW and "C" in out:
            out["C"] += QUAD_FLOOR   # nodes by quadrature: its own (measured, not re-checked here) error
        if self.info.get("evaluator") == _RULE and "C" in out:
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
            self.info["evaluator"] = (_RULE if self._ev.maxrule else
                                      "polar Chebyshev-Fourier rule" if self._ev.fast else _SLOW)
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
            h = _shifted(pol.expr, pol.f)       # phi(0) != 0: the modes m >= 1 of phi - phi(0)
            pol = _Polar2(h, h, pol.parity) if h is not None else pol
        if pol is not None and pol.f is pol.g:
            def R(q, th):
                out = np.empty(np.shape(q))
                for qq in np.unique(q):
                    sel = q == qq
                    out[sel] = 2.0 * scale * polar_distance(pol.coefficients(qq, qq), th[sel]) / qq
                return out
            how = _D_POLAR
        elif self.kind == "homogeneous" and self.degree == 1 and self._mr is not None and self._mr[0] is self._mr[1]:
            R, how = _rule_distance(*self._mr[::2]), _D_RULE
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
        pending = _initial_cells(qs.max() if self.kind == "general" else 1.0, self.theta_max, self.parity,
                                 graded=ev.fast if graded is None else graded)
        tn = cheb.nodes(N_TH)
        cells, scale, tail_q = [], None, 0.0
        # the quadrature's nodes carry ~QUAD_FLOOR noise: a tail at that level is noise, not resolution
        if tail is None:
            tail = (4 * TAIL if ev.maxrule else TAIL) if ev.fast else QUAD_FLOOR
        while pending:
            if len(cells) + len(pending) > MAX_CELLS:
                raise TableError(f"{self.name}: theta-cells did not converge (more than {MAX_CELLS} cells)")
            ths = np.concatenate([cheb.to_panel(a, b, tn) for a, b in pending])
            G = gfun(np.repeat(qs, ths.size), np.tile(ths, nt)).reshape(nt, -1)
            if not np.all(np.isfinite(G)):
                raise TableError(f"{self.name}: non-finite node values")
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
        slow = self.info.get("D") == _D_RULE
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
        qs, qh = _panel_q(p, xs), _panel_q(p, xh)
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

    def ensure(self, q_lo=None, q_hi=None):
        """Build the panels needed to cover [q_lo, q_hi] (contiguously with those present); returns
        the number of panels built (a progress bar on a terminal once it takes 2 s). Homogeneous kind:
        builds the theta-table once."""
        t0 = time.perf_counter()
        if self.kind == "homogeneous":
            todo = [] if 0 in self.panels else [0]
        else:
            lo = panel_of(max(q_lo, 0.0))
            hi = panel_of(q_hi)
            if hi > Q_CAP_EXP - E0:
                raise TableError(f"{self.name}: q = {q_hi:.3g} is beyond the table cap 2^{Q_CAP_EXP}")
            if self.panels:
                lo, hi = min(lo, min(self.panels)), max(hi, max(self.panels))
            todo = [p for p in range(lo, hi + 1) if p not in self.panels]
        if not todo:
            return 0
        ev = self.evaluator()
        with bar(len(todo) + 1, f"building the table of {self.name}", "step") as shown:
            for p in todo:
                pn = self._build_theta_table(ev) if self.kind == "homogeneous" else self._build_panel(ev, p)
                self.panels[p] = _accept(self, p, pn)
                shown.update()
            self._mp_checks(todo)
            shown.update()
        self.info["build_seconds"] += time.perf_counter() - t0
        save(self)
        return len(todo)

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
        cand = [p for p in built if self.kind == "homogeneous" or _panel_q(p, -1.0) < MP_QMAX]
        for _ in range(n if cand else 0):
            p = int(rng.choice(cand))
            if self.kind == "homogeneous":
                q = 1.0
            else:
                hi = min(MP_QMAX, float(_panel_q(p, 1.0)))
                lo = float(_panel_q(p, -1.0))
                q = float(rng.uniform(lo, hi)) if p else float(rng.uniform(0.05, 1.0) * hi)
            th = float(rng.uniform(0.0, math.pi))
            q12 = q * math.cos(th)
            try:
                ref = float(evaluate(self.K.C, (Q1, Q2, Q12), (q, q, q12), self.K.kinks, MP_DPS))
                Vq = float(evaluate(self.K.V, (Q,), (q,), self.K.kinks, MP_DPS))
            except NotImplementedError:
                return   # no dps path (max-pool covariance): held-out checks only
            M = self.arrays()    # the scalar twins: no numba compilation during a build
            got = C_scalar(M, q, q, q12)
            rec = dict(q=q, theta=th, err=abs(got - ref) / Vq)
            if self.parity == 1 and ref != 0:
                rec["err_rel"] = abs(got - ref) / abs(ref)
            Dref = 2.0 * (Vq - ref)   # the reference's own error (~1e-15 V) is small against D >= V/10
            if self.info.get("D") not in (None, D_DIFF) and Dref >= 0.1 * Vq:
                rec["err_D"] = abs(D_scalar(M, q, q, q12, 4.0 * q * math.sin(0.5 * th) ** 2) - Dref) / Dref
            self.info["mp_checks"].append(rec)

    # ---------------------------------------------------------------- run time
    def arrays(self):
        """The data array M read by the compiled V, C, in_domain (see MAPS_SOURCE), packed from the panels
        as they are now: M is re-packed whenever a panel was added, replaced or removed since the last
        packing, by any route (a build, the merge of another process's panels in :func:`save`, a caller),
        so M never covers less (or more) than :attr:`panels` and :attr:`q_range` say."""
        key = self._packed
        if key is None or key[0] is not self.V1 or len(key[1]) != len(self.panels) or \
                any(self.panels.get(p) is not pn for p, pn in key[1]):
            key = self._packed = (self.V1, list(self.panels.items()), _pack(self))
        return key[2]

    def merge(self, other):
        """Adopt the panels of ``other`` (the same kernel's table, e.g. read from disk) that extend this
        table's panels contiguously (the compiled lookup needs one run of panels); returns how many."""
        if not self.panels:
            self.panels.update(other.panels)
            if self.V1 is None:
                self.V1 = other.V1
            return len(other.panels)
        n = 0
        for step, end in ((1, max(self.panels)), (-1, min(self.panels))):
            while end + step in other.panels and end + step not in self.panels:
                end += step
                self.panels[end] = other.panels[end]
                n += 1
        return n

    def module(self):
        return load_module()

    def V(self, q):
        """V(q) from the table (float64, compiled evaluation; NaN outside the table)."""
        q = np.asarray(q, dtype=float)
        out = self.module().V_many(self.arrays(), np.ascontiguousarray(q.ravel()))
        return out.reshape(q.shape) if q.ndim else float(out[0])

    def C(self, q1, q2, q12):
        """C(q1, q2, q12) from the table (general kind: q1 == q2 only; NaN outside)."""
        a, b, c = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (q1, q2, q12)))
        out = self.module().C_many(self.arrays(), *(np.ascontiguousarray(v.ravel()) for v in (a, b, c)))
        return out.reshape(a.shape) if a.ndim else float(out[0])

    def D(self, q1, q2, q12, d):
        """D = E[(psi(u) - psi(v))^2] from the table, d = q1 + q2 - 2 q12 (general kind: q1 == q2; NaN outside)."""
        a, b, c, e = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (q1, q2, q12, d)))
        out = self.module().D_many(self.arrays(), *(np.ascontiguousarray(v.ravel()) for v in (a, b, c, e)))
        return out.reshape(a.shape) if a.ndim else float(out[0])

    def describe(self) -> str:
        e = self.error
        lo, hi = self.q_range
        rng = "all q" if self.kind == "homogeneous" else f"q in [{lo:.3g}, {hi:.3g}]"
        ncells = sum(len(p.cells) for p in self.panels.values())
        return (f"table of {self.name}: {self.kind}" + (f" degree {self.degree}" if self.kind == "homogeneous" else "")
                + f", parity {('none', 'odd', 'even')[self.parity]}, {rng}, {len(self.panels)} panel(s), {ncells} cells; "
                + ", ".join(f"{k} <= {v:.1e}" for k, v in e.items()) + f"; nodes by {self.info['evaluator']}"
                + f"; D by {self.info.get('D')}")


def _accept(T, p, pn):
    vals = [v for k, v in pn.err.items() if k in ("V", "C", "D")]
    worst = math.nan if any(v != v for v in vals) else max(vals)
    if not worst <= ACCEPT:
        raise TableError(f"{T.name}: panel {p} reaches only {worst:.1e} at held-out points (required {ACCEPT:.0e})")
    return pn


# ----------------------------------------------------------------------------- packing + compiled maps
# Layout of the flat data array M (one float64 array: one cheap argument for the compiled code).
_H = 20   # header: kind, parity, p_lo, p_hi, E0, degree, scaled, V1, psi0^2, 2^E0, 2^(E0/2),
#           offsets of: V coefficients, per-panel first cell, cell edges, cell coefficients; cell block size;
#           has R cells, offsets of: per-panel first R cell, R cell edges, R cell coefficients


def _pack(T):
    """Flatten a table into M: header (_H), V coefficients (N_T per panel), first cell index per
    panel (+ end), theta edges (2 per cell), cell coefficients (fixed block per cell)."""
    ps = sorted(T.panels) or [0]
    plo, phi = (0, 0) if T.kind == "homogeneous" else (ps[0], ps[-1])
    if T.kind == "general" and ps != list(range(plo, phi + 1)):
        raise TableError(f"{T.name}: panels {ps} are not contiguous")
    blk = N_TH if T.kind == "homogeneous" else N_T * N_TH
    vco, first, edges, cco = [], [0], [], []
    rfirst, redges, rco = [0], [], []
    hasR = all(T.panels[p].rcells for p in range(plo, phi + 1)) if T.panels else False
    for p in range(plo, phi + 1):
        pn = T.panels[p]
        if T.kind == "general":
            if pn.vcoef.size != N_T:
                raise TableError(f"panel {p}: {pn.vcoef.size} V coefficients, the compiled evaluation needs {N_T}")
            vco.append(pn.vcoef)
        for a, b, coef in pn.cells:
            if coef.size != blk:
                raise TableError(f"cell shape {coef.shape}: the compiled evaluation needs {blk} coefficients")
            edges += [a, b]
            cco.append(coef.ravel())
        first.append(first[-1] + len(pn.cells))
        for a, b, coef in (pn.rcells if hasR else []):
            if coef.size != blk:
                raise TableError(f"R cell shape {coef.shape}: the compiled evaluation needs {blk} coefficients")
            redges += [a, b]
            rco.append(coef.ravel())
        rfirst.append(rfirst[-1] + (len(pn.rcells) if hasR else 0))
    vco = np.concatenate(vco) if vco else np.zeros(0)
    OV = _H
    OP = OV + vco.size
    OE = OP + len(first)
    OC = OE + len(edges)
    RP = OC + blk * len(cco)
    RE = RP + len(rfirst)
    RC = RE + len(redges)
    head = [1 if T.kind == "homogeneous" else 0, T.parity, plo, phi, E0, T.degree, 1 if T.psi0sq == 0 else 0,
            T.V1 if T.V1 is not None else np.nan, T.psi0sq, 2.0 ** E0, 2.0 ** (E0 / 2), OV, OP, OE, OC, blk,
            1 if hasR else 0, RP, RE, RC]
    assert len(head) == _H
    return np.concatenate([np.asarray(head, dtype=float), vco, np.asarray(first, dtype=float),
                           np.asarray(edges, dtype=float)] + cco
                          + [np.asarray(rfirst, dtype=float), np.asarray(redges, dtype=float)] + rco)


MAPS_SOURCE = cheb.compiled_source(N_T) + """

@njit(inline="always", **_OPTS)
def _panel(M, q):
    \"\"\"(i, x): index of q's panel among those stored (-1 if none) and q's coordinate in [-1, 1].\"\"\"
    if q < M[9]:
        p = 0
        x = 2.0 * math.sqrt(q) / M[10] - 1.0
    else:
        mant, e = math.frexp(q)
        p = e - int(M[4])
        x = 2.0 * math.log2(mant) + 1.0
    if p < M[2] or p > M[3] or not (0.0 <= q < math.inf):
        return -1, x
    return p - int(M[2]), x


@njit(inline="always", **_OPTS)
def _locate(M, OP, OE, i, th):
    \"\"\"(j, y): the last cell j of panel i (index table at OP, edges at OE) whose lower edge is <= theta,
    and theta's coordinate y in [-1, 1] in it.\"\"\"
    lo = int(M[OP + i])
    hi = int(M[OP + i + 1]) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if M[OE + 2 * mid] <= th:
            lo = mid
        else:
            hi = mid - 1
    ta = M[OE + 2 * lo]
    tb = M[OE + 2 * lo + 1]
    return lo, min(1.0, max(-1.0, (2.0 * th - ta - tb) / (tb - ta)))


@njit(inline="always", **_OPTS)
def in_domain(M, qa, qb, qab):
    \"\"\"True where the table can evaluate the step (always for the homogeneous kind).\"\"\"
    if M[0] == 1.0:
        return True
    return _panel(M, qa)[0] >= 0


@njit(**_OPTS)
def V(M, q):
    \"\"\"homogeneous: V(1) q^n; general: q v(x) if psi(0) = 0 else v(x) (NaN outside the table).\"\"\"
    if M[0] == 1.0:
        return M[7] * q ** int(M[5])
    i, x = _panel(M, q)
    if i < 0:
        return math.nan
    v = _cheb1(M, int(M[11]) + NT * i, x)
    return q * v if M[6] == 1.0 else v


@njit(**_OPTS)
def C(M, q1, q2, q12):
    \"\"\"C from the theta-cells of q1's panel, theta = atan2(sqrt((1 - c)(1 + c)), c) (|c| with parity);
    general kind: equal norms (q2 = q1) only.\"\"\"
    hom = M[0] == 1.0
    par = int(M[1])
    if q1 == q2:
        sq = q1
        if sq == 0.0:
            return 0.0 if hom else M[8]
        a = (q1 - q12) / q1
        b = (q1 + q12) / q1
        c = q12 / q1
    else:
        sq = math.sqrt(q1) * math.sqrt(q2)
        if sq == 0.0:
            return 0.0 if hom else M[8]
        c = q12 / sq
        a = 1.0 - c
        b = 1.0 + c
    sn = math.sqrt(max(a * b, 0.0))
    th = math.atan2(sn, abs(c)) if par != 0 else math.atan2(sn, c)
    if hom:
        i = 0
        x = 0.0
    else:
        i, x = _panel(M, q1)
        if i < 0:
            return math.nan
    lo, y = _locate(M, int(M[12]), int(M[13]), i, th)
    o = int(M[14]) + int(M[15]) * lo
    if hom:
        g = _cheb1(M, o, y)
        n = int(M[5])
        if par == 1:
            return q12 * sq ** (n - 1) * g
        return sq ** n * g
    g = _cheb2(M, o, x, y)
    if M[6] == 0.0:
        return g
    if par == 1:
        return q12 * g
    return q1 * g


@njit(**_OPTS)
def D(M, q1, q2, q12, d):
    \"\"\"E[(psi(u) - psi(v))^2], d = q1 + q2 - 2 q12 (accurate as c -> 1; q12 is used only for theta > pi/2).
    With s2 = sin^2(theta/2) (equal norms: d/(4q)) and R(theta) = (V - C)/(q s2) from the R-cells:
    general kind (q2 = q1): D = 2 q s2 R; homogeneous of degree n:
    D = V1 (q1^(n/2) - q2^(n/2))^2 + 2 (q1 q2)^(n/2) s2 R, s2 = (d - (sqrt q1 - sqrt q2)^2)/(4 sqrt(q1 q2)).
    theta > pi/2: odd psi D = V + V - 2C (C <= 0), even psi R at pi - theta with cos^2(theta/2) = (1 + c)/2.
    No R-cells (no cancellation-free node rule): V + V - 2C.\"\"\"
    hom = M[0] == 1.0
    par = int(M[1])
    if not hom and q1 != q2:
        return math.nan
    if M[16] == 0.0:
        return V(M, q1) + V(M, q2) - 2.0 * C(M, q1, q2, q12)
    i = 0
    x = 0.0
    a0 = 0.0
    if hom:
        n = int(M[5])
        if q1 == q2:
            sq = q1
            s2 = d / (4.0 * q1) if q1 > 0.0 else 0.0
        else:
            r1 = math.sqrt(q1)
            r2 = math.sqrt(q2)
            sq = r1 * r2
            dr = (q1 - q2) / (r1 + r2)          # sqrt(q1) - sqrt(q2) without cancellation
            sn = 0.0                             # (r1^n - r2^n)/(r1 - r2)
            for j in range(n):
                sn += r1 ** j * r2 ** (n - 1 - j)
            a0 = M[7] * (dr * sn) ** 2
            s2 = (d - dr * dr) / (4.0 * sq) if sq > 0.0 else 0.0
        scale = 2.0 * sq ** n
    else:
        i, x = _panel(M, q1)
        if i < 0:
            return math.nan
        sq = q1
        s2 = d / (4.0 * q1) if q1 > 0.0 else 0.0
        scale = 2.0 * q1
    if sq == 0.0:
        return a0
    s2 = min(max(s2, 0.0), 1.0)
    if s2 <= 0.5:
        co2 = 1.0 - s2
    else:
        co2 = min(max((sq + q12) / (2.0 * sq), 0.0), 1.0)
        if par == 1:
            return V(M, q1) + V(M, q2) - 2.0 * C(M, q1, q2, q12)
        if par == 2:
            s2, co2 = co2, s2
    th = 2.0 * math.atan2(math.sqrt(s2), math.sqrt(co2))
    lo, y = _locate(M, int(M[17]), int(M[18]), i, th)
    o = int(M[19]) + int(M[15]) * lo
    r = _cheb1(M, o, y) if hom else _cheb2(M, o, x, y)
    return a0 + scale * s2 * r


@njit(**_OPTS)
def V_many(M, q):
    out = np.empty(q.shape[0])
    for i in range(q.shape[0]):
        out[i] = V(M, q[i]) if (M[0] == 1.0 or _panel(M, q[i])[0] >= 0) else math.nan
    return out


@njit(**_OPTS)
def C_many(M, q1, q2, q12):
    out = np.empty(q1.shape[0])
    for i in range(q1.shape[0]):
        ok = M[0] == 1.0 or (q1[i] == q2[i] and _panel(M, q1[i])[0] >= 0)
        out[i] = C(M, q1[i], q2[i], q12[i]) if ok else math.nan
    return out


@njit(**_OPTS)
def D_many(M, q1, q2, q12, d):
    out = np.empty(q1.shape[0])
    for i in range(q1.shape[0]):
        ok = M[0] == 1.0 or (q1[i] == q2[i] and _panel(M, q1[i])[0] >= 0)
        out[i] = D(M, q1[i], q2[i], q12[i], d[i]) if ok else math.nan
    return out
""".replace("NT * i", f"{N_T} * i")

_MODULE = None


def load_module():
    """The compiled table module (one for all activations; the data M is an argument)."""
    global _MODULE
    if _MODULE is None:
        _MODULE = codegen.load_path(codegen.write_source("tables", codegen.table_module_source(MAPS_SOURCE)))
    return _MODULE


# ----------------------------------------------------------------------------- disk cache
_KEYS: dict = caches.memo()


def _key(K):
    k = _KEYS.get(K)
    if k is None:
        k = _KEYS[K] = _key_of(K)
    return k


def _key_of(K):
    parts = [f"table v{TABLE_VERSION}", f"symfield {__version__}", f"E0 {E0} NT {N_T} NTH {N_TH} TAIL {TAIL!r}",
             K.act.name, sp.srepr(K.act.expr), str(K.act.pool), str(K.act.k), sp.srepr(K.V), sp.srepr(K.C),
             repr(tuple(K.kinks))]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def path_of(K) -> Path:
    """The cache file of K's table (``_c``: files carrying a content hash, core.files.save_checked_npz)."""
    slug = re.sub(r"[^0-9A-Za-z]+", "_", K.act.name).strip("_")[:40] or "act"
    return cache_dir() / "tables" / f"sf_table_{slug}_{_key(K)}_c.npz"


def save(T, path=None):
    """Write the table atomically (npz; JSON metadata; a sha256 of the members) to its cache file, or to
    ``path`` (a shipped copy: no merge, no machine paths). Panels from another process that extend T's
    contiguously are merged first (:meth:`Table.merge`).
    An unwritable cache is warned about; the table still works in this process."""
    ship, path = path is not None, path or path_of(T.K)
    other = None if ship else _read(path, T.K)
    if other is not None:
        T.merge(other)
    data = {}
    info = {k: v for k, v in T.info.items() if k not in ("path", "shipped")}   # set when read
    meta = dict(kind=T.kind, degree=T.degree, parity=T.parity, psi0sq=T.psi0sq, V1=T.V1, info=info,
                panels={})
    for p, pn in T.panels.items():
        data[f"v{p}"] = pn.vcoef
        meta["panels"][str(p)] = dict(err=pn.err, cells=[(a, b) for a, b, _ in pn.cells],
                                      rcells=[(a, b) for a, b, _ in pn.rcells])
        for j, (_, _, coef) in enumerate(pn.cells):
            data[f"c{p}_{j}"] = coef
        for j, (_, _, coef) in enumerate(pn.rcells):
            data[f"r{p}_{j}"] = coef
    data["meta"] = np.array(json.dumps(meta, sort_keys=True))
    try:
        save_checked_npz(path, data)
    except OSError as err:
        if ship:
            raise
        warn(f"cannot write the table of {T.name} ({err.strerror or err}); kept in memory only", path)
        return
    if not ship:
        T.info["path"] = str(path)


def ship_name(K) -> str:
    """The file name of K's table among the shipped ones (symfield.numeric.shipped): a hash of what it
    tabulates -- phi's expression, pool, k, kinks and the table parameters -- not of any version."""
    slug = re.sub(r"[^0-9A-Za-z]+", "_", K.act.name).strip("_")[:40] or "act"
    k = shipped.key(f"table v{TABLE_VERSION}", f"E0 {E0} NT {N_T} NTH {N_TH} TAIL {TAIL!r}",
                    sp.srepr(K.act.expr), str(K.act.pool), str(K.act.k), repr(tuple(K.kinks)))
    return f"sf_table_{slug}_{k}.npz"


def _read(path, K, is_shipped=False):
    """The table stored at ``path`` (None if absent). A file that cannot be read, fails its sha256 or
    :func:`check_structure` is moved aside with one warning (None: rebuilt); a shipped one is only
    warned about (the package directory is never written)."""
    if path is None or not path.exists():
        return None
    try:
        z = load_checked_npz(path, shipped.sha256(path) if is_shipped else None)   # shipped: against MANIFEST.json
        meta = json.loads(str(z["meta"]))
        T = Table(K)
        if (meta["kind"], meta["degree"], meta["parity"]) != (T.kind, T.degree, T.parity):
            raise InvalidValue(f"kind/degree/parity {meta['kind']}/{meta['degree']}/{meta['parity']} are not the kernel's")
        T.V1, T.info = meta["V1"], meta["info"]
        for p, d in meta["panels"].items():
            cells = [(a, b, z[f"c{p}_{j}"]) for j, (a, b) in enumerate(d["cells"])]
            rcells = [(a, b, z[f"r{p}_{j}"]) for j, (a, b) in enumerate(d.get("rcells", []))]
            T.panels[int(p)] = Panel(z[f"v{p}"], cells, d["err"], rcells)
        check_structure(T)
    except Exception as err:   # any failure to read or check (BadZipFile, EOFError, KeyError, ...): rebuilt
        if is_shipped:
            warn(f"shipped table ignored ({type(err).__name__}: {err}); building it", path)
        else:
            quarantine(path, f"{type(err).__name__}: {err}")
        return None
    T.info.pop("path", None)     # files written before paths were left out
    T.info["shipped" if is_shipped else "path"] = str(path)
    return T


def check_structure(T):
    """ValueError unless T is what the compiled lookup (_pack, _panel, _locate, _cheb*) may index into:
    panels {0} (homogeneous) or contiguous 0 <= p <= Q_CAP_EXP - E0; V coefficients (N_T,) (none for
    homogeneous); per panel >= 1 theta-cell, cells (and R-cells, if any) tiling [0, theta_max] in order
    with coefficients (1 or N_T, N_TH); all values finite; V1 finite (homogeneous); error entries numbers."""
    ps = sorted(T.panels)
    hom = T.kind == "homogeneous"
    if not ps or (ps != [0] if hom else (ps != list(range(ps[0], ps[-1] + 1)) or ps[0] < 0 or ps[-1] > Q_CAP_EXP - E0)):
        raise InvalidValue(f"panels {ps}")
    if hom and not (isinstance(T.V1, (int, float)) and math.isfinite(T.V1)):
        raise InvalidValue(f"V1 = {T.V1!r}")
    if not (isinstance(T.info, dict) and isinstance(T.info.get("mp_checks"), list)):
        raise InvalidValue("info")
    nt = 1 if hom else N_T
    for p in ps:
        pn = T.panels[p]
        v = np.asarray(pn.vcoef)
        if v.shape != ((0,) if hom else (N_T,)) or not np.isfinite(v).all():
            raise InvalidValue(f"panel {p}: V coefficients of shape {v.shape}")
        if not all(isinstance(e, (int, float)) and (e == e or k not in ("V", "C", "D")) for k, e in pn.err.items()):
            raise InvalidValue(f"panel {p}: error entries {pn.err}")
        for what, cells in (("cells", pn.cells), ("R-cells", pn.rcells)):
            if what == "cells" or cells:
                _check_cells(cells, nt, T.theta_max, f"panel {p} {what}")


def _check_cells(cells, nt, tmax, what):
    if not cells:
        raise InvalidValue(f"{what}: none")
    edges = [e for a, b, _ in cells for e in (a, b)]
    if not all(isinstance(e, float) and math.isfinite(e) for e in edges):
        raise InvalidValue(f"{what}: edges {edges}")
    if edges[0] != 0.0 or edges[-1] != tmax or any(b <= a for a, b, _ in cells) or \
            any(cells[j][1] != cells[j + 1][0] for j in range(len(cells) - 1)):
        raise InvalidValue(f"{what}: edges do not tile [0, {tmax}]")
    for _, _, coef in cells:
        if not (isinstance(coef, np.ndarray) and coef.shape == (nt, N_TH) and coef.dtype == np.float64
                and np.isfinite(coef).all()):
            raise InvalidValue(f"{what}: coefficients of shape {np.shape(coef)}")


_TABLES: dict = caches.memo()


def table(act, q_lo=None, q_hi=None) -> Table:
    """The table of ``act`` (from this process, the disk cache, or built now), covering [q_lo, q_hi]
    when given (general kind). Raises NotImplementedError for activations that are not tabulated."""
    K = act if isinstance(act, Kernel) else kernel(act)
    key = _key(K)
    T = _TABLES.get(key)
    if T is None:
        T = (_read(path_of(K), K) or _read(shipped.lookup("tables", ship_name(K)), K, is_shipped=True)
             or Table(K))
        _TABLES[key] = T
    if T.kind == "homogeneous" or q_hi is not None:
        T.ensure(0.0 if q_lo is None else q_lo, q_hi)
    return T


# ----------------------------------------------------------------------------- scalar evaluation (no numba)
def C_scalar(M, q1, q2, q12):
    """The compiled C of MAPS_SOURCE for one point, in Python/NumPy (~10 us; no compilation), or None
    outside the table (general kind: unequal norms or q's panel not built)."""
    hom = M[0] == 1.0
    if q1 == q2:
        sq, c = q1, q12 / q1
        a, b = (q1 - q12) / q1, (q1 + q12) / q1
    else:
        if not hom:
            return None
        sq = math.sqrt(q1) * math.sqrt(q2)
        c = q12 / sq
        a, b = 1.0 - c, 1.0 + c
    par = int(M[1])
    sn = math.sqrt(max(a * b, 0.0))
    th = math.atan2(sn, abs(c)) if par != 0 else math.atan2(sn, c)
    if hom:
        i, x = 0, 0.0
    else:
        if q1 < M[9]:
            p, x = 0, 2.0 * math.sqrt(q1) / M[10] - 1.0
        else:
            mant, e = math.frexp(q1)
            p, x = e - int(M[4]), 2.0 * math.log2(mant) + 1.0
        if p < M[2] or p > M[3] or not (0.0 < q1 < math.inf):
            return None
        i = p - int(M[2])
    g = _cell_scalar(M, int(M[12]), int(M[13]), int(M[14]), i, x, th, hom)
    if hom:
        n = int(M[5])
        return q12 * sq ** (n - 1) * g if par == 1 else sq ** n * g
    if M[6] == 0.0:
        return g
    return q12 * g if par == 1 else q1 * g


def C_homogeneous_many(M, q1, q2, q12):
    """C of a homogeneous theta-table at float64 arrays, vectorised in NumPy (the twin of C_scalar's
    homogeneous branch: no compilation, ~1 us per point)."""
    a, b, c12 = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (q1, q2, q12)))
    eq = a == b
    with np.errstate(invalid="ignore", divide="ignore"):
        sq = np.where(eq, a, np.sqrt(a) * np.sqrt(b))
        c = c12 / sq
        lo_, hi_ = np.where(eq, (a - c12) / a, 1.0 - c), np.where(eq, (a + c12) / a, 1.0 + c)
        sn = np.sqrt(np.maximum(lo_ * hi_, 0.0))
    par, n = int(M[1]), int(M[5])
    th = np.arctan2(sn, np.abs(c)) if par != 0 else np.arctan2(sn, c)
    OP, OE, OC, blk = int(M[12]), int(M[13]), int(M[14]), int(M[15])
    first, last = int(M[OP]), int(M[OP + 1]) - 1
    starts = M[OE + 2 * np.arange(first, last + 1)]
    k = first + np.clip(np.searchsorted(starts, th, side="right") - 1, 0, last - first)
    ta, tb = M[OE + 2 * k], M[OE + 2 * k + 1]
    y = np.clip((2.0 * th - ta - tb) / (tb - ta), -1.0, 1.0)
    coef = M[OC + blk * k[..., None] + np.arange(blk)]
    g = np.sum(coef * cheb.basis(y, N_TH), axis=-1)
    with np.errstate(invalid="ignore", over="ignore"):
        out = c12 * sq ** (n - 1) * g if par == 1 else sq**n * g
    return np.where(sq == 0.0, 0.0, out)


def _cell_scalar(M, OP, OE, OC, i, x, th, hom):
    """Python twin of the compiled _locate + _cheb1/_cheb2: the cell interpolant at (x, theta)."""
    lo, hi = int(M[OP + i]), int(M[OP + i + 1]) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if M[OE + 2 * mid] <= th:
            lo = mid
        else:
            hi = mid - 1
    ta, tb = M[OE + 2 * lo], M[OE + 2 * lo + 1]
    y = min(1.0, max(-1.0, (2.0 * th - ta - tb) / (tb - ta)))
    blk = int(M[15])
    c = M[OC + blk * lo:OC + blk * (lo + 1)]
    ty = cheb.basis(y, N_TH)
    # np.sum(c * ty), not c @ ty: the same (pairwise) summation as C_homogeneous_many, so that array and
    # scalar sf.C agree to the bit
    return float(np.sum(c * ty)) if hom else float(cheb.basis(x, N_T) @ c.reshape(N_T, N_TH) @ ty)


def D_scalar(M, q1, q2, q12, d):
    """The compiled D of MAPS_SOURCE for one point, in Python/NumPy (no compilation), or None outside the
    table (general kind: unequal norms or q's panel not built)."""
    hom, par = M[0] == 1.0, int(M[1])
    if not hom and q1 != q2:
        return None
    if M[16] == 0.0:
        c = C_scalar(M, q1, q2, q12)
        if c is None:
            return None
        n = int(M[5])
        Vs = [M[7] * q ** n if hom else None for q in (q1, q2)]
        if not hom:
            i, x = _panel_scalar(M, q1)
            if i is None:
                return None
            v = float(cheb.chebval(x, M[int(M[11]) + N_T * i:int(M[11]) + N_T * (i + 1)]))
            Vs = [q1 * v if M[6] == 1.0 else v] * 2
        return Vs[0] + Vs[1] - 2.0 * c
    i, x, a0 = 0, 0.0, 0.0
    if hom:
        n = int(M[5])
        if q1 == q2:
            sq, s2 = q1, (d / (4.0 * q1) if q1 > 0 else 0.0)
        else:
            r1, r2 = math.sqrt(q1), math.sqrt(q2)
            sq, dr = r1 * r2, (q1 - q2) / (r1 + r2)
            a0 = M[7] * (dr * sum(r1 ** j * r2 ** (n - 1 - j) for j in range(n))) ** 2
            s2 = (d - dr * dr) / (4.0 * sq) if sq > 0 else 0.0
        scale = 2.0 * sq ** n
    else:
        i, x = _panel_scalar(M, q1)
        if i is None:
            return None
        sq, s2, scale = q1, (d / (4.0 * q1) if q1 > 0 else 0.0), 2.0 * q1
    if sq == 0.0:
        return a0
    s2 = min(max(s2, 0.0), 1.0)
    co2 = 1.0 - s2
    if s2 > 0.5:
        co2 = min(max((sq + q12) / (2.0 * sq), 0.0), 1.0)
        if par == 1:
            M16 = M.copy()
            M16[16] = 0.0
            return D_scalar(M16, q1, q2, q12, d)
        if par == 2:
            s2, co2 = co2, s2
    th = 2.0 * math.atan2(math.sqrt(s2), math.sqrt(co2))
    return a0 + scale * s2 * _cell_scalar(M, int(M[17]), int(M[18]), int(M[19]), i, x, th, hom)


def _panel_scalar(M, q):
    """(i, x) of q's stored panel, or (None, x) outside (Python twin of the compiled _panel)."""
    if q < M[9]:
        p, x = 0, 2.0 * math.sqrt(q) / M[10] - 1.0
    else:
        mant, e = math.frexp(q)
        p, x = e - int(M[4]), 2.0 * math.log2(mant) + 1.0
    if p < M[2] or p > M[3] or not (0.0 <= q < math.inf):
        return None, x
    return int(p - M[2]), x


def covers(M, q) -> np.ndarray:
    """Where the packed table M evaluates the recursion's step at q (the compiled in_domain, vectorised):
    everywhere for the homogeneous kind, else where q's panel is among those packed."""
    q = np.asarray(q, dtype=float)
    if M[0] == 1.0:
        return np.ones(q.shape, dtype=bool)
    with np.errstate(invalid="ignore"):
        p = np.where(q < M[9], 0, np.frexp(q)[1] - int(M[4]))
        return (p >= M[2]) & (p <= M[3]) & (q >= 0.0) & (q < math.inf)


# ----------------------------------------------------------------------------- sf.C's fast path
BUILD_GUESS = 150.0      # seconds per panel assumed before any build was timed (tanh+max2: ~140 s measured)
_SPENT: dict = caches.memo()        # (table key, panel) -> seconds sf.C spent on quadrature there


def fast_C_many(K, q1, q2, q12, one):
    """Array :func:`fast_C`: homogeneous psi in one vectorised pass over the theta-table; otherwise
    ``one(x, y, z)`` (the scalar path, with its quadrature fallback) at each point."""
    T = table(K)
    if T.kind == "homogeneous":
        return C_homogeneous_many(T.arrays(), q1, q2, q12)
    return np.frompyfunc(one, 3, 1)(q1, q2, q12)


def fast_C(K, q1, q2, q12, slow):
    """sf.C for a max-pool covariance without a closed form (``slow()`` = the quadrature path).

    Homogeneous psi: the theta-table, built (~2 s) or loaded on first use, for all q1, q2.
    General kind: the (q, theta) table where q1 == q2 and q's panel is built (memory or disk); elsewhere
    the quadrature, whose time per panel is added up: once it exceeds the expected build time of the
    panel (the last measured one, else BUILD_GUESS) the panel is built (ski rental: at most ~2x the
    cost of the better of 'always quadrature' and 'build at once'). Unequal norms, q > 2^Q_CAP_EXP:
    always quadrature."""
    key = _key(K)
    T = _TABLES.get(key)
    if T is None:
        T = table(K)
    if T.kind == "homogeneous" or (q1 == q2 and panel_of(q1) in T.panels):
        v = C_scalar(T.arrays(), q1, q2, q12)
        if v is None:   # a table that covers q cannot evaluate it: never build again for it
            warnings.warn(f"sf.C: the table of {T.name} covers q = {q1!r} but did not evaluate it; "
                          f"quadrature is used", RuntimeWarning, stacklevel=3)
            return slow()
        return v
    if q1 != q2 or panel_of(q1) > Q_CAP_EXP - E0:
        return slow()
    t0 = time.perf_counter()
    out = slow()
    p = panel_of(q1)
    spent = _SPENT[key, p] = _SPENT.get((key, p), 0.0) + time.perf_counter() - t0
    per = T.info["build_seconds"] / len(T.panels) if T.panels else BUILD_GUESS
    need = 1 if not T.panels else max(p - max(T.panels), min(T.panels) - p, 1)
    if spent > per * need:
        T.ensure(q1, q1)
    return out
