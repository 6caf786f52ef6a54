"""Generated Numba code for the closed-form maps of a kernel.

The numeric grid layer is *printed* from the symbolic one: the SymPy expressions of
V(q) and C(q1, q2, q12) go through :class:`NumbaPrinter` (a SymPy Python code printer
that maps functions to ``math.*``) into a real ``.py`` file in a user cache directory
outside the package, which is imported with importlib and compiled by numba with
``njit(cache=True, fastmath=False)``. The generated code IS the formula; nothing is
copied by hand.

Cache directory: ``$SYMFIELD_CACHE/codegen`` if SYMFIELD_CACHE is set, else
``${XDG_CACHE_HOME:-~/.cache}/symfield/codegen``. The file name carries a hash of the
generated source (which contains the printed expressions) and of the symfield, numba,
sympy and Python versions, so an edit to any of them gives a new file. Files are written
atomically (temporary file + rename) and never rewritten once present.

The cache is not trusted (threat model in :mod:`symfield.core.files`: another local user, or a process
that can write the cache but not this user's key). Before a module is imported the sha256 of its bytes
is compared with the digest in its name (which :func:`write_source` computed from the source it
generated) and the very bytes checked are compiled (no ``.pyc``); a file that fails (tampered,
truncated, empty, unreadable) is moved aside and rewritten from its source.

numba's own cache (``njit(cache=True)``: an index ``.nbi`` and data ``.nbc`` per function in
``__pycache__`` beside the module) consists of pickles, and unpickling runs code, so numba must read
none that this user's symfield did not write. Every dispatcher of a loaded module is guarded
(:func:`_guard`) before any is called: the sha256 of every byte numba writes is captured as numba writes
it and kept in a record, ``<module>.nbsig``, sealed with the user's key (core.files.seal: an HMAC the
attacker cannot make); right before numba reads a function's files (and before it saves, which reads the
index first) each is checked against the record (:func:`_check_numba`). A file that is not recorded or
differs -- planted, edited, left by an older symfield or a killed process -- makes all of the module's
numba files go (one CacheWarning), and numba compiles afresh. Checks and writes of one module's files
hold a lock (flock), so two processes never see each other's half-updated record. Why this is enough:
the record cannot be forged without the key, a file that matches it holds the bytes numba wrote for
this user, and only those are unpickled. The remaining gap is a swap between the check and numba's read
(microseconds); against other users it is closed by the folder: ``__pycache__`` is created 0700 and
numba's cache is used only when that folder and its parent are owned by the user and writable by no
one else (else it is switched off for the module, one warning, and compiled code lives in memory). Not
covered: a process that can read the key or write the package, and a same-user process racing that window.

Only an allow-list of functions is printable (:data:`ALLOWED`); anything else raises
NotImplementedError naming the function. Square-root radicands are clamped at 0 in the
generated code (``math.sqrt(max(x, 0.0))``): on the domain of the maps (q > 0,
|q12| <= sqrt(q1 q2)) every radicand is >= 0 exactly, so a negative value can only be
rounding, e.g. q1*q2 - q12**2 at c = 1. That Gram determinant (arc-cosine kernels) is printed
as ``_gram_sqrt(q1, q2, q12)``, which also rescales by an exact power of two so that q1*q2
cannot overflow for q up to ~1e308.

Every generated module has the same tail: the one recursion (:data:`STEP_SOURCE`) and the grid
kernel (:data:`GRID_SOURCE`), which call ``V(M, q)``, ``C(M, q1, q2, q12)`` and ``in_domain(M, ...)``.
``M`` is one float64 array: ignored by closed forms (:func:`no_data`), the packed table of
:mod:`symfield.tables` otherwise (one compiled table module serves every activation, the table is
data). The recursion step and the closed-form maps are inlined (``inline="always"``: no per-point
call overhead); the tables' larger V and C stay calls (inlining them made numba's compile of the
parallel kernel take minutes). Outside numba the same step runs through :func:`step_functions`
(propagate's NumPy quadrature path, divergence's mpmath path).

This module never imports numba at import time; only :func:`load` does.
"""
from __future__ import annotations

