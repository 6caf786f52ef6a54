"""Layer maps in numbers: q_map, qab_map, chi1, chi1_tilde, q_growth (docs/theory.md section 2).

    q'   = sigma_w2 V(q) + sigma_b2
    q12' = sigma_w2 C(Q1, Q2, Q12) + sigma_b2
    chi1 = sigma_w2 E[sum_j (d psi/du_j)^2](q)      (= d q12'/d q12 at c = 1)

``dps=None`` gives float64 numpy values (broadcast over arrays); ``dps=N`` gives mpmath
numbers (element-wise, numpy object arrays for array input) correct to N digits.
"""
from __future__ import annotations

from symfield.core.errors import InvalidType, InvalidValue, Unsupported
import math
from typing import Any, Literal

import mpmath
import numpy as np
from numpy.typing import ArrayLike, NDArray

from symfield.core import validate as check
from symfield.numeric.evaluate import GUARD_DIGITS, to_mpf
from symfield.numeric.maps import maps
from symfield.symbolic.activation import Activation
from symfield.symbolic.integrals import kinds
from symfield.symbolic.kernel import kernel
from symfield.symbolic.kernel_type import MAPS
from symfield.theory import norm as nm
from symfield.theory.qstar import dpsi2_at_fixed_point, q_star


def _num(func, name, value, dps, **rule):
    arr = check.real(func, name, value, **rule)
    if dps is None:
        return arr
    # mpmath path: floats are read as the decimals they print as (0.1 -> mpf('0.1')), like numeric.evaluate
    vals = np.asarray(value, dtype=object) if np.ndim(value) else value
    with mpmath.workdps(dps + GUARD_DIGITS):
        return to_mpf(vals) if np.ndim(vals) == 0 else np.frompyfunc(to_mpf, 1, 1)(vals)


def _out(value, like, dps):
    """The engine's value shaped as the input: a float64 0-d array for scalars (as numpy), mpmath numbers kept."""
    if dps is not None:
        return value
    return np.asarray(value, dtype=float).reshape(np.shape(like)) if np.ndim(like) == 0 else np.asarray(value, dtype=float)


def _combine(scale, shift, base, dps):
    if dps is None:
        return scale * base + shift
    with mpmath.workdps(dps + GUARD_DIGITS):
        f = np.frompyfunc(lambda a, b, c: +(to_mpf(a) * c + to_mpf(b)), 3, 1)
        out = f(scale, shift, base)
        return out if isinstance(out, np.ndarray) else out


def V(act: str | Activation, q: ArrayLike, dps: int | None = None) -> NDArray[Any] | mpmath.mpf:
    """Variance kernel V(q) = E[psi(u)^2], u ~ N(0, q I_k).

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation` (pools included).
    q : array_like
        Pre-activation variance (> 0); arrays broadcast.
    dps : int, optional
        None for float64; N for mpmath numbers correct to N digits.

    Returns
    -------
    ndarray or mpmath.mpf
        V(q): float64 array shaped like ``q`` (0-d for a scalar), or mpmath numbers.

    Examples
    --------
    >>> float(sf.V("relu", 2.0))       # V(q) = q/2
    1.0
    """
    K = kernel(act)
    dps = check.dps("V", dps)
    qv = _num("V", "q", q, dps, lo=0, lo_open=True)
    return _out(maps(K, dps).V(qv), qv, dps)


def _pair(func, q1, q2, q12, dps, expr=None):
    """Validated (q1, q2, q12) with |q12| <= sqrt(q1 q2). For a closed-form ``expr`` in float64, a q12 that
    the check lets through a few ulps beyond the bound (c = 1 written as sqrt(q1 q2)) is moved onto it, so
    S = sqrt(q1 q2 - q12^2) stays real; the quadrature rules of integral maps read q1 q2 - q12^2 exactly
    and treat |c| = 1 themselves, so their input is left as given."""
    a = _num(func, "q1", q1, dps, lo=0, lo_open=True)
    b = _num(func, "q2", q2, dps, lo=0, lo_open=True)
    c = _num(func, "q12", q12, dps)
    check.covariance(func, *(np.asarray(v, float) for v in (a, b, c)))
    if dps is not None or expr is None or kinds(expr):
        return a, b, c
    edge = np.abs(c) >= np.sqrt(a * b) * (1 - 1e-15)
    if not np.any(edge):
        return a, b, c
    return a, b, np.where(edge, np.asarray(np.frompyfunc(_on_bound, 3, 1)(a, b, c), dtype=float), c)


def _on_bound(x, y, z):
    """z moved towards 0 by whole ulps until z^2 <= x y holds exactly (x, y, z float64)."""
    x, y, z = float(x), float(y), float(z)
    with mpmath.workprec(300):           # exact for products of doubles
        while mpmath.mpf(z) ** 2 > mpmath.mpf(x) * mpmath.mpf(y):
            z = math.nextafter(z, 0.0)
    return z


