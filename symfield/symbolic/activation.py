"""Activations: built-in names, safe user formulas, and multi-node pools.

An :class:`Activation` is a SymPy expression ``phi(x)`` plus an optional pool
(``psi = max_j phi(u_j)`` or ``(1/k) sum_j phi(u_j)`` over ``k`` independent nodes).
"""
from __future__ import annotations

from symfield.core.errors import InvalidType, InvalidValue, SYMPY_GAVE_UP
import ast
import difflib
import math
import re
import warnings
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import mpmath
import numpy as np
import sympy as sp

from symfield.core import timelimit, validate
from symfield.symbolic.formula import FUNCTIONS, MAX_LENGTH, FormulaError, X, brief, parse

x = X


def _num(value, name, spec):
    if isinstance(value, bool) or not isinstance(value, (int, float, sp.Rational)):
        raise InvalidType(f"The '{name}' parameter of activation('{spec}') must be a real number. Got {value!r} instead.")
    if isinstance(value, float):
        validate.real("activation", name, value)
        return sp.Rational(repr(value))
    return sp.sympify(value)


def _abrelu(a=0, b=1):
    return a * sp.Min(x, 0) + b * sp.Max(x, 0)


def _poly(coeffs=(0, 1)):
    if not isinstance(coeffs, (list, tuple)) or not coeffs:
        raise InvalidType(f"The 'coeffs' parameter of activation('polynomial') must be a non-empty list of numbers "
                        f"(c0, c1, ...). Got {coeffs!r} instead.")
    return sum(_num(c, "coeffs", "polynomial") * x**i for i, c in enumerate(coeffs))


# name -> (builder, default parameters, description)
BUILTINS = {
    "linear": (lambda: x, {}, "phi(x) = x"),
    "relu": (lambda: sp.Max(x, 0), {}, "max(x, 0)"),
    "leaky_relu": (lambda slope=sp.Rational(1, 100): _abrelu(slope, 1), {"slope": 0.01}, "max(x,0) + slope*min(x,0)"),
    "abs": (lambda: sp.Abs(x), {}, "|x|"),
    "abrelu": (_abrelu, {"a": 0, "b": 1}, "a*min(x,0) + b*max(x,0)"),
    "erf": (lambda a=1, b=1, c=0: a * sp.erf(b * x) + c, {"a": 1, "b": 1, "c": 0}, "a*erf(b*x) + c"),
    "tanh": (lambda: sp.tanh(x), {}, "tanh(x)"),
    "sigmoid": (lambda: 1 / (1 + sp.exp(-x)), {}, "1/(1+exp(-x))"),
    "softplus": (lambda: sp.log(1 + sp.exp(x)), {}, "log(1+exp(x))"),
    "silu": (lambda: x / (1 + sp.exp(-x)), {}, "x*sigmoid(x) (swish)"),
    "swish": (lambda: x / (1 + sp.exp(-x)), {}, "alias of silu"),
    "gelu": (lambda: x * (1 + sp.erf(x / sp.sqrt(2))) / 2, {}, "x*Phi(x), exact (erf) form"),
    "elu": (lambda alpha=1: sp.Piecewise((x, x > 0), (alpha * (sp.exp(x) - 1), True)), {"alpha": 1},
            "x for x>0, alpha*(exp(x)-1) otherwise"),
    "mish": (lambda: x * sp.tanh(sp.log(1 + sp.exp(x))), {}, "x*tanh(softplus(x))"),
    "sin": (lambda: sp.sin(x), {}, "sin(x)"),
    "cos": (lambda: sp.cos(x), {}, "cos(x)"),
    "monomial": (lambda n=2: x**n, {"n": 2}, "x**n"),
    "polynomial": (_poly, {"coeffs": (0, 1)}, "sum_i coeffs[i] x**i"),
}
POOLS = (None, "max", "avg")
MAX_K = 8


