"""Certified piecewise-Chebyshev interpolants of 1-D maps f(q) (V, E[psi'^2]) for fast float64 grids.

Panels in t = log2 q: [2^p, 2^(p+1)] for p = P_LO..P_HI-1, with N Chebyshev nodes each, node values
from the accurate float64 evaluator. Every panel is checked against the evaluator at the N-1
second-kind Chebyshev points and split while its error exceeds TOL (relative to max|f| on the panel)
(:func:`symfield.numeric.chebyshev.refine`); ``error`` is the largest held-out error. Points outside
[2^P_LO, 2^P_HI] are evaluated directly (never extrapolated); a panel whose evaluations raise
QuadratureError ends the table there.

With a ``key`` (a string naming the map exactly) the certified panels are cached on disk
(``tables1d/``), hashed, structure-checked before use and quarantined when they fail
(core.files.quarantine). docs/numerics.md section 3.
"""
from __future__ import annotations

from symfield.core.errors import InvalidValue
import hashlib

import numpy as np

from symfield.core.files import cache_dir, load_checked_npz, quarantine, save_checked_npz, warn
from symfield.core.progress import bar
from symfield.core.version import __version__
from symfield.numeric import chebyshev as cheb
from symfield.numeric import shipped
from symfield.numeric.quadrature import QuadratureError

N, TOL, P_LO, P_HI, MAX_DEPTH = 16, 1e-13, -40, 40, 6     # [2^-40, 2^40] covers the fixed-point scans' [Q_MIN, Q_MAX]
CHUNK = 4096        # points per block of a table evaluation
FIT = "dct2"    # coefficients by symfield.numeric.chebyshev (part of the cache key)


class Table1D:
    """f(q) on (0, inf): Chebyshev panels in log2 q inside [2^P_LO, 2^P_HI], f itself outside."""
    BUILD_EVALS = 5e3    # evaluations of f a build takes: (P_HI - P_LO) panels x 31 nodes = 2480 for a smooth f, x 2 for splits

    @classmethod
    def cached(cls, f, key, ship=None):
        """(table, refused): the table of ``key`` (f outside its panels) from the disk cache or the shipped
        tables, or None; ``refused`` is True when a file was there but failed its checks (moved aside, one
        warning). Nothing is built."""
        self = cls.__new__(cls)
        self.f, self.ship, self.refused = f, ship, False
        if self._load(_path(key)):
            return self, False
        if ship is not None and self._load(shipped.lookup("tables1d", ship_name(ship)), is_shipped=True):
            return self, False
        return None, self.refused

    def __init__(self, f, key=None, ship=None, load=True):
        """``key``: the disk-cache name; ``ship``: the stable name of a shipped table of the same map
        (symfield.numeric.shipped), read when the cache has none; ``load=False``: build (the caller has
        looked in both, :meth:`cached`)."""
        self.f, self.ship = f, ship
        path = _path(key) if key is not None else None
        if load and path is not None and self._load(path):
            return
        if load and ship is not None and self._load(shipped.lookup("tables1d", ship_name(ship)), is_shipped=True):
            return
        f = lambda t: self.f(2.0 ** t)
        panels = []
        with bar(P_HI - P_LO, "building a 1-D table of V or E[psi'^2]", "panel") as shown:
            for p in range(P_LO, P_HI):
                try:
                    panels += cheb.refine(f, float(p), float(p + 1), N, TOL, MAX_DEPTH)
                except QuadratureError:      # beyond the rule's reach: the table ends here (f raises above)
                    if p == P_LO:
                        raise
                    break
                shown.update()
        self.lo = np.array([pn[0] for pn in panels])
        self.hi = np.array([pn[1] for pn in panels])
        self.coef = np.array([pn[2] for pn in panels])
        self.error = max(pn[3] for pn in panels)
        if path is not None:
            self.save(path)

    def _load(self, path, is_shipped=False):
        if path is None or not path.exists():
            return False
        try:
            z = load_checked_npz(path, shipped.sha256(path) if is_shipped else None)   # shipped: against MANIFEST.json
            lo, hi, coef, error = z["lo"], z["hi"], z["coef"], float(z["error"])
            check_structure(lo, hi, coef, error)
        except Exception as err:     # any failure to read or check: moved aside (shipped: ignored), rebuilt
            if is_shipped:
                warn(f"shipped 1-D table ignored ({type(err).__name__}: {err}); building it", path)
            else:
                quarantine(path, f"{type(err).__name__}: {err}")
            self.refused = True
            return False
        self.lo, self.hi, self.coef, self.error = lo, hi, coef, error
        return True

    def save(self, path):
        try:
            save_checked_npz(path, dict(lo=self.lo, hi=self.hi, coef=self.coef, error=self.error))
        except OSError as err:      # unwritable cache: the table still works in this process
            warn(f"cannot write the 1-D table ({err.strerror or err}); kept in memory only", path)

    def __call__(self, q):
        q = np.asarray(q, float)
        out = np.empty(q.shape)
        flat, res = q.ravel(), out.ravel()
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.log2(flat)
        inside = (t >= P_LO) & (t <= self.hi[-1])     # panels are closed: q = 2^P_HI is the last one's end
        if (~inside).any():      # direct evaluation, once per distinct value (brackets repeat Q_MIN, Q_MAX)
            u, inv = np.unique(flat[~inside], return_inverse=True)
            res[~inside] = np.asarray(self.f(u), float)[inv.ravel()]
        if inside.all():
            res[:] = self._panels(t)
        elif inside.any():
            res[inside] = self._panels(t[inside])
        return out

    def _panels(self, t):
        """The panels' Chebyshev sums at t = log2 q inside them, in blocks of CHUNK points (the gathered
        coefficient rows stay in cache)."""
        out = np.empty(t.shape)
        for s in range(0, t.size, CHUNK):
            ti = t[s:s + CHUNK]
            k = np.searchsorted(self.lo, ti, side="right") - 1
            a, b = self.lo[k], self.hi[k]
            out[s:s + CHUNK] = cheb.clenshaw(self.coef[k], (2 * ti - a - b) / (b - a))
        return out


