"""Generated Numba code: the closed-form maps printed from SymPy, and the modules numba compiles.

The numeric grid layer is *printed* from the symbolic one (docs/numerics.md section 2): the SymPy
expressions of V(q), C(q1, q2, q12) and the distance map go through :class:`NumbaPrinter` into one-line
functions of a real ``.py`` file in the cache directory (``$SYMFIELD_CACHE/codegen``, else
``${XDG_CACHE_HOME:-~/.cache}/symfield/codegen``), followed by the fixed kernels of
:mod:`symfield.numeric.kernels` copied from their modules (the maps' dispatch, or the table maps, and the
recursion); numba compiles it with ``cache=True``. The generated code IS the formula. A file's name
carries a sha256 of its text (printed expressions, kernel sources, versions), it is written atomically and
never rewritten; before import its bytes are checked against that name and the very bytes checked are
compiled (a bad file is moved aside and rewritten). numba's own cache files are checked before numba
reads them (:mod:`symfield.numeric.numba_cache`). Only the functions of the printer's table are printable
(:data:`NumbaPrinter._kf`); anything else raises NotPrintable naming it. Square-root radicands are clamped
at 0 (on the maps' domain they are >= 0 exactly, so a negative value is rounding), the inverse tangent family
is printed as the branch-free helpers of :mod:`symfield.numeric.kernels.helpers` (loops over them vectorise), and
b^(k + 1/2) is printed as
b^k sqrt(b) (a few ulps, no pow call); q1 q2 - q12^2 is printed
as ``_gram_sqrt`` (no overflow for q up to ~1e308). This module never imports numba at import time.
"""
from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass
import inspect
import re
import sys
import types
from importlib import metadata
from pathlib import Path

import numpy as np
import sympy as sp
from sympy.codegen.cfunctions import expm1  # noqa: F401 (printed by name: expm1)
from sympy.printing.pycode import PythonCodePrinter

from symfield.core.errors import CacheError, InvalidValue, NotPrintable
from symfield.core.files import atomic_write, authenticate, cache_dir, quarantine
from symfield.core.version import __version__
from symfield.numeric import chebyshev as cheb
from symfield.numeric import numba_cache
from symfield.numeric.kernels import closed_maps, helpers, jit, layout, recursion, table_maps
from symfield.symbolic.distance import Distance, d as DD, distance, plain_distance
from symfield.symbolic.gaussian import q as Q, q1 as Q1, q2 as Q2, q12 as Q12

COMPILED = "# ---- compiled ----\n"
_GRAM = Q1 * Q2 - Q12**2
_ATOMS = (sp.Symbol, sp.Number, sp.NumberSymbol, sp.Add, sp.Mul, sp.Pow)


class NumbaPrinter(PythonCodePrinter):
    """Python/``math`` printer for numba's nopython mode: exactly the functions of :data:`_kf` are printable."""
    printmethod = "_numbacode"
    _kf = {"atan2": "_atan2", "atan": "_atan", "asin": "_asin", "acos": "_acos",
           "exp": "math.exp", "log": "math.log", "erf": "math.erf", "erfc": "math.erfc",
           "sin": "math.sin", "cos": "math.cos", "tan": "math.tan", "sinh": "math.sinh",
           "cosh": "math.cosh", "tanh": "math.tanh", "expm1": "math.expm1", "Abs": "abs",
           "Max": "max", "Min": "min", "SinMinusTCos": "_sin_minus_tcos"}

    def __init__(self, settings=None, gram="_gram_sqrt(q1, q2, q12)"):
        super().__init__(dict({"fully_qualified_modules": True, "standard": "python3"}, **(settings or {})))
        self.gram = gram     # how sqrt(q1 q2 - q12^2) is printed (a local of a joint function: "g")

    def _print_Pow(self, expr, rational=False):
        b, e = expr.as_base_exp()
        if e == sp.S.Half and sp.expand(b - _GRAM) == 0:
            return self.gram
        if e.is_Rational and not e.is_Integer and e.q == 2:
            base = f"max({self._print(b)}, 0.0)"
            root = f"math.sqrt({base})"
            if e == sp.S.Half:
                return root
            if e == -sp.S.Half:
                return f"(1.0/{root})"
            k = abs(e.p) // 2           # b^(k + 1/2) = b^k sqrt(b): a sqrt and k products, not a pow call
            half = f"({base}**{k}*{root})" if k > 1 else f"({base}*{root})"
            return half if e > 0 else f"(1.0/{half})"
        return super()._print_Pow(expr, rational=rational)

    def _print_Max(self, expr):
        return f"{self._kf['Max']}(" + ", ".join(f"float({self._print(a)})" for a in expr.args) + ")"

    def _print_Min(self, expr):
        return f"{self._kf['Min']}(" + ", ".join(f"float({self._print(a)})" for a in expr.args) + ")"

    def _print_SinMinusTCos(self, expr):
        return f"{self._kf['SinMinusTCos']}({self._print(expr.args[0])})"

    def _print_not_supported(self, expr):
        raise NotPrintable(f"the generated-code printer cannot print {expr}")