def C(act: str | Activation, q1: ArrayLike, q2: ArrayLike, q12: ArrayLike,
      dps: int | None = None) -> float | NDArray[Any] | mpmath.mpf:
    """Covariance kernel C = E[psi(u) psi(v)] for the two-input covariance [[q1, q12], [q12, q2]].

    Maps without a closed form: from a certified table where the maps engine has one (or building it pays
    for itself), else the quadrature (:mod:`symfield.numeric.maps`).

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation` (pools included).
    q1, q2, q12 : array_like
        Variances (> 0) and covariance, with q12^2 <= q1 q2; arrays broadcast.
    dps : int, optional
        None for float64; N for mpmath numbers correct to N digits.

    Returns
    -------
    ndarray or mpmath.mpf
        C(q1, q2, q12).

    Examples
    --------
    >>> round(float(sf.C("relu", 1.0, 1.0, 0.0)), 12)     # mean(1)^2 = 1/(2 pi)
    0.159154943092
    """
    K = kernel(act)
    dps = check.dps("C", dps)
    a, b, c = _pair("C", q1, q2, q12, dps, K.C)
    return _out(maps(K, dps).C(a, b, c), a, dps)


def q_map(act: str | Activation, q: ArrayLike, sigma_w2: ArrayLike, sigma_b2: ArrayLike,
          dps: int | None = None, norm: str | None = None, norm_at: str = "before",
          batch: int | None = None) -> NDArray[Any] | mpmath.mpf:
    """Variance map q -> sigma_w2 V(q) + sigma_b2.

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation` (pools included).
    q : array_like
        Variance of the layer's pre-activations (> 0).
    sigma_w2, sigma_b2 : array_like
        Weight and bias variances (>= 0); all arrays broadcast.
    dps : int, optional
        None for float64; N for mpmath numbers correct to N digits.
    norm : {None, 'layer', 'batch'}
        Normalisation in each block ``[norm] -> phi -> [norm] -> W . + b`` (docs/theory.md section 12):
        LayerNorm before phi gives q' = sigma_w2 V(1) + sigma_b2, after phi sigma_w2 + sigma_b2.
    norm_at : {'before', 'after'}
        Normalise the pre-activation h ("before") or phi(h) ("after").
    batch : int, optional
        BatchNorm batch size B >= 2 (equicorrelated batch); None for B -> infinity.

    Returns
    -------
    ndarray or mpmath.mpf
        The next layer's variance q'.

    Examples
    --------
    >>> sf.q_map("relu", np.array([1.0, 2.0]), 2.0, 0.0)
    array([1., 2.])
    """
    K = kernel(act)
    dps = check.dps("q_map", dps)
    qv = _num("q_map", "q", q, dps, lo=0, lo_open=True)
    sw = _num("q_map", "sigma_w2", sigma_w2, dps, lo=0)
    sb = _num("q_map", "sigma_b2", sigma_b2, dps, lo=0)
    opts = nm.options("q_map", norm, norm_at, batch)
    if opts is not None:
        return _normed_q(K, opts, sw, sb, qv, dps)
    return _combine(sw, sb, _out(maps(K, dps).V(qv), qv, dps), dps)


def _normed_q(K, opts, sw, sb, qv, dps):
    """q' under a normalisation (:mod:`symfield.theory.norm`)."""
    if opts.kind == "layer":
        out = nm.ln_q(K, opts.at, sw, sb, qv, dps)
    else:
        Gd = nm.bn_gram(K, opts.at, opts.batch, dps)[0]
        out = _combine(sw, sb, Gd, dps) + (0 * qv if dps is None else 0)
    return np.asarray(out, dtype=float)[()] if dps is None else out


