"""Edge-of-chaos gains and weight scales (docs/theory.md sections 2 and 5).

A fan-in initialiser draws W_ij with variance sigma_w2/fan_in and b_i with variance sigma_b2; ``gain`` is
sqrt(sigma_w2) at the edge of chaos chi1 = sigma_w2 E[phi'(sqrt(q*) z)^2] = 1, so the weight standard deviation
is gain/sqrt(fan); fans of dense and convolution kernels and the neural-tangents parameterisation.
"""
from __future__ import annotations

import math
import numbers
import warnings
from typing import NamedTuple

import numpy as np

from symfield.core import validate as check
from symfield.core.errors import InvalidType, InvalidValue
from symfield.symbolic.activation import Activation, activation
from symfield.theory.eoc import eoc, eoc_depth
from symfield.theory.maps import q_map
from symfield.theory.width_gain import width_gain

DISTRIBUTIONS = ("normal", "uniform", "truncated_normal")
MODES = ("fan_in", "fan_out", "fan_avg")   # torch's mode= and JAX's variance_scaling mode= names
TRUNCATION = 2.0   # truncated normals are cut at +-2 standard deviations of the untruncated normal
MAX_STD = math.sqrt(np.finfo(float).max)   # 1.3407807929942596e154: the largest std whose square is finite


def truncated_variance(a: float = TRUNCATION) -> float:
    """Variance of a standard normal truncated to (-a, a): 1 - 2 a phi(a)/(2 Phi(a) - 1).

    Exact via math.erf; at a = 2 it is 0.7737413... (sqrt 0.8796256610..., the constant JAX's
    ``variance_scaling(..., "truncated_normal")`` divides by)."""
    a = float(check.real("init.truncated_variance", "a", a, lo=0, lo_open=True))
    pdf = math.exp(-a * a / 2) / math.sqrt(2 * math.pi)
    return 1 - 2 * a * pdf / math.erf(a / math.sqrt(2))


def as_activation(act):
    """act as an :class:`Activation` (built-in names and formulas parsed)."""
    return act if isinstance(act, Activation) else activation(act)


def _warn_if_not_reached(A, e, q0):
    """RuntimeWarning when the recursion from q^(1) = q0 does not approach the EOC fixed point q*."""
    qs = float(e.q_star)
    if not e.stable:
        why = f"q* = {qs:.6g} is unstable (q_slope = {e.q_slope:.6g} > 1)"
    elif math.isfinite(qs) and not e.note:
        step = float(q_map(A, q0, float(e.sigma_w2), float(e.sigma_b2))) - q0
        if not step * (q0 - qs) > 0:
            return
        why = f"from q = {q0:g} the variance map moves away from q* = {qs:.6g} (marginal fixed point)"
    else:
        return
    warnings.warn(f"init.gain: {A.name} at sigma_b2 = {float(e.sigma_b2):g}: chi1(q*) = 1 holds, but {why}; "
                  "a deep network started at q0 does not sit at the edge of chaos (pass depth=L for the "
                  "sigma_w2 at which prod chi1 = 1 over L layers, sf.eoc_depth).", RuntimeWarning, stacklevel=3)


