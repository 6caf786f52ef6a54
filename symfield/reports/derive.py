"""The derivation of an activation's mean-field theory as a complete LaTeX document.

    tex = derive(act)          # str: a complete, deterministic LaTeX document

Every formula is printed by SymPy's LaTeX printer from the package's own expressions, with the
literature's symbols; prose comes from fixed templates keyed by the method that produced each map
(``Kernel.methods``). Displays that can be read back by a machine are tagged by a comment on the line before:

    % symfield-check: NAME   the display "LHS = RHS [= RHS2]" equals the quantity NAME
                             (V, C, mean, dpsi2, dC, dV, chi1, eoc_h, eoc_sw, eoc_sw0,
                             qgrowth_sw, gamma2, igb_gamma, igb_c, igb_pdf)
    % symfield-def: SYMBOL   the display "SYMBOL = RHS" defines a symbol used by checked displays

Gaussian integrals are written with the measure Dz = dz e^{-z^2/2}/sqrt(2 pi) over the real line.
Output is byte-stable: no dates or versions, fixed orderings, numbers to 6 significant digits.
"""
from __future__ import annotations

from symfield.core.errors import InvalidValue, Unsupported
import contextvars
import re
from typing import Literal

import sympy as sp
from sympy.printing.latex import LatexPrinter

from symfield.symbolic import gaussian as G
from symfield.symbolic.activation import Activation, activation, is_monotone
from symfield.symbolic.distance import SinMinusTCos, distance
from symfield.symbolic.formula import X as x
from symfield.symbolic.integrals import GaussianIntegral, Kind
from symfield.symbolic.kernel import kernel
from symfield.theory.eoc import eoc
from symfield.theory.maps import map_value

q, q1, q2, q12 = G.q, G.q1, G.q2, G.q12
z, z1, z2 = G.z, G.z1, G.z2
c = sp.Symbol("c", real=True)
theta = sp.Symbol("theta", nonnegative=True)
u, v = sp.symbols("u v", real=True)
m_ = sp.Symbol("m", real=True)
sw = sp.Symbol("sigma_w", positive=True)
sb2 = sp.Symbol("sigma_b2", nonnegative=True)
gam = sp.Symbol("gamma", positive=True)
g_ = sp.Symbol("g", positive=True)
qaa, qab = sp.symbols("q_aa q_ab", positive=True)
qstar = sp.Symbol("q_star", positive=True)

NAMES = {q: "q", q1: "q_{1}", q2: "q_{2}", q12: "q_{12}", z1: "z_{1}", z2: "z_{2}", theta: r"\theta",
         sw: r"\sigma_{w}", sb2: r"\sigma_{b}^{2}", gam: r"\gamma", qaa: "q_{aa}", qab: "q_{ab}",
         qstar: "q^{*}"}
WIDTH = 62          # display width budget in printed characters (a4, 2cm margins, 10pt)
SB2_TABLE = (0.0, 0.05, 0.1, 0.2)


class _Printer(LatexPrinter):
    """LaTeX with the literature's notation: Gaussian measures Dz, Theta for the step, Phi for the
    normal CDF, full inverse-trig names, ln."""

    def __init__(self):
        super().__init__(dict(symbol_names=NAMES, inv_trig_style="full", ln_notation=True))

    def _print_Integral(self, expr):
        lims = expr.limits
        gauss = all(len(L) == 3 and L[1] == -sp.oo and L[2] == sp.oo for L in lims)
        body = expr.function
        if gauss:
            w = sp.Mul(*[G.normal_pdf(L[0]) for L in lims])
            rest = sp.powsimp(body / w)
            if all(body.has(sp.exp(-L[0] ** 2 / 2)) and not rest.has(sp.exp(L[0] ** 2 / 2)) for L in lims):
                meas = r"\, ".join(r"\mathcal{D}" + self._print(L[0]) for L in lims)
                inner = self._print(rest)
                if isinstance(rest, sp.Add):
                    inner = r"\left[" + inner + r"\right]"
                return r"\int " + meas + r"\; " + inner
        return super()._print_Integral(expr)

    def _print_Heaviside(self, expr, exp=None):
        tex = r"\Theta\left(" + self._print(expr.args[0]) + r"\right)"
        return tex if exp is None else tex + "^{" + exp + "}"

    def _print_atan2(self, expr, exp=None):
        tex = r"\operatorname{atan2}\left(" + self._print(expr.args[0]) + ", " + self._print(expr.args[1]) + r"\right)"
        return tex if exp is None else r"\left(" + tex + r"\right)^{" + exp + "}"


_PRINTER = _Printer()
_NCDF = sp.Function("Phi")


def tex(expr) -> str:
    """LaTeX of a SymPy expression in the document's notation."""
    return _PRINTER.doprint(sp.sympify(expr))


def _width(t: str) -> int:
    """Rough printed width of LaTeX math: a fraction counts its wider part, a command one character."""
    def frac(s):
        while (i := s.find("\\frac")) >= 0:
            a, j = _group(s, i + 5)
            b, k = _group(s, j)
            s = s[:i] + "x" * max(_width(a), _width(b)) + s[k:]
        return s
    t = frac(t)
    t = re.sub(r"\\(left|right|Bigl|Bigr|limits|operatorname|mathcal)\b", "", t)
    t = re.sub(r"\\[,;!]", "", t)
    t = re.sub(r"\\[a-zA-Z]+", "x", t)
    t = re.sub(r"[{}]", "", t)
    return len(t.replace(" ", ""))


def _group(s, i):
    """The brace group starting at s[i] ('{'): (content, index after it)."""
    assert s[i] == "{", s[i:i + 20]
    depth = 0
    for j in range(i, len(s)):
        depth += {"{": 1, "}": -1}.get(s[j], 0)
        if depth == 0:
            return s[i + 1:j], j + 1
    raise InvalidValue("unbalanced braces")


def _split(expr) -> list[str]:
    """LaTeX chunks of expr, one per display line, for multline when it is too wide: top-level
    terms of a sum (or of a fraction's numerator, written as 1/den [ ... ])."""
    if not expr.has(sp.Integral):  # the narrowest of a few equal forms
        forms = {tex(e): e for e in (expr, sp.together(expr), sp.factor(expr))}
        full = min(forms, key=lambda t: (_width(t), t))
        expr = forms[full]
    else:
        full = tex(expr)
    if _width(full) <= WIDTH:
        return [full]
    num, den = sp.fraction(expr)
    if isinstance(expr, sp.Add):
        pre, terms, post = "", expr.as_ordered_terms(), ""
    elif den != 1 and isinstance(sp.expand(num), sp.Add):
        pre, terms, post = r"\frac{1}{" + tex(den) + r"} \Bigl[", sp.expand(num).as_ordered_terms(), r"\Bigr]"
    else:
        return [full]
    lines, cur = [], pre
    for i, t in enumerate(terms):
        piece = tex(t)
        if i > 0:
            piece = ("- " + tex(-t)) if piece.startswith("-") else "+ " + piece
        if cur and _width(cur + piece) > WIDTH and cur != pre:
            lines.append(cur)
            cur = ""
        cur = (cur + " " + piece).strip()
    lines.append(cur + post)
    return lines