def check_structure(lo, hi, coef, error):
    """ValueError unless the panels tile [P_LO, top] in order (hi[i] = lo[i+1]; top <= P_HI an integer, below
    P_HI where the rule stops resolving f, QuadratureError), coef is (n, N) float64,
    everything finite and 0 <= error < inf (what __call__ indexes and trusts)."""
    n = lo.shape[0] if lo.ndim == 1 else -1
    if not (n >= 1 and hi.shape == (n,) and coef.shape == (n, N) and coef.dtype == np.float64):
        raise InvalidValue(f"shapes lo {lo.shape}, hi {hi.shape}, coef {coef.shape} (need (n,), (n,), (n, {N}))")
    if not (np.isfinite(coef).all() and np.isfinite(lo).all() and np.isfinite(hi).all()):
        raise InvalidValue("non-finite values")
    if not (lo[0] == P_LO and P_LO < hi[-1] <= P_HI and hi[-1] == int(hi[-1]) and (hi > lo).all()
            and np.array_equal(hi[:-1], lo[1:])):
        raise InvalidValue(f"panels do not tile [{P_LO}, top] with an integer top <= {P_HI}")
    if not 0.0 <= error < np.inf:
        raise InvalidValue(f"error bound {error!r}")


def ship_name(ship):
    """File name of a shipped 1-D table: a hash of the map's stable name and the table parameters."""
    return f"t1d_{shipped.key('table1d', f'N {N} TOL {TOL!r} P {P_LO}:{P_HI} depth {MAX_DEPTH} fit {FIT}', ship)}.npz"


def _path(key):
    text = f"table1d sha256 N {N} TOL {TOL!r} P {P_LO}:{P_HI} depth {MAX_DEPTH} fit {FIT} symfield {__version__}\n{key}"
    return cache_dir() / "tables1d" / f"t1d_{hashlib.sha256(text.encode()).hexdigest()[:24]}.npz"
