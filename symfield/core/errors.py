"""The exceptions symfield raises: one root, :class:`SymfieldError`, and a class per kind of failure.

Each class also derives from the built-in exception a caller would expect (ValueError for a bad value,
NotImplementedError for a valid request the package does not support, ArithmeticError for a number that
could not be certified), so ``except ValueError`` keeps working and ``except sf.SymfieldError`` catches
everything the package raises on purpose. "This path does not apply here" is signalled by a named
subclass of :class:`Unsupported` (NotTabulable, NotPrintable, NoRule) and caught by that name only, so a
bare NotImplementedError from a bug lower down is never mistaken for it.
"""
from __future__ import annotations


class SymfieldError(Exception):
    """Root of every exception symfield raises on purpose."""


class InvalidValue(SymfieldError, ValueError):
    """A value outside what a parameter allows, or a request with no answer (no edge of chaos there)."""


class InvalidType(SymfieldError, TypeError):
    """An argument of the wrong type."""


class Unsupported(SymfieldError, NotImplementedError):
    """A valid request that symfield does not support; the message names what is supported."""


class NotTabulable(Unsupported):
    """This kernel's maps have no certified table (the caller uses quadrature)."""


class NotPrintable(Unsupported):
    """A closed form outside the generated-code printer's allow-list (the caller uses quadrature)."""


class NoRule(Unsupported):
    """No numeric rule for this integral in this number context (e.g. a max-pool covariance at dps)."""


class PrecisionError(SymfieldError, ArithmeticError):
    """A number that could not be computed to its promised accuracy (a root's residual, a series)."""


class NotCertified(PrecisionError):
    """A table panel that failed its accuracy checks (the caller falls back to quadrature)."""


class QuadratureError(PrecisionError):
    """A float64 Gaussian expectation whose error estimate exceeds its tolerance."""


class CacheError(SymfieldError, ValueError):
    """A cached file is unusable (hash mismatch, wrong structure): callers move it aside and rebuild."""


class FormulaError(SymfieldError, ValueError):
    """A user formula that is not an allowed expression in x."""


class TooExpensive(SymfieldError, ValueError):
    """A symbolic step ran past its time or memory budget (one line: step, formula, budget)."""


class TimeLimitExceeded(SymfieldError):
    """The call ran longer than its time limit."""


class RunError(SymfieldError, RuntimeError):
    """A run that could not go on (a sweep chunk failed, a scheduler did not start)."""


# What SymPy raises when it cannot do a step (a limit, a root, a simplification); symbolic code that
# tries a step and has a fallback catches exactly these, by this name.
SYMPY_GAVE_UP = (NotImplementedError, ValueError, TypeError, ArithmeticError, AttributeError, RecursionError)