def _eq(lhs: str, rhs, tag: str | None = None, more=None, kind="check", fallback=None) -> list[str]:
    """A numbered display 'lhs = rhs [= more]' (multline when too wide), with its tag comment;
    ``fallback`` (LaTeX, untagged) replaces rhs when even the split lines stay too wide."""
    if tag and kind == "check" and not isinstance(rhs, str) and not _checkable(rhs):
        tag = None
    chunks = _split(rhs) if not isinstance(rhs, str) else [rhs]
    if fallback is not None and max(_width(ch) for ch in chunks) > 1.2 * WIDTH:
        chunks, tag = [fallback], None
    if more is not None:
        chunks[-1] += " = " + (more if isinstance(more, str) else tex(more))
    out = [f"% symfield-{kind}: {tag}"] if tag else []
    if len(chunks) == 1:
        return out + [r"\begin{equation}", f"{lhs} = {chunks[0]}", r"\end{equation}"]
    body = [f"{lhs} = {chunks[0]} \\\\"] + [f"  {ch} \\\\" for ch in chunks[1:-1]] + [f"  {chunks[-1]}"]
    return out + [r"\begin{multline}"] + body + [r"\end{multline}"]


def _plain(t: str) -> list[str]:
    return [r"\begin{equation*}", t, r"\end{equation*}"]


# ---------------------------------------------------------------- display forms of the maps
def _odd(I) -> bool:
    """Integrand odd under the joint sign flip of all integration variables (the integral is 0)."""
    vs = [L[0] for L in I.limits]
    f = I.function
    return sp.expand(f.xreplace({w: -w for w in vs}) + f) == 0  # conservative: no simplify


def _show_integrals(expr, *, parity=True):
    """Readable form of the unevaluated integrals in expr: the single-node 2-D defining integral as
    E[f(u) g(v)] over Dz1 Dz2 with u, v defined in the text; max-pool 1-D integrals with Phi;
    integrals of odd integrands replaced by 0 (parity)."""
    repl = {}
    for I in sorted(expr.atoms(sp.Integral), key=sp.default_sort_key):
        if parity and all(L[1] == -sp.oo and L[2] == sp.oo for L in I.limits) and _odd(I):
            repl[I] = sp.Integer(0)
            continue
        spec = I.integrand if isinstance(I, GaussianIntegral) else None
        kind = spec.kind if spec is not None else None
        if kind is Kind.NORMAL2:
            f, g = spec.f, spec.g
            body = f.subs(x, u) * g.subs(x, v) * G.normal_pdf(z1) * G.normal_pdf(z2)
            repl[I] = sp.Integral(body, (z1, -sp.oo, sp.oo), (z2, -sp.oo, sp.oo))
        elif kind in (Kind.MAX2, Kind.ARGMAX2):
            repl[I] = I.xreplace({q12: c * sp.sqrt(q1) * sp.sqrt(q2)})
        elif kind is Kind.MAX1:
            k, f, qq = spec.k, spec.f, I.scale()
            body = k * _NCDF(m_) ** (k - 1) * f.subs(x, sp.sqrt(qq) * m_) * G.normal_pdf(m_)
            repl[I] = sp.Integral(body, (m_, -sp.oo, sp.oo))
    return expr.xreplace(repl) if repl else expr


def _show_atan2(expr):
    """atan2(y, x) in the literature's forms: theta = arccos(q12/sqrt(q1 q2)) for the arc-cosine
    angle, arccos(x/sqrt(x^2 + y^2)) when y = sqrt(.) >= 0, arcsin(y/sqrt(x^2 + y^2)) when x = sqrt(.) > 0."""
    def rewrite(a):
        y, xx = a.args
        if y == sp.sqrt(q1 * q2 - q12**2) and xx == q12:
            return theta
        if isinstance(y, sp.Pow) and y.exp == sp.Rational(1, 2):
            return sp.acos(xx / sp.sqrt(sp.factor(xx**2 + y**2)))
        if isinstance(xx, sp.Pow) and xx.exp == sp.Rational(1, 2):
            return sp.asin(y / sp.sqrt(sp.factor(xx**2 + y**2)))
        return a
    return expr.replace(lambda e: isinstance(e, sp.atan2), rewrite)


def show(expr):
    """The display form of a map expression (mathematically equal to it)."""
    return _show_atan2(_show_integrals(sp.sympify(expr)))