def gain(act, sigma_b2=0.0, width=None, depth=None, residual=None, q0=1.0) -> float:
    """sqrt(sigma_w2) on the edge of chaos at ``sigma_b2``: weights ~ N(0, gain^2/fan_in).

    sigma_w2 solves chi1 = sigma_w2 E[phi'(sqrt(q*) z)^2] = 1 with q* = sigma_w2 E[phi(sqrt(q*) z)^2]
    + sigma_b2 (``sf.eoc``, exact root finding on the package's certified maps).

    - Positively homogeneous phi (relu family): E[phi'^2] does not depend on q, so
      gain = 1/sqrt(E[phi'^2]) at every sigma_b2: relu sqrt(2); leaky_relu(a) sqrt(2/(1 + a^2)).
    - phi(0) = 0 and sigma_b2 = 0: q* = 0 and gain = 1/abs(phi'(0)): tanh 1 (not torch's 5/3),
      gelu 2 (phi'(0) = 1/2). x*erf(x) has phi'(0) = 0 and so no EOC at sigma_b2 = 0 (ValueError).
    - otherwise numeric: tanh at sigma_b2 = 0.05 gives sigma_w2 = 1.76095..., gain 1.32701...

    A RuntimeWarning says when chi1(q*) = 1 holds at a q* the network does not reach from ``q0``
    (unstable q*, e.g. x*erf(x) at sigma_b2 = 0.05; or marginal q* = 0 left from above, e.g. gelu
    at sigma_b2 = 0, where q grows from q0 = 1).

    Parameters
    ----------
    act : str or Activation
        Activation, e.g. "relu", "tanh", "leaky_relu(0.2)", "gelu", "x*erf(x)".
    sigma_b2 : float
        Bias variance (>= 0).
    width, depth : int, optional
        ``depth`` alone: where the edge of chaos is unstable (see below), the depth-L edge of chaos
        ``sf.eoc_depth`` (prod chi1 = 1 over ``depth`` layers from q0) is used instead, with a
        RuntimeWarning. Give both to apply the width-aware correction (``sf.width_gain``): the sigma_w2 whose
        width-n mean variance at layer ``depth`` equals the infinite-width EOC value, to O(1/n^2).
    residual : float, optional
        alpha of residual blocks z + alpha (W phi(z) + b), for the width correction only.
    q0 : float
        Input norm ``|x|^2/n0`` (used by the width correction and the reachability warning).

    Returns
    -------
    float
        gain = sqrt(sigma_w2).

    Examples
    --------
    >>> gain("relu")  # sqrt(2)
    1.4142135623730951
    >>> round(gain("tanh", sigma_b2=0.05), 7)
    1.3270097
    """
    A = as_activation(act)
    sb = float(check.real("init.gain", "sigma_b2", sigma_b2, lo=0))
    q0 = float(check.real("init.gain", "q0", q0, lo=0, lo_open=True))
    if width is not None and depth is None:
        raise InvalidValue("init.gain: the width correction needs both width and depth; 'depth' is missing.")
    if residual is not None and width is None:
        raise InvalidValue("init.gain: 'residual' only enters the width correction; pass width and depth too.")
    e = eoc(A, sb)
    sw = float(e.sigma_w2)
    if not e.stable and depth is not None:      # the usable alternative: prod chi1 = 1 over the depth
        d = eoc_depth(A, sb, depth, q0=q0)
        warnings.warn(f"init.gain: {A.name} at sigma_b2 = {sb:g}: the edge of chaos q* = {float(e.q_star):.6g} is "
                      f"unstable (q_slope = {e.q_slope:.6g} > 1); using the depth-{d.depth} edge of chaos "
                      f"sigma_w2 = {d.sigma_w2:.10g} (prod chi1 = 1 from q0 = {q0:g}; a 1% change in sigma_w2 "
                      f"changes the product by {d.sensitivity:.3g}%).", RuntimeWarning, stacklevel=2)
        sw = d.sigma_w2
    else:
        _warn_if_not_reached(A, e, q0)
    if width is not None:
        sw = width_gain(A, sw, sb, width, depth, q0=q0, residual=residual).sigma_w2
    return math.sqrt(sw)