from symfield.core.errors import InvalidValue, NotPrintable, RunError
import glob
import hashlib
import importlib.util
import json
import os
import re
import sys
import threading
from contextlib import contextmanager
from enum import IntEnum
from importlib import metadata
from pathlib import Path

import numpy as np
import sympy as sp
from sympy.printing.pycode import PythonCodePrinter

try:
    import fcntl
except ImportError:      # pragma: no cover (Windows: no cross-process lock)
    fcntl = None

from symfield.core.files import CacheError, atomic_write, authenticate, cache_dir, check_private, quarantine, seal, warn
from symfield.core.version import __version__
from sympy.codegen.cfunctions import expm1

from symfield.symbolic.distance import Distance, SinMinusTCos, d as DD, distance, plain_distance
from symfield.symbolic.gaussian import q as Q, q1 as Q1, q2 as Q2, q12 as Q12

# SymPy function class -> printed name (all of these are supported by numba in nopython mode).
ALLOWED = {
    sp.atan2: "math.atan2", sp.atan: "math.atan", sp.asin: "math.asin", sp.acos: "math.acos",
    sp.exp: "math.exp", sp.log: "math.log", sp.erf: "math.erf", sp.erfc: "math.erfc",
    sp.sin: "math.sin", sp.cos: "math.cos", sp.tan: "math.tan",
    sp.sinh: "math.sinh", sp.cosh: "math.cosh", sp.tanh: "math.tanh",
    sp.Abs: "abs", sp.Max: "max", sp.Min: "min", expm1: "math.expm1", SinMinusTCos: "_sin_minus_tcos",
}
_ATOMS = (sp.Symbol, sp.Number, sp.NumberSymbol, sp.Add, sp.Mul, sp.Pow)
_SUPPORTED_TEXT = "+, -, *, /, powers, sqrt, pi, E, " + ", ".join(sorted(
    {f.__name__ for f in ALLOWED}))

# One layer of the recursion, written once. Generated modules compile it with numba (scalars, one
# grid point per call); :func:`step_functions` executes the same text in plain Python with other maps
# (propagate's NumPy fallback: vectorised quadrature; divergence: mpmath). V and C are module globals
# (the only names it needs); M is the maps' data: unused by closed forms, the table arrays of
# symfield.tables for maps without one.
STEP_SOURCE = """
def first_layer(qa0, qb0, qab0, d0, sw, sb):
    \"\"\"Layer l = 1 is linear (docs/theory.md section 1): q1 = sigma_w2 q0 + sigma_b2, d1 = sigma_w2 d0.\"\"\"
    return sw * qa0 + sb, sw * qb0 + sb, sw * qab0 + sb, sw * d0


def layer_step(qa, qb, qab, dd, sw, sb, alpha2, residual, general, M):
    \"\"\"Layer l >= 2 (docs/theory.md sections 2, 7 and 8).

    plain:    q' = sigma_w2 V(q) + sigma_b2,   q12' = sigma_w2 C(qa, qb, q12) + sigma_b2,   d' = sigma_w2 D(qa, qb, q12, d)
    residual: q' = q + alpha^2 (sigma_w2 V(q) + sigma_b2)  (and likewise for q12; d' = d + alpha^2 sigma_w2 D)
    d = qa + qb - 2 q12 is carried by its own map (no bias term, no cancellation as c -> 1). One 2-D map
    per layer: for c >= 1/2 (d <= (qa + qb)/2) the distance map D and C = (V(qa) + V(qb) - D)/2, else the
    covariance map C and D = V(qa) + V(qb) - 2C -- each derived one without cancellation where it is used.
    With general False the two inputs have equal norm (qb = qa) and V(qb), C's and D's q2 reuse qa.
    \"\"\"
    va = V(M, qa)
    if general:
        q2 = qb
        vb = V(M, qb)
    else:
        q2 = qa
        vb = va
    if near(dd, qa, q2):
        dv = D(M, qa, q2, qab, dd)
        cv = 0.5 * (va + vb - dv)
    else:
        cv = C(M, qa, q2, qab)
        dv = va + vb - 2.0 * cv
    fa = sw * va + sb
    fb = sw * vb + sb
    fab = sw * cv + sb
    fd = sw * dv
    if residual:
        return qa + alpha2 * fa, qb + alpha2 * fb, qab + alpha2 * fab, dd + alpha2 * fd
    return fa, fb, fab, fd
"""
_STEP_CODE = compile(STEP_SOURCE, "<symfield.codegen.STEP_SOURCE>", "exec")


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