# ---------------------------------------------------------------- method prose
def _how(method: str, two: bool = True) -> str:
    """One or two sentences saying how a map was obtained, from its method name (``two``: a
    two-input map)."""
    if method == "arccos" and not two:
        return ("The integrand is piecewise homogeneous, $f(x) = b x^n$ ($x > 0$), $a x^n$ ($x < 0$), so "
                "$\\E[f(u)] = q^{n/2}\\,(b + (-1)^n a)\\,\\E[z^n; z > 0]$ with "
                "$\\E[z^n; z > 0] = 2^{n/2 - 1}\\Gamma(\\tfrac{n+1}{2})/\\sqrt{\\pi}$.")
    table = [
        ("arccos", "The activation is piecewise homogeneous, $a\\min(x,0) + b\\max(x,0)$ (or its step derivative), "
                   "so the expectation is an arc-cosine kernel (Cho and Saul, 2009), written with "
                   "$S = \\sqrt{q_1 q_2 - q_{12}^2}$ and the angle $\\theta$ of eq.~\\eqref{eq:theta} "
                   "(computed as $\\operatorname{atan2}(S, q_{12})$, which stays accurate near $c = 1$)."),
        ("basis", "The activation is a linear combination of $x^m e^{\\alpha x}$, $\\operatorname{erf}(bx)$ and "
                  "$e^{-a x^2}$; each pair of terms has a tabulated Gaussian expectation (derivatives of the "
                  "moment generating function $e^{(s^2 q_1 + 2 s t q_{12} + t^2 q_2)/2}$, the arcsine kernel of "
                  "$\\operatorname{erf}$, Gaussian bumps), and the result is simplified by SymPy."),
        ("stein", "The integrand is a sum of $x^m e^{-a x^2} \\prod_i \\operatorname{erf}(b_i x)$; Gaussian "
                  "reweighting $\\E_q[F e^{-a x^2}] = \\E_{q'}[F]/\\sqrt{1 + 2 a q}$, $q' = q/(1 + 2aq)$, and Stein's "
                  "lemma $\\E[x F(x)] = q\\,\\E[F'(x)]$ reduce it to Gaussian moments and the arcsine kernel."),
        ("halfline", "The activation is piecewise with a kink at $0$ and pieces of the form $x^m e^{\\alpha x}$; each "
                     "half line is integrated with the half-line moment generating function "
                     "$e^{s^2 q/2}\\operatorname{erfc}(\\mp s\\sqrt{q/2})/2$."),
        ("integrate", "SymPy's \\texttt{integrate} evaluated the defining integral in closed form "
                      "(the result is checked numerically)."),
        ("integral (order statistic h_k)", "No closed form was found. The order-statistic reduction of "
                                           "Section~\\ref{sec:pool} leaves the two-dimensional integral against "
                                           "$h_k$, evaluated by deterministic quadrature."),
        ("integral (argmax term", "No closed form was found. By Price's theorem only the node that is the "
                                  "argmax of both $u$ and $v$ contributes, which leaves a two-dimensional "
                                  "integral against $a_k = k F^{k-1}\\rho_c$, evaluated by quadrature."),
        ("integral (order statistic)", "No closed form was found. The reduction to the maximum $M_k$ "
                                       "(Section~\\ref{sec:pool}) leaves a one-dimensional integral against its "
                                       "density, evaluated by quadrature."),
        ("integral", "No closed form was found (SymPy's tables, the Stein reduction and \\texttt{integrate} "
                     "all fail), so the defining Gaussian integral is kept as it is and evaluated numerically "
                     "(Section~\\ref{sec:numerics})."),
        ("d/dq of V", "Differentiating the closed form of $V$ (Gaussian integration by parts gives "
                      "$V'(q) = \\E[\\phi'^2 + \\phi\\phi'']$)."),
        ("d/dq12 of C", "Differentiating the closed form of $C$ in $q_{12}$ (Price's theorem: "
                        "$\\partial C/\\partial q_{12} = \\E[\\phi'(u)\\phi'(v)]$)."),
        ("avg-pool identity", "The average-pool moment identities of Section~\\ref{sec:pool} applied to the "
                              "single-node maps."),
        ("even identity E f(M_2) = E f(z)", "For $k = 2$ and an even integrand $f$, $\\E f(M_2) = \\E f(z)$ "
                                            "($\\max$ and $\\min$ of two standard normals have the same "
                                            "absolute value), so the single-node expectation applies."),
        ("M_k moments", "The integrand is piecewise homogeneous, $f(x) = b x^n$ ($x > 0$), $a x^n$ ($x < 0$); the "
                        "half-line moments of $M_k$ are known exactly."),
        ("k=2 split", "For $k = 2$, $\\E f(M_2) = \\E f_{\\mathrm{even}}(z) + \\E[f_{\\mathrm{odd}}(\\sqrt{q} z)"
                      "\\operatorname{erf}(z/\\sqrt{2})]$ and both parts have closed forms."),
        ("mean + |diff|", "For a linear $\\phi$ and $k = 2$, $\\max(u_1, u_2) = (u_1 + u_2)/2 + |u_1 - u_2|/2$; "
                          "the two halves are independent with covariance $\\Sigma/2$, which gives the absolute-value "
                          "arc-cosine kernel."),
        ("E[x phi phi'(sqrt(q) M_k)]/q", "Gaussian integration by parts along the maximum: "
                                        "$V'(q) = \\E[(x\\phi\\phi')(\\sqrt{q} M_k)]/q$."),
    ]
    for key, text in table:  # names that contain parentheses themselves
        if "(" in key and method.startswith(key):
            rest = method[len(key):].strip()
            inner = rest[1:-1] if rest.startswith("(") and rest.endswith(")") else ""
            return text + (f" The single-node expectation: {_how(inner, two)}" if inner else "")
    inner = ""
    mm = re.match(r"^(.*?)\s*\((.*)\)$", method)
    if mm:
        method, inner = mm.group(1), mm.group(2)
    if method.startswith(("d/dq of V", "d/dq12 of C")):
        inner = ""  # V and C were described where they were derived
    sub = f" The single-node map: {_how(inner, two)}" if inner else ""
    for key, text in table:
        if method.startswith(key):
            return text + sub
    if method.startswith("generalised order statistics"):
        return ("$\\phi$ is not monotone, so the maximum is taken over the values $Y_j = \\phi(u_j)$: the node "
                "that attains it has density $k\\,F_Y(\\phi(u))^{k-1} n(u)$ ($F_Y$ the distribution function of "
                "$\\phi(u)$), which reduces the $2k$-dimensional defining integral to one (two for $C$) "
                f"dimensions, evaluated by quadrature (\\texttt{{{_tt(method)}}}).")
    if "dimensional integral" in method:
        return ("The activation is not monotone, so $\\max_j \\phi(u_j) \\ne \\phi(\\max_j u_j)$ and there is no "
                "order-statistic reduction: the defining $2k$-dimensional integral is kept and evaluated by "
                "quadrature (implemented for $k = 2$)." + sub)
    return f"Method: \\texttt{{{_tt(method)}}}." + sub


def _tt(s: str) -> str:
    return s.replace("\\", "\\textbackslash{}").replace("_", "\\_").replace("&", "\\&").replace("%", "\\%") \
        .replace("#", "\\#").replace("$", "\\$").replace("{", "\\{").replace("}", "\\}").replace("^", "\\^{}")


def _num(v) -> str:
    """A float to 6 significant digits, as LaTeX."""
    s = f"{float(v):.6g}"
    if "e" in s:
        mant, ex = s.split("e")
        return f"{mant} \\times 10^{{{int(ex)}}}"
    return s


# ---------------------------------------------------------------- the document
def derive(act: str | Activation, pool: Literal["max", "avg"] | None = None, k: int = 2,
           norm: bool = False) -> str:
    """A complete, compilable LaTeX document deriving the mean-field theory of ``act`` step by step.

    Parameters
    ----------
    act : str or Activation
        Anything :func:`symfield.activation` accepts.
    pool : {'max', 'avg'}, optional
        Pool over ``k`` nodes, as in :func:`symfield.activation`.
    k : int
        Pool size.
    norm : bool
        Add a section on LayerNorm and BatchNorm (docs/theory.md section 12).

    Returns
    -------
    str
        The LaTeX source (deterministic).

    Examples
    --------
    >>> sf.derive("relu").splitlines()[0][1:]
    'documentclass[10pt]{article}'
    """
    if pool is not None or not isinstance(act, Activation):
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            act = activation(act, pool=pool, k=k) if pool is not None else activation(act)
    K = kernel(act)
    _SAID.set(set())
    parts = [_preamble(act), _conventions(act), _activation_section(act, K)]
    if act.pool is not None and act.k > 1:
        parts.append(_pool_section(act))
    parts += [_variance(K), _mean(K), _covariance(K), _distance(K), _slopes(K), _eoc(K), _depth(K), _igb(K)]
    if norm:
        parts.append(_norm_section(K))
    parts += [_numerics(K), [r"\end{document}", ""]]
    return "\n".join(line for part in parts for line in part)