def fan(fan_in, fan_out=None, mode="fan_in") -> float:
    """The count n of Var W = gain^2/n for ``mode`` (torch's and JAX's names):

    - "fan_in": n = fan_in, the number of terms each pre-activation sums; keeps the forward variance
      q' = sigma_w2 E[phi^2] + sigma_b2 of the mean-field recursion (the edge of chaos is defined here);
    - "fan_out": n = fan_out, the number of terms each input's gradient sums; keeps the backward variance
      (He et al.'s 2/n_out variant); the forward q then scales by fan_in/fan_out per layer;
    - "fan_avg": n = (fan_in + fan_out)/2 (Glorot/Xavier's 2/(n_in + n_out) for gain 1; JAX's "fan_avg").

    Examples
    --------
    >>> fan(256, 512, "fan_avg")
    384.0
    """
    if mode not in MODES:
        raise InvalidValue(f"The 'mode' parameter of init.fan must be one of {MODES}. Got {mode!r} instead.")
    fan_in = float(check.real("init.fan", "fan_in", fan_in, lo=0, lo_open=True))
    if mode == "fan_in":
        return fan_in
    if fan_out is None:
        raise InvalidValue(f"The 'fan_out' parameter of init.fan is needed for mode={mode!r}. Got None instead.")
    fan_out = float(check.real("init.fan", "fan_out", fan_out, lo=0, lo_open=True))
    return float(fan_out) if mode == "fan_out" else (fan_in + fan_out) / 2


def std(act, fan_in, distribution="normal", sigma_b2=0.0, width=None, depth=None, mode="fan_in", fan_out=None,
        **kw) -> float:
    """The parameter of the weight distribution that gives Var W = gain^2/n, n = :func:`fan` (fan_in by default).

    Parameters
    ----------
    act : str or Activation
    fan_in : int
        Inputs per unit (Dense: in_features; conv: in_channels/groups * prod(kernel_size)).
    distribution : {"normal", "uniform", "truncated_normal"}
        What is returned:

        - "normal": the standard deviation gain/sqrt(fan_in);
        - "uniform": the BOUND a of U(-a, a), a = sqrt(3) * gain/sqrt(fan_in) (Var U = a^2/3);
        - "truncated_normal": the standard deviation s of the UNtruncated normal which, cut at
          +-2 s (the convention of ``jax.random.truncated_normal(key, -2, 2)`` and of
          ``jax.nn.initializers.variance_scaling``), has variance gain^2/fan_in:
          s = gain/sqrt(fan_in)/sqrt(v), v = 1 - 4 phi(2)/erf(sqrt 2) = 0.77374... Pass it as
          ``jax.nn.initializers.truncated_normal(s)`` or ``torch.nn.init.trunc_normal_(w, std=s,
          a=-2*s, b=2*s)`` (torch's a, b are absolute bounds, not multiples of std).
    sigma_b2, width, depth, **kw
        As in :func:`gain`.
    mode : {"fan_in", "fan_out", "fan_avg"}
        Which count divides gain^2 (:func:`fan`); "fan_out" and "fan_avg" need ``fan_out``.
    fan_out : int, optional
        Outputs each input feeds (Dense: out_features; conv: out_channels/groups * prod(kernel_size)).

    Returns
    -------
    float

    Examples
    --------
    >>> round(std("relu", 512), 6)
    0.0625
    >>> round(std("relu", 512, "uniform"), 6)
    0.108253
    """
    fan_in = check.integer("init.std", "fan_in", fan_in, lo=1)
    if distribution not in DISTRIBUTIONS:
        raise InvalidValue(f"The 'distribution' parameter of init.std must be one of {DISTRIBUTIONS}. "
                         f"Got {distribution!r} instead.")
    n = fan(fan_in, fan_out, mode)
    s = gain(act, sigma_b2, width, depth, **kw) / math.sqrt(n)
    return draw_scale(s, distribution)


def draw_scale(s, distribution):
    """The draw parameter of std s: the uniform bound sqrt(3) s, the truncated normal's pre-truncation std, or s."""
    if distribution == "uniform":
        return math.sqrt(3) * s
    if distribution == "truncated_normal":
        return s / math.sqrt(truncated_variance(TRUNCATION))
    return s


def bias_std(sigma_b2) -> float:
    """Standard deviation of the biases, sqrt(sigma_b2) (b ~ N(0, sigma_b2), no fan-in scaling).

    Examples
    --------
    >>> bias_std(0.04)
    0.2
    """
    return math.sqrt(float(check.real("init.bias_std", "sigma_b2", sigma_b2, lo=0)))