def step_functions(V, C, D):
    """``(first_layer, layer_step)`` of :data:`STEP_SOURCE` executed in plain Python with the maps
    ``V(M, q)``, ``C(M, q1, q2, q12)`` and ``D(M, q1, q2, q12, d)`` (any number type: NumPy arrays, mpmath mpf, ...).

    The one way to run the recursion outside numba, so every path iterates the same text:
    q' = sigma_w2 V(q) + sigma_b2, q12' = sigma_w2 C(qa, qb, q12) + sigma_b2, d' = sigma_w2 D
    (residual: q + alpha^2 (...)).
    """
    ns = {"V": V, "C": C, "D": D, "near": _near}
    exec(_STEP_CODE, ns)
    return ns["first_layer"], ns["layer_step"]


TINY = 2.2250738585072014e-308   # smallest normal float64: below it d has lost relative precision


class Status(IntEnum):
    """The per-point status codes of the compiled recursion (:data:`GRID_SOURCE` prints its literals from
    these): OK..UNDERFLOW end a point (propagate's public codes 0-3); LEFT_TABLE and PAUSED are internal
    (the point stopped with its state, to be continued by the caller)."""
    OK = 0            # done
    OVERFLOW = 1      # q or q12 non-finite; later rows NaN
    DOMAIN = 2        # outside the maps' domain (q < 0, d NaN or < 0); later rows NaN
    UNDERFLOW = 3     # done, but d underflowed (gamma beyond float64) after layer last
    LEFT_TABLE = 4    # stopped where in_domain is False (outside the table): extend it and continue
    PAUSED = 5        # paused after layer stop < depth (a chunk of layers ended): continue