def _title(act) -> str:
    phi = f"$\\phi(x) = {tex(act.expr)}$"
    if act.pool is None or act.k == 1:
        return f"Mean-field theory of {phi}"
    kind = "max" if act.pool == "max" else "average"
    return f"Mean-field theory of {phi} with {kind}-pooling over $k = {act.k}$ nodes"


def _preamble(act):
    from symfield.core.version import __version__
    return [r"\documentclass[10pt]{article}",
            f"% generated by symfield {__version__}: sf.derive({act.name!r}) (deterministic: no time stamp, so "
            "the file regenerates byte for byte)",
            r"\usepackage[a4paper,margin=2cm]{geometry}",
            r"\usepackage{amsmath,amssymb}",
            r"\allowdisplaybreaks",
            r"\emergencystretch=2em",
            r"\newcommand{\E}{\mathbb{E}}",
            f"\\title{{{_title(act)}}}",
            r"\author{Derivation generated by \texttt{symfield} (\texttt{sf.derive})}",
            r"\date{}",
            r"\begin{document}",
            r"\maketitle",
            r"\noindent Activation: \texttt{" + _tt(act.name) + r"}. Every formula below is printed from the "
            r"SymPy expressions that \texttt{symfield} derives and evaluates; equations marked in the source with "
            r"\texttt{symfield-check} are parsed back and compared with the package's numbers by its test suite.",
            ""]


def _conventions(act):
    pooled = act.pool is not None and act.k > 1
    out = [r"\section{Network and conventions}",
           r"A fully connected network of width $N \to \infty$ with pre-activations",
           *_plain(r"h^{(l)}_i(x) = \sum_j W^{(l)}_{ij}\, y^{(l-1)}_j(x) + b^{(l)}_i, \qquad "
                   r"W_{ij} \sim \mathcal{N}(0, \sigma_w^2/N), \quad b_i \sim \mathcal{N}(0, \sigma_b^2),"),
           r"where $\sigma_w^2$ and $\sigma_b^2$ are variances. Inputs are normalised and uncorrelated, "
           r"$q^{(0)}_{aa} = 1$, $q^{(0)}_{ab} = 0$, and the first layer is linear: "
           r"$q^{(1)} = \sigma_w^2 q^{(0)} + \sigma_b^2$. "]
    if pooled:
        op = r"\max_{j} \phi(h_j)" if act.pool == "max" else r"\frac{1}{k}\sum_{j} \phi(h_j)"
        out.append(f"Each unit is a multi-node activation $y = \\psi(h_1, \\dots, h_k) = {op}$ with $k = {act.k}$, "
                   r"the $h_j$ being independent pre-activations of the same input (different rows of $W$).")
    else:
        out.append(r"Each unit applies the activation, $y = \psi(h) = \phi(h)$.")
    out += ["",
            r"Gaussian expectations are written with the standard normal measure "
            r"$\mathcal{D}z = e^{-z^2/2}\,dz/\sqrt{2\pi}$ over the real line. For two inputs with covariance "
            r"$\begin{pmatrix} q_1 & q_{12} \\ q_{12} & q_2 \end{pmatrix}$ the standard construction is",
            "% symfield-def: c",
            r"\begin{equation}", r"c = \frac{q_{12}}{\sqrt{q_{1} q_{2}}}", r"\end{equation}",
            "% symfield-def: u",
            r"\begin{equation}", r"u = \sqrt{q_{1}} z_{1}", r"\end{equation}",
            "% symfield-def: v",
            r"\begin{equation}", r"v = \sqrt{q_{2}} \left(c z_{1} + \sqrt{1 - c^{2}} z_{2}\right)", r"\end{equation}",
            r"with $z_1, z_2$ independent standard normal, and the angle",
            "% symfield-def: theta",
            r"\begin{equation}\label{eq:theta}", r"\theta = \arccos{\left(\frac{q_{12}}{\sqrt{q_{1} q_{2}}} \right)}",
            r"\end{equation}",
            r"($0 \le \theta \le \pi$). The maps that the recursion needs are",
            *_plain(r"V(q) = \E[\psi(u)^2], \quad C(q_1, q_2, q_{12}) = \E[\psi(u)\psi(v)], \quad "
                    r"\E[\psi](q), \quad \E[\psi'^2](q) = \E\Big[\sum_j (\partial_{u_j}\psi)^2\Big],"),
            r"with $u \sim \mathcal{N}(0, q)$ (per node) in the one-input maps, and the layer recursion is",
            *_plain(r"q^{(l+1)} = \sigma_w^2\, V(q^{(l)}) + \sigma_b^2, \qquad "
                    r"q^{(l+1)}_{12} = \sigma_w^2\, C(q^{(l)}_1, q^{(l)}_2, q^{(l)}_{12}) + \sigma_b^2."),
            ""]
    return out


def _activation_section(act, K):
    phi = act.expr
    d1 = sp.diff(phi, x)
    out = [r"\section{The activation}", *_plain(f"\\phi(x) = {tex(phi)}, \\qquad \\phi'(x) = {tex(d1)}.")]
    notes = []
    if K.kinks:
        pts = ", ".join(_num(p) for p in K.kinks)
        notes.append(f"$\\phi$ is not differentiable at $x \\in \\{{{pts}\\}}$; $\\phi'$ is its derivative almost "
                     r"everywhere, which is all the Gaussian expectations below need (a kink has measure zero), "
                     r"while $\phi''$ carries a Dirac mass there.")
    else:
        notes.append(r"$\phi$ is smooth on the real line.")
    if sp.simplify(phi + phi.subs(x, -x)) == 0:
        notes.append(r"$\phi$ is odd, so every Gaussian integral of an odd integrand below vanishes; in particular "
                     r"$\E[\phi] = 0$.")
    elif sp.simplify(phi - phi.subs(x, -x)) == 0:
        notes.append(r"$\phi$ is even.")
    notes.append(r"$\phi$ is monotone non-decreasing." if is_monotone(phi) else r"$\phi$ is not monotone.")
    notes.append(r"Its Gaussian moments are finite for every $q$: $\log|\phi(x)|$ and $\log|\phi'(x)|$ grow more "
                 r"slowly than $x^2$ (checked when the activation was built).")
    return out + [" ".join(notes), ""]