_SUPPORTED_TEXT = "+, -, *, /, powers, sqrt, pi, E, " + ", ".join(sorted(NumbaPrinter._kf))


def check_printable(expr: sp.Expr, what: str, args=()) -> None:
    """Raise NotPrintable naming the first construct outside the printer's table."""
    for node in sp.preorder_traversal(expr):
        if isinstance(node, sp.Integral):
            raise NotPrintable(
                f"{what} has no closed form (it contains an unevaluated Integral); generated code "
                f"needs closed-form maps. Supported: {_SUPPORTED_TEXT}.")
        if isinstance(node, sp.Symbol):
            if node not in args:
                raise NotPrintable(f"{what} contains the symbol {node}; only {', '.join(map(str, args))} may appear.")
            continue
        if isinstance(node, sp.Function):
            if type(node).__name__ not in NumbaPrinter._kf:
                name = getattr(node.func, "__name__", str(node.func))
                raise NotPrintable(
                    f"{what} contains the function '{name}', which the generated-code printer does not "
                    f"support. Supported: {_SUPPORTED_TEXT}.")
            continue
        if not isinstance(node, _ATOMS):
            raise NotPrintable(
                f"{what} contains '{type(node).__name__}' ({node}), which the generated-code printer does "
                f"not support. Supported: {_SUPPORTED_TEXT}.")


def stable_form(expr: sp.Expr) -> sp.Expr:
    """An exactly equal form that avoids overflow at large q: products of exponentials merged into one
    exponential of the summed exponent (sin/cos kernels: (exp(2 q12) - 1) exp(-q1/2 - q12 - q2/2) ->
    exp(q12 - ...) - exp(-q12 - ...)), so exp(2 q12) never overflows while the product is representable."""
    if expr.has(sp.exp):
        return sp.powsimp(sp.expand(expr), combine="exp")
    return expr


def print_map(expr: sp.Expr, what: str, args, gram="_gram_sqrt(q1, q2, q12)") -> str:
    expr = stable_form(sp.sympify(expr))
    check_printable(expr, what, args)
    return NumbaPrinter(gram=gram).doprint(expr)


_VECTOR_CALLS = {"math.sqrt", "abs", "max", "min", "float", "_atan2", "_atan", "_asin", "_acos", "_gram_sqrt"}


def _vectorises(code: str) -> bool:
    """Printed code whose calls all have a vector form (LLVM vectorises a loop of it): arithmetic, sqrt, abs, max,
    min, the branch-free inverse tangents and _gram_sqrt -- not exp, log, erf, sin, ... (scalar calls into libm)."""
    return set(re.findall(r"([\w.]+)\(", code)) <= _VECTOR_CALLS


def _printed(name: str, args, code: str) -> str:
    return f"@njit(inline=\"always\", **OPTS)\ndef {name}({', '.join(map(str, args))}):\n    return {code}\n"


def _printed_pair(name: str, args, first: sp.Expr, second: sp.Expr, what: str) -> str:
    """One function returning (first, second), each printed as by itself (the same numbers), ``second`` evaluated
    before ``first`` and sqrt(q1 q2 - q12^2) once: the compiled code computes the terms they share (an atan2,
    a sqrt) once, with no call in between that could stop LLVM from merging them."""
    forms = [print_map(e, what, args, gram="g") if e is not sp.nan else "math.nan" for e in (first, second)]
    gram = "    g = _gram_sqrt(q1, q2, q12)\n" if any("g" in re.findall(r"\b\w+\b", f) for f in forms) else ""
    return (f"@njit(inline=\"always\", **OPTS)\ndef {name}({', '.join(map(str, args))}):\n{gram}"
            f"    b = {forms[1]}\n    a = {forms[0]}\n    return a, b\n")