_S = Status
GRID_SOURCE = f"""
BLOCK = 16
TINY = {TINY!r}


@njit(inline="always", **_OPTS)
def _code(qa, qb, qab, dd):
    \"\"\"0 fine, 1 q or q12 non-finite (overflow), 2 outside the domain (q < 0, d NaN or < 0), 3 gamma beyond float64.\"\"\"
    if not (math.isfinite(qa) and math.isfinite(qb) and math.isfinite(qab)):
        return {_S.OVERFLOW:d}
    if not (qa >= 0.0 and qb >= 0.0 and dd >= 0.0):
        return {_S.DOMAIN:d}
    if not (dd >= TINY and math.isfinite(qab / (0.5 * dd))):   # gamma = q12 / (d/2), as Propagation computes it
        return {_S.UNDERFLOW:d}
    return {_S.OK:d}


@njit(parallel=True, **_OPTS)
def recurse(sw, sb, qa0, qb0, qab0, d0, depth, stop, store, alpha2, residual, general, M,
            start, st_qa, st_qb, st_qab, st_d, out_qa, out_qb, out_qab, out_d, status, last):
    \"\"\"Layers up to `stop` (<= depth) at every grid point (parallel over blocks of points); rows of out_* at
    layers `store`. Callers run long recursions in chunks of layers (stop < depth) so that Python can
    handle signals (Ctrl-C) between chunks; the chunked run is bit-identical to one call with stop = depth.

    Point i starts at layer start[i] (1: from the inputs; > 1: from the state st_*[i] of layer start[i] - 1;
    0: skipped, nothing written). Points are advanced BLOCK at a time, layer by layer (independent points:
    their map evaluations overlap in the CPU). On return status[i] is
      0 done; 1 q or q12 overflowed (that layer's value is stored as is, later stored rows are NaN);
      2 left the maps' domain (a map gave NaN or a negative value; later rows NaN);
      3 done, but d underflowed (gamma = 2 q12/d beyond float64) after layer last[i] (the last finite gamma;
        callers set last[i] = depth beforehand, and the rows go on: q stays exact, d is 0 or subnormal);
      4 stopped at a layer where in_domain is False (outside a table): start[i], st_*[i] then hold the layer
        to continue from and the state before it, rows from that layer on are NaN until a continuation fills them;
      5 paused after layer stop < depth: start[i] = stop + 1, st_*[i] hold layer stop (rows after it untouched).
    Rows of layers before start[i] are never touched. out_qb is written only when general (else a placeholder).
    \"\"\"
    n = sw.shape[0]
    nstore = store.shape[0]
    for blk in prange((n + BLOCK - 1) // BLOCK):
        i0 = blk * BLOCK
        m = min(BLOCK, n - i0)
        qa = np.empty(BLOCK)
        qb = np.empty(BLOCK)
        qab = np.empty(BLOCK)
        dd = np.empty(BLOCK)
        first = np.zeros(BLOCK, dtype=np.int64)
        live = np.zeros(BLOCK, dtype=np.bool_)
        nlive = 0
        lmin = depth + 1
        for j in range(m):
            s = start[i0 + j]
            if s > 0:
                first[j] = s
                live[j] = True
                nlive += 1
                lmin = min(lmin, s)
                qa[j] = st_qa[i0 + j]
                qb[j] = st_qb[i0 + j]
                qab[j] = st_qab[i0 + j]
                dd[j] = st_d[i0 + j]
        k = 0
        while k < nstore and store[k] < lmin:
            k += 1
        for l in range(lmin, stop + 1):
            if nlive == 0:
                break
            for j in range(m):
                if live[j] and l >= first[j]:
                    if l == 1:
                        qa[j], qb[j], qab[j], dd[j] = first_layer(qa0, qb0, qab0, d0, sw[i0 + j], sb[i0 + j])
                    elif in_domain(M, qa[j], qb[j], qab[j]):
                        qa[j], qb[j], qab[j], dd[j] = layer_step(qa[j], qb[j], qab[j], dd[j], sw[i0 + j], sb[i0 + j],
                                                                 alpha2, residual, general, M)
                    else:
                        live[j] = False
                        nlive -= 1
                        status[i0 + j] = {_S.LEFT_TABLE:d}
                        start[i0 + j] = l
                        st_qa[i0 + j] = qa[j]
                        st_qb[i0 + j] = qb[j]
                        st_qab[i0 + j] = qab[j]
                        st_d[i0 + j] = dd[j]
            if k < nstore and store[k] == l:
                for j in range(m):
                    if first[j] > 0 and l >= first[j]:
                        out_qa[k, i0 + j] = qa[j] if live[j] else math.nan
                        out_qab[k, i0 + j] = qab[j] if live[j] else math.nan
                        out_d[k, i0 + j] = dd[j] if live[j] else math.nan
                        if general:
                            out_qb[k, i0 + j] = qb[j] if live[j] else math.nan
                k += 1
            for j in range(m):
                if live[j] and l >= first[j]:
                    code = _code(qa[j], qb[j], qab[j], dd[j])
                    if code == {_S.UNDERFLOW:d}:
                        if last[i0 + j] == depth:
                            last[i0 + j] = l - 1
                    elif code != {_S.OK:d}:
                        live[j] = False
                        nlive -= 1
                        status[i0 + j] = code
                        if last[i0 + j] == depth:
                            last[i0 + j] = l - 1
        for kk in range(k, nstore):
            for j in range(m):
                if first[j] > 0 and not live[j] and store[kk] >= first[j]:
                    out_qa[kk, i0 + j] = math.nan
                    out_qab[kk, i0 + j] = math.nan
                    out_d[kk, i0 + j] = math.nan
                    if general:
                        out_qb[kk, i0 + j] = math.nan
        for j in range(m):
            if live[j]:
                if stop < depth:
                    status[i0 + j] = {_S.PAUSED:d}
                    if first[j] <= stop:     # else it has not started yet: start, st_* stay as they are
                        start[i0 + j] = stop + 1
                        st_qa[i0 + j] = qa[j]
                        st_qb[i0 + j] = qb[j]
                        st_qab[i0 + j] = qab[j]
                        st_d[i0 + j] = dd[j]
                else:
                    status[i0 + j] = {_S.UNDERFLOW:d} if last[i0 + j] < depth else {_S.OK:d}
"""

