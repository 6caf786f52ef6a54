"""Certified piecewise-Chebyshev interpolants of 1-D maps f(q) (V, E[psi'^2]) for fast float64 grids.

Panels in t = log2 q: [2^p, 2^(p+1)] for p = P_LO..P_HI-1, with N Chebyshev nodes each, node values
from the accurate float64 evaluator (quadrature, ~1e-14). Certificate: on every panel the
interpolant is compared with the evaluator at the N-1 second-kind Chebyshev points (where the
interpolation error peaks); a panel whose error exceeds TOL (relative to max|f| on the panel) is
split in two, recursively. ``error`` is the largest held-out error; points outside [2^P_LO, 2^P_HI]
are evaluated directly (never extrapolated).

With a ``key`` (a string naming the map exactly, e.g. the srepr of its SymPy expression) the
certified panels are cached on disk beside the generated code (``tables1d/``), so a new process
loads them instead of re-running ~8e4 quadratures; the file name hashes the key, the table
parameters and the symfield version.
"""
from __future__ import annotations

import hashlib

import numpy as np

from symfield.core.files import cache_dir, save_npz

N, TOL, P_LO, P_HI, MAX_DEPTH = 16, 1e-13, -40, 40, 6     # [2^-40, 2^40] covers fixedpoint's [Q_MIN, Q_MAX]
_X = np.cos(np.pi * (np.arange(N) + 0.5) / N)[::-1]           # first-kind nodes on [-1, 1]
_H = np.cos(np.pi * np.arange(1, N) / N)[::-1]                 # held-out second-kind points


class Table1D:
    """f(q) on (0, inf): Chebyshev panels in log2 q inside [2^P_LO, 2^P_HI], f itself outside."""

    def __init__(self, f, key=None):
        self.f = f
        path = _path(key) if key is not None else None
        if path is not None and self._load(path):
            return
        edges, coefs, self.error = [], [], 0.0
        for p in range(P_LO, P_HI):
            self._panel(float(p), float(p + 1), 0, edges, coefs)
        self.lo = np.array([e[0] for e in edges])
        self.hi = np.array([e[1] for e in edges])
        self.coef = np.array(coefs)
        if path is not None:
            self._save(path)

    def _load(self, path):
        try:
            with np.load(path, allow_pickle=False) as z:
                self.lo, self.hi, self.coef, self.error = z["lo"], z["hi"], z["coef"], float(z["error"])
            return True
        except (OSError, ValueError, KeyError):
            return False    # absent or unreadable: rebuilt

    def _save(self, path):
        try:
            save_npz(path, dict(lo=self.lo, hi=self.hi, coef=self.coef, error=self.error))
        except OSError:
            pass            # read-only cache: the table still works in this process

    def _panel(self, a, b, depth, edges, coefs):
        t = 0.5 * (a + b) + 0.5 * (b - a) * _X
        c = np.polynomial.chebyshev.chebfit(_X, self.f(2.0 ** t), N - 1)
        th = 0.5 * (a + b) + 0.5 * (b - a) * _H
        ref = self.f(2.0 ** th)
        err = np.max(np.abs(np.polynomial.chebyshev.chebval(_H, c) - ref)) / max(np.max(np.abs(ref)), 1e-300)
        if err > TOL and depth < MAX_DEPTH:
            m = 0.5 * (a + b)
            self._panel(a, m, depth + 1, edges, coefs)
            self._panel(m, b, depth + 1, edges, coefs)
            return
        self.error = max(self.error, err)
        edges.append((a, b))
        coefs.append(c)

    def __call__(self, q):
        q = np.asarray(q, float)
        out = np.empty(q.shape)
        flat, res = q.ravel(), out.ravel()
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.log2(flat)
        inside = (t >= P_LO) & (t < P_HI)
        if (~inside).any():      # direct evaluation, once per distinct value (brackets repeat Q_MIN, Q_MAX)
            u, inv = np.unique(flat[~inside], return_inverse=True)
            res[~inside] = np.asarray(self.f(u), float)[inv.ravel()]
        if inside.any():
            ti = t[inside]
            k = np.searchsorted(self.lo, ti, side="right") - 1
            a, b = self.lo[k], self.hi[k]
            y = (2 * ti - a - b) / (b - a)
            c = self.coef[k]                      # Clenshaw over the panel coefficients
            b1 = np.zeros(ti.shape)
            b2 = np.zeros(ti.shape)
            for j in range(N - 1, 0, -1):
                b1, b2 = 2 * y * b1 - b2 + c[:, j], b1
            res[inside] = y * b1 - b2 + c[:, 0]
        return out


def _path(key):
    from symfield.core.version import __version__
    text = f"table1d N {N} TOL {TOL!r} P {P_LO}:{P_HI} depth {MAX_DEPTH} symfield {__version__}\n{key}"
    return cache_dir() / "tables1d" / f"t1d_{hashlib.sha256(text.encode()).hexdigest()[:24]}.npz"
