"""Safe parser for user-typed activation formulas in the variable ``x``.

The text is parsed by Python's ``ast`` (which only builds a tree, executes nothing)
and the tree is walked with an allow-list: numbers, ``x``, ``pi``, ``e``,
``+ - * / **`` and the named functions in :data:`FUNCTIONS`. Every other node
(attributes, subscripts, comparisons, lambdas, keyword arguments, strings, other
names, ...) is refused. The SymPy expression is built node by node, never by
``eval`` or ``sympify`` of the raw text.
"""
from __future__ import annotations

import ast

import sympy as sp

X = sp.Symbol("x", real=True)

MAX_LENGTH = 2000
MAX_NODES = 400
MAX_EXPONENT = 64


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


class FormulaError(ValueError):
    """A user formula that is not an allowed expression in x."""


def _refuse(text, why):
    raise FormulaError(f"The 'formula' parameter of activation must be an expression in x built from numbers, "
                       f"+ - * / **, and the functions {', '.join(sorted(FUNCTIONS))}. Got {text!r} instead: {why}.")


def parse(text: str) -> sp.Expr:
    """Parse ``text`` into a SymPy expression in :data:`X`, refusing anything outside the allow-list."""
    if not isinstance(text, str):
        raise TypeError(f"The 'formula' parameter of activation must be a str. Got {text!r} instead.")
    if len(text) > MAX_LENGTH:
        _refuse(text[:40] + "...", f"longer than {MAX_LENGTH} characters")
    source = text.replace("^", "**").strip()
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as err:
        _refuse(text, f"not a formula ({err.msg})")
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        _refuse(text, f"more than {MAX_NODES} syntax nodes")
    return _build(tree.body, text)


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