# The tail of every generated module: the recursion and the grid kernel, compiled by numba.
_RECURSION_SOURCE = """
@njit(inline="always", **_OPTS)
def near(dd, qa, q2):
    return dd <= 0.5 * (qa + q2)

""" + STEP_SOURCE + """

first_layer = njit(inline="always", **_OPTS)(first_layer)
layer_step = njit(inline="always", **_OPTS)(layer_step)

""" + GRID_SOURCE

_PRELUDE = """import math

import numpy as np
from numba import njit, prange

_OPTS = dict(cache=True, fastmath=False, error_model="numpy")
"""


_GRAM = Q1 * Q2 - Q12**2

# sqrt(q1 q2 - q12^2) (the arc-cosine kernels' sin(theta) sqrt(q1 q2)) clamped at 0 and scaled by
# an exact power of two when q is huge or tiny, so q1*q2 cannot overflow (|q| up to ~1e308) or
# underflow. Exact scaling: same rounding as the direct formula, and exactly 0 at c = 1.
_HELPER_SOURCE = '''
@njit(**_OPTS)
def _gram_sqrt(q1, q2, q12):
    m = max(abs(q1), abs(q2), abs(q12))
    if 1e-150 < m < 1e150 or m == 0.0 or not math.isfinite(m):
        return math.sqrt(max(q1 * q2 - q12 * q12, 0.0))
    e = math.frexp(m)[1]
    a = math.ldexp(q1, -e)
    b = math.ldexp(q2, -e)
    c = math.ldexp(q12, -e)
    return math.ldexp(math.sqrt(max(a * b - c * c, 0.0)), e)


@njit(**_OPTS)
def _sin_minus_tcos(t):
    # W(t) = sin t - t cos t: Taylor series sum_k (-1)^(k+1) 2k t^(2k+1)/(2k+1)! for |t| < 0.5 (no cancellation)
    if abs(t) >= 0.5:
        return math.sin(t) - t * math.cos(t)
    t2 = t * t
    s = 0.0
    for k in range(12, 0, -1):
        s = s * t2 + (1.0 if k % 2 == 1 else -1.0) * 2.0 * k / _FACT[2 * k + 1]
    return s * t2 * t


_FACT = np.array([math.factorial(i) for i in range(26)], dtype=np.float64)
'''


class NumbaPrinter(PythonCodePrinter):
    """Python/``math`` printer for numba's nopython mode, restricted to :data:`ALLOWED`."""
    printmethod = "_numbacode"

    def __init__(self, settings=None):
        super().__init__(dict({"fully_qualified_modules": True, "standard": "python3"}, **(settings or {})))

    def _print_Pow(self, expr, rational=False):
        b, e = expr.as_base_exp()
        if e == sp.S.Half and sp.expand(b - _GRAM) == 0:
            return "_gram_sqrt(q1, q2, q12)"
        if e.is_Rational and not e.is_Integer and e.q == 2:
            base = f"max({self._print(b)}, 0.0)"
            root = f"math.sqrt({base})"
            if e == sp.S.Half:
                return root
            if e == -sp.S.Half:
                return f"(1.0/{root})"
            return f"({base}**({self._print(e)}))"
        return super()._print_Pow(expr, rational=rational)

    def _print_Max(self, expr):
        return "max(" + ", ".join(f"float({self._print(a)})" for a in expr.args) + ")"

    def _print_Min(self, expr):
        return "min(" + ", ".join(f"float({self._print(a)})" for a in expr.args) + ")"

    def _print_SinMinusTCos(self, expr):
        return f"_sin_minus_tcos({self._print(expr.args[0])})"

    def _print_not_supported(self, expr):
        raise NotPrintable(f"the generated-code printer cannot print {expr}")