def kernel_source(module: types.ModuleType) -> str:
    """The part of a kernel module that generated modules copy: everything below its COMPILED line."""
    text = inspect.getsource(module)
    return text.split(COMPILED, 1)[1].strip("\n") + "\n"


def _versions() -> str:
    vs = [f"symfield {__version__}", f"sympy {sp.__version__}",
          f"python {sys.version_info.major}.{sys.version_info.minor}"]
    try:
        vs.append(f"numba {metadata.version('numba')}")
    except metadata.PackageNotFoundError:  # pragma: no cover
        vs.append("numba ?")
    return ", ".join(vs)


def _assemble(header: list, parts: list) -> str:
    prelude = ["import math", "", "import numpy as np", "from numba import njit, prange", "",
               f"OPTS = {jit.OPTS!r}"]
    return "\n".join(header) + "\n" + "\n".join(prelude) + "\n\n\n" + "\n\n".join(parts)


@dataclass(frozen=True)
class NtkMaps:
    """The NTK's maps of a closed-form kernel, to print (:mod:`symfield.numeric.kernels.closed_maps`, docs/theory.md
    section 13): P = E[psi'^2](q), T = dC/dq12 (q1, q2, q12), and dT = P - T at equal norms by ``mode``: "plain"
    (the difference), "price" (T2 = d(dC)/dq12 for d <= small max(q, 1)), "derivative" (the distance map of
    phi' in d, ``dt_eq`` (q, d), over ``div``, for c >= 1/2)."""
    P: sp.Expr
    T: sp.Expr
    mode: str = "plain"
    T2: sp.Expr | None = None
    dt_eq: sp.Expr | None = None
    div: int = 2
    small: float = 1e-4

    MODES = {"plain": 0, "price": 1, "derivative": 2}

    def printed(self, name: str) -> list:
        """The printed functions and constants (NotPrintable when a map is outside the printer's table)."""
        a3 = (Q1, Q2, Q12)
        nan = sp.nan
        forms = [("P_expr", (Q,), self.P), ("T_expr", a3, self.T),
                 ("T2_expr", a3, self.T2 if self.mode == "price" else nan),
                 ("DT_eq", (Q, DD), self.dt_eq if self.mode == "derivative" else nan)]
        consts = (f"NTK_MAPS = True\nDT_MODE = {self.MODES[self.mode]}\nDT_DIV = {float(self.div)!r}\n"
                  f"DT_SMALL = {float(self.small)!r}\n")
        return [consts] + [_printed(f, args, "math.nan" if e is nan else print_map(e, f"the NTK map {f} of {name}", args))
                           for f, args, e in forms]


def _ntk_stubs() -> list:
    """A module without the NTK: its maps return NaN (the recursion calls them only with ntk True)."""
    a3 = (Q1, Q2, Q12)
    return ["NTK_MAPS = False\nDT_MODE = 0\nDT_DIV = 2.0\nDT_SMALL = 0.0001\n"] + [
        _printed(f, args, "math.nan") for f, args in
        (("P_expr", (Q,)), ("T_expr", a3), ("T2_expr", a3), ("DT_eq", (Q, DD)))]


