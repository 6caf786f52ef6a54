"""Symbolic Gaussian expectations E[f(u)] and E[f(u) g(v)] (docs/theory.md section 3).

    u ~ N(0, q)  (one node);   (u, v) ~ N(0, [[q1, q12], [q12, q2]])  (two inputs).

Methods, tried in this order (the name of the one that succeeded is returned):

``arccos``     f, g piecewise homogeneous of degree n = 0, 1: the arc-cosine kernels (Cho & Saul).
``basis``      f, g combinations of x^m e^(alpha x), erf(b x) and exp(-alpha x^2): pairwise tables from the
               moment generating function, the arcsin kernel of erf, Gaussian products.
``stein``      (1-D) sums of x^m e^(-a x^2) prod_i erf(b_i x) (gelu, x erf(x)): Gaussian reweighting and
               Stein's lemma, down to Gaussian moments and the arcsin kernel.
``halfline``   (1-D) pieces of the x^m e^(alpha x) kind with a kink at 0: the half-line MGF.
``integrate``  (1-D) sympy.integrate under a time limit, checked numerically afterwards.
``integral``   no closed form found: the defining integral is kept (an unevaluated sympy Integral).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import comb, factorial

import sympy as sp

from symfield.core import caches, timelimit
from symfield.symbolic.formula import X as x
from symfield.symbolic.integrals import GaussianIntegral, Integrand, Kind, normal_pdf

q = sp.Symbol("q", positive=True)
q1, q2 = sp.symbols("q1 q2", positive=True)
q12 = sp.Symbol("q12", real=True)
z, z1, z2 = sp.symbols("z z1 z2", real=True)
_t = sp.Symbol("t", positive=True)
_s, _r = sp.symbols("s r")

INTEGRATE_SECONDS = 1.5


@dataclass(frozen=True)
class Expectation:
    value: sp.Expr
    method: str

    @property
    def closed(self) -> bool:
        return not self.value.has(sp.Integral)


def integral1(f):
    """E[f(sqrt(q) z)] as an unevaluated integral over z."""
    f = sp.sympify(f)
    return GaussianIntegral(f.subs(x, sp.sqrt(q) * z) * normal_pdf(z), (z, -sp.oo, sp.oo),
                            integrand=Integrand(Kind.NORMAL1, f))


def integral2(f, g):
    """E[f(u) g(v)] as an unevaluated double integral (standard construction)."""
    c = q12 / sp.sqrt(q1 * q2)
    u = sp.sqrt(q1) * z1
    v = sp.sqrt(q2) * (c * z1 + sp.sqrt(1 - c**2) * z2)
    return GaussianIntegral(f.subs(x, u) * g.subs(x, v) * normal_pdf(z1) * normal_pdf(z2),
                            (z1, -sp.oo, sp.oo), (z2, -sp.oo, sp.oo),
                            integrand=Integrand(Kind.NORMAL2, sp.sympify(f), sp.sympify(g)))


# ---------------------------------------------------------------- arc-cosine family
_PIECEWISE_LINEAR = (sp.Max, sp.Min, sp.Abs, sp.Heaviside, sp.sign)

def homogeneous(f):
    """(n, a, b) with f(x) = b x^n (x > 0), a x^n (x < 0) (sign convention of a*min(x,0)+b*max(x,0)), else None."""
    f = sp.sympify(f)
    if not all(isinstance(n, _PIECEWISE_LINEAR + (sp.Add, sp.Mul, sp.Symbol, sp.Number, sp.NumberSymbol))
               or isinstance(n, sp.Pow) and n.exp.is_Integer for n in sp.preorder_traversal(f)):
        return None
    pos, neg = sp.simplify(f.subs(x, _t)), sp.simplify(f.subs(x, -_t))
    for n in (0, 1, 2, 3, 4):
        b, a = sp.simplify(pos / _t**n), sp.simplify(neg / (-_t)**n)
        if not b.has(_t) and not a.has(_t) and b.is_real is not False and a.is_real is not False:
            return n, a, b
        if pos == 0 and neg == 0:
            return 0, sp.Integer(0), sp.Integer(0)
    return None


def _arccos_pair(hf, hg):
    (n, a1, b1), (m, a2, b2) = hf, hg
    S = sp.sqrt(q1 * q2 - q12**2)
    theta = sp.atan2(S, q12)
    if n != m or n > 1:
        return _arccos_degrees(hf, hg, S, theta)
    if n == 1:
        return sp.simplify((a1 * a2 + b1 * b2) * (S + (sp.pi - theta) * q12) - (a1 * b2 + a2 * b1) * (S - theta * q12)) / (2 * sp.pi)
    return ((a1 * a2 + b1 * b2) * (sp.pi - theta) + (a1 * b2 + a2 * b1) * theta) / (2 * sp.pi)


def _arccos_degrees(hf, hg, S, theta):
    """E[f(u) g(v)] for homogeneous f, g of any degrees n, m (the arc-cosine kernels of higher order).

    In polar coordinates (z1, z2) = r (cos t, sin t): u = sqrt(q1) r cos t, v = sqrt(q2) r cos(t - theta),
    so E = q1^(n/2) q2^(m/2) 2^((n+m)/2) Gamma((n+m)/2 + 1) A, with the angular mean
    A = (1/2pi) int f(cos t) g(cos(t - theta)) dt over four arcs where the signs are fixed. On each arc
    cos^n t cos^m(t - theta) is a trigonometric polynomial, integrated term by term in e^(ikt); the
    result is a polynomial in cos theta, sin theta and theta (Chebyshev T_p, U_p for cos p theta, sin p theta).
    """
    (n, a1, b1), (m, a2, b2) = hf, hg
    # arcs (lo, hi) as (multiple of theta, multiple of pi/2), with the sign pattern's coefficient
    arcs = [((0, -1), (1, -1), b1 * a2), ((1, -1), (0, 1), b1 * b2), ((0, 1), (1, 1), a1 * b2), ((1, 1), (0, 3), a1 * a2)]
    terms = {}                                  # (theta power, p) -> coefficient of theta^e e^(i p theta)

    def add(key, c):
        terms[key] = terms.get(key, 0) + c
    for j in range(n + 1):
        for l in range(m + 1):
            w = sp.Rational(comb(n, j) * comb(m, l), 2 ** (n + m))
            k, r = 2 * j - n + 2 * l - m, m - 2 * l          # e^(i k t) e^(i r theta)
            for (lt, lp), (ht, hp), coef in arcs:
                if coef == 0:
                    continue
                if k == 0:
                    add((1, r), w * coef * (ht - lt))
                    add((0, r), w * coef * sp.Rational(hp - lp, 2) * sp.pi)
                else:
                    add((0, r + k * ht), w * coef * sp.I ** (k * hp) / (sp.I * k))
                    add((0, r + k * lt), -w * coef * sp.I ** (k * lp) / (sp.I * k))
    C, s = q12 / sp.sqrt(q1 * q2), S / sp.sqrt(q1 * q2)
    A = sp.Integer(0)
    for (e, p), c in terms.items():
        c = sp.expand(c)
        re, im = sp.re(c), sp.im(c)
        cos_p = sp.chebyshevt(abs(p), C)
        sin_p = sp.sign(p) * s * sp.chebyshevu(abs(p) - 1, C) if p else 0
        A += theta**e * (re * cos_p - im * sin_p)
    radial = 2 ** sp.Rational(n + m, 2) * sp.gamma(sp.Rational(n + m, 2) + 1)
    return sp.expand(q1 ** sp.Rational(n, 2) * q2 ** sp.Rational(m, 2) * radial * A / (2 * sp.pi))


def _halfmoment(n):
    """E[z^n; z > 0] for standard normal z."""
    return 2 ** (sp.Rational(n, 2) - 1) * sp.gamma(sp.Rational(n + 1, 2)) / sp.sqrt(sp.pi)


def _arccos1(h):
    n, a, b = h
    # f(x) = b x^n on x>0 and a x^n on x<0: E = q^(n/2) (b + (-1)^n a) E[z^n; z>0]
    return q ** sp.Rational(n, 2) * (b + (-1) ** n * a) * _halfmoment(n)


# ---------------------------------------------------------------- basis tables
def _exp_quadratic(base, ex):
    """(c2, c1, c0) for a factor exp(c2 x^2 + c1 x + c0) (base**ex with base exp(...) or E), else None."""
    arg = sp.expand(base.args[0] * ex if isinstance(base, sp.exp) else ex)
    if not arg.is_polynomial(x) or sp.Poly(arg, x).degree() > 2:
        return None
    return arg.coeff(x, 2), arg.coeff(x, 1), arg.subs(x, 0)


def _basis(f):
    """Decompose f = sum coeff * basis; basis is ('pe', m, alpha) | ('erf', b) | ('bump', alpha). None if not possible."""
    f = sp.expand(sp.sympify(f).rewrite(sp.exp) if f.has(sp.sin, sp.cos, sp.sinh, sp.cosh) else sp.sympify(f))
    out = []
    for term in sp.Add.make_args(f):
        coeff, dep = term.as_independent(x, as_Add=False)
        if dep == 1:
            out.append((coeff, ("pe", 0, sp.Integer(0))))
            continue
        m, alpha, kind = 0, sp.Integer(0), None
        for factor in sp.Mul.make_args(sp.powsimp(dep, combine="exp")):
            base, ex = factor.as_base_exp()
            if base == x and ex.is_Integer and ex > 0:
                m += int(ex)
            elif isinstance(base, sp.exp) or base == sp.E:
                quad = _exp_quadratic(base, ex)
                if quad is None:
                    return None
                c2, c1, c0 = quad
                coeff *= sp.exp(c0)
                if c2 != 0:
                    if kind is not None or c1 != 0 or not (c2 < 0):
                        return None
                    kind = ("bump", -c2)
                else:
                    alpha += c1
            elif isinstance(factor, sp.erf) and ex == 1:
                b = sp.simplify(factor.args[0] / x)
                if b.has(x) or kind is not None:
                    return None
                kind = ("erf", b)
            else:
                return None
        if kind is not None:
            if m or alpha != 0:
                return None
            out.append((coeff, kind))
        else:
            out.append((coeff, ("pe", m, alpha)))
    return out


def _centred_moment2(i, j):
    """E[u^i v^j] for centred (u, v) with variances q1, q2 and covariance q12 (Isserlis).

    Sum over k cross pairings: C(i,k) C(j,k) k! (i-k-1)!! (j-k-1)!! q1^((i-k)/2) q2^((j-k)/2) q12^k."""
    if (i + j) % 2:
        return sp.Integer(0)
    return sp.Add(*[comb(i, k) * comb(j, k) * factorial(k) * _dfact(i - k - 1) * _dfact(j - k - 1)
                    * q1 ** ((i - k) // 2) * q2 ** ((j - k) // 2) * q12 ** k
                    for k in range(i % 2, min(i, j) + 1, 2)])


def _dfact(n):
    """n!! with (-1)!! = 1."""
    out = 1
    while n > 1:
        out, n = out * n, n - 2
    return out


def _mgf2(m, alpha, n, beta):
    """E[u^m v^n exp(alpha u + beta v)] by Gaussian tilting: the exponential shifts the means to
    mu1 = alpha q1 + beta q12, mu2 = alpha q12 + beta q2 and multiplies by exp(var/2) of the exponent."""
    tilt = sp.exp((alpha**2 * q1 + 2 * alpha * beta * q12 + beta**2 * q2) / 2)
    if alpha == 0 and beta == 0:
        return _centred_moment2(m, n)
    mu1, mu2 = alpha * q1 + beta * q12, alpha * q12 + beta * q2
    poly = sp.Add(*[comb(m, i) * comb(n, j) * mu1 ** (m - i) * mu2 ** (n - j) * _centred_moment2(i, j)
                    for i in range(m + 1) for j in range(n + 1) if (i + j) % 2 == 0])
    return tilt * sp.expand(poly)


def _mgf1(m, alpha):
    """E[u^m exp(alpha u)], u ~ N(0, q): exp(alpha^2 q/2) E[(u + alpha q)^m]."""
    poly = sp.Add(*[comb(m, i) * (alpha * q) ** (m - i) * _dfact(i - 1) * q ** (i // 2)
                    for i in range(0, m + 1, 2)])
    return sp.exp(alpha**2 * q / 2) * sp.expand(poly)


def _pair_table(bf, bg):
    """E[bf(u) bg(v)] for two basis functions."""
    kf, kg = bf[0], bg[0]
    if kf == "pe" and kg == "pe":
        return _mgf2(bf[1], bf[2], bg[1], bg[2])
    if kf == "erf" and kg == "erf":
        a, b = bf[1], bg[1]
        return 2 / sp.pi * sp.atan2(2 * a * b * q12, sp.sqrt(1 + 2 * a**2 * q1 + 2 * b**2 * q2 + 4 * a**2 * b**2 * (q1 * q2 - q12**2)))
    if kf == "bump" and kg == "bump":
        a, b = bf[1], bg[1]
        return 1 / sp.sqrt(1 + 2 * a * q1 + 2 * b * q2 + 4 * a * b * (q1 * q2 - q12**2))
    if {kf, kg} == {"erf", "bump"}:
        return sp.Integer(0)  # odd times even under the symmetric joint law
    pe, other = (bf, bg) if kf == "pe" else (bg, bf)
    if pe[1] == 0 and pe[2] == 0:  # constant times the 1-D mean of the other
        one = _single_table(other)
        return one.subs(q, q2 if pe is bf else q1)
    return None


def _single_table(b):
    if b[0] == "pe":
        return _mgf1(b[1], b[2])
    if b[0] == "erf":
        return sp.Integer(0)
    return 1 / sp.sqrt(1 + 2 * b[1] * q)


def _product_basis(bf, bg):
    """1-D: the product of two basis functions as a basis expectation at variance q."""
    kf, kg = bf[0], bg[0]
    if kf == "pe" and kg == "pe":
        return _mgf1(bf[1] + bg[1], bf[2] + bg[2])
    if kf == "bump" and kg == "bump":
        return 1 / sp.sqrt(1 + 2 * (bf[1] + bg[1]) * q)
    if kf in ("erf", "bump") and kg in ("erf", "bump"):
        return _pair_table(bf, bg).subs({q1: q, q2: q, q12: q})
    pe, other = (bf, bg) if kf == "pe" else (bg, bf)
    if pe[1] == 0 and pe[2] == 0:
        return _single_table(other)
    return None


def _basis_expect(f, g, pair):
    df, dg = _basis(f), _basis(g)
    if df is None or dg is None:
        return None
    total = sp.Integer(0)
    for cf, bf in df:
        for cg, bg in dg:
            val = pair(bf, bg)
            if val is None:
                return None
            total += cf * cg * val
    return total


# ---------------------------------------------------------------- Stein reduction (1-D)
def _stein_terms(expr):
    """expr = sum coeff * x^m exp(-a x^2) prod_i erf(b_i x)  ->  [(coeff, m, a, (b_i...))], else None."""
    out = []
    for term in sp.Add.make_args(sp.expand(expr)):
        coeff, dep = term.as_independent(x, as_Add=False)
        m, a, erfs = 0, sp.Integer(0), []
        for factor in sp.Mul.make_args(sp.powsimp(dep, combine="exp")):
            base, ex = factor.as_base_exp()
            if base == x and ex.is_Integer and ex > 0:
                m += int(ex)
            elif isinstance(base, sp.erf) and ex.is_Integer and ex > 0:
                b = sp.simplify(base.args[0] / x)
                if b.has(x):
                    return None
                erfs += [b] * int(ex)
            elif isinstance(base, sp.exp) or base == sp.E:
                quad = _exp_quadratic(base, ex)
                if quad is None:
                    return None
                c2, c1, c0 = quad
                if c1 != 0 or not c2 <= 0:
                    return None
                coeff *= sp.exp(c0)
                a += -c2
            elif dep != 1:
                return None
        if len(erfs) > 2 + m:
            return None
        out.append((coeff, m, a, tuple(erfs)))
    return out


def _stein(m, a, erfs, qq):
    """E[x^m e^(-a x^2) prod erf(b_i x)], x ~ N(0, qq): Gaussian reweighting and Stein's lemma
    E[x F(x)] = qq E[F'(x)], down to the arcsin kernel and Gaussian moments."""
    if a != 0:
        return _stein(m, 0, erfs, qq / (1 + 2 * a * qq)) / sp.sqrt(1 + 2 * a * qq)
    if (m + len(erfs)) % 2:
        return sp.Integer(0)  # odd integrand
    if not erfs:
        return sp.factorial2(m - 1) * qq ** sp.Rational(m, 2)
    if m == 0:
        if len(erfs) != 2:
            return None
        b1, b2 = erfs
        return 2 / sp.pi * sp.asin(2 * b1 * b2 * qq / sp.sqrt((1 + 2 * b1**2 * qq) * (1 + 2 * b2**2 * qq)))
    total = sp.Integer(0) if m < 2 else _stein(m - 2, 0, erfs, qq)
    if total is None:
        return None
    total *= max(m - 1, 0)
    for i, b in enumerate(erfs):
        part = _stein(m - 1, b**2, erfs[:i] + erfs[i + 1:], qq)
        if part is None or total is None:
            return None
        total += 2 * b / sp.sqrt(sp.pi) * part
    return qq * total


def _stein_expect(f, g):
    terms = _stein_terms(f * g)
    if terms is None or not any(e for _, _, _, e in terms):
        return None
    total = sp.Integer(0)
    for coeff, m, a, erfs in terms:
        val = _stein(m, a, erfs, q)
        if val is None:
            return None
        total += coeff * val
    return total


# ---------------------------------------------------------------- half-line (1-D)
_HALFLINE_OK = (sp.exp, sp.sin, sp.cos, sp.sinh, sp.cosh, sp.Max, sp.Min, sp.Abs, sp.Heaviside, sp.Piecewise)


def _halfline(f, g):
    if any(not isinstance(a, _HALFLINE_OK) for a in (f * g).atoms(sp.Function)):
        return None
    fp, fn = f.subs(x, _t), f.subs(x, -_t)
    gp, gn = g.subs(x, _t), g.subs(x, -_t)
    total = sp.Integer(0)
    for h, sign in ((sp.expand(fp * gp), 1), (sp.expand(fn * gn), -1)):
        h = sp.simplify(h)
        d = _basis(h.subs(_t, x) if sign == 1 else h.subs(_t, -x))
        if d is None or any(b[0] != "pe" for _, b in d):
            return None
        for c, (_, m, alpha) in d:
            half = sp.exp(_s**2 * q / 2) * sp.erfc(-sign * _s * sp.sqrt(q / 2)) / 2  # erfc: no 1 - erf cancellation
            total += c * sp.diff(half, _s, m).subs(_s, alpha)
    return total


# ---------------------------------------------------------------- sympy.integrate with a time limit
_HOPELESS = (sp.tanh, sp.log, sp.atan, sp.asinh, sp.tan, sp.sech)


def _erf_degree(expr):
    """Total degree of expr as a polynomial in its erf/erfc factors (0 when it is not one). sympy's Meijer-G
    integration takes the product of two G-functions (the Gaussian density and one more): a term with three erf
    factors, e.g. in E[gelu^4] = E[x^4 (1 + erf(x/sqrt 2))^4]/16, is beyond it, and trying costs the whole
    INTEGRATE_SECONDS budget."""
    atoms = sorted(expr.atoms(sp.erf, sp.erfc), key=sp.default_sort_key)
    if not atoms:
        return 0
    ts = sp.symbols(f"_erf0:{len(atoms)}")
    try:
        return sp.Poly(expr.xreplace(dict(zip(atoms, ts))), *ts).total_degree()
    except sp.PolynomialError:
        return 0


def _integrable_class(expr):
    """Worth a sympy.integrate attempt: no tanh/log/... and no x in a denominator (sigmoid-like)."""
    if expr.has(*_HOPELESS) or _erf_degree(expr) >= 3:
        return False
    return not any(isinstance(n, sp.Pow) and n.exp.is_negative and n.base.has(x) for n in sp.preorder_traversal(expr))


def _integrate1(f, g):
    """sympy.integrate of E[f g] within INTEGRATE_SECONDS (a watchdog budget: any thread); None when it
    fails or runs out of time. One attempt per integrand and budget in a process (:data:`_INTEGRATED`): the
    finite-width coefficients and the Gram moments both ask for E[phi^4], and a failed attempt costs the whole
    budget each time."""
    if INTEGRATE_SECONDS <= 0:
        return None
    if not _integrable_class(f * g):
        return None
    key = (f * g, INTEGRATE_SECONDS)
    if key not in _INTEGRATED:
        _INTEGRATED[key] = _integrate1_once(f, g)
    return _INTEGRATED[key]


_INTEGRATED: dict = caches.memo()


def _integrate1_once(f, g):
    try:
        res = timelimit.call_with_time_limit(INTEGRATE_SECONDS, sp.integrate,
                                             (f * g).subs(x, sp.sqrt(q) * z) * normal_pdf(z), (z, -sp.oo, sp.oo))
    except Exception:   # TimeLimitExceeded, or sympy giving up
        return None
    if res.has(sp.Integral) or res.has(sp.Piecewise) or not res.is_finite:
        return None
    return res


def _tidy(expr):
    expr = sp.sympify(expr)
    if expr.has(sp.I):
        expr = sp.simplify(sp.expand_complex(expr))
        if expr.has(sp.I):
            return None
    return sp.simplify(expr) if sp.count_ops(expr) < 60 else sp.expand(expr)


# ---------------------------------------------------------------- public
def expect1(f, g=sp.Integer(1), *, try_integrate=True) -> Expectation:
    """E[f(u) g(u)], u ~ N(0, q), as a SymPy expression in ``q``."""
    f, g = sp.sympify(f), sp.sympify(g)
    hf, hg = homogeneous(f), homogeneous(g)
    if hf and hg:
        n, a1, b1 = hf
        m, a2, b2 = hg
        return Expectation(sp.simplify(_arccos1((n + m, a1 * a2, b1 * b2))), "arccos")
    val = _basis_expect(f, g, _product_basis)
    if val is not None and (val := _tidy(val)) is not None:
        return Expectation(val, "basis")
    val = _stein_expect(f, g)
    if val is not None and (val := _tidy(val)) is not None:
        return Expectation(val, "stein")
    if not (f * g).has(sp.DiracDelta):
        val = _halfline(f, g)
        if val is not None and (val := _tidy(val)) is not None:
            return Expectation(val, "halfline")
    if try_integrate and not (f * g).has(sp.DiracDelta):
        val = _integrate1(f, g)
        if val is not None:
            return Expectation(val, "integrate")
    return Expectation(integral1(f * g), "integral")


def expect2(f, g) -> Expectation:
    """E[f(u) g(v)] as a SymPy expression in ``q1, q2, q12``."""
    f, g = sp.sympify(f), sp.sympify(g)
    hf, hg = homogeneous(f), homogeneous(g)
    if hf and hg:
        val = _arccos_pair(hf, hg)
        if val is not None:
            return Expectation(val, "arccos")
    val = _basis_expect(f, g, _pair_table)
    if val is not None and (val := _tidy(val)) is not None:
        return Expectation(val, "basis")
    return Expectation(integral2(f, g), "integral")