def check_printable(expr: sp.Expr, what: str, args=()) -> None:
    """Raise NotImplementedError naming the first construct outside the allow-list."""
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
            if type(node) not in ALLOWED:
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
    """An exactly equal form that avoids overflow at large q.

    Products of exponentials are merged into one exponential of the summed exponent
    (sin/cos kernels: (exp(2 q12) - 1) exp(-q1/2 - q12 - q2/2) -> exp(q12 - ...) - exp(-q12 - ...)),
    so intermediate exp(2 q12) never overflows while the product is representable.
    """
    if expr.has(sp.exp):
        return sp.powsimp(sp.expand(expr), combine="exp")
    return expr


def print_map(expr: sp.Expr, what: str, args) -> str:
    expr = stable_form(sp.sympify(expr))
    check_printable(expr, what, args)
    return NumbaPrinter().doprint(expr)


def _versions() -> str:
    vs = [f"symfield {__version__}", f"sympy {sp.__version__}",
          f"python {sys.version_info.major}.{sys.version_info.minor}"]
    try:
        vs.append(f"numba {metadata.version('numba')}")
    except metadata.PackageNotFoundError:  # pragma: no cover
        vs.append("numba ?")
    return ", ".join(vs)


def module_source(name: str, V: sp.Expr, C: sp.Expr, dist: Distance | None = None) -> str:
    """The complete text of the generated module (byte-stable for equal input); D defaults to V + V - 2C."""
    v_code = print_map(V, f"the map V of {name}", (Q,))
    c_code = print_map(C, f"the map C of {name}", (Q1, Q2, Q12))
    dist = plain_distance(V, C) if dist is None else dist
    d_eq = print_map(dist.near_eq, f"the map D of {name}", (Q, DD))
    d_near = print_map(dist.near, f"the map D of {name}", (Q1, Q2, DD))
    d_far = print_map(dist.far, f"the map D of {name}", (Q1, Q2, Q12))
    # User text (the activation's name may be a raw formula, newlines and all) appears only as repr()
    # string literals, never in a comment or as code.
    header = "\n".join([
        "# Generated by symfield.codegen from the symbolic kernel maps. Do not edit:",
        "# the file is keyed by a hash of its content and regenerated when anything changes.",
        f"ACTIVATION = {name!r}",
        f"VERSIONS = {_versions()!r}",
        f"V_TEXT = {sp.sstr(V)!r}                     # V(q)",
        f"C_TEXT = {sp.sstr(C)!r}                     # C(q1, q2, q12)",
        f"D_TEXT = {f'{sp.sstr(dist.near_eq)}   ({dist.method})'!r}   # D(q, d)",
    ])
    return f"""{header}
{_PRELUDE}
{_HELPER_SOURCE}

@njit(inline="always", **_OPTS)
def V(M, q):
    return {v_code}


@njit(inline="always", **_OPTS)
def C(M, q1, q2, q12):
    return {c_code}


@njit(inline="always", **_OPTS)
def D(M, q1, q2, q12, d):
    # E[(psi(u) - psi(v))^2], d = q1 + q2 - 2 q12: in d where c >= 1/2 (no cancellation as c -> 1), else in q12
    if d <= 0.5 * (q1 + q2):
        if q1 == q2:
            q = q1
            return {d_eq}
        return {d_near}
    return {d_far}


@njit(inline="always", **_OPTS)
def in_domain(M, qa, qb, qab):
    return True

{_RECURSION_SOURCE}"""


def table_module_source(maps_source: str) -> str:
    """A generated module whose V, C, in_domain read their data M (symfield.tables) at run time."""
    header = "\n".join([
        "# Generated by symfield.codegen: table-interpolated maps (symfield.tables) + the recursion.",
        "# Do not edit: the file is keyed by a hash of its content.",
        f"VERSIONS = {_versions()!r}",
    ])
    return f"""{header}
{_PRELUDE}
{_HELPER_SOURCE}
{maps_source}
{_RECURSION_SOURCE}"""


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
        _purge_numba(path, None)
    return atomic_write(path, data)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:20]


_SOURCES: dict = {}  # path -> bytes written by write_source in this process (to rewrite a bad file)


