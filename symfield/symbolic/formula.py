"""Safe parser for user-typed activation formulas in the variable ``x``.

The text is parsed by Python's ``ast`` (which only builds a tree, executes nothing) and the tree is
walked with an allow-list: numbers, ``x``, ``pi``, ``e``, ``+ - * / **`` and the named functions in
:data:`FUNCTIONS`; every other node is refused. The SymPy expression is built node by node, never by
``eval`` or ``sympify`` of the raw text.

Before SymPy touches the tree it is bounded (:func:`_bound`): size (MAX_LENGTH, MAX_NODES), depth
(MAX_DEPTH), every constant subtree evaluated in mpmath and refused unless 0 or between 1e-300 and 1e300
in magnitude, exponents at most MAX_EXPONENT with denominators at most MAX_DENOMINATOR, the polynomial
degree of every algebraic subtree at most MAX_EXPONENT, and at most MAX_EXP_NESTING nested
exponentials. After SymPy combines powers the exponents of x are checked again, and rationals with more
than 30 digits become 30-digit Floats (MAX_EXACT).
"""
from __future__ import annotations

from symfield.core.errors import InvalidType
import ast

import mpmath
import sympy as sp

from symfield.core.errors import FormulaError  # noqa: F401 (raised here)

X = sp.Symbol("x", real=True)

MAX_LENGTH = 2000
MAX_NODES = 400
MAX_EXPONENT = 64          # |exponent| of a power, and the polynomial degree in x of any subtree
MAX_DEPTH = 40             # nesting depth of the syntax tree
MAX_DENOMINATOR = 10**4    # q of a fractional exponent p/q (x**0.37 is 37/100)
MAX_EXP_NESTING = 2        # exp(exp(x)) is allowed (and then refused if its moments diverge), exp(exp(exp(x))) not
MAX_LOG10 = 300            # constants are 0 or 1e-300 <= |c| <= 1e300
MAX_EXACT = 10**30         # a rational p/q with |p| or q above this becomes a 30-digit Float


def _relu(a):
    return sp.Max(a, 0)


FUNCTIONS = {
    "exp": sp.exp, "log": sp.log, "sqrt": sp.sqrt,
    "sin": sp.sin, "cos": sp.cos, "tan": sp.tan, "atan": sp.atan, "arctan": sp.atan,
    "sinh": sp.sinh, "cosh": sp.cosh, "tanh": sp.tanh, "asinh": sp.asinh, "arcsinh": sp.asinh,
    "erf": sp.erf, "erfc": sp.erfc, "abs": sp.Abs, "sign": sp.sign,
    "max": sp.Max, "min": sp.Min, "relu": _relu,
    "heaviside": lambda a: sp.Heaviside(a, sp.Rational(1, 2)), "step": lambda a: sp.Heaviside(a, sp.Rational(1, 2)),
    "sigmoid": lambda a: 1 / (1 + sp.exp(-a)),
    "softplus": lambda a: sp.log(1 + sp.exp(a)),
    "sech": sp.sech,
}
ARITY = {"max": (2, 8), "min": (2, 8)}
CONSTANTS = {"x": X, "pi": sp.pi, "e": sp.E, "E": sp.E}


def _refuse(text, why):
    raise FormulaError(f"The 'formula' parameter of activation must be an expression in x built from numbers, "
                       f"+ - * / **, and the functions {', '.join(sorted(FUNCTIONS))}. Got {text!r} instead: {why}.")


def parse(text: str) -> sp.Expr:
    """Parse ``text`` into a SymPy expression in :data:`X`, refusing anything outside the allow-list."""
    if not isinstance(text, str):
        raise InvalidType(f"The 'formula' parameter of activation must be a str. Got {text!r} instead.")
    if len(text) > MAX_LENGTH:
        _refuse(text[:40] + "...", f"longer than {MAX_LENGTH} characters")
    source = text.replace("^", "**").strip()
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as err:
        _refuse(text, f"not a formula ({err.msg})")
    except (ValueError, RecursionError, MemoryError) as err:   # null bytes, a parser stack overflow
        _refuse(text, f"not a formula ({type(err).__name__})")
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        _refuse(text, f"more than {MAX_NODES} syntax nodes")
    if _depth(tree.body) > MAX_DEPTH:
        _refuse(text, f"nested more than {MAX_DEPTH} levels deep")
    with mpmath.workprec(64):
        _bound(tree.body, text)
    expr = _inexact_large(_build(tree.body, text))
    for node in sp.preorder_traversal(expr):
        if isinstance(node, sp.Pow) and node.base.has(X) and node.exp.is_number \
                and abs(node.exp) > MAX_EXPONENT:
            _refuse(text, f"SymPy combines its powers into {brief(node)}, an exponent larger than {MAX_EXPONENT}")
    return expr