def _pool_section(act):
    k = act.k
    out = [r"\section{Pooling over $k = " + str(k) + r"$ nodes}\label{sec:pool}"]
    if act.pool == "avg":
        out += [r"For $\psi = \frac{1}{k}\sum_j \phi(u_j)$ with independent nodes, expanding the square and the "
                r"product and using independence across nodes gives the moment identities",
                *_plain(r"\E[\psi^2] = \frac{1}{k}\E[\phi^2] + \Big(1 - \frac{1}{k}\Big)\E[\phi]^2, \quad "
                        r"\E[\psi(u)\psi(v)] = \frac{1}{k} C_\phi + \Big(1 - \frac{1}{k}\Big)\E[\phi(u)]\,\E[\phi(v)],"
                        r" \quad \E[\psi'^2] = \frac{1}{k}\E[\phi'^2]."),
                r"For odd $\phi$ the product of means vanishes, so every map equals the single-node map with "
                r"$\sigma_w^2/k$: the edge of chaos and the neutrality line move up by the factor $k$.", ""]
        return out
    if not is_monotone(act.expr):
        return out + [r"$\phi$ is not monotone, so $\max_j\phi(u_j) \neq \phi(\max_j u_j)$: there is no "
                      r"order-statistic reduction and every map keeps its $2k$-dimensional defining integral.", ""]
    out += [r"For monotone non-decreasing $\phi$, $\max_j \phi(u_j) = \phi(\max_j u_j)$. With $M_k$ the maximum of $k$ "
            r"independent standard normals, whose density is $k\, n(m)\, \Phi(m)^{k-1}$ ($n$ the standard normal "
            r"density, $\Phi$ its distribution function), the one-input maps reduce to one dimension:",
            *_plain(r"V(q) = \int \mathcal{D}m\; k\,\Phi(m)^{k-1} \phi(\sqrt{q}\,m)^2, \qquad "
                    r"\E[\psi'^2](q) = \int \mathcal{D}m\; k\,\Phi(m)^{k-1} \phi'(\sqrt{q}\,m)^2"),
            r"(the gradient flows through the argmax only). For two inputs the pair "
            r"$(S, T) = (\max_j u_j/\sqrt{q_1}, \max_j v_j/\sqrt{q_2})$ has joint distribution function $F(s,t)^k$, "
            r"$F$ the standard bivariate normal distribution function with correlation $c$, so the $2k$-dimensional "
            r"covariance integral reduces to two dimensions with the density",
            *_plain(r"h_k(s,t;c) = k F^{k-1} \rho_c(s,t) + k(k-1) F^{k-2} F_s F_t, \quad "
                    r"F_s = n(s)\, \Phi\Big(\frac{t - cs}{\sqrt{1-c^2}}\Big), \quad "
                    r"F_t = n(t)\, \Phi\Big(\frac{s - ct}{\sqrt{1-c^2}}\Big),"),
            r"$\rho_c$ the bivariate normal density, and $C = \iint \phi(\sqrt{q_1}s)\phi(\sqrt{q_2}t)\,h_k\,ds\,dt$. "
            r"By Price's theorem the slope $\partial C/\partial q_{12}$ only sees the node that is the argmax "
            r"for both inputs: $a_k(s,t;c) = k F^{k-1}\rho_c(s,t)$.", ""]
    return out


_SAID: contextvars.ContextVar = contextvars.ContextVar("said")


def _map_block(K, name, lhs, intro):
    expr = K[name]
    how = _how(K.methods[name], name in ("C", "dC"))
    said = _SAID.get()
    out = [intro, "Obtained in the same way as above." if how in said else how]
    said.add(how)
    shown = show(expr)
    if shown != expr and expr.has(sp.Integral) and not shown.has(sp.Integral):
        out.append(r"The remaining integrals have odd integrands and vanish.")
    out += _eq(lhs, shown, name)
    return out


def _checkable(expr) -> bool:
    """The display can be read back: Gaussian-measure integrals only, no symbolic densities (h_k, a_k,
    F_Y), no cases."""
    if expr.has(sp.Piecewise):
        return False
    undef = [f for f in expr.atoms(sp.core.function.AppliedUndef) if f.func != _NCDF]
    gauss = all(all(len(L) == 3 and L[1] == -sp.oo and L[2] == sp.oo for L in I.limits) and
                all(I.function.has(sp.exp(-L[0] ** 2 / 2)) for L in I.limits) for I in expr.atoms(sp.Integral))
    return not undef and gauss


def _variance(K):
    out = [r"\section{Variance map}",
           *_map_block(K, "V", "V(q)", r"The variance map is $V(q) = \E[\psi(u)^2]$, $u \sim \mathcal{N}(0, q)$."),
           r"so that $q^{(l+1)} = \sigma_w^2 V(q^{(l)}) + \sigma_b^2$; its fixed point $q^*$ solves "
           r"$q^* = \sigma_w^2 V(q^*) + \sigma_b^2$.", ""]
    return out


def _mean(K):
    out = [r"\section{Mean activation}",
           *_map_block(K, "mean", r"\E[\psi](q)", r"The mean $\E[\psi(u)]$ enters the covariance at $c = 0$ and "
                                                  r"decides whether a layer creates drift (Section~\ref{sec:igb})."),
           ""]
    return out


def _covariance(K):
    out = [r"\section{Covariance map}",
           *_map_block(K, "C", r"C(q_{1}, q_{2}, q_{12})", r"The covariance map is $C = \E[\psi(u)\psi(v)]$ with "
                                                             r"$u, v$ of the standard construction."),
           r"Two exact special cases hold and are tested: $C(q, q, q) = V(q)$ and "
           r"$C(q_1, q_2, 0) = \E[\psi](q_1)\,\E[\psi](q_2)$. The correlation $c^{(l)} = q^{(l)}_{12}/q^{(l)}$ "
           r"then follows the $c$-map at the variance fixed point,",
           *_plain(r"c^{(l+1)} = \frac{\sigma_w^2\, C(q^*, q^*, c^{(l)} q^*) + \sigma_b^2}{q^*},"),
           r"started from $c^{(1)} = \sigma_b^2/(\sigma_w^2 + \sigma_b^2)$; its stable fixed point is $c^*$.", ""]
    return out