def module_source(name: str, V: sp.Expr, C: sp.Expr, dist: Distance | None = None, ntk: NtkMaps | None = None) -> str:
    """The complete text of the generated module of closed-form maps (byte-stable for equal input);
    D defaults to V + V - 2C; the NTK's maps when ``ntk`` is given, else NaN stand-ins."""
    dist = plain_distance(V, C) if dist is None else dist
    v_code = print_map(V, f"the map V of {name}", (Q,))
    printed = [f"MEMO_V = {not _vectorises(v_code)}   # V calls a function without a vector form: keep it per point\n",
               _printed("V_expr", (Q,), v_code),
               _printed("C_expr", (Q1, Q2, Q12), print_map(C, f"the map C of {name}", (Q1, Q2, Q12))),
               _printed("D_eq", (Q, DD), print_map(dist.near_eq, f"the map D of {name}", (Q, DD))),
               _printed("D_near", (Q1, Q2, DD), print_map(dist.near, f"the map D of {name}", (Q1, Q2, DD))),
               _printed("D_far", (Q1, Q2, Q12), print_map(dist.far, f"the map D of {name}", (Q1, Q2, Q12)))]
    printed += _ntk_stubs() if ntk is None else ntk.printed(name)
    t = sp.nan if ntk is None else ntk.T          # the joint forms of the NTK's path: (C, T) and (D, D[phi'])
    dt = ntk.dt_eq if ntk is not None and ntk.mode == "derivative" else sp.nan
    printed += [_printed_pair("CT_expr", (Q1, Q2, Q12), C, t, f"the maps C, T of {name}"),
                _printed_pair("DDT_eq", (Q, DD), dist.near_eq, dt, f"the maps D, D[phi'] of {name}")]
    # User text (the activation's name may be a raw formula, newlines and all) appears only as repr()
    # string literals, never in a comment or as code.
    header = ["# Generated by symfield.codegen from the symbolic kernel maps. Do not edit:",
              "# the file is keyed by a hash of its content and regenerated when anything changes.",
              f"ACTIVATION = {name!r}",
              f"VERSIONS = {_versions()!r}",
              f"V_TEXT = {sp.sstr(V)!r}                     # V(q)",
              f"C_TEXT = {sp.sstr(C)!r}                     # C(q1, q2, q12)",
              f"D_TEXT = {f'{sp.sstr(dist.near_eq)}   ({dist.method})'!r}   # D(q, d)"]
    return _assemble(header, [kernel_source(layout), kernel_source(helpers), *printed,
                              kernel_source(closed_maps), kernel_source(recursion)])


CHEB_SUMS = ("# ---- Chebyshev sums", "# ---- end of the Chebyshev sums\n")


def table_module_source() -> str:
    """The generated module whose V, C, D, in_domain read a packed table M (symfield.numeric.tables) at run
    time: table_maps with its Clenshaw loops replaced by the printed unrolled sums (same values, faster)."""
    header = ["# Generated by symfield.codegen: table-interpolated maps (symfield.numeric.kernels.table_maps)",
              "# and the recursion. Do not edit: the file is keyed by a hash of its content.",
              f"VERSIONS = {_versions()!r}"]
    maps_text = kernel_source(table_maps)
    a, b = maps_text.index(CHEB_SUMS[0]), maps_text.index(CHEB_SUMS[1]) + len(CHEB_SUMS[1])
    maps_text = maps_text[:a] + cheb.compiled_source(layout.NT) + maps_text[b:]
    return _assemble(header, [kernel_source(layout), maps_text, kernel_source(recursion)])


def write_source(slug: str, src: str) -> Path:
    """Write ``src`` as cache_dir()/sf_<slug>_<hash>.py (if absent, atomically); returns the path.
    A present file whose bytes differ from ``src`` (tampered, truncated, unreadable) is moved aside
    and rewritten."""
    data = src.encode("utf-8")
    digest = _digest(data)
    slug = re.sub(r"[^0-9A-Za-z]+", "_", slug).strip("_")[:40] or "act"
    path = cache_dir() / f"sf_{slug}_{digest}.py"
    _SOURCES[str(path)] = data
    if path.exists():
        try:
            if path.read_bytes() == data:
                return path
            why = "content does not match the sha256 in its name"
        except OSError as err:
            why = f"unreadable: {err}"
        quarantine(path, why)
        numba_cache.purge(path, None)
    return atomic_write(path, data)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:20]


_SOURCES: dict = {}  # path -> bytes written by write_source in this process (to rewrite a bad file)


def write(name: str, V: sp.Expr, C: sp.Expr, dist: Distance | None = None, ntk: NtkMaps | None = None) -> Path:
    """Generate (if absent) the module for these maps; returns its path. Never rewrites a file."""
    return write_source(name + ("_ntk" if ntk is not None else ""), module_source(name, V, C, dist, ntk))


_LOADED: dict = {}   # path -> module
_PATHS: dict = {}    # (name, V, C) -> path of the generated file


def _verified(path: Path) -> bytes:
    """The file's bytes after checking their sha256 against the digest in the name (sf_<slug>_<digest>.py,
    which write_source computed from the source it generated); a bad file is moved aside and rewritten
    from the source written by this process, else ValueError."""
    want = path.stem.rpartition("_")[2]
    try:
        data = path.read_bytes()
        authenticate(data, sha256=want, where="the sha256 in its name")
        return data
    except CacheError as err:
        why = str(err)
    except OSError as err:
        why = f"unreadable: {err}"
    src = _SOURCES.get(str(path))
    if src is None or _digest(src) != want:
        raise InvalidValue(f"generated module {path}: {why}; not imported (it is regenerated by codegen.write_source)")
    quarantine(path, why)
    numba_cache.purge(path, None)
    atomic_write(path, src)
    return src