def qab_map(act: str | Activation, q1: ArrayLike, q2: ArrayLike, q12: ArrayLike, sigma_w2: ArrayLike,
            sigma_b2: ArrayLike, dps: int | None = None, norm: str | None = None, norm_at: str = "before",
            batch: int | None = None) -> NDArray[Any] | mpmath.mpf:
    """Covariance map q12 -> sigma_w2 C(Q1, Q2, Q12) + sigma_b2.

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation` (pools included).
    q1, q2, q12 : array_like
        The two inputs' variances (> 0) and covariance (q12^2 <= q1 q2).
    sigma_w2, sigma_b2 : array_like
        Weight and bias variances (>= 0); all arrays broadcast.
    dps : int, optional
        None for float64; N for mpmath numbers correct to N digits.
    norm : {None, 'layer', 'batch'}
        Normalisation in each block ``[norm] -> phi -> [norm] -> W . + b`` (docs/theory.md section 12).
    norm_at : {'before', 'after'}
        Normalise the pre-activation h ("before") or phi(h) ("after").
    batch : int, optional
        BatchNorm batch size B >= 2 (equicorrelated batch); None for B -> infinity.

    Returns
    -------
    ndarray or mpmath.mpf
        The next layer's covariance q12'.

    Examples
    --------
    >>> round(float(sf.qab_map("relu", 1.0, 1.0, 0.0, 2.0, 0.0)), 12)    # 2/(2 pi)
    0.318309886184
    """
    K = kernel(act)
    dps = check.dps("qab_map", dps)
    pair = _pair("qab_map", q1, q2, q12, dps, K.C)
    sw = _num("qab_map", "sigma_w2", sigma_w2, dps, lo=0)
    sb = _num("qab_map", "sigma_b2", sigma_b2, dps, lo=0)
    opts = nm.options("qab_map", norm, norm_at, batch)
    if opts is not None:
        return _normed_qab(K, opts, sw, sb, pair, dps)
    return _combine(sw, sb, _out(maps(K, dps).C(*pair), pair[0], dps), dps)


def _normed_qab(K, opts, sw, sb, pair, dps):
    """q12' under a normalisation (:mod:`symfield.theory.norm`)."""
    if opts.kind == "layer":
        out = nm.ln_qab(K, opts.at, sw, sb, *pair, dps)
        return np.asarray(out, dtype=float)[()] if dps is None else out
    nm.require_equicorrelated("qab_map", pair[0], pair[1])
    if np.any(np.asarray(pair[2] == pair[0], dtype=bool)):
        raise InvalidValue("qab_map with norm='batch': a batch of identical inputs (q12 = q1 = q2, c = 1) has zero "
                           "variance over the batch, so BatchNorm is 0/0; give q12 < q1.")
    God = nm.bn_gram(K, opts.at, opts.batch, dps, pair[2] / pair[0])[1]
    out = _combine(sw, sb, God, dps) + (0 * pair[2] if dps is None else 0)
    return np.asarray(out, dtype=float)[()] if dps is None else out


def chi1(act: str | Activation, sigma_w2: ArrayLike, sigma_b2: ArrayLike, q: ArrayLike | None = None,
         dps: int | None = None, norm: str | None = None, norm_at: str = "before",
         batch: int | None = None) -> NDArray[Any] | mpmath.mpf:
    """chi1 = sigma_w2 E[sum_j (d psi/du_j)^2] at q (default: at the variance fixed point q*).

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation` (pools included).
    sigma_w2, sigma_b2 : array_like
        Weight and bias variances (>= 0); arrays broadcast.
    q : array_like, optional
        The variance at which to evaluate (> 0); default q* (:func:`q_star`), where q* = inf gives
        the limit map's slope sigma_w2 E[psi_inf'^2] (gelu: sigma_w2/2) and q* = 0 gives
        sigma_w2 E[psi'^2](0+). Under a normalisation: the variance entering the norm (default its
        fixed point); LayerNorm before phi: chi1 = sigma_w2 E[psi'^2](1)/q; after phi: sigma_w2
        E[psi'^2](q)/Var psi(q); BatchNorm: the gradient rate lambda_B (no q, sigma_w2 or sigma_b2 dependence).
    dps : int, optional
        None for float64; N for mpmath numbers correct to N digits.
    norm : {None, 'layer', 'batch'}
        Normalisation in each block ``[norm] -> phi -> [norm] -> W . + b`` (docs/theory.md section 12).
    norm_at : {'before', 'after'}
        Normalise the pre-activation h ("before") or phi(h) ("after").
    batch : int, optional
        BatchNorm batch size B >= 2 (equicorrelated batch); None for B -> infinity.

    Returns
    -------
    ndarray or mpmath.mpf
        chi1 = d q12'/d q12 at c = 1; the edge of chaos is chi1 = 1.

    Examples
    --------
    >>> float(sf.chi1("relu", 2.0, 0.0, q=1.0))
    1.0
    """
    K = kernel(act)
    dps = check.dps("chi1", dps)
    sw = _num("chi1", "sigma_w2", sigma_w2, dps, lo=0)
    sb = _num("chi1", "sigma_b2", sigma_b2, dps, lo=0)
    opts = nm.options("chi1", norm, norm_at, batch)
    if opts is not None:
        qv = None if q is None else _num("chi1", "q", q, dps, lo=0, lo_open=True)
        return _normed_chi1(K, opts, sw, sb, qv, dps)
    if q is None:       # at q*: its limits q* = 0 and q* = inf included (the slope sf.phase uses)
        qs = q_star(act, sigma_w2, sigma_b2, dps=dps)
        return _combine(sw, 0, dpsi2_at_fixed_point(K, qs, dps), dps)
    qv = _num("chi1", "q", q, dps, lo=0, lo_open=True)
    return _combine(sw, 0, _out(maps(K, dps).dpsi2(qv), qv, dps), dps)