def _distance(K):
    """The distance map D(q, d) = E[(psi(u) - psi(v))^2] at equal norms, in its cancellation-free form."""
    D = distance(K)
    out = [r"\section{Distance map}",
           r"The squared distance of two inputs' pre-activations, $d = q_{aa} + q_{bb} - 2 q_{ab}$, has its own map "
           r"$d^{(l+1)} = \sigma_w^2 D(q^{(l)}, d^{(l)})$ with $D = \E[(\psi(u) - \psi(v))^2] = 2V(q) - 2C(q, q, q - d/2)$ "
           r"at equal norms: the bias cancels, and $D = d\,\E[\psi'^2] + O(d^2)$ as $d \to 0$, so "
           r"$\gamma = 2 q_{ab}/d$ and $1 - c = d/(2q)$ keep their relative accuracy at any depth."]
    if D.stable:
        out += [f"Written without the cancellation of $2V - 2C$ ({_tt(D.method)}"
                + (r"; $W(t) = \sin t - t\cos t = t^3/3 - t^5/30 + \dots$" if D.near_eq.has(SinMinusTCos) else "")
                + r"), for $d \le q$:", *_eq("D(q, d)", D.near_eq, None)]
    elif K.closed_form:
        out += [r"No cancellation-free form was found: $D$ is evaluated as the plain difference $2V - 2C$, which "
                r"loses digits as $c \to 1$ (the numerics say so)."]
    else:
        out += [r"There is no closed form; for small $d$, with $u, v = m \pm \delta/2$ ($m$ and $\delta$ independent "
                r"Gaussians of variances $q - d/4$ and $d$), $D = d\,\E_w\big[w^2\,\E_m[(\int_{-1/2}^{1/2} "
                r"\psi'(m + t\sqrt{d}\,w)\,dt)^2]\big]$ needs $\psi'$ only; the tables tabulate $D/d$."]
    return out + [""]


def _slopes(K):
    out = [r"\section{Slopes: $\E[\psi'^2]$ and $\chi_1$}",
           *_map_block(K, "dpsi2", r"\E[\psi'^2](q)", r"The gradient factor needs $\E[\psi'^2](q) = "
                                                      r"\E[\sum_j (\partial_{u_j}\psi)^2]$, $u \sim \mathcal{N}(0, q)$."),
           r"By Price's theorem ($\partial_{q_{12}} \E[f(u)g(v)] = \E[f'(u)g'(v)]$ per node) the slope of the "
           r"covariance map at $c = 1$ is",
           *_eq(r"\chi_{1}", sw**2 * show(K.dpsi2), "chi1"),
           r"evaluated at $q = q^*$. It is both the slope of the $c$-map at $c = 1$ and the factor by which "
           r"squared gradients grow per layer on the way back.",
           *_map_block(K, "dC", r"\frac{\partial C}{\partial q_{12}}",
                       r"Away from $c = 1$ the $c$-map slope is $\sigma_w^2\,\partial C/\partial q_{12} = "
                       r"\sigma_w^2\,\E[\psi'(u)\psi'(v)]$:"),
           *_map_block(K, "dV", r"V'(q)", r"The slope of the variance map is $\sigma_w^2 V'(q)$, with "
                                          r"$V'(q) = \E[\phi'^2 + \phi\phi'']$ by Gaussian integration by parts:"),
           ""]
    return out


def _norm_section(K):
    """LayerNorm and BatchNorm maps of K (docs/theory.md section 12), with K's closed forms at q = 1."""
    V1, d1, m1 = (K[n].subs(q, 1) for n in ("V", "dpsi2", "mean"))
    V1, d1, m1 = (e if e.has(sp.Integral) else sp.simplify(e) for e in (V1, d1, m1))
    ratio = d1 - V1 if d1.has(sp.Integral) or V1.has(sp.Integral) else sp.simplify(d1 - V1)
    out = [r"\section{Normalisation layers}",
           r"Blocks are $[\mathrm{norm}] \to \phi \to [\mathrm{norm}] \to W\cdot + b$, without learned scale "
           r"or shift. \emph{LayerNorm before $\phi$} divides each sample's pre-activations by their root mean "
           r"square (their mean over units vanishes at infinite width), so every sample enters $\psi$ at "
           r"variance 1:",
           *_plain(r"q' = \sigma_w^2 V(1) + \sigma_b^2, \qquad q_{12}' = \sigma_w^2 C(1, 1, c) + \sigma_b^2, \qquad "
                   r"\chi_1 = \frac{\sigma_w^2\,\E[\psi'^2](1)}{\sigma_w^2 V(1) + \sigma_b^2},"),
           r"with, for this activation,",
           *_plain(f"V(1) = {tex(V1)}, \\qquad \\E[\\psi'^2](1) = {tex(d1)}."),
           r"The phase depends on $\sigma_b^2/\sigma_w^2$ only; the edge of chaos is the ray",
           *_plain(f"\\frac{{\\sigma_b^2}}{{\\sigma_w^2}} = \\E[\\psi'^2](1) - V(1) = {tex(ratio)}."),
           r"\emph{LayerNorm after $\phi$} centres and scales $\psi$ over units, $m = \E[\psi](q)$, "
           r"$s^2 = V(q) - m^2$, here $\E[\psi](1) = " + tex(m1) + r"$:",
           *_plain(r"q' = \sigma_w^2 + \sigma_b^2, \qquad q_{12}' = \sigma_w^2\,\frac{C - m_a m_b}{s_a s_b} + "
                   r"\sigma_b^2, \qquad 1 - \hat c = \frac{\E[(\psi(u) - \psi(v))^2]}{2\,\mathrm{Var}\,\psi},"),
           *_plain(r"\chi_1 = \sigma_w^2\,\E[\psi'^2](q^*)/\mathrm{Var}\,\psi(q^*), \qquad q^* = \sigma_w^2 + "
                   r"\sigma_b^2."),
           r"\emph{BatchNorm} over an equicorrelated batch of $B$ samples maps each unit onto the sphere of radius "
           r"$\sqrt{B}$ in the complement of $(1, \dots, 1)$, uniformly; before $\phi$ the gradient grows per "
           r"layer by",
           *_plain(r"\lambda_B = \frac{(B-1)\E d^2 + \E d_1 d_2 - \E d^2 x^2 + \E d_1 x_1 d_2 x_2}"
                   r"{(B-3)(G_d - G_{od})} \;\xrightarrow{B\to\infty}\; \frac{\E[\phi'^2]}{\mathrm{Var}\,\phi} = "
                   + (tex(sp.simplify(d1 / (V1 - m1 ** 2))) if not (d1.has(sp.Integral) or V1.has(sp.Integral)
                                                                   or m1.has(sp.Integral))
                      else r"\frac{\E[\psi'^2](1)}{V(1) - \E[\psi](1)^2}") + r","),
           r"$d = \phi'(x)$, $G_d = \E\phi(x_1)^2$, $G_{od} = \E\phi(x_1)\phi(x_2)$ on that sphere; after $\phi$ "
           r"the batch Gram matrix is $q^* = \sigma_w^2 + \sigma_b^2$, $q_{ab}^* = \sigma_b^2 - \sigma_w^2/(B-1)$.", ""]
    return out