def output_bias(p, logit_var=0.0):
    """Bias of a sigmoid (binary) output unit whose mean prediction at initialisation is the class prior
    ``p``: b = log(p/(1 - p)), the prior log-odds; for a softmax head and class priors p_k (a sequence
    summing to 1), b_k = log p_k.

    Why: a cross-entropy head started at b = 0 predicts 1/2 (1/K) for every input, so on a 1 %-positive
    data set the initial loss is log 2 = 0.693 where the constant best guess costs the prior's entropy
    H(p) = -p log p - (1 - p) log(1 - p) = 0.056; the first updates then only learn the bias, and a
    large negative-class gradient swamps the rest. With sigma(b) = p the loss starts at H(p).
    The logit at initialisation is z = b + u, u ~ N(0, v) with v = sigma_w2 q of the last layer
    (``logit_var``); v > 0 pulls E[sigma(b + u)] towards 1/2, so b solves E[sigma(b + sqrt(v) Z)] = p
    (Gauss-Hermite quadrature, 80 nodes, and a bracketing root); v = 0 gives the closed form.

    Examples
    --------
    >>> round(output_bias(0.01), 6)
    -4.59512
    >>> [round(b, 6) for b in output_bias([0.5, 0.25, 0.25])]
    [-0.693147, -1.386294, -1.386294]
    """
    F = "init.output_bias"
    v = float(check.real(F, "logit_var", logit_var, lo=0))
    if not isinstance(p, (numbers.Real, np.floating)) or isinstance(p, bool):
        pk = np.asarray(check.real(F, "p", p, lo=0, lo_open=True, hi=1), float)
        if pk.ndim != 1 or pk.size < 2 or abs(pk.sum() - 1) > 1e-9:
            raise InvalidValue(f"The 'p' parameter of {F} must be a probability in (0, 1) or class priors summing "
                               f"to 1. Got {p!r} instead.")
        return [float(x) for x in np.log(pk)]
    p = float(check.real(F, "p", p, lo=0, lo_open=True, hi=1))
    if p >= 1:
        raise InvalidValue(f"The 'p' parameter of {F} must be a probability in (0, 1). Got {p!r} instead.")
    b0 = math.log(p / (1 - p))
    if v == 0:
        return b0
    from scipy.optimize import brentq
    from scipy.special import expit
    z, w = np.polynomial.hermite_e.hermegauss(80)
    w = w / w.sum()
    mean = lambda b: float(w @ expit(b + math.sqrt(v) * z)) - p          # noqa: E731
    span = abs(b0) + 10 * math.sqrt(v) + 10
    return float(brentq(mean, -span, span, xtol=1e-14))


class NTStd(NamedTuple):
    """neural-tangents parameters: standard deviations, W ~ N(0, W_std^2/fan_in), b ~ N(0, b_std^2)."""
    W_std: float
    b_std: float


class Variances(NamedTuple):
    """symfield parameters: variances."""
    sigma_w2: float
    sigma_b2: float


def to_nt(sigma_w2, sigma_b2=0.0) -> NTStd:
    """(W_std, b_std) = (sqrt(sigma_w2), sqrt(sigma_b2)) for ``neural_tangents.stax.Dense(W_std=, b_std=)``.

    symfield speaks variances, neural-tangents standard deviations; the result is a named tuple so
    the square root cannot be lost silently. Negative input raises a ValueError naming the parameter.

    Examples
    --------
    >>> to_nt(2.0, 0.01)
    NTStd(W_std=1.4142135623730951, b_std=0.1)
    """
    sw = float(check.real("init.to_nt", "sigma_w2", sigma_w2, lo=0))
    sb = float(check.real("init.to_nt", "sigma_b2", sigma_b2, lo=0))
    return NTStd(math.sqrt(sw), math.sqrt(sb))


