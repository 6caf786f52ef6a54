"""A strict reader of the generated documents' LaTeX (tests/reports/test_derive.py): tagged displays back to SymPy.

A small recursive-descent parser for the LaTeX subset the documents use, independent of SymPy's
printer; anything else raises ValueError.  Gaussian integrals written with the measure Dz,
int Dz f(z) = int f(z) e^(-z^2/2)/sqrt(2 pi) dz, are read as sympy Integrals and evaluated by
tensor Gauss-Legendre quadrature (:func:`numeric`).  Why not sympy.parsing.latex: its ANTLR
backend needs antlr4 4.11 (this image has 4.13.2), has no erf/\\operatorname and misreads
``\\tanh^{2}{(..)} e^{..}``; its Lark backend rejects ``q_{12}`` and ``\\pi`` inside ``\\frac``
(sympy 1.14).
"""
import re

import numpy as np
import sympy as sp
from scipy import special

# ---------------------------------------------------------------- the reader
_TOKEN = re.compile(r"\\[a-zA-Z]+|\\[,;:! ]|\\\\|\d+(?:\.\d+)?|[a-zA-Z]|[{}()\[\]^_+\-*/=|,'&.]|\s+")
_SKIP = {r"\,", r"\;", r"\:", r"\!", "\\ ", "\\\\", "&", r"\quad", r"\qquad", r"\nonumber"}
_GREEK = {"alpha", "beta", "gamma", "delta", "theta", "sigma", "chi", "mu", "rho", "xi", "psi", "phi", "tau"}
_FUNCS = {"sin": sp.sin, "cos": sp.cos, "tan": sp.tan, "sinh": sp.sinh, "cosh": sp.cosh, "tanh": sp.tanh,
          "exp": sp.exp, "ln": sp.log, "log": sp.log, "arcsin": sp.asin, "arccos": sp.acos, "arctan": sp.atan,
          "max": sp.Max, "min": sp.Min, "erf": sp.erf, "erfc": sp.erfc, "erfinv": sp.erfinv, "sign": sp.sign,
          "atan2": sp.atan2, "Theta": lambda a: sp.Heaviside(a, sp.Rational(1, 2)),
          "Phi": lambda a: (1 + sp.erf(a / sp.sqrt(2))) / 2}


class Reader:
    """LaTeX math -> SymPy, for the subset used here; anything else raises ValueError."""

    def __init__(self, text):
        pos, toks = 0, []
        while pos < len(text):
            mm = _TOKEN.match(text, pos)
            if not mm:
                raise ValueError(f"cannot tokenize at {text[pos:pos + 20]!r}")
            t = mm.group()
            pos = mm.end()
            if not t.isspace() and t not in _SKIP:
                toks.append(t)
        self.toks, self.i = toks, 0

    def peek(self, k=0):
        return self.toks[self.i + k] if self.i + k < len(self.toks) else None

    def take(self, want=None):
        t = self.peek()
        if t is None or (want is not None and t != want):
            raise ValueError(f"expected {want!r}, got {t!r} at token {self.i}: {' '.join(self.toks[self.i:self.i + 8])}")
        self.i += 1
        return t

    def parse(self):
        e = self.expr()
        if self.peek() == ".":
            self.take()
        if self.peek() is not None:
            raise ValueError(f"trailing tokens: {' '.join(self.toks[self.i:self.i + 8])}")
        return e

    def expr(self):
        e = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            t = self.term()
            e = e + t if op == "+" else e - t
        return e

    def term(self):
        if self.peek() in ("+", "-"):
            return -self.term() if self.take() == "-" else self.term()
        return self.product()

    def _starts_factor(self, t):
        if t is None:
            return False
        if t in ("{", "("):
            return True
        if t[0] == "\\":
            return t not in (r"\right", r"\Bigr", r"\end") and t not in (r"\cdot", r"\times")
        return t[0].isalnum()

    def product(self):
        e = self.factor()
        while True:
            if self.peek() in (r"\cdot", r"\times"):
                self.take()
            elif not self._starts_factor(self.peek()):
                return e
            e = e * self.factor()

    def factor(self):
        base = self.primary()
        while self.peek() == "^":
            self.take()
            base = base ** self.script()
        return base

    def script(self):
        if self.peek() == "{":
            self.take()
            e = self.expr()
            self.take("}")
            return e
        t = self.take()
        if t.isdigit():
            return sp.Integer(t)
        if t[0].isalpha():
            return sp.Symbol(t, real=True)
        raise ValueError(f"bad script {t!r}")

    def _sub(self):
        """Subscript text after '_': a brace group of letters/digits/commas or one token."""
        self.take("_")
        if self.peek() != "{":
            return self.take().lstrip("\\")
        self.take("{")
        parts = []
        while self.peek() != "}":
            parts.append(self.take().lstrip("\\"))
        self.take("}")
        return "".join(parts)

    def _symbol(self, name):
        if self.peek() == "_":
            name += "_" + self._sub()
        if self.peek() == "^" and self.peek(1) == "{" and self.peek(2) == "*" and self.peek(3) == "}":
            self.i += 4
            name += "^*"
        return sp.Symbol(name, real=True)

    def _args(self):
        """Function arguments: {\\left( a, b \\right)} | \\left( .. \\right) | ( .. ) | one factor."""
        if self.peek() == "{" and self.peek(1) == r"\left":
            self.take("{")
            args = self._args()
            self.take("}")
            return args
        if self.peek() in (r"\left", "("):
            close = ")"
            if self.take() == r"\left":
                self.take("(")
            args = [self.expr()]
            while self.peek() == ",":
                self.take()
                args.append(self.expr())
            if self.peek() == r"\right":
                self.take()
            self.take(close)
            return args
        return [self.factor()]

    def primary(self):
        t = self.take()
        if re.fullmatch(r"\d+(\.\d+)?", t):
            return sp.Rational(t)
        if t.isalpha() and len(t) == 1:
            if t == "e" and self.peek() != "_":
                return sp.E
            return self._symbol(t)
        if t == "{":
            e = self.expr()
            self.take("}")
            return e
        if t == "(":
            e = self.expr()
            self.take(")")
            return e
        if t in (r"\left", r"\Bigl", r"\bigl", r"\Big", r"\big"):
            d = self.take()
            close = {"(": ")", "[": "]", "|": "|"}[d]
            e = self.expr()
            self.take({r"\left": r"\right", r"\Bigl": r"\Bigr", r"\bigl": r"\bigr"}.get(t, t))
            self.take(close)
            return sp.Abs(e) if d == "|" else e
        name = t[1:]
        if name == "frac":
            a = self.primary_group()
            b = self.primary_group()
            return a / b
        if name == "sqrt":
            n = 2
            if self.peek() == "[":
                self.take()
                n = self.expr()
                self.take("]")
            return self.primary_group() ** (sp.Integer(1) / n)
        if name == "pi":
            return sp.pi
        if name == "infty":
            return sp.oo
        if name == "operatorname":
            self.take("{")
            fname = ""
            while self.peek() != "}":
                fname += self.take()
            self.take("}")
            return self._apply(fname)
        if name in _FUNCS:
            return self._apply(name)
        if name in _GREEK:
            return self._symbol(name)
        if name == "int":
            return self._integral()
        raise ValueError(f"unsupported command {t!r}")

    def primary_group(self):
        self.take("{")
        e = self.expr()
        self.take("}")
        return e

    def _apply(self, fname):
        if fname not in _FUNCS:
            raise ValueError(f"unknown function {fname!r}")
        power = None
        if self.peek() == "^":
            self.take()
            power = self.script()
        val = _FUNCS[fname](*self._args())
        return val if power is None else val ** power

    def _integral(self):
        """\\int \\mathcal{D}z_1 \\mathcal{D}z_2 integrand (Gaussian measures over the real line)."""
        vs = []
        while self.peek() == r"\mathcal":
            self.take()
            self.take("{")
            self.take("D")
            self.take("}")
            vs.append(self._symbol(self.take()))
        if not vs:
            raise ValueError("only Gaussian-measure integrals \\int \\mathcal{D}z ... are read")
        body = self.product()
        for w in vs:
            body = body * sp.exp(-w**2 / 2) / sp.sqrt(2 * sp.pi)
        return sp.Integral(body, *[(w, -sp.oo, sp.oo) for w in vs])