def homogeneous(K) -> bool:
    """psi positively homogeneous of degree one (phi = a min(x,0) + b max(x,0), and its pools)."""
    return K.degree_one and not K.V.has(sp.Integral) and not K.dpsi2.has(sp.Integral)


def _at0(expr):
    """lim_{q -> 0+} of a one-input map: the limit of the closed form, or the integrand at q = 0
    integrated (None when SymPy cannot finish)."""
    if not expr.has(sp.Integral):
        return sp.simplify(sp.limit(expr, q, 0, "+"))
    at0 = expr.replace(lambda e: isinstance(e, sp.Integral),
                       lambda I: sp.Integral(I.function.subs(q, 0), *I.limits).doit())
    at0 = sp.simplify(at0)
    return None if at0.has(sp.Integral) or at0.free_symbols else at0


def _eoc(K):
    out = [r"\section{Fixed points and the edge of chaos}",
           r"The edge of chaos (EOC) is where $\chi_1(q^*) = 1$ together with the variance fixed-point equation. "
           r"Substituting $\sigma_w^2 = 1/\E[\psi'^2](q^*)$ into $q^* = \sigma_w^2 V(q^*) + \sigma_b^2$ eliminates "
           r"$\sigma_w^2$:",
           *_plain(r"q^* = \frac{V(q^*)}{\E[\psi'^2](q^*)} + \sigma_b^2, \qquad \sigma_w^2 = \frac{1}{\E[\psi'^2](q^*)}."),
           r"The first equation is solved for $q^*$ by a bracketing root finder (iterating the map would stall "
           r"near $q^* = 0$)."]
    if homogeneous(K):
        d, V1 = sp.simplify(K.dpsi2), sp.simplify(K.V.subs(q, 1))
        out += [r"Here $\psi$ is positively homogeneous of degree one, so $V(q) = V(1)\,q$ and $\E[\psi'^2]$ does "
                r"not depend on $q$. Hence $\chi_1 = \sigma_w^2\E[\psi'^2]$ is the same at every $q$ and equals 1 at",
                *_eq(r"\sigma_{w}^{2}", 1 / d, "eoc_sw0"),
                r"while at $\sigma_b^2 = 0$ the variance changes by the factor $\sigma_w^2 V(q)/q = \sigma_w^2 V(1)$ per "
                r"layer, which equals 1 at the variance criterion",
                *_eq(r"\sigma_{w}^{2}", 1 / V1, "qgrowth_sw")]
        if sp.simplify(V1 - d) == 0:
            out += [r"The two coincide, so the edge of chaos is the vertical line with this $\sigma_w^2$ at every "
                    r"$\sigma_b^2$. For $\sigma_b^2 > 0$ the variance fixed point is infinite there: $q^*$ diverges "
                    r"exactly where $\chi_1$ reaches 1 (the eliminated equation reads $q^* = q^* + \sigma_b^2$).", ""]
        else:
            rel = "<" if bool(sp.N(d - V1) < 0) else ">"
            out += [f"The two differ ($\\E[\\psi'^2] {rel} V(1)$): where gradients are preserved the variance "
                    r"is not, and the slope of the $c$-map at $c = 1$ at $\sigma_b^2 = 0$ is "
                    f"$\\chi_1/(\\sigma_w^2 V(1)) = \\E[\\psi'^2]/V(1) {rel} 1$ for every $\\sigma_w^2$. "
                    r"The edge of chaos is still the vertical line $\sigma_w^2 = 1/\E[\psi'^2]$; for $\sigma_b^2 > 0$ "
                    r"the eliminated equation $q = q\,V(1)/\E[\psi'^2] + \sigma_b^2$ has no finite root, so $q^*$ is "
                    r"infinite on it.", ""]
        return out
    if not K.V.has(sp.Integral) and not K.dpsi2.has(sp.Integral):
        h = sp.simplify(K.V / K.dpsi2).subs(q, qstar) + sb2
        w = sp.simplify(1 / K.dpsi2).subs(q, qstar)
        if len(_split(h)) == 1 and len(_split(w)) == 1:
            out += [r"With the closed forms above the eliminated equations read",
                    *_eq(r"q^{*}", h, "eoc_h"), *_eq(r"\sigma_{w}^{2}", w, "eoc_sw")]
        else:
            out.append(r"With the closed forms of $V$ and $\E[\psi'^2]$ above (too long to be worth "
                       r"expanding here) both equations are explicit in $q^*$.")
    else:
        out.append(r"Here $V$ or $\E[\psi'^2]$ is an integral, so $q^*$ is found numerically with both evaluated "
                   r"by quadrature.")
    d0, v0 = _at0(K.dpsi2), _at0(K.V)
    if v0 is not None and v0 != 0:
        out.append(r"Here $\psi(0) \neq 0$, so $V(0^+) > 0$ and $q = 0$ is not a fixed point: $\sigma_b^2 = 0$ is "
                   r"not special and the eliminated equation is solved as for $\sigma_b^2 > 0$.")
    else:
        out.append(r"At $\sigma_b^2 = 0$ the root is $q^* = 0$, and $\E[\psi'^2](0^+)$ gives the EOC exactly:")
        if d0 is not None and d0.is_positive:
            out += _eq(r"\sigma_{w}^{2}", 1 / d0, "eoc_sw0")
        elif d0 is not None and d0 == 0:
            out.append(r"here $\E[\psi'^2](0^+) = 0$ ($\phi'(0) = 0$), so there is no edge of chaos at "
                       r"$\sigma_b^2 = 0$.")
    rows, unstable = [], False
    for b in SB2_TABLE:
        try:
            e = eoc(K.act, b)
            sw_, qs_ = float(e.sigma_w2), float(e.q_star)
            qe = max(qs_, 1e-12)  # re-check the point on the maps: chi1 = 1 and q* = sigma_w2 V(q*) + sigma_b2
            r1 = abs(sw_ * float(map_value(K.act, "dpsi2", qe)) - 1)
            r2 = abs(sw_ * float(map_value(K.act, "V", qe)) + b - qs_) / max(qs_, 1.0)
            if max(r1, r2) > 1e-8:
                rows.append(f"{_num(b)} & \\multicolumn{{2}}{{c}}{{not determined (inconsistent root)}} \\\\")
            elif float(e.q_slope) > 1:      # sigma_w2 V'(q*) > 1: q leaves q*, no network sits there
                unstable = True
                rows.append(f"{_num(b)} & {_num(sw_)} & {_num(qs_)}$^\\dagger$ \\\\")
            else:
                rows.append(f"{_num(b)} & {_num(sw_)} & {_num(qs_)} \\\\")
        except (ValueError, Unsupported):
            rows.append(f"{_num(b)} & \\multicolumn{{2}}{{c}}{{no edge of chaos}} \\\\")
        except (ArithmeticError, MemoryError):
            rows.append(f"{_num(b)} & \\multicolumn{{2}}{{c}}{{not determined}} \\\\")
    out += [r"Numerically (\texttt{sf.eoc}, float64, 6 significant digits):", r"\begin{center}",
            r"\begin{tabular}{ccc}", r"$\sigma_b^2$ & $\sigma_w^2$ & $q^*$ \\ \hline", *rows, r"\end{tabular}",
            r"\end{center}"]
    if unstable:
        out.append(r"$^\dagger$ An unstable fixed point, $\sigma_w^2 V'(q^*) > 1$: the recursion for $q$ moves away "
                   r"from it, so no deep network stays on this edge of chaos; the depth-$L$ edge of chaos "
                   r"(\texttt{sf.eoc\_depth}), where the product of $\chi_1$ over the layers is 1, applies instead.")
    out.append("")
    return out