def write(name: str, V: sp.Expr, C: sp.Expr, dist: Distance | None = None) -> Path:
    """Generate (if absent) the module for these maps; returns its path. Never rewrites a file."""
    return write_source(name, module_source(name, V, C, dist))


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
    _purge_numba(path, None)
    atomic_write(path, src)
    return src


# ----------------------------------------------------------------------------- numba's cache files
def _numba_files(path: Path, folder: Path | None = None, base: str | None = None):
    """numba's index (.nbi) and data (.nbc) files in ``folder`` (default: __pycache__ beside the module) of
    the generated module ``path``, or of its one function whose files start with ``base``."""
    folder = path.parent / "__pycache__" if folder is None else folder
    return sorted(f for f in folder.glob(glob.escape(base or path.stem) + ".*") if f.suffix in (".nbi", ".nbc"))


def _record_path(path: Path, folder: Path) -> Path:
    return folder / f"{path.stem}.nbsig"


def _purge_numba(path: Path, why, folder: Path | None = None):
    """Remove numba's cache files of one generated module and their record (one warning when ``why`` is given)."""
    folder = path.parent / "__pycache__" if folder is None else folder
    files = _numba_files(path, folder)
    for f in files + [_record_path(path, folder)]:
        try:
            f.unlink()
        except OSError:
            pass
    if why and files:
        warn(f"numba cache files unusable ({why}); removed {len(files)} file(s), recompiled", path)


def _record_bytes(files: dict) -> bytes:
    return json.dumps(files, sort_keys=True).encode()


def _read_record(path: Path, folder: Path) -> dict:
    """{file name: sha256} recorded for the module's numba files ({} if there is no record); CacheError
    unless the record is sealed with this user's key (core.files.seal)."""
    rec = _record_path(path, folder)
    try:
        raw = json.loads(rec.read_bytes())
        files, mac = dict(raw["files"]), raw["mac"]
    except FileNotFoundError:
        return {}
    except (ValueError, KeyError, TypeError) as err:
        raise CacheError(f"{rec.name} unreadable ({type(err).__name__})") from None
    try:
        authenticate(_record_bytes(files), f"numba {path.stem}", mac=mac)
    except CacheError as err:
        raise CacheError(f"{rec.name} {err}") from None
    return files


def _write_record(path: Path, folder: Path, written: dict) -> None:
    """Add the sha256 of the files numba just wrote to the record (entries of removed files dropped), sealed."""
    try:
        files = _read_record(path, folder)
    except CacheError:
        files = {}       # a bad record: only what was just written is trusted
    files = {n: h for n, h in {**files, **written}.items() if (folder / n).exists()}
    atomic_write(_record_path(path, folder),
                 json.dumps({"files": files, "mac": seal(_record_bytes(files), f"numba {path.stem}")}), durable=False)


def _check_numba(path: Path, folder: Path, base: str) -> None:
    """Before numba reads (unpickles) the files of one function (``base``): each must have the sha256 that the
    sealed record holds for it. Otherwise all the module's numba files are removed, with one warning, and
    numba compiles afresh."""
    files = _numba_files(path, folder, base)
    if not files:
        return
    try:
        record = _read_record(path, folder)
        for f in files:
            if f.name not in record:
                raise CacheError(f"{f.name} is not in the record sealed with this user's key")
            authenticate(f.read_bytes(), sha256=record[f.name], where=f"the sha256 recorded for {f.name}")
    except (CacheError, OSError) as err:
        _purge_numba(path, str(err), folder)


_HELD: dict = {}     # lock file -> [threading lock, depth, open file] of this process


@contextmanager
def _locked(lock: Path):
    """An exclusive lock on ``lock`` across processes (flock; none where fcntl is missing), re-entrant in
    this process: no reader checks a file while another process of this user writes it or its record."""
    held = _HELD.setdefault(str(lock), [threading.RLock(), 0, None])
    with held[0]:
        if held[1] == 0 and fcntl is not None:
            held[2] = open(os.open(lock, os.O_RDWR | os.O_CREAT, 0o600), "rb")
            fcntl.flock(held[2].fileno(), fcntl.LOCK_EX)
        held[1] += 1
        try:
            yield
        finally:
            held[1] -= 1
            if held[1] == 0 and held[2] is not None:
                held[2].close()       # releases the flock
                held[2] = None