def read(text):
    """LaTeX math -> SymPy expression (ValueError outside the subset)."""
    return Reader(text).parse()


# ---------------------------------------------------------------- tagged displays
_DISPLAY = re.compile(r"% symfield-(check|def): (\S+)\n\\begin\{(equation|multline)\}(?:\\label\{[^}]*\})?\n(.*?)\n"
                      r"\\end\{\3\}", re.S)


def displays(tex):
    """[(kind, name, [expressions])]: each display 'LHS = A [= B]' gives A (and B)."""
    out = []
    for kind, name, _, body in _DISPLAY.findall(tex):
        body = body.strip().rstrip(".,")
        sides = _top_level_split(body, "=")
        out.append((kind, name, [read(s) for s in sides[1:]]))
    return out


def _top_level_split(s, ch):
    depth, parts, cur = 0, [], ""
    for t in s:
        depth += {"{": 1, "}": -1}.get(t, 0)
        if t == ch and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += t
    return parts + [cur]


def sym(name):
    """The real symbol the reader makes of a name (q_1, sigma_w, q^*, ...)."""
    return sp.Symbol(name, real=True)


_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(10)
_MODS = [{"Heaviside": lambda a, h=0.5: np.heaviside(a, h), "erfinv": special.erfinv, "Max": np.maximum,
          "Min": np.minimum}, "scipy", "numpy"]


def _gauss_rule(L=10.0, width=0.25):
    edges = np.arange(-L, L + width / 2, width)
    a, b = edges[:-1, None], edges[1:, None]
    x = ((b - a) / 2 * _NODES + (a + b) / 2).ravel()
    w = ((b - a) / 2 * _WEIGHTS).ravel()
    return x, w


def numeric(expr, point):
    """Value of a read-back expression at point {symbol: float}: Integrals by tensor Gauss-Legendre
    (panels of 0.25 on [-10, 10], 10 nodes each; the integrands carry their Gaussian weights)."""
    e = expr.xreplace({k: sp.Float(v, 30) for k, v in point.items()})
    repl = {}
    for I in e.atoms(sp.Integral):
        vs = [L[0] for L in I.limits]
        f = sp.lambdify(vs, I.function, modules=_MODS)
        x, w = _gauss_rule()
        grids = np.meshgrid(*([x] * len(vs)), indexing="ij")
        W = np.prod(np.meshgrid(*([w] * len(vs)), indexing="ij"), axis=0)
        with np.errstate(over="ignore", invalid="ignore"):
            vals = np.broadcast_to(np.asarray(f(*grids), dtype=float), W.shape)
        repl[I] = sp.Float(float(np.sum(vals * W)))
    e = e.xreplace(repl)
    free = e.free_symbols
    assert not free, f"unbound symbols {free} in {e}"
    return float(sp.N(e, 20))


def resolve(expr, defs):
    """Substitute the documents' definitions ({symbol: expression}) until nothing changes."""
    for _ in range(5):
        new = expr.xreplace(defs)
        if new == expr:
            return expr
        expr = new
    return expr