def _depth(K):
    return [r"\section{Depth scales}",
            r"Linearising the recursions around the fixed points (Schoenholz et al., 2017) gives the depths over "
            r"which $q$ and $c$ approach $q^*$ and $c^*$:",
            *_plain(r"\xi_q^{-1} = -\ln\big[\sigma_w^2\, V'(q^*)\big], \qquad "
                    r"\xi_c^{-1} = -\ln\Big[\sigma_w^2\, \frac{\partial C}{\partial q_{12}}(q^*, q^*, c^* q^*)\Big],"),
            r"with $V'$ and $\partial C/\partial q_{12}$ as derived above. At $c^* = 1$ the argument of $\xi_c$ is "
            r"$\chi_1$, so $\xi_c$ diverges on the edge of chaos: where $q^*$ is a stable fixed point "
            r"($\sigma_w^2 V'(q^*) < 1$), signals (and gradients) propagate to any depth there.", ""]


def _igb(K):
    mean = show(K.mean)
    V = show(K.V)
    g2 = mean**2 / (V - mean**2)
    g2 = (g2 if g2.has(sp.Integral) else sp.simplify(g2)).subs(q, sw**2)
    out = [r"\section{Initial guessing bias}\label{sec:igb}",
           r"For a fixed network, each unit's pre-activation over the data is $\mathcal{N}(\mu_i, \sigma_y^2)$ and the "
           r"centres $\mu_i$ vary over initialisations with variance $\sigma_\mu^2$. The drift ratio "
           r"$\gamma = \sigma_\mu^2/\sigma_y^2$ follows from the mean-field kernel (infinite width, then infinite "
           r"data): $q_{aa} = \sigma_\mu^2 + \sigma_y^2$ and $q_{ab} = \sigma_\mu^2$, so",
           *_eq(r"\gamma", qab / (qaa - qab), "igb_gamma"),
           *_eq("c", gam / (1 + gam), "igb_c"),
           r"With a binary output, the fraction of inputs assigned to class 0 is $G_0 = \Phi(\sqrt{\gamma} Z)$, "
           r"$Z \sim \mathcal{N}(0,1)$, with density on $(0,1)$",
           *_eq("p(g)", sp.exp((1 - 1 / gam) * sp.erfinv(2 * g_ - 1) ** 2) / sp.sqrt(gam), "igb_pdf"),
           r"uniform exactly at $\gamma = 1$ ($c = 1/2$), peaked at $1/2$ for $\gamma < 1$ (neutrality) and pushing "
           r"its mass to $0$ and $1$ for $\gamma > 1$ (prejudice); $\E[G_0] = 1/2$ always. The phases follow from "
           r"$c^*$ and the slope $\chi_1$: $c^* = 1$ ($\gamma^* = \infty$) is ordered, edge-of-chaos or chaotic "
           r"deep prejudice for $\chi_1 <, =, > 1$; $1/2 < c^* < 1$ is prejudice; $c^* \le 1/2$ is neutrality.",
           "",
           r"\paragraph{Does one layer create drift?} With centred, uncorrelated inputs and $\sigma_b^2 = 0$, the first "
           r"layer gives $q^{(1)} = \sigma_w^2$, $q^{(1)}_{12} = 0$, and the second "
           r"$q^{(2)}_{12} = \sigma_w^2 C(q^{(1)}, q^{(1)}, 0) = \sigma_w^2\,\E[\psi](q^{(1)})^2$, so"]
    out += _eq(r"\gamma^{(2)}", g2, "gamma2",
               fallback=r"\frac{\E[\psi](\sigma_w^2)^2}{V(\sigma_w^2) - \E[\psi](\sigma_w^2)^2}")
    if mean == 0:
        out.append(r"which vanishes: $\E[\psi] = 0$, and this activation creates no drift from centred inputs.")
    else:
        out.append(r"which is positive: $\E[\psi] \ne 0$, so a single layer already creates drift.")
    return out + [""]


def _numerics(K):
    closed = [n for n in ("V", "C", "mean", "dpsi2", "dC", "dV") if not K[n].has(sp.Integral)]
    openm = [n for n in ("V", "C", "mean", "dpsi2", "dC", "dV") if K[n].has(sp.Integral)]
    names = {"V": "$V$", "C": "$C$", "mean": r"$\E[\psi]$", "dpsi2": r"$\E[\psi'^2]$", "dC": r"$\partial C/\partial q_{12}$",
             "dV": "$V'$"}
    out = [r"\section{How the numbers are computed}\label{sec:numerics}"]
    if closed:
        out.append("Closed forms (" + ", ".join(names[n] for n in closed) + r") are evaluated from the SymPy "
                   r"expressions (float64 with NumPy/SciPy, or with \texttt{dps=N} digits in mpmath), using "
                   r"$\operatorname{atan2}(S, q_{12})$ for $\theta$.")
    if openm:
        out.append("Integrals (" + ", ".join(names[n] for n in openm) + r") are evaluated by composite "
                   r"Gauss--Legendre quadrature on panels of one standard deviation over $\pm 12$ standard "
                   r"deviations, refined on an activation grid and at the kinks, with 12 nodes per panel in float64 "
                   r"(relative error below $10^{-10}$); with \texttt{dps=N} the same panels run in mpmath with "
                   r"error control. Two-dimensional integrals use the conditional form "
                   r"$v \mid u \sim \mathcal{N}(q_{12}u/q_1, (q_1 q_2 - q_{12}^2)/q_1)$.")
    return out + [""]