def from_nt(W_std, b_std=0.0) -> Variances:
    """(sigma_w2, sigma_b2) = (W_std^2, b_std^2) from neural-tangents standard deviations.

    A negative W_std or b_std raises (a standard deviation is >= 0; a negative one usually means a
    variance or a log-scale value was passed), and so does one above MAX_STD, whose square overflows.

    Examples
    --------
    >>> from_nt(1.5, 0.1)
    Variances(sigma_w2=2.25, sigma_b2=0.010000000000000002)
    """
    w = float(check.real("init.from_nt", "W_std", W_std, lo=0, hi=MAX_STD))
    b = float(check.real("init.from_nt", "b_std", b_std, lo=0, hi=MAX_STD))
    return Variances(w * w, b * b)


# ---------------------------------------------------------------- JAX / Flax
def _axes(spec, ndim, what):
    """Normalised axis indices of an int or a tuple of ints (JAX's in_axis/out_axis/batch_axis)."""
    spec = (spec,) if isinstance(spec, (numbers.Integral, np.integer)) else tuple(spec)
    if not all(isinstance(a, (numbers.Integral, np.integer)) and -ndim <= a < ndim for a in spec):
        raise InvalidValue(f"The '{what}' parameter of init.jax must be axes of a {ndim}-axis kernel. Got {spec!r} "
                           "instead.")
    return {int(a) % ndim for a in spec}


def kernel_fans(shape, in_axis=-2, out_axis=-1, batch_axis=()) -> tuple:
    """(fan_in, fan_out) of a Flax/JAX kernel, as ``jax.nn.initializers.variance_scaling`` counts them:
    receptive field r = prod(shape)/(in size * out size * batch size), fan_in = in size * r,
    fan_out = out size * r. The defaults give fan_in = prod(shape[:-1]) (Dense (in, out): in; conv HWIO:
    H*W*I); a DenseGeneral or attention kernel (in, heads, head_dim) needs in_axis=0, out_axis=(1, 2),
    where prod(shape[:-1]) = in*heads would be wrong.

    Examples
    --------
    >>> kernel_fans((512, 8, 64), in_axis=0, out_axis=(1, 2))
    (512, 512)
    >>> kernel_fans((3, 3, 64, 128))
    (576, 1152)
    """
    try:
        axes = tuple(shape)
    except TypeError:
        axes = None
    if axes is None or not all(isinstance(s, (numbers.Integral, np.integer)) and not isinstance(s, bool) for s in axes):
        raise InvalidType(f"The 'shape' parameter of init.jax must be a tuple of integers (kernel axes, out last). "
                        f"Got {shape!r} instead.")
    if len(axes) < 2 or min(axes) < 0:
        raise InvalidValue(f"The 'shape' parameter of init.jax must have at least 2 axes of size >= 0 (kernel, out "
                         f"last). Got {axes!r} instead; use init.jax_bias for biases.")
    ins, outs = _axes(in_axis, len(axes), "in_axis"), _axes(out_axis, len(axes), "out_axis")
    batch = _axes(batch_axis, len(axes), "batch_axis")
    if ins & outs or (ins | outs) & batch:
        raise InvalidValue(f"The 'in_axis' parameter of init.jax must not share axes with out_axis or batch_axis. Got "
                           f"in_axis={in_axis!r}, out_axis={out_axis!r}, batch_axis={batch_axis!r} instead.")
    r = math.prod(int(s) for i, s in enumerate(axes) if i not in ins | outs | batch)
    fan_in = math.prod(int(axes[i]) for i in ins) * r
    fan_out = math.prod(int(axes[i]) for i in outs) * r
    if fan_in < 1 or fan_out < 1:
        raise InvalidValue(f"The 'shape' parameter of init.jax must have fan_in = prod(shape[:-1]) >= 1 (Var W = "
                         f"gain^2/fan_in). Got {axes!r} (fan_in {fan_in}, fan_out {fan_out}) instead.")
    return fan_in, fan_out


def kernel_fan_in(shape, in_axis=-2, out_axis=-1, batch_axis=()) -> int:
    """fan_in of a Flax/JAX kernel (:func:`kernel_fans`): prod(shape[:-1]) by default, >= 1."""
    return kernel_fans(shape, in_axis, out_axis, batch_axis)[0]
