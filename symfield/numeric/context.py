"""Number contexts: one algorithm, written once, runs in float64 or in mpmath at dps digits.

A context says how numbers are made, stored and solved for, as mpmath's ``fp``/``mp`` do: ``num`` reads
inputs, ``full`` makes arrays, ``roots`` solves many bracketed problems at once, ``run`` calls an
algorithm at the context's working precision and rounds its result. The maps themselves come from the
engine (:func:`symfield.numeric.maps.maps`), which pairs a kernel with a context.

* :class:`Float64`: float64, vectorised over 1-D numpy arrays; roots by :func:`symfield.numeric.vroot.vroot`.
* :class:`Mp`: mpmath at ``dps`` digits on 1-D object arrays (``dps + 10`` working digits, results rounded
  to dps, inputs read as the decimals they print as); each root by anderson to 10^(-2 dps), certified by
  its residual |f(x)| <= 10^-dps max(1, |x|) (PrecisionError otherwise).
"""
from __future__ import annotations

import math

import mpmath
import numpy as np

from symfield.core.errors import PrecisionError
from symfield.numeric.evaluate import to_mpf
from symfield.numeric.vroot import vroot


def objects(values) -> np.ndarray:
    """1-D object array of the given numbers (mpf)."""
    out = np.empty(len(values), dtype=object)
    out[:] = list(values)
    return out


class Float64:
    """float64 numbers, vectorised over 1-D numpy arrays."""
    dps = None
    zero, inf = 0.0, math.inf

    def num(self, x):
        return np.asarray(x, float)

    def full(self, n, v):
        return np.full(n, v, dtype=float)

    def roots(self, f, lo, hi, flo, fhi, what):
        """Roots of f(x, j) (problem j at x) on the brackets [lo, hi] (f(lo) = flo, f(hi) = fhi)."""
        return vroot(f, lo, hi, flo, fhi)

    def run(self, algorithm, *inputs):
        """algorithm(*inputs) with the inputs as float64 arrays."""
        return algorithm(*(self.num(x) for x in inputs))

    def show(self, x):
        return f"{x:g}"


class Mp:
    """mpmath numbers at ``dps`` digits on 1-D object arrays."""
    zero, inf = mpmath.mpf(0), mpmath.inf

    def __init__(self, dps: int):
        self.dps = dps

    def num(self, x):
        """Inputs read as the decimals they print as (0.1 -> mpf('0.1')), as numeric.evaluate."""
        return objects([to_mpf(v) for v in np.ravel(x)])

    def full(self, n, v):
        return objects([mpmath.mpf(v)] * n)       # the float's binary value

    def root(self, f, lo, hi, what):
        """Root of the scalar f on [lo, hi] (anderson to 10^(-2 dps)), certified by its residual:
        PrecisionError with the achieved vs required error unless |f| <= 10^-dps max(1, |root|), and
        PrecisionError when anderson finds none."""
        dps = self.dps
        try:
            root = mpmath.findroot(f, (lo, hi), solver="anderson", tol=mpmath.mpf(10) ** (-2 * dps))
        except (ValueError, ZeroDivisionError) as e:      # no root to dps digits in the float64 bracket
            raise PrecisionError(f"{what}: no root found at dps={dps} in the float64 bracket "
                                 f"[{mpmath.nstr(lo, 8)}, {mpmath.nstr(hi, 8)}] ({str(e).splitlines()[0]})") from None
        resid = abs(f(root))
        if resid > mpmath.mpf(10) ** (-dps) * max(1, abs(root)):
            raise PrecisionError(f"{what}: residual {mpmath.nstr(resid, 3)} exceeds the required "
                                 f"{mpmath.nstr(mpmath.mpf(10) ** -dps, 3)} (dps={dps})")
        return root

    def roots(self, f, lo, hi, flo, fhi, what):
        """As :meth:`Float64.roots`, one certified :meth:`root` per bracket."""
        def one(k):           # findroot reads the arity: a plain one-argument function of x
            return lambda t: f(objects([t]), np.array([k]))[0]
        return objects([self.root(one(k), lo[k], hi[k], what) for k in range(len(lo))])

    def refine(self, f, x0, tol, what, left):
        """The float64 root x0 of f refined: :meth:`root` on [x0, x0 (1 + 1e-9)], certified by its
        residual and by staying within tol of x0 (else PrecisionError(left(root)))."""
        x0 = mpmath.mpf(x0)
        root = self.root(f, x0, x0 * (1 + mpmath.mpf(10) ** -9), what)
        if abs(root - x0) > tol:
            raise PrecisionError(left(root))
        return root

    def run(self, algorithm, *inputs):
        """algorithm(*inputs) at dps + 10 digits, inputs read by :meth:`num`; the result (array or tuple of
        arrays) rounded to dps."""
        with mpmath.workdps(self.dps + 10):
            out = algorithm(*(self.num(x) for x in inputs))
        with mpmath.workdps(self.dps):
            rounded = [objects([+v for v in a]) for a in (out if isinstance(out, tuple) else (out,))]
        return tuple(rounded) if isinstance(out, tuple) else rounded[0]

    def show(self, x):
        with mpmath.workdps(self.dps + 10):
            return str(to_mpf(x))


FLOAT64 = Float64()


def context(dps: int | None) -> Float64 | Mp:
    """The number context of ``dps``: float64 (None) or mpmath at dps digits."""
    return FLOAT64 if dps is None else Mp(dps)