class _Tee:
    """A file that passes writes through and hashes them (the sha256 of what numba wrote, not of what is on disk later)."""

    def __init__(self, fh):
        self.fh, self.sha = fh, hashlib.sha256()

    def write(self, b):
        self.sha.update(b)
        return self.fh.write(b)


def _private_folder(folder: Path) -> str:
    """'' if numba's cache folder and its parent are owned by this user and writable by nobody else (then no
    other user can swap a file between the check and numba's read), else why not."""
    try:
        for d in (folder, folder.parent):
            check_private(os.stat(d), f"numba cache folder {d}")
    except (OSError, CacheError) as err:
        return str(err)
    return ""


def _guard_one(disp, path: Path) -> str:
    """Route one dispatcher's cache through the check: before numba reads its index or data files
    (load_overload, and save_overload, which reads the index first) they are checked (:func:`_check_numba`);
    the sha256 of every file numba writes is recorded. Returns why its cache was switched off ('' if not)."""
    from numba.core.caching import NullCache

    cache = disp._cache
    if isinstance(cache, NullCache):
        return ""
    try:
        cf = cache._cache_file
        index = Path(cf._index_path)
        open_for_write, load, save = cf._open_for_write, cache.load_overload, cache.save_overload
    except AttributeError:           # not the numba cache layout this guard knows: no cache at all
        cache.disable()
        return "numba's cache layout is not the one symfield checks"
    folder, base = index.parent, index.name[: -len(".nbi")]
    why = _private_folder(folder)
    if why:
        cache.disable()
        return why
    lock, written = folder / f"{path.stem}.lock", {}

    @contextmanager
    def recording(filepath):
        with open_for_write(filepath) as fh:
            tee = _Tee(fh)
            yield tee
        written[os.path.basename(filepath)] = tee.sha.hexdigest()   # after numba renamed it into place

    def checked_load(sig, target_context):
        with _locked(lock):
            _check_numba(path, folder, base)
            return load(sig, target_context)

    def checked_save(sig, data):
        with _locked(lock):
            _check_numba(path, folder, base)
            written.clear()
            try:
                save(sig, data)
            finally:
                if written:
                    _write_record(path, folder, written)

    cf._open_for_write, cache.load_overload, cache.save_overload = recording, checked_load, checked_save
    return ""


def _guard(module, path: Path) -> None:
    """:func:`_guard_one` for every numba dispatcher of a generated module, before any of them is called; one
    warning if the cache had to be switched off (compiled code then lives in this process only)."""
    from numba.core.dispatcher import Dispatcher

    off = set()
    for name, obj in vars(module).items():
        if isinstance(obj, Dispatcher):
            if obj.overloads:        # compiled during exec (a signature in the decorator): read before any check
                raise RunError(f"generated module {path}: {name} was compiled at import; symfield's "
                                   f"generated code must compile lazily")
            off.add(_guard_one(obj, path))
    off.discard("")
    if off:
        warn(f"numba cache not used ({'; '.join(sorted(off))}); compiled code is kept in this process only", path)


def load_path(path: Path):
    """Import a generated module from its path (once per process): the checked bytes (:func:`_verified`) are
    compiled and executed, then every numba function of the module is guarded (:func:`_guard`) before any
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
            _guard(module, path)
        except BaseException:
            sys.modules.pop(modname, None)
            raise
        _LOADED[key] = module
    return _LOADED[key]


def load(K):
    """The compiled module (V(M, q), C(M, q1, q2, q12), layer_step, recurse) of a closed-form Kernel ``K``
    (M is ignored; pass :func:`no_data`).

    Raises NotImplementedError (before importing numba) when a map is not printable.
    """
    key = (K.act.name, K.V, K.C)
    if key not in _PATHS:
        _PATHS[key] = write(*key, distance(K))
    return load_path(_PATHS[key])


def no_data():
    """The M argument of closed-form modules (ignored; one fixed type keeps one compiled signature)."""
    return np.zeros(1)