def _inexact_large(expr):
    """expr with every rational whose numerator or denominator exceeds MAX_EXACT (1e-300 is
    1/10^300) as a 30-digit Float: SymPy's exact algorithms (gcd, series, factor) on 300-digit
    integers run for hours, and no activation needs such a constant exactly."""
    big = {r: sp.Float(r, 30) for r in expr.atoms(sp.Rational) if abs(r.p) > MAX_EXACT or r.q > MAX_EXACT}
    return expr.xreplace(big) if big else expr


def _depth(root):
    """Nesting depth of a syntax tree (iterative: no recursion limit)."""
    best, stack = 0, [(root, 1)]
    while stack:
        node, d = stack.pop()
        best = max(best, d)
        stack.extend((c, d + 1) for c in ast.iter_child_nodes(node))
    return best


_MP = {"exp": mpmath.exp, "log": mpmath.log, "sqrt": mpmath.sqrt, "sin": mpmath.sin, "cos": mpmath.cos,
       "tan": mpmath.tan, "atan": mpmath.atan, "arctan": mpmath.atan, "sinh": mpmath.sinh, "cosh": mpmath.cosh,
       "tanh": mpmath.tanh, "asinh": mpmath.asinh, "arcsinh": mpmath.asinh, "erf": mpmath.erf,
       "erfc": mpmath.erfc, "abs": abs, "sign": mpmath.sign, "max": max, "min": min,
       "relu": lambda a: max(a, 0), "heaviside": lambda a: mpmath.mpf(a > 0) + (a == 0) / mpmath.mpf(2),
       "sigmoid": lambda a: 1 / (1 + mpmath.exp(-a)), "softplus": lambda a: mpmath.log(1 + mpmath.exp(a)),
       "sech": mpmath.sech}
_MP["step"] = _MP["heaviside"]
_GROWING = ("exp", "sinh", "cosh")
_PASS_DEGREE = ("abs", "max", "min", "relu")   # |x**3| has degree 3; other functions of x count as degree 1


def short(value) -> str:
    """A number for messages, at most ~6 significant digits; a magnitude too large to print in full
    (sech(1e300) = 8e-434294481903251827651...) as its power of 10."""
    if isinstance(value, mpmath.mpc):
        return f"({short(value.real)} {'-' if value.imag < 0 else '+'} {short(abs(value.imag))}j)"
    value = mpmath.mpf(value)
    if not mpmath.isfinite(value) or value == 0 or abs(mpmath.log10(abs(value))) < 1e6:
        return mpmath.nstr(value, 6)
    return f"{'-' if value < 0 else ''}10^({mpmath.nstr(mpmath.log10(abs(value)), 6)})"


def brief(expr) -> str:
    """An expression for messages: numbers longer than 20 characters (10**300, 851/500 is kept) shown
    as 6-digit floats."""
    expr = sp.sympify(expr)
    long = {n: sp.Float(n, 6) for n in expr.atoms(sp.Rational, sp.Float) if len(str(n)) > 20}
    return sp.sstr(expr.xreplace(long) if long else expr)


def _checked(text, value, what):
    """value (an mpmath number) if real and 0 or within 10**(+-MAX_LOG10), else a refusal."""
    if isinstance(value, mpmath.mpc):
        if value.imag != 0:
            _refuse(text, f"the constant {what} = {short(value)} is not real")
        value = value.real
    if not mpmath.isfinite(value):
        _refuse(text, f"the constant {what} is not finite")
    if value != 0 and not -MAX_LOG10 - 1e-9 <= mpmath.log10(abs(value)) <= MAX_LOG10 + 1e-9:   # 1e300 rounds up
        _refuse(text, f"the constant {what} = {short(value)} is outside the allowed magnitudes "
                      f"0 or 1e-{MAX_LOG10} to 1e{MAX_LOG10}")
    return value


def _bound(node, text):
    """(value, degree, nesting) of a syntax subtree: its mpmath value when constant (else None), a bound
    on its polynomial degree in x, and the depth of exp-like functions of x in it; refuses what is outside
    the limits of the module docstring before anything is computed at full size."""
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            _refuse(text, f"the constant {node.value!r} is not a real number")
        if isinstance(node.value, int) and abs(node.value) > 10**30:
            _refuse(text, "an integer constant larger than 1e30")
        return _checked(text, mpmath.mpf(node.value), repr(node.value)), 0, 0
    if isinstance(node, ast.Name):
        consts = {"pi": mpmath.pi, "e": mpmath.e, "E": mpmath.e}
        return (+consts[node.id], 0, 0) if node.id in consts else (None, 1, 0)
    if isinstance(node, ast.UnaryOp):
        value, degree, nest = _bound(node.operand, text)
        negate = isinstance(node.op, ast.USub) and value is not None
        return (-value if negate else value), degree, nest
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow)):
        return _bound_binop(node, text, _bound(node.left, text), _bound(node.right, text))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _MP \
            and not node.keywords:
        args = [_bound(a, text) for a in node.args]
        name = node.func.id
        if all(v is not None for v, _, _ in args):
            try:
                value = _MP[name](*[v for v, _, _ in args])
            except (TypeError, ValueError, ZeroDivisionError):
                return None, 0, 0   # arity errors and the like are reported by _build
            return _checked(text, value, ast.unparse(node)), 0, 0
        nest = max(n for _, _, n in args) + (name in _GROWING)
        if nest > MAX_EXP_NESTING:
            _refuse(text, f"more than {MAX_EXP_NESTING} nested exp/sinh/cosh of x (they overflow every "
                          "Gaussian moment and every evaluation)")
        return None, (max(d for _, d, _ in args) if name in _PASS_DEGREE else 1), nest
    return None, 0, 0   # refused by _build with the precise reason