def _normed_chi1(K, opts, sw, sb, qv, dps):
    """chi1 under a normalisation (:mod:`symfield.theory.norm`)."""
    if opts.kind == "batch" and opts.at == "after" and opts.batch is None:   # B -> inf: the batch statistics are constants
        out = nm.ln_chi1(K, "after", sw, sb, qv, dps)
    elif opts.kind == "batch":
        rate = nm.bn_rate(K, opts.at, opts.batch, dps, sw, sb)[0]
        out = rate + 0 * sw + 0 * sb if dps is None else rate
    else:
        out = nm.ln_chi1(K, opts.at, sw, sb, qv, dps)
    return np.asarray(out, dtype=float)[()] if dps is None else out


def chi1_tilde(act: str | Activation, sigma_w2: ArrayLike, sigma_b2: ArrayLike, q: ArrayLike,
               dps: int | None = None) -> NDArray[Any] | mpmath.mpf:
    """d q12'/d q12 at c = 1 at the CURRENT q (used where q* does not exist).

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation` (pools included).
    sigma_w2, sigma_b2 : array_like
        Weight and bias variances (>= 0).
    q : array_like
        The current variance (> 0).
    dps : int, optional
        None for float64; N for mpmath numbers correct to N digits.

    Returns
    -------
    ndarray or mpmath.mpf
        ``chi1(act, sigma_w2, sigma_b2, q=q, dps=dps)``.

    Examples
    --------
    >>> float(sf.chi1_tilde("relu", 2.0, 0.1, q=5.0))     # relu: sigma_w2/2 at every q
    1.0
    """
    return chi1(act, sigma_w2, sigma_b2, q=q, dps=dps)


def q_growth(act: str | Activation, sigma_w2: ArrayLike, dps: int | None = None) -> NDArray[Any] | mpmath.mpf:
    """sigma_w2 V(q)/q: the per-layer growth of q for positively homogeneous psi at sigma_b2 = 0.

    Parameters
    ----------
    act : str or Activation
        A positively homogeneous activation (psi(t u) = t psi(u), t > 0), else NotImplementedError.
    sigma_w2 : array_like
        Weight variance (>= 0).
    dps : int, optional
        None for float64; N for mpmath numbers correct to N digits.

    Returns
    -------
    ndarray or mpmath.mpf
        The factor q'/q = sigma_w2 V(1).

    Examples
    --------
    >>> float(sf.q_growth("relu", 3.0))
    1.5
    """
    K = kernel(act)
    dps = check.dps("q_growth", dps)
    sw = _num("q_growth", "sigma_w2", sigma_w2, dps, lo=0)
    if not K.degree_one:
        raise Unsupported(f"q_growth needs a positively homogeneous activation (psi(t u) = t psi(u), t > 0, "
                                  f"so that V(q) = V(1) q); {K.act.name} is not. Use chi1 or q_map instead.")
    return _combine(sw, 0, _out(maps(K, dps).V(_num("q_growth", "q", 1.0, dps)), 1.0, dps), dps)


def map_value(act: str | Activation, name: Literal["V", "C", "mean", "dpsi2", "dC", "dV"], *args: ArrayLike,
              dps: int | None = None) -> NDArray[Any] | mpmath.mpf:
    """Evaluate one kernel map by name ('V', 'C', 'mean', 'dpsi2', 'dC', 'dV') at (q) or (q1, q2, q12).

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation` (pools included).
    name : {'V', 'C', 'mean', 'dpsi2', 'dC', 'dV'}
        The map (symfield.kernel's module docstring defines each).
    *args : array_like
        ``q`` for the one-input maps, ``q1, q2, q12`` for 'C' and 'dC'.
    dps : int, optional
        None for float64; N for mpmath numbers correct to N digits.

    Returns
    -------
    ndarray or mpmath.mpf
        The map's value.

    Examples
    --------
    >>> float(sf.map_value("relu", "dpsi2", 1.0))     # E[relu'(u)^2] = 1/2
    0.5
    """
    K = kernel(act)
    if name not in MAPS:
        raise InvalidValue(f"The 'name' parameter of map_value must be one of {MAPS}. Got {name!r} instead.")
    dps = check.dps("map_value", dps)
    two = name in ("C", "dC")
    if len(args) != (3 if two else 1):
        raise InvalidType(f"map_value('{name}') takes {'(q1, q2, q12)' if two else '(q)'}; got {len(args)} values.")
    vals = _pair("map_value", *args, dps, K[name]) if two else (_num("map_value", "q", args[0], dps, lo=0, lo_open=True),)
    return _out(getattr(maps(K, dps), name)(*vals), vals[0], dps)
