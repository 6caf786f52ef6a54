"""Activations: built-in names, safe user formulas, and multi-node pools.

An :class:`Activation` is a SymPy expression ``phi(x)`` plus an optional pool
(``psi = max_j phi(u_j)`` or ``(1/k) sum_j phi(u_j)`` over ``k`` independent nodes).
"""
from __future__ import annotations

import ast
import difflib
import re
import warnings
from dataclasses import dataclass
from functools import lru_cache

import mpmath
import sympy as sp

from symfield.core import validate
from symfield.symbolic.formula import FUNCTIONS, MAX_LENGTH, FormulaError, X, parse

x = X


def _num(value, name, spec):
    if isinstance(value, bool) or not isinstance(value, (int, float, sp.Rational)):
        raise TypeError(f"The '{name}' parameter of activation('{spec}') must be a real number. Got {value!r} instead.")
    if isinstance(value, float):
        validate.real("activation", name, value)
        return sp.Rational(repr(value))
    return sp.sympify(value)


def _abrelu(a=0, b=1):
    return a * sp.Min(x, 0) + b * sp.Max(x, 0)


def _poly(coeffs=(0, 1)):
    if not isinstance(coeffs, (list, tuple)) or not coeffs:
        raise TypeError(f"The 'coeffs' parameter of activation('polynomial') must be a non-empty list of numbers "
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


def activations():
    """Names of the built-in activations."""
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

    def __call__(self, value):
        """phi(value) for a float (single node)."""
        return float(self.expr.subs(x, value))


_SPEC = re.compile(r"^\s*([A-Za-z_]\w*)\s*(?:\((.*)\))?\s*$", re.S)


def _builtin_args(name, argtext, spec):
    """Parse 'leaky_relu(0.2)' / 'erf(a=2, b=0.5)' arguments: numbers only."""
    try:
        call = ast.parse(f"f({argtext})", mode="eval").body
    except SyntaxError:
        raise ValueError(f"The 'name' parameter of activation has malformed arguments. Got {spec!r} instead.") from None

    def lit(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -lit(node.operand)
        if isinstance(node, (ast.Tuple, ast.List)):
            return tuple(lit(e) for e in node.elts)
        raise ValueError(f"The arguments of activation {spec!r} must be numbers. Got {ast.unparse(node)!r} instead.")
    names = list(BUILTINS[name][1])
    if len(call.args) > len(names):
        raise ValueError(f"The activation '{name}' takes parameters {names}. Got {spec!r} instead.")
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


def activation(spec, pool=None, k=2, **params) -> Activation:
    """Build an activation from a built-in name (with parameters) or a formula in x.

    ``activation("leaky_relu", slope=0.2)``, ``activation("leaky_relu(0.2)")``,
    ``activation("x*erf(x)")``, ``activation("relu", pool="max", k=2)``.
    """
    if isinstance(spec, Activation):
        base = spec
        if params:
            raise ValueError("Parameters cannot be given together with an Activation object.")
    else:
        base = _single(spec, tuple(sorted(params.items(), key=lambda kv: kv[0])))
    if pool is None:
        return base
    if pool not in POOLS:
        raise ValueError(f"The 'pool' parameter of activation must be one of 'max', 'avg' or None. Got {pool!r} instead.")
    k = validate.integer("activation", "k", k, lo=1, hi=MAX_K)
    if base.pool is not None:
        raise ValueError(f"The activation {base.name!r} is already pooled; pools cannot be nested.")
    if pool == "max" and k > 1 and not is_monotone(base.expr):
        warnings.warn(f"{base.name} is not monotone non-decreasing: max-pool has no order-statistic reduction and "
                      f"uses the slower {2 * k}-dimensional integral.", stacklevel=2)
    return Activation(f"{base.name}+{pool}{k}", base.expr, pool, k)


def _single(spec, params) -> Activation:
    if not isinstance(spec, str):
        raise TypeError(f"The 'name' parameter of activation must be a str (a built-in name or a formula in x) "
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
            raise ValueError(f"The activation '{name}' takes parameters {sorted(defaults) or 'none'}. "
                             f"Got {sorted(unknown)} instead.")
        full = {**defaults, **params}
        args = {kk: (v if kk == "coeffs" else _num(v, kk, name)) for kk, v in full.items()}
        if name == "monomial" and not (args["n"].is_integer and 0 <= args["n"] <= 64):
            raise ValueError(f"The 'n' parameter of activation('monomial') must be an integer in [0, 64]. "
                             f"Got {full['n']!r} instead.")
        if name == "polynomial" and len(full["coeffs"]) > 65:
            raise ValueError("The 'coeffs' parameter of activation('polynomial') must have at most 65 entries.")
        return Activation(_spec_name(name, params, defaults), sp.sympify(builder(**args)))
    if params:
        raise ValueError(f"Parameters {sorted(params)} were given for {spec!r}, which is not a built-in activation.")
    if match and match.group(2) is None and match.group(1) not in ("x", "pi", "e", "E"):
        guess = difflib.get_close_matches(spec.strip(), sorted(set(BUILTINS) | set(FUNCTIONS)), n=3)
        hint = f" Did you mean {' or '.join(repr(g) for g in guess)}?" if guess else ""
        raise ValueError(f"The 'name' parameter of activation must be a built-in activation "
                         f"({', '.join(activations())}) or a formula in x. Got {spec!r} instead.{hint}")
    expr = _formula(spec)
    return Activation(spec.strip(), expr)


@lru_cache(maxsize=256)
def _formula(text) -> sp.Expr:
    expr = parse(text)
    check_gaussian_moments(expr, text)
    return expr


_PROBES = (-3.7, -1.3, -0.1, 0.0, 0.1, 1.3, 3.7, -30.0, 30.0)


def check_gaussian_moments(expr, text=None):
    """Refuse formulas that are not real and finite on the line, or whose Gaussian moments diverge.

    E[phi(sqrt(q) z)^2] is finite for every q only if log|phi(x)| = o(x^2); the same is
    required of phi' (chi1). Tested on log|f(x)|/x^2 at |x| = 300 and 3000.
    """
    text = text or str(expr)
    fn = sp.lambdify(x, expr, modules="mpmath")
    with mpmath.workdps(30):
        for p in _PROBES:
            try:
                val = mpmath.mpmathify(fn(mpmath.mpf(p)))
            except (ZeroDivisionError, ValueError, OverflowError, TypeError):
                val = mpmath.nan
            if isinstance(val, mpmath.mpc) and abs(val.imag) > 1e-25 * max(1, abs(val.real)):
                raise FormulaError(f"The formula {text!r} is not real-valued on the real line "
                                   f"(at x = {p:g} it is {mpmath.nstr(val, 6)}).")
            if not mpmath.isfinite(val):
                raise FormulaError(f"The formula {text!r} is not finite on the real line (at x = {p:g}).")
        for f, what in ((expr, "phi"), (sp.diff(expr, x), "phi'")):
            # |sin|, |cos| <= 1: bounding them keeps mpmath away from reducing huge arguments mod 2 pi
            f = f.replace(sp.sin, lambda a: sp.Integer(1)).replace(sp.cos, lambda a: sp.Integer(1))
            fn = sp.lambdify(x, f, modules="mpmath")
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
    for den in _denominators(expr):
        if den.is_polynomial(x) and sp.Poly(den, x).degree() > 0 and sp.real_roots(sp.Poly(den, x)):
            raise FormulaError(f"The formula {text!r} has a pole on the real line (zero of {den}).")
    return expr


def _denominators(expr):
    for node in sp.preorder_traversal(expr):
        if isinstance(node, sp.Pow) and node.exp.is_number and node.exp < 0:
            yield node.base


def is_monotone(expr) -> bool:
    """Non-decreasing on the real line (checked symbolically where possible, else on a fine grid)."""
    d = sp.diff(expr, x)
    fn = sp.lambdify(x, d, modules="mpmath")
    grid = [mpmath.mpf(i) / 50 for i in range(-2000, 2001)]
    try:
        return all(mpmath.re(mpmath.mpmathify(fn(g))) >= -1e-12 for g in grid if g != 0)
    except (TypeError, ValueError, ZeroDivisionError):
        return False


def kinks(expr) -> tuple:
    """Real points where phi is not smooth (args of Max/Min/Abs/Heaviside/sign, Piecewise conditions)."""
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
    points = set()
    for a in args:
        a = sp.expand(a)
        if a.is_polynomial(x) and a.has(x):
            points.update(float(r) for r in sp.real_roots(sp.Poly(a, x)))
    return tuple(sorted(points))