def _bound_binop(node, text, left, right):
    (lv, ld, ln), (rv, rd, rn) = left, right
    what = ast.unparse(node)
    nest = max(ln, rn)
    if isinstance(node.op, ast.Pow):
        if rv is not None and abs(rv) > MAX_EXPONENT:
            _refuse(text, f"an exponent larger than {MAX_EXPONENT} in absolute value")
        if rv is not None and rv != int(rv):
            frac = _build(node.right, text)   # safe: a bounded constant
            if frac.is_Rational and frac.q > MAX_DENOMINATOR:
                _refuse(text, f"the exponent {ast.unparse(node.right)} is not a fraction p/q with "
                              f"q <= {MAX_DENOMINATOR}")
        if lv is not None and rv is not None:
            if lv == 0:
                if rv < 0:
                    _refuse(text, "division by zero")
                return mpmath.mpf(rv == 0), 0, 0
            if abs(rv * mpmath.log10(abs(lv))) > MAX_LOG10 + 1:
                _refuse(text, f"the constant {what} is outside the allowed magnitudes 0 or 1e-{MAX_LOG10} "
                              f"to 1e{MAX_LOG10}")
            return _checked(text, mpmath.power(lv, rv), what), 0, 0
        if rv is None:   # a power of x in the exponent grows like exp
            nest = max(ln, rn) + 1
            if nest > MAX_EXP_NESTING:
                _refuse(text, f"more than {MAX_EXP_NESTING} nested exp/sinh/cosh/powers of x")
            return None, 1, nest
        degree = ld * int(mpmath.ceil(abs(rv)))
    elif lv is not None and rv is not None:
        if isinstance(node.op, ast.Div) and rv == 0:
            _refuse(text, "division by zero")
        op = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
              ast.Div: lambda a, b: a / b}[type(node.op)]
        return _checked(text, op(lv, rv), what), 0, 0
    else:
        degree = max(ld, rd) if isinstance(node.op, (ast.Add, ast.Sub)) else ld + rd
    if degree > MAX_EXPONENT:
        _refuse(text, f"a polynomial degree in x above {MAX_EXPONENT} ({what})")
    return None, degree, nest


def _build(node, text):
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            _refuse(text, f"the constant {node.value!r} is not a real number")
        if isinstance(node.value, int):
            if abs(node.value) > 10**30:
                _refuse(text, "an integer constant larger than 1e30")
            return sp.Integer(node.value)
        return sp.Rational(repr(node.value)) if abs(node.value) < 1e30 else sp.Float(node.value)
    if isinstance(node, ast.Name):
        if node.id in CONSTANTS:
            return CONSTANTS[node.id]
        if node.id in FUNCTIONS:
            _refuse(text, f"the function '{node.id}' must be called with an argument, e.g. {node.id}(x)")
        _refuse(text, f"the name '{node.id}' is not allowed (the only variable is x)")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        arg = _build(node.operand, text)
        return -arg if isinstance(node.op, ast.USub) else arg
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow)):
        left, right = _build(node.left, text), _build(node.right, text)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        if isinstance(node.op, ast.Div):
            if right == 0:
                _refuse(text, "division by zero")
            return left / right
        if right.is_number and abs(float(right)) > MAX_EXPONENT:
            _refuse(text, f"an exponent larger than {MAX_EXPONENT} in absolute value")
        if left == 0 and right.is_number and float(right) < 0:
            _refuse(text, "division by zero")
        return left ** right
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            name = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
            _refuse(text, f"the function '{name}' is not allowed")
        if node.keywords:
            _refuse(text, "keyword arguments are not allowed")
        name = node.func.id
        lo, hi = ARITY.get(name, (1, 1))
        if not lo <= len(node.args) <= hi:
            _refuse(text, f"'{name}' takes {lo if lo == hi else f'{lo} to {hi}'} argument(s), got {len(node.args)}")
        return FUNCTIONS[name](*[_build(a, text) for a in node.args])
    _refuse(text, f"'{ast.unparse(node)}' ({type(node).__name__}) is not allowed")