def activations() -> list[str]:
    """Names of the built-in activations.

    Returns
    -------
    list of str
        Sorted names; each is accepted by :func:`activation` (with its parameters, if any).

    Examples
    --------
    >>> sf.activations()[:4]
    ['abrelu', 'abs', 'cos', 'elu']
    """
    return sorted(BUILTINS)


@dataclass(frozen=True)
class Activation:
    """phi(x) as a SymPy expression, optionally pooled over k nodes."""
    name: str
    expr: sp.Expr
    pool: str | None = None
    k: int = 1

    @property
    def single(self) -> "Activation":
        """The single-node activation phi underlying a pool."""
        if self.pool is None:
            return self
        return Activation(self.name[: -len(f"+{self.pool}{self.k}")], self.expr)

    def __str__(self):
        return self.name

    def __call__(self, value: float) -> float:
        """phi(value) for a float (single node)."""
        return float(self.expr.subs(x, value))


_SPEC = re.compile(r"^\s*([A-Za-z_]\w*)\s*(?:\((.*)\))?\s*$", re.S)


def _builtin_args(name, argtext, spec):
    """Parse 'leaky_relu(0.2)' / 'erf(a=2, b=0.5)' arguments: numbers only."""
    try:
        call = ast.parse(f"f({argtext})", mode="eval").body
    except SyntaxError:
        raise InvalidValue(f"The 'name' parameter of activation has malformed arguments. Got {spec!r} instead.") from None

    def lit(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -lit(node.operand)
        if isinstance(node, (ast.Tuple, ast.List)):
            return tuple(lit(e) for e in node.elts)
        raise InvalidValue(f"The arguments of activation {spec!r} must be numbers. Got {ast.unparse(node)!r} instead.")
    names = list(BUILTINS[name][1])
    if len(call.args) > len(names):
        raise InvalidValue(f"The activation '{name}' takes parameters {names}. Got {spec!r} instead.")
    params = dict(zip(names, (lit(a) for a in call.args)))
    params.update({kw.arg: lit(kw.value) for kw in call.keywords})
    return params


def _is_formula_call(match):
    """'tanh(x)' or 'erf(2*x)' is a formula; 'erf(2, 0.5)' gives built-in parameters."""
    return match.group(1) in FUNCTIONS and re.search(r"\bx\b", match.group(2)) is not None


def _spec_name(name, params, defaults):
    shown = {k: v for k, v in params.items() if defaults.get(k) != v}
    if not shown:
        return name
    return f"{name}(" + ", ".join(f"{k}={v}" for k, v in shown.items()) + ")"


def activation(spec: str | Activation, pool: Literal["max", "avg"] | None = None, k: int = 2,
               **params: float | tuple[float, ...]) -> Activation:
    """Build an activation from a built-in name (with parameters) or a formula in x.

    ``activation("leaky_relu", slope=0.2)``, ``activation("leaky_relu(0.2)")``,
    ``activation("x*erf(x)")``, ``activation("relu", pool="max", k=2)``.

    Parameters
    ----------
    spec : str or Activation
        A built-in name (:func:`activations`), optionally with arguments, or a formula in x.
    pool : {'max', 'avg'}, optional
        Pool phi over ``k`` nodes; None for a single node.
    k : int
        Pool size (1..8), used only with ``pool``.
    **params : float or tuple of float
        Parameters of a built-in activation (e.g. ``slope`` of leaky_relu).

    Returns
    -------
    Activation
        The activation, named canonically (e.g. ``'leaky_relu(slope=0.2)'``, ``'relu+max2'``).

    Examples
    --------
    >>> sf.activation("leaky_relu(0.2)").name
    'leaky_relu(slope=0.2)'
    >>> sf.activation("relu", pool="max", k=2).name
    'relu+max2'
    """
    if isinstance(spec, Activation):
        base = spec
        if params:
            raise InvalidValue("Parameters cannot be given together with an Activation object.")
    else:
        base = _single(spec, tuple(sorted(params.items(), key=lambda kv: kv[0])))
    if pool is None:
        return base
    if pool not in POOLS:
        raise InvalidValue(f"The 'pool' parameter of activation must be one of 'max', 'avg' or None. Got {pool!r} instead.")
    k = validate.integer("activation", "k", k, lo=1, hi=MAX_K)
    if base.pool is not None:
        raise InvalidValue(f"The activation {base.name!r} is already pooled; pools cannot be nested.")
    if pool == "max" and k > 1 and not is_monotone(base.expr):
        warnings.warn(f"{base.name} is not monotone non-decreasing: max-pool has no order-statistic reduction and "
                      f"uses the slower {2 * k}-dimensional integral.", stacklevel=2)
    return Activation(f"{base.name}+{pool}{k}", base.expr, pool, k)


def _single(spec, params) -> Activation:
    if not isinstance(spec, str):
        raise InvalidType(f"The 'name' parameter of activation must be a str (a built-in name or a formula in x) "
                        f"or an Activation. Got {spec!r} instead.")
    params = dict(params)
    if len(spec) > MAX_LENGTH:
        parse(spec)  # refuses with the formula error
    match = _SPEC.match(spec)
    if match and match.group(1) in BUILTINS and not (match.group(2) is not None and _is_formula_call(match)):
        name = match.group(1)
        if match.group(2) is not None:
            params = {**_builtin_args(name, match.group(2), spec), **params}
        builder, defaults, _ = BUILTINS[name]
        unknown = set(params) - set(defaults)
        if unknown:
            raise InvalidValue(f"The activation '{name}' takes parameters {sorted(defaults) or 'none'}. "
                             f"Got {sorted(unknown)} instead.")
        full = {**defaults, **params}
        args = {kk: (v if kk == "coeffs" else _num(v, kk, name)) for kk, v in full.items()}
        if name == "monomial" and not (args["n"].is_integer and 0 <= args["n"] <= 64):
            raise InvalidValue(f"The 'n' parameter of activation('monomial') must be an integer in [0, 64]. "
                             f"Got {full['n']!r} instead.")
        if name == "polynomial" and len(full["coeffs"]) > 65:
            raise InvalidValue("The 'coeffs' parameter of activation('polynomial') must have at most 65 entries.")
        return Activation(_spec_name(name, params, defaults), sp.sympify(builder(**args)))
    if params:
        raise InvalidValue(f"Parameters {sorted(params)} were given for {spec!r}, which is not a built-in activation.")
    if match and match.group(2) is None and match.group(1) not in ("x", "pi", "e", "E"):
        guess = difflib.get_close_matches(spec.strip(), sorted(set(BUILTINS) | set(FUNCTIONS)), n=3)
        hint = f" Did you mean {' or '.join(repr(g) for g in guess)}?" if guess else ""
        raise InvalidValue(f"The 'name' parameter of activation must be a built-in activation "
                         f"({', '.join(activations())}) or a formula in x. Got {spec!r} instead.{hint}")
    expr = _formula(spec)
    return Activation(spec.strip(), expr)


@lru_cache(maxsize=256)
def _formula(text) -> sp.Expr:
    expr = parse(text)
    check_gaussian_moments(expr, text)
    return expr


_PROBES = (-3.7, -1.3, -0.1, 0.0, 0.1, 1.3, 3.7, -30.0, 30.0)
PROBE_DPS = 30          # mpmath precision of every numeric probe of phi
PROBE_SECONDS = 30.0    # time budget of the probes of one formula (timelimit.STEP_MEMORY of memory)
CHECK_SECONDS = 60.0    # time budget of the singularity check of one formula
EXP_ARG_LIMIT = 10**5   # in probes, exp/sinh/cosh/powers beyond e^(1e5) count as overflow, not computed
TRIG_ARG_LIMIT = mpmath.mpf("1e4000")  # in probes, sin/cos/tan of a larger argument are not reduced (overflow)
_bpow = sp.Function("bounded_pow")


class _TooLarge(OverflowError):
    """A probe value past EXP_ARG_LIMIT / TRIG_ARG_LIMIT: refused rather than computed."""


def _exp_guard(fn, name, one_sided):
    def guarded(a):
        r = mpmath.re(a)
        if r > EXP_ARG_LIMIT or (not one_sided and r < -EXP_ARG_LIMIT):
            raise _TooLarge(f"{name} of an argument beyond {EXP_ARG_LIMIT:g}")
        return mpmath.mpf(0) if one_sided and r < -EXP_ARG_LIMIT else fn(a)
    return guarded


def _trig_guard(fn, name):
    def guarded(a):
        if abs(a) > TRIG_ARG_LIMIT:
            raise _TooLarge(f"{name} of an argument beyond {TRIG_ARG_LIMIT:g}")
        return fn(a)
    return guarded


def _power(b, e):
    if b != 0 and abs(mpmath.re(e) * mpmath.log(abs(b))) > EXP_ARG_LIMIT:
        raise _TooLarge(f"a power beyond e^{EXP_ARG_LIMIT:g}")
    return mpmath.power(b, e)


_GUARDED = {"exp": _exp_guard(mpmath.exp, "exp", True), "sinh": _exp_guard(mpmath.sinh, "sinh", False),
            "cosh": _exp_guard(mpmath.cosh, "cosh", False), "sin": _trig_guard(mpmath.sin, "sin"),
            "cos": _trig_guard(mpmath.cos, "cos"), "tan": _trig_guard(mpmath.tan, "tan"), "bounded_pow": _power}


def mp_function(expr):
    """expr as an mpmath function of x whose exp-like growth and trig reductions are bounded:
    past EXP_ARG_LIMIT / TRIG_ARG_LIMIT it raises OverflowError instead of computing (or exhausting
    memory on) a number with an astronomically large exponent. Evaluate it under mpmath.workdps."""
    safe = expr.replace(lambda n: isinstance(n, sp.Pow) and not (n.exp.is_Integer and abs(n.exp) <= 64),
                        lambda n: _bpow(n.base, n.exp))
    return sp.lambdify(x, safe, modules=[_GUARDED, "mpmath"])


def check_gaussian_moments(expr, text=None):
    """Refuse formulas that are not real and finite on the line, or whose Gaussian moments diverge.

    First the real singularities of phi and phi' (:func:`check_singularities`); then probes; then
    E[phi(sqrt(q) z)^2] is finite for every q only if log|phi(x)| = o(x^2); the same is
    required of phi' (chi1). Tested on log|f(x)|/x^2 at |x| = 300 and 3000.
    """
    text = text or str(expr)
    if expr.has(sp.zoo, sp.oo, sp.nan):
        raise FormulaError(f"The formula {text!r} is not finite on the real line (SymPy reads it as {expr}).")
    timelimit.bounded("the singularity check", text, check_singularities, expr, text, seconds=CHECK_SECONDS)
    return timelimit.bounded("the probes", text, _probe, expr, text, seconds=PROBE_SECONDS)


def _probe(expr, text):
    """Values of phi at _PROBES, growth of phi and phi' at |x| = 300, 3000 (bounded: :func:`mp_function`)."""
    fn = mp_function(expr)
    with mpmath.workdps(PROBE_DPS):
        for p in _PROBES:
            try:
                val = mpmath.mpmathify(fn(mpmath.mpf(p)))
            except _TooLarge as err:
                raise FormulaError(f"The formula {text!r} is refused rather than probed at x = {p:g}: it takes {err} "
                                   f"there (symfield needs log|phi(x)| = o(x^2)).") from None
            except (ZeroDivisionError, ValueError, OverflowError, TypeError):
                val = mpmath.nan
            if isinstance(val, mpmath.mpc) and abs(val.imag) > 1e-25 * max(1, abs(val.real)):
                raise FormulaError(f"The formula {text!r} is not real-valued on the real line "
                                   f"(at x = {p:g} it is {mpmath.nstr(val, 6)}).")
            if not mpmath.isfinite(val):
                raise FormulaError(f"The formula {text!r} is not finite on the real line (at x = {p:g}).")
        for f, what in ((expr, "phi"), (_derivative(expr), "phi'")):
            # |sin|, |cos| <= 1: bounding them keeps mpmath away from reducing huge arguments mod 2 pi
            f = f.replace(sp.sin, lambda a: sp.Integer(1)).replace(sp.cos, lambda a: sp.Integer(1))
            fn = mp_function(f)
            rates = []
            for r in (300, 3000):
                logs = []
                for xv in (r, -r, 1.1 * r, -1.1 * r):
                    try:
                        v = abs(mpmath.mpmathify(fn(mpmath.mpf(xv))))
                    except (OverflowError, ValueError, ZeroDivisionError):
                        v = mpmath.inf
                    logs.append(mpmath.inf if not mpmath.isfinite(v) else (mpmath.log(v) if v > 0 else -mpmath.inf))
                rates.append(max(logs) / r**2)
            if rates[1] > 1e-7 and rates[1] >= 0.5 * rates[0]:
                raise FormulaError(
                    f"The Gaussian expectations of {text!r} diverge: log|{what}(x)| grows like x^2 or faster "
                    f"(log|{what}|/x^2 = {mpmath.nstr(rates[1], 3)} at |x| = 3000), so E[{what}(sqrt(q) z)^2] "
                    f"is infinite for large q. symfield needs log|{what}(x)| = o(x^2).")
    return expr


# ---------------------------------------------------------------- real singularities (poles, log, powers)
SOLVE_SECONDS = 2.0   # time limit of one SymPy zero-set computation; past it the numeric scan decides
ALLOWED = ("symfield needs phi(x) and phi'(x) finite and real-valued at every real x (kinks of "
           "max/min/abs/relu/step are allowed, e.g. abs(x)**1.5, sqrt(1 + x**2), log(1 + exp(x))).")
# f(a) with real poles at the real zeros of P(a): tan = sin/cos, ...
_POLES = {sp.tan: sp.cos, sp.sec: sp.cos, sp.cot: sp.sin, sp.csc: sp.sin, sp.coth: sp.sinh, sp.csch: sp.sinh}
_GRID = np.sinh(np.linspace(-math.asinh(3000.0), math.asinh(3000.0), 60001))   # |x| <= 3000, step 3e-4 at 0
_NICE = (0, 1, -1, 2, -2, 3, -3, 0.5, -0.5, 10, -10)


def _requirements(expr):
    """(base, need, node) for each node of expr that is finite and real only where base != 0
    ('nonzero'), > 0 ('positive') or >= 0 ('nonnegative'); innermost nodes first."""
    for node in sp.postorder_traversal(expr):
        if type(node) in _POLES:
            yield _POLES[type(node)](node.args[0]), "nonzero", node
        elif isinstance(node, sp.log):
            yield node.args[0], "positive", node
        elif isinstance(node, sp.Pow) and node.base.has(x):
            e = node.exp
            if not e.is_number:
                yield node.base, "positive", node
            elif e.is_integer:
                if e < 0:
                    yield node.base, "nonzero", node
            else:
                yield node.base, ("nonnegative" if e > 0 else "positive"), node


def check_singularities(expr, text=None):
    """FormulaError unless phi and phi' are finite and real at every real x (Max/Min/Abs/Heaviside
    kinks allowed: their phi' has jumps, not poles).  Zero sets by SymPy (real roots of polynomials,
    solveset over the reals) under a time limit of SOLVE_SECONDS each, else a numeric scan of |x| <= 3000
    (sign changes and near-zero minima, bisected); negativity at chosen points, near the zeros and on
    the scan.  One message per kind (pole, log, fractional power), naming the point."""
    text = text or str(expr)
    done = set()
    dphi = _derivative(expr)
    for f, where in ((expr, None), (dphi, dphi)):
        for base, need, node in _requirements(f):
            if (base, need) in done:
                continue
            done.add((base, need))
            bad = _violation(base, need)
            if bad is not None:
                raise FormulaError(_singular_message(text, where, base, node, *bad))
    return expr


def _derivative(expr):
    """phi' almost everywhere: the Dirac masses of Heaviside/sign jumps dropped."""
    return sp.diff(expr, x).replace(sp.DiracDelta, lambda *a: sp.S.Zero)


def _singular_message(text, dphi, base, node, kind, point):
    at, b, n = _show(point), brief(base), brief(node)
    if type(node) in _POLES or (isinstance(node, sp.Pow) and node.exp.is_integer):
        what = f"has a pole on the real line at x = {at}, a zero of {b}: it is not finite there"
    elif isinstance(node, sp.log):
        what = (f"takes {n}, which is not finite at x = {at}, where {b} = 0" if kind == "zero" else
                f"takes {n}, which is not real-valued at x = {at}, where {b} < 0")
    elif kind == "zero":
        what = f"takes {n}, a negative power of {b}, which is not finite at x = {at}, where {b} = 0"
    else:
        what = (f"takes {n}, a {'fractional' if node.exp.is_number else 'variable'} power of {b}, and "
                f"{b} < 0 at x = {at}: it is not real-valued there (a real fractional power needs a base >= 0 "
                f"everywhere)")
    if dphi is None:
        return f"The formula {text!r} {what}. {ALLOWED}"
    return (f"The derivative phi'(x) = {brief(dphi)} of the formula {text!r} {what}, so chi1 = sigma_w2 "
            f"E[phi'(sqrt(q) z)^2] is infinite. {ALLOWED}")


def _show(point):
    """A point for messages: exact when short (pi/2 = 1.5708), else its float."""
    if isinstance(point, (int, float)):
        return f"{point:.6g}"
    text = sp.sstr(point)
    if point.is_Rational and len(text) <= 12:
        return text
    value = f"{float(sp.N(point, 20)):.6g}"
    return value if len(text) > 24 or "RootOf" in text or text == value else f"{text} = {value}"


def _violation(base, need):
    """None if base meets need on the whole real line, else ('zero' | 'negative', point)."""
    if not base.has(x) or (need == "nonzero" and (base.is_nonzero or base.is_positive or base.is_negative)) \
            or (need == "positive" and base.is_positive) or (need == "nonnegative" and base.is_nonnegative):
        return None
    zeros = _real_zeros(base)
    if need in ("positive", "nonnegative"):
        cands = list(_NICE) + [float(sp.N(z)) + d * (1 + abs(float(sp.N(z)))) for z in (zeros or [])[:20]
                                for d in (-1e-6, 1e-6)]
        fz = sorted(float(sp.N(z)) for z in (zeros or [])[:20])
        cands += [(a + b) / 2 for a, b in zip(fz[:-1], fz[1:])]
        neg = _negative_at(base, cands)
        if neg is not None:
            return "negative", neg
        if need == "nonnegative":
            return None
    if zeros is None:
        zero = _numeric_zero(base)
        return None if zero is None else ("zero", zero)
    return ("zero", zeros[0]) if zeros else None


def _limited(fn, *args):
    """fn(*args) under the SOLVE_SECONDS time limit; None on timeout or when SymPy gives up."""
    try:
        return timelimit.call_with_time_limit(SOLVE_SECONDS, fn, *args)
    except (timelimit.TimeLimitExceeded, sp.PolynomialError, *SYMPY_GAVE_UP):
        return None


def _real_zeros(base):
    """Real zeros of base (SymPy numbers, smallest |x| first), [] if none, None if SymPy cannot decide."""
    if base.is_polynomial(x):
        poly = sp.Poly(base, x)
        if poly.domain.is_QQ or poly.domain.is_ZZ:
            roots = _limited(sp.real_roots, poly)
            if roots is not None:
                return sorted(set(roots), key=_order)
    return _set_points(_limited(sp.solveset, base, x, sp.S.Reals))


def _order(p):
    v = float(sp.N(p, 20))
    return (round(abs(v), 12), v < 0)


def _set_points(S):
    """Some points of a real solution set (smallest |x| first), [] if empty, None if undecided."""
    if S is None:
        return None
    if S is sp.S.EmptySet:
        return []
    if isinstance(S, sp.FiniteSet):
        return _real_points(S)
    if isinstance(S, sp.ImageSet) and S.base_sets == (sp.S.Integers,):
        # solveset's image sets over the reals may hold complex members (log(e^(2 pi n) - 1), n < 0)
        return _real_points({S.lamda(n) for n in range(-4, 5)}) or None
    if isinstance(S, sp.Interval):
        lo, hi = S.inf, S.sup
        p = min(max(sp.S.Zero, lo), hi)
        if S.contains(p) != sp.true:
            p = (lo + hi) / 2 if lo.is_finite and hi.is_finite else (lo + 1 if lo.is_finite else hi - 1)
        return [p]
    if isinstance(S, sp.Intersection):
        rest = [arg for arg in S.args if arg != sp.S.Reals]
        return _set_points(rest[0]) if len(rest) == 1 and isinstance(rest[0], sp.FiniteSet) else None
    if isinstance(S, sp.Union):
        parts = [_set_points(arg) for arg in S.args]
        found = [p for part in parts if part for p in part]
        if found or all(part == [] for part in parts):
            return sorted(found, key=_order)
    return None


def _real_points(points):
    """The real members of a set of SymPy numbers (smallest |x| first); complex ones dropped."""
    pts = []
    for p in points:
        try:
            v = complex(sp.N(p, 30))
        except (TypeError, ValueError):
            continue
        if math.isfinite(v.real) and abs(v.imag) <= 1e-20 * (1 + abs(v.real)):
            pts.append(p if p.is_real else sp.re(sp.N(p, 30)))
    return sorted(pts, key=_order)


def _numpy_fn(base):
    fn = sp.lambdify(x, base, modules=[{"Heaviside": lambda a, h=0.5: np.heaviside(a, h)}, "scipy", "numpy"])

    def call(v):
        with np.errstate(all="ignore"):
            out = np.asarray(fn(v), dtype=complex)
        out = np.broadcast_to(out, np.shape(v))
        return np.where(np.isfinite(out) & (np.abs(out.imag) <= 1e-12 * (1 + np.abs(out.real))), out.real, np.nan)
    return call


def _negative_at(base, cands):
    """A point where base < 0: first among cands (mpmath), else on the scan grid; None if none found."""
    fm = mp_function(base)
    with mpmath.workdps(PROBE_DPS):
        for p in cands:
            try:
                v = mpmath.mpmathify(fm(mpmath.mpf(p)))
            except (ZeroDivisionError, ValueError, OverflowError, TypeError):
                continue
            if isinstance(v, mpmath.mpf) and v < 0:
                return p
    vals = _numpy_fn(base)(_GRID)
    neg = np.flatnonzero(vals < 0)
    return float(_GRID[neg[np.argmin(np.abs(_GRID[neg]))]]) if neg.size else None


def _numeric_zero(base):
    """A real zero of base on |x| <= 3000 found by the scan: a sign change bisected to a point where |base|
    is below 1e-9 of its size nearby (a jump across 0 is not a zero), or a near-zero local minimum of |base|
    refined by golden section.  None if none is found."""
    fn = _numpy_fn(base)
    v = fn(_GRID)
    a = np.abs(v)
    local = np.lib.stride_tricks.sliding_window_view(np.pad(np.where(np.isfinite(a), a, 0.0), 50), 101).max(axis=1)
    cands = sorted(np.flatnonzero(np.sign(v[:-1]) * np.sign(v[1:]) < 0), key=lambda i: abs(_GRID[i]))[:200]
    mins = np.flatnonzero((a[1:-1] <= a[:-2]) & (a[1:-1] <= a[2:]) & (a[1:-1] < 1e-3 * local[1:-1])) + 1
    for i in cands:
        lo, hi, flo = _GRID[i], _GRID[i + 1], v[i]
        for _ in range(80):   # bisection of the sign change
            mid = 0.5 * (lo + hi)
            fmid = fn(np.array([mid]))[0]
            if fmid == 0:
                return float(mid)
            if not np.isfinite(fmid):
                break
            lo, hi, flo = (mid, hi, fmid) if np.sign(fmid) == np.sign(flo) else (lo, mid, flo)
        else:
            if np.nanmin(np.abs(fn(np.array([lo, hi])))) <= 1e-9 * max(a[i], a[i + 1]):
                return float(0.5 * (lo + hi))
    for i in sorted(mins, key=lambda i: abs(_GRID[i]))[:200]:
        lo, hi = _GRID[i - 1], _GRID[i + 1]
        for _ in range(100):   # golden section on |base|
            m1, m2 = hi - 0.618 * (hi - lo), lo + 0.618 * (hi - lo)
            if abs(fn(np.array([m1]))[0]) <= abs(fn(np.array([m2]))[0]):
                hi = m2
            else:
                lo = m1
        if abs(fn(np.array([0.5 * (lo + hi)]))[0]) <= 1e-12 * local[i]:
            return float(0.5 * (lo + hi))
    return None


def is_monotone(expr) -> bool:
    """Non-decreasing on the real line (checked symbolically where possible, else on a fine grid)."""
    d = sp.diff(expr, x).replace(sp.DiracDelta, lambda *a: sp.S.Zero)  # a jump is checked on phi's values
    fn, f = mp_function(d), mp_function(expr)
    grid = [mpmath.mpf(i) / 50 for i in range(-2000, 2001)]
    try:
        values = [mpmath.re(mpmath.mpmathify(f(g))) for g in grid]
        if any(b < a - 1e-12 * (1 + abs(a)) for a, b in zip(values, values[1:])):
            return False
        return all(mpmath.re(mpmath.mpmathify(fn(g))) >= -1e-12 for g in grid if g != 0)
    except (TypeError, ValueError, ZeroDivisionError, OverflowError):
        return False


def kink_args(expr) -> list:
    """The expressions whose zeros are expr's kinks and jumps: differences of Max/Min arguments, the
    arguments of Abs/Heaviside/sign/DiracDelta, lhs - rhs of Piecewise conditions."""
    args = []
    for node in sp.preorder_traversal(expr):
        if isinstance(node, (sp.Max, sp.Min)):
            a = node.args
            args += [a[i] - a[j] for i in range(len(a)) for j in range(i + 1, len(a))]
        elif isinstance(node, (sp.Abs, sp.Heaviside, sp.sign, sp.DiracDelta)):
            args.append(node.args[0])
        elif isinstance(node, sp.Piecewise):
            for _, cond in node.args:
                if isinstance(cond, sp.core.relational.Relational):
                    args.append(cond.lhs - cond.rhs)
    return args


def kinks(expr) -> tuple:
    """Real points where phi is not smooth (the real zeros of :func:`kink_args` polynomial in x)."""
    points = set()
    for a in kink_args(expr):
        a = sp.expand(a)
        if a.is_polynomial(x) and a.has(x):
            try:
                points.update(float(r) for r in sp.real_roots(sp.Poly(a, x)))
            except SYMPY_GAVE_UP:  # coefficients such as sqrt(2) or pi: numerical roots suffice
                roots = (complex(r) for r in sp.Poly(a, x).nroots(n=30))
                points.update(r.real for r in roots if abs(r.imag) <= 1e-12 * (1 + abs(r.real)))
    return tuple(sorted(points))