def load_path(path: Path):
    """Import a generated module from its path (once per process): the checked bytes (:func:`_verified`) are
    compiled and executed, then every numba function of the module is guarded (:func:`symfield.numeric.numba_cache.guard`) before any
    is called, so numba reads none of its cache files unchecked."""
    path = Path(path)
    key = str(path)
    if key not in _LOADED:
        data = _verified(path)
        try:
            (path.parent / "__pycache__").mkdir(mode=0o700, exist_ok=True)    # numba's cache: private
        except OSError:
            pass
        modname = "symfield_generated_" + path.stem
        spec = importlib.util.spec_from_file_location(modname, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[modname] = module
        try:
            exec(compile(data, key, "exec"), module.__dict__)
            numba_cache.guard(module, path)
        except BaseException:
            sys.modules.pop(modname, None)
            raise
        _LOADED[key] = module
    return _LOADED[key]


def load(K, ntk: NtkMaps | None = None):
    """The compiled module (V(M, q), C(M, q1, q2, q12), layer_step, recurse) of a closed-form Kernel ``K``
    (M is ignored; pass :func:`no_data`), with the NTK's maps ``ntk`` (a module of its own; without them
    the NTK's maps are NaN stand-ins).

    Raises NotPrintable (before importing numba) when a map is not printable.
    """
    key = (K.act.name, K.V, K.C, ntk)
    if key not in _PATHS:
        _PATHS[key] = write(*key[:3], distance(K), ntk)
    return load_path(_PATHS[key])


def no_data():
    """The M argument of closed-form modules (ignored; one fixed type keeps one compiled signature)."""
    return np.zeros(1)



_TABLE_MODULE: list = []


def table_module_loaded() -> bool:
    """The compiled table module is loaded in this process (calls cost no compilation)."""
    return bool(_TABLE_MODULE)


def table_module():
    """The compiled table module (one for all activations: the table is its data M)."""
    if not _TABLE_MODULE:
        _TABLE_MODULE.append(load_path(write_source("tables", table_module_source())))
    return _TABLE_MODULE[0]


# ----------------------------------------------------------------------------- the recursion in Python
def _near(dd, qa, q2):
    """c >= 1/2 (d <= (qa + q2)/2) for numbers, or for arrays whose points all agree (callers split them)."""
    m = np.asarray(dd <= 0.5 * (qa + q2))
    if m.all():
        return True
    if not m.any():
        return False
    raise InvalidValue("layer_step: points on both sides of c = 1/2 in one call (split them with near_mask)")


def near_mask(dd, qa, q2):
    """The points where layer_step uses the distance map (c >= 1/2)."""
    return np.asarray(dd <= 0.5 * (qa + q2))


def bind(module: types.ModuleType, **names) -> dict:
    """The functions of a kernel module with some of their globals replaced (the maps V, C, D, in_domain):
    the same code objects, run as plain Python against other maps. Returns {name: function}."""
    ns = dict(vars(module))
    ns.update(names)
    out = {}
    for key, f in vars(module).items():
        if isinstance(f, types.FunctionType) and f.__module__ == module.__name__ and key not in names:
            out[key] = ns[key] = types.FunctionType(f.__code__, ns, f.__name__, f.__defaults__, f.__closure__)
    return out


def step_functions(V, C, D):
    """``(first_layer, layer_step)`` of :mod:`symfield.numeric.kernels.recursion` run as plain Python with the
    maps ``V(M, q)``, ``C(M, q1, q2, q12)`` and ``D(M, q1, q2, q12, d)`` (any number type: NumPy arrays,
    mpmath mpf, ...): the one recursion, outside numba."""
    f = bind(recursion, near=_near, **plain_maps(V, C, D))
    return f["first_layer"], f["layer_step"]


def plain_maps(V, C, D) -> dict:
    """The maps a kernel of :mod:`symfield.numeric.kernels.recursion` calls, from V, C and D as Python functions:
    C_equal, D_equal are C, D at equal norms."""
    return dict(V=V, C=C, D=D, C_equal=lambda M, q, q12: C(M, q, q, q12), D_equal=lambda M, q, q12, d: D(M, q, q, q12, d))
