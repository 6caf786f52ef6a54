"""Edge-of-chaos initialisers for JAX/Flax and PyTorch, neural-tangents conversions, and a diagnosis
of recorded pre-activations against the mean-field theory (docs/theory.md sections 2, 5, 9, 10).

A fan-in initialiser draws W_ij with variance sigma_w2/fan_in and b_i with variance sigma_b2, so the
pre-activations of a wide network follow q' = sigma_w2 E[phi(sqrt(q) z)^2] + sigma_b2. The edge of
chaos (EOC) is chi1 = sigma_w2 E[phi'(sqrt(q*) z)^2] = 1 at the fixed point q*; ``gain`` is
sqrt(sigma_w2) there, so the weight standard deviation is gain/sqrt(fan_in).

Frameworks are imported lazily: ``jax`` only inside :func:`jax`/:func:`jax_bias`, ``torch`` only
inside :func:`torch_`/:func:`record_torch`; neither is a dependency of symfield.
"""
from __future__ import annotations

from symfield.core.errors import InvalidType, InvalidValue, Unsupported
import contextlib
import math
import numbers
import warnings
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from symfield.core import validate as check
from symfield.core.dataset import ToXarray, flags
from symfield.simulate import finite_data_gamma
from symfield.symbolic.activation import Activation, activation
from symfield.theory.finite_width import finite_width
from symfield.theory.eoc import eoc, eoc_depth
from symfield.theory.gram import gram_fluctuations
from symfield.theory.maps import q_map
from symfield.theory.propagate import propagate
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


def _act(act):
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
    A = _act(act)
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
    return _scale(s, distribution)


def _scale(s, distribution):
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


def jax(act, sigma_b2=0.0, distribution="normal", width=None, depth=None, mode="fan_in", in_axis=-2, out_axis=-1,
        batch_axis=(), **kw):
    """A ``jax.nn.initializers``-style initializer ``init(key, shape, dtype=jnp.float32)`` on the EOC.

    Fans as ``jax.nn.initializers.variance_scaling`` counts them (:func:`kernel_fans`; by default
    fan_in = prod(shape[:-1]): Dense kernel (in, out), Conv kernel HWIO), and Var W = gain(act,
    sigma_b2, ...)^2/n with n = :func:`fan` of ``mode`` for every distribution ("uniform": U(-a, a)
    with a = sqrt(3) std; "truncated_normal": cut at +-2 sd of the untruncated normal, see :func:`std`).

    Parameters
    ----------
    act, sigma_b2, width, depth, **kw
        As in :func:`gain`.
    distribution : {"normal", "uniform", "truncated_normal"}
    mode : {"fan_in", "fan_out", "fan_avg"}
    in_axis, out_axis, batch_axis : int or tuple of int
        JAX's names: e.g. in_axis=0, out_axis=(1, 2) for a DenseGeneral/attention kernel (in, heads, dim).

    Returns
    -------
    callable
        init(key, shape, dtype=jnp.float32) -> jax.Array.

    Examples
    --------
    >>> import flax.linen as nn                                      # doctest: +SKIP
    >>> layer = nn.Dense(512, kernel_init=jax("tanh", sigma_b2=0.05),
    ...                  bias_init=jax_bias(0.05))                   # doctest: +SKIP
    """
    import jax as jx
    import jax.numpy as jnp
    if distribution not in DISTRIBUTIONS:
        raise InvalidValue(f"The 'distribution' parameter of init.jax must be one of {DISTRIBUTIONS}. "
                         f"Got {distribution!r} instead.")
    fan(1, 1, mode)                                   # a bad mode fails here, not at the first call
    g = gain(act, sigma_b2, width, depth, **kw)

    def init(key, shape, dtype=jnp.float32):
        s = _scale(g / math.sqrt(fan(*kernel_fans(shape, in_axis, out_axis, batch_axis), mode)), distribution)
        if distribution == "uniform":
            return jx.random.uniform(key, shape, dtype, -1.0, 1.0) * jnp.asarray(s, dtype)
        if distribution == "truncated_normal":
            return jx.random.truncated_normal(key, -TRUNCATION, TRUNCATION, shape, dtype) * jnp.asarray(s, dtype)
        return jx.random.normal(key, shape, dtype) * jnp.asarray(s, dtype)

    init.gain = g
    return init


def jax_bias(sigma_b2):
    """A ``jax.nn.initializers``-style bias initializer: b ~ N(0, sigma_b2) (zeros when sigma_b2 = 0)."""
    import jax as jx
    import jax.numpy as jnp
    s = bias_std(sigma_b2)

    def init(key, shape, dtype=jnp.float32):
        return jx.random.normal(key, shape, dtype) * jnp.asarray(s, dtype)

    return init


# ---------------------------------------------------------------- PyTorch
_TORCH_RULE = ("a torch Linear or Conv module (with a weight) or a weight tensor of shape (out, in, *kernel); "
               "for a container, call it on each layer of model.modules()")


def _torch_what(m):
    shape = getattr(m, "shape", None)
    if shape is not None:
        return f"a tensor of shape {tuple(shape)}"
    return f"{'a module' if hasattr(m, 'parameters') else 'an object'} of type {type(m).__name__}"


def torch_fans(module_or_tensor) -> tuple:
    """(fan_in, fan_out) of a torch Linear/Conv/ConvTranspose module or a bare weight tensor: the number of
    terms each output sums, and each input's gradient sums (interior positions; k kernel size, s stride,
    per spatial axis, g groups):

    - Linear: (in_features, out_features); a tensor (out, in, k...): (in prod k, out prod k) (torch's count);
    - Conv: (in/g prod k, out/g prod(k/s)): a strided conv visits each input prod(k/s) times on average
      (torch's ``_calculate_fan_in_and_fan_out`` ignores the stride in fan_out);
    - ConvTranspose: (in/g prod(k/s), out/g prod k): each output gathers prod(k/s) input positions per
      input channel on average (exactly when s divides k, e.g. k = 4, s = 2: 2 per axis; for k = 3, s = 2
      the positions alternate 1 and 2 taps and the mean over positions is what Var W = gain^2/fan_in fixes).
      torch's count for the weight (in, out/g, k...) would give out/g prod k, wrong by a factor (in/out) prod s.

    Anything else (LayerNorm, Embedding, Sequential, ...) is refused with a TypeError, a zero fan with a
    ValueError."""
    m, name = module_or_tensor, "The 'module_or_tensor' parameter of init.torch_"
    if hasattr(m, "in_features") and getattr(m, "weight", None) is not None:
        fans = (int(m.in_features), int(m.out_features))
    elif hasattr(m, "in_channels") and hasattr(m, "kernel_size") and getattr(m, "weight", None) is not None:
        k, g = math.prod(m.kernel_size), m.groups
        per = k / math.prod(getattr(m, "stride", (1,)))
        fans = ((m.in_channels // g * per, m.out_channels // g * k) if getattr(m, "transposed", False)
                else (m.in_channels // g * k, m.out_channels // g * per))
    elif hasattr(m, "shape") and not hasattr(m, "parameters"):
        shape = tuple(m.shape)
        if len(shape) < 2:
            raise InvalidValue(f"{name} must be {_TORCH_RULE}. Got {_torch_what(m)} instead.")
        fans = (int(shape[1] * math.prod(shape[2:])), int(shape[0] * math.prod(shape[2:])))
    else:
        raise InvalidType(f"{name} must be {_TORCH_RULE}. Got {_torch_what(m)} instead.")
    if min(fans) <= 0:
        raise InvalidValue(f"{name} must have fan_in >= 1 (Var W = gain^2/fan_in; a lazy module needs a forward pass "
                         f"first). Got {_torch_what(m)} with fan_in {fans[0]:g}, fan_out {fans[1]:g} instead.")
    return tuple(int(f) if float(f).is_integer() else float(f) for f in fans)


def torch_fan_in(module_or_tensor) -> float:
    """fan_in of :func:`torch_fans`: the number of terms each output of the layer sums (an int unless a
    ConvTranspose stride does not divide its kernel)."""
    return torch_fans(module_or_tensor)[0]


def torch_(module_or_tensor, act, sigma_b2=0.0, distribution="normal", width=None, depth=None, mode="fan_in",
           **kw):
    """Initialise in place a torch Linear/Conv/ConvTranspose module (weight and bias) or a bare weight tensor.

    Var W = gain^2/n, n = :func:`fan` of :func:`torch_fans` and ``mode`` ("fan_in" default, "fan_out",
    "fan_avg"; ConvTranspose fan-in counts the inputs each output really sums, in/groups prod(k/s));
    the bias, if any, ~ N(0, sigma_b2). "uniform": U(-a, a), a = sqrt(3) std; "truncated_normal":
    ``trunc_normal_(std=s, a=-2 s, b=2 s)`` with s from :func:`std`. Returns the module or tensor.

    Examples
    --------
    >>> import torch                                                  # doctest: +SKIP
    >>> layer = torch_(torch.nn.Linear(256, 256), "tanh", sigma_b2=0.05)   # doctest: +SKIP
    """
    import torch
    if distribution not in DISTRIBUTIONS:
        raise InvalidValue(f"The 'distribution' parameter of init.torch_ must be one of {DISTRIBUTIONS}. "
                         f"Got {distribution!r} instead.")
    is_module = isinstance(module_or_tensor, torch.nn.Module)
    if not (is_module or isinstance(module_or_tensor, torch.Tensor)):
        raise InvalidType(f"The 'module_or_tensor' parameter of init.torch_ must be {_TORCH_RULE}. "
                        f"Got {_torch_what(module_or_tensor)} instead.")
    n = fan(*torch_fans(module_or_tensor), mode)
    weight = module_or_tensor.weight if is_module else module_or_tensor
    s = _scale(gain(act, sigma_b2, width, depth, **kw) / math.sqrt(n), distribution)
    with torch.no_grad():
        if distribution == "uniform":
            torch.nn.init.uniform_(weight, -s, s)
        elif distribution == "truncated_normal":
            torch.nn.init.trunc_normal_(weight, 0.0, s, -TRUNCATION * s, TRUNCATION * s)
        else:
            torch.nn.init.normal_(weight, 0.0, s)
        bias = getattr(module_or_tensor, "bias", None) if is_module else None
        if bias is not None:
            torch.nn.init.normal_(bias, 0.0, bias_std(sigma_b2))
    return module_or_tensor


@contextlib.contextmanager
def record_torch(model, types=None):
    """Context manager recording the outputs (pre-activations) of every Linear/Conv module of ``model``.

    Yields a list that, after the forward pass, holds one numpy array per call, shape (batch, -1), in
    call order, in the module's float type (float16/bfloat16 as float32: pass ``precision=`` to
    :func:`diagnose` then); pass it to :func:`diagnose`. The hooks are removed on exit.

    Examples
    --------
    >>> with record_torch(model) as acts:                              # doctest: +SKIP
    ...     model(x)
    >>> print(diagnose(acts, "tanh", 1.76, 0.05))                      # doctest: +SKIP
    """
    import torch
    types = types or (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
    out, handles = [], []

    def hook(mod, inputs, output):
        h = output.detach().reshape(output.shape[0], -1).cpu()
        out.append((h.float() if h.dtype in (torch.float16, torch.bfloat16) else h).numpy())

    for mod in model.modules():
        if isinstance(mod, types):
            handles.append(mod.register_forward_hook(hook))
    try:
        yield out
    finally:
        for h in handles:
            h.remove()


# ---------------------------------------------------------------- diagnosis
DIAGNOSIS_STATUS = {0: "inside the band", 1: "outside the band", 2: "non-finite measurement",
                    3: "not compared (no band)", 4: "c and gamma beyond the recording precision (e.g. float32)"}
DIAGNOSIS_STATUS_NAMES = ("inside_band", "outside_band", "non_finite_measurement", "not_compared",
                          "beyond_recording_precision")
STATS = ("q", "c", "gamma")
FAMILY_ALPHA = 0.05     # z=None: P(any band misses | the theory holds) <= 5 % (Bonferroni over the compared bands)
RESOLUTION = 1e3        # 1 - c below RESOLUTION eps^2 is rounding noise of the recording's float type,
RESOLUTION_C = 100      # and below RESOLUTION_C eps64 that of c = Q_ab/sqrt(Q_aa Q_bb) computed in float64


def precision_floor(eps):
    """Smallest 1 - c a recording in a float type of machine epsilon ``eps`` resolves:
    max(RESOLUTION eps^2, RESOLUTION_C eps64); 1.42e-11 for float32, 2.22e-14 for float64.

    Inputs whose pre-activations differ by a relative delta have 1 - c ~ delta^2/2; a float type stores
    each entry to a relative eps/2, so 1 - c below ~eps^2 is rounding (measured gamma ~ 1/eps^2 ~ 1e14 in
    float32 however ordered the network), and c itself, a ratio computed in float64, is exact to ~eps64."""
    return np.maximum(RESOLUTION * np.asarray(eps, float) ** 2, RESOLUTION_C * np.finfo(float).eps)


def family_z(m: int, alpha: float = FAMILY_ALPHA) -> float:
    """Half-width in sd of m two-sided normal bands that together miss with probability <= alpha (Bonferroni):
    z = Phi^{-1}(1 - alpha/(2m)); 1.96 for m = 1, 2.865 for m = 12, 3.19 for m = 72.

    One 2-sd band covers ~95 %, but 12 of them all cover one network only ~91 % of the time: over 1000
    seeded torch relu networks (width 256, depth 4, 4 inputs; docs/scripts/diagnose_coverage.py) the q bands
    of :func:`diagnose` covered 95.4-97.5 %, the c and gamma bands 99.7-100 % (their sd is one pair's, an
    upper bound for the mean over pairs); all 12 at z = 2: 90.8 % of networks, at family_z(12): 99.5 %.

    Examples
    --------
    >>> round(family_z(12), 3)
    2.865
    """
    from statistics import NormalDist
    m = max(int(m), 1)
    return NormalDist().inv_cdf(1 - alpha / (2 * m))


def _layer_eps(h, precision):
    """Machine epsilon of one recorded layer: ``precision`` when given, else its float dtype's (torch dtypes by
    name; bfloat16 2^-7), float64's for anything else."""
    d = precision if precision is not None else getattr(h, "dtype", None)
    name = str(d).replace("torch.", "")
    if name == "bfloat16":
        return 2.0 ** -7
    try:
        dt = np.dtype(name) if d is not None else np.dtype(float)
    except TypeError:
        dt = None
    if dt is None or not np.issubdtype(dt, np.floating):
        if precision is not None:
            raise InvalidValue(f"The 'precision' parameter of init.diagnose must be a float dtype (e.g. 'float32'). "
                               f"Got {precision!r} instead.")
        dt = np.dtype(float)
    return float(np.finfo(dt).eps)


@dataclass(frozen=True)
class Diagnosis(ToXarray):
    """Measured per-layer statistics against the mean-field theory; arrays of shape (depth,).

    ``q``, ``c``, ``gamma``: measured (q = mean_a ``|h_a|^2/n``; c = mean over pairs a < b of
    Q_ab/sqrt(Q_aa Q_bb), Q = H H^T/n; gamma = Vtilde/V, the estimator of ``sf.simulate``).
    ``*_theory``: infinite width (``sf.propagate``; gamma by ``sf.finite_data_gamma`` at P inputs).
    ``*_mean``, ``*_sd``: the width-n mean and standard deviation (``sf.finite_width`` for one input,
    ``sf.gram_fluctuations`` for several; NaN where not available). ``*_flag``: outside mean +- z sd, or
    not finite (c and gamma need two inputs). ``status`` per layer (DIAGNOSIS_STATUS), ``reasons`` in words;
    ``ok`` is False when a layer is flagged, None when nothing was compared (no band), else True.
    ``eps``: machine epsilon of each recorded layer; where the measured 1 - c is below :func:`precision_floor`
    the inputs' pre-activations agree to rounding (float32 saturation of an ordered network): c and gamma
    are not compared there (status 4), instead of a false alarm against a band the recording cannot resolve.
    ``to_xarray()``: every array over ``layer``, ``status`` with CF flags.
    """
    layers: np.ndarray
    q: np.ndarray
    c: np.ndarray
    gamma: np.ndarray
    q_theory: np.ndarray
    c_theory: np.ndarray
    gamma_theory: np.ndarray
    q_mean: np.ndarray
    q_sd: np.ndarray
    c_mean: np.ndarray
    c_sd: np.ndarray
    gamma_mean: np.ndarray
    gamma_sd: np.ndarray
    z: float = 2.0
    params: dict = field(default_factory=dict)
    note: str = ""
    eps: np.ndarray | None = None
    STATUS = DIAGNOSIS_STATUS

    def _applies(self, name: str) -> bool:
        return name == "q" or self.params.get("n_inputs", 2) > 1

    @property
    def beyond_precision(self) -> np.ndarray:
        """Per layer: 1 - c (measured) < :func:`precision_floor`, the rounding floor of the recording."""
        if not self._applies("c"):
            return np.zeros(len(self.layers), bool)
        eps = np.full(len(self.layers), np.finfo(float).eps) if self.eps is None else np.asarray(self.eps, float)
        with np.errstate(invalid="ignore"):
            return np.isfinite(self.q) & np.isfinite(self.c) & (1 - self.c < precision_floor(eps))

    def _skip(self, name):
        return np.zeros(len(self.layers), bool) if name == "q" else self.beyond_precision

    def nonfinite(self, name: str) -> np.ndarray:
        """Per layer: the measured statistic ``name`` is NaN or infinite (where it applies and is resolvable)."""
        if not self._applies(name):
            return np.zeros(len(self.layers), bool)
        return ~np.isfinite(getattr(self, name)) & ~self._skip(name)

    def compared(self, name: str) -> np.ndarray:
        """Per layer: a finite band exists for ``name`` and the recording resolves it."""
        band = np.isfinite(getattr(self, f"{name}_mean")) & np.isfinite(getattr(self, f"{name}_sd"))
        return band & ~self._skip(name) if self._applies(name) else np.zeros(len(self.layers), bool)

    def outside(self, name: str) -> np.ndarray:
        """Per layer: the finite measurement lies outside mean +- z sd."""
        x, mean, sd = (getattr(self, f"{name}{s}") for s in ("", "_mean", "_sd"))
        with np.errstate(invalid="ignore"):
            return self.compared(name) & np.isfinite(x) & (np.abs(x - mean) > self.z * sd)

    def _flag(self, name):
        return self.outside(name) | self.nonfinite(name)

    @property
    def q_flag(self):
        return self._flag("q")

    @property
    def c_flag(self):
        return self._flag("c")

    @property
    def gamma_flag(self):
        return self._flag("gamma")

    @property
    def flags(self):
        """Per layer: True where q, c or gamma lies outside its band or is not finite."""
        return self.q_flag | self.c_flag | self.gamma_flag

    @property
    def status(self) -> np.ndarray:
        """Per layer (DIAGNOSIS_STATUS): 2 a non-finite measurement, else 1 outside a band, else 4 when c and
        gamma are beyond the recording precision, else 3 when no statistic had a band, else 0."""
        bad = np.any([self.nonfinite(n) for n in STATS], axis=0)
        out = np.any([self.outside(n) for n in STATS], axis=0)
        seen = np.any([self.compared(n) for n in STATS], axis=0)
        code = np.where(bad, 2, np.where(out, 1, np.where(self.beyond_precision, 4, np.where(seen, 0, 3))))
        return code.astype(np.int8)

    @property
    def reasons(self) -> list:
        """Per layer, why it is flagged or not compared ('' when inside every band)."""
        rows, status = [], self.status

        def band(n, i):
            m, s = getattr(self, n + "_mean")[i], self.z * getattr(self, n + "_sd")[i]
            return f"[{m - s:.6g}, {m + s:.6g}]"

        for i in range(len(self.layers)):
            why = [f"{n} = {getattr(self, n)[i]:g} is not finite" for n in STATS if self.nonfinite(n)[i]]
            why += [f"{n} = {getattr(self, n)[i]:.6g} outside {band(n, i)}" for n in STATS if self.outside(n)[i]]
            if not why and status[i] == 3:
                why = ["not compared: no finite-width band"]
            if self.beyond_precision[i]:
                why.append(self._precision_reason(i))
            rows.append("; ".join(why))
        return rows

    def _precision_reason(self, i):
        eps = float(self.eps[i]) if self.eps is not None else float(np.finfo(float).eps)
        kind = {float(np.finfo(t).eps): t.__name__ for t in (np.float16, np.float32, np.float64)}.get(eps, "bfloat16"
                                                                                                      if eps == 2.0 ** -7 else f"eps {eps:.3g}")
        return (f"{kind} saturation: measured 1 - c = {1 - self.c[i]:.3g} < {float(precision_floor(eps)):.3g} "
                f"(precision_floor), the inputs agree to rounding, so c and gamma (= {self.gamma[i]:.3g}) "
                f"are not measurable here (theory 1 - c = {1 - self.c_theory[i]:.3g}); q is still compared")

    @property
    def ok(self) -> bool | None:
        """False when a layer is flagged (outside a band or non-finite), None when no layer was compared with
        a band (e.g. bands=False), else True."""
        if self.flags.any():
            return False
        return None if (self.status == 3).all() else True

    def table(self) -> str:
        """A per-layer table: measured, infinite-width theory, width-n band, and a flag column."""
        p = self.params
        head = (f"diagnose: {p['act']}, sigma_w2={p['sigma_w2']:g}, sigma_b2={p['sigma_b2']:g}, width={p['width']}, "
                f"{p['n_inputs']} inputs, q0={p['q0']:.6g}, qab0={p['qab0']:.6g}; band = width-{p['width']} "
                f"mean +- {self.z:.4g} sd ({p.get('z_rule', 'given')})")

        def cell(x, t, m, s, f):
            band = "" if not np.isfinite(s) else f"[{m - self.z * s:.4g}, {m + self.z * s:.4g}]"
            return f"{x:9.4g} {t:9.4g} {band:>21}{'*' if f else ' '}"

        cols = f"{'layer':>5} | {'q':>9} {'theory':>9} {'band':>21}  | {'c':>9} {'theory':>9} {'band':>21}  |" \
               f" {'gamma':>9} {'theory':>9} {'band':>21}  | flag"
        rows = [head, cols, "-" * len(cols)]
        word = {0: "ok", 1: "OUTSIDE", 2: "NON-FINITE", 3: "not compared", 4: "ok (c, gamma beyond precision)"}
        marks, status = {n: self._flag(n) for n in STATS}, self.status
        for i, l in enumerate(self.layers):
            rows.append(f"{l:>5} | " + " | ".join(cell(getattr(self, n)[i], getattr(self, n + "_theory")[i],
                                                       getattr(self, n + "_mean")[i], getattr(self, n + "_sd")[i],
                                                       marks[n][i]) for n in STATS)
                        + " | " + word[int(status[i])])
        counts = [int((status == k).sum()) for k in (1, 2, 3, 4)]
        verdict = {True: "ok", False: "NOT ok", None: "inconclusive (nothing compared)"}[self.ok]
        sat = (f" {counts[3]} with c and gamma beyond the recording precision (float saturation, see reasons)."
               if counts[3] else "")
        rows.append(f"{counts[0]} of {len(self.layers)} layers outside the band, {counts[1]} non-finite, "
                    f"{counts[2]} not compared (* marks the statistic): {verdict}." + sat
                    + (f" {self.note}" if self.note else ""))
        return "\n".join(rows)

    __str__ = table

    def dataset_parts(self) -> dict:
        """The arrays, coordinates, dims and parameters of :meth:`to_xarray` (for symfield.io.output.save)."""
        data = {f"{n}{s}": np.asarray(getattr(self, f"{n}{s}"), dtype=float) for n in STATS
                for s in ("", "_theory", "_mean", "_sd")}
        data.update({f"{n}_flag": self._flag(n).astype(np.int8) for n in STATS}, status=self.status)
        if self.eps is not None:
            data["eps"] = np.asarray(self.eps, float)
        va = {"status": {"long_name": "layer status (see flag_meanings)", **flags(DIAGNOSIS_STATUS_NAMES)}}
        for n, what in (("q", "variance q"), ("c", "correlation c"), ("gamma", "gamma")):
            va[n] = {"long_name": f"measured {what}", "units": "1"}
            va[f"{n}_theory"] = {"long_name": f"infinite-width theory of {what}", "units": "1"}
            va[f"{n}_mean"] = {"long_name": f"width-n mean of {what} (band centre)", "units": "1"}
            va[f"{n}_sd"] = {"long_name": f"width-n standard deviation of {what} (band half-width / z)", "units": "1"}
            va[f"{n}_flag"] = {"long_name": f"{what} outside its band or not finite", "units": "1",
                               **flags(("not_flagged", "flagged"))}
        params = {**{k: v for k, v in self.params.items() if v is not None}, "z": self.z, "note": self.note}
        va["eps"] = {"long_name": "machine epsilon of the recorded layer's float type", "units": "1"}
        return dict(data=data, coords={"layer": np.asarray(self.layers)}, params=params, var_attrs=va)


def _measure(H):
    """(q, c, gamma) of one layer's pre-activations H (P, n)."""
    P, n = H.shape
    with np.errstate(all="ignore"):          # a non-finite layer gives non-finite statistics (flagged)
        Q = H @ H.T / n
        q = float(np.trace(Q) / P)
        if P < 2:
            return q, math.nan, math.nan, math.nan
        i, j = np.triu_indices(P, 1)
        d = np.diag(Q)
        c = float(np.mean(Q[i, j] / np.sqrt(d[i] * d[j])))
        gamma = float(H.mean(axis=0).var() / H.var(axis=0).mean())
        return q, c, gamma, float(Q[i, j].mean())


def _bands(A, sw, sb, depth, q0, qab0, P, n, residual, bands):
    """Width-n means and sds of (q, c, gamma); NaN arrays (and a note) where the theory is not available."""
    nan = np.full(depth, np.nan)
    if not bands:
        return (nan,) * 6, "bands=False: no finite-width bands."
    try:
        if P == 1 and residual is None:
            fw = finite_width(A, sw, sb, depth, q0)
            return (fw.G(n), np.sqrt((2 * fw.K**2 + fw.V) / n), nan, nan, nan, nan), ""
        g = gram_fluctuations(A, sw, sb, depth, q0=(q0, q0, qab0), residual=residual)
    except (Unsupported, ArithmeticError, ValueError) as exc:
        return (nan,) * 6, f"no finite-width bands: {exc}"
    m, cov = g.mean(n), g.gram_cov
    q_mean = m[:, 0]
    q_sd = np.sqrt((cov[:, 0, 0] + (P - 1) * cov[:, 0, 1]) / (P * n))    # mean of P exchangeable q_aa
    if P == 1:
        return (q_mean, q_sd, nan, nan, nan, nan), ""
    c_mean, c_sd = g.c_mean(n), np.sqrt(g.c_var(n))                      # one pair: bounds the pair mean's sd
    gamma_mean = finite_data_gamma(q_mean, m[:, 2], P)[2]
    gamma_sd = P / ((P - 1) * (1 - c_mean) ** 2) * c_sd                 # delta method, d gamma/dc
    return (q_mean, q_sd, c_mean, c_sd, gamma_mean, gamma_sd), ""


def _recorded(activations, precision):
    """(layers as float64 (P, n) arrays, machine epsilon per layer, P) of diagnose's ``activations``."""
    F = "init.diagnose"
    if isinstance(activations, np.ndarray) and activations.ndim == 2:
        activations = [activations]
    eps = np.array([_layer_eps(h, precision) for h in activations])
    Hs = [np.asarray(h, dtype=float) for h in activations]
    if not Hs:
        raise InvalidValue(f"The 'activations' parameter of {F} must hold at least one layer. Got [] instead.")
    P = Hs[0].shape[0] if Hs[0].ndim else 0
    if any(h.ndim < 2 or h.shape[0] != P for h in Hs) or P < 1:
        raise InvalidValue(f"The 'activations' parameter of {F} must be arrays of shape (n_inputs, width) with the "
                           f"same n_inputs. Got shapes {[h.shape for h in Hs]} instead.")
    return [h.reshape(P, -1) for h in Hs], eps, P


def _inputs(meas, q0, qab0, sw, sb, P):
    """(q0, qab0) of diagnose: given, or from layer 1's measured q and mean overlap, (m - sigma_b2)/sigma_w2."""
    F = "init.diagnose"
    if (q0 is None or (qab0 is None and P > 1)) and not np.all(np.isfinite(meas[0, [0, 3] if P > 1 else [0]])):
        raise InvalidValue(f"The 'activations' parameter of {F} must be finite in layer 1 when q0 and qab0 come from "
                           f"it. Got q = {meas[0, 0]:g}, mean overlap = {meas[0, 3]:g} there instead; pass q0 and qab0.")
    q0 = (meas[0, 0] - sb) / sw if q0 is None else float(check.real(F, "q0", q0, lo=0, lo_open=True))
    if qab0 is None:
        qab0 = (meas[0, 3] - sb) / sw if P > 1 else 0.0
    qab0 = float(check.real(F, "qab0", qab0))
    if not q0 > 0 or abs(qab0) > q0:
        raise InvalidValue(f"{F}: layer 1 implies q0 = {q0:.6g}, qab0 = {qab0:.6g} (not a covariance); "
                           "pass q0 and qab0, or check sigma_w2 and sigma_b2.")
    return q0, qab0


def diagnose(activations, act, sigma_w2, sigma_b2, width=None, q0=None, qab0=None, residual=None,
             z=None, bands=True, precision=None) -> Diagnosis:
    """Compare pre-activations recorded from any framework with the mean-field theory, layer by layer.

    Parameters
    ----------
    activations : sequence of array-likes
        One per layer, shape (n_inputs, width) (trailing axes are flattened), the pre-activations
        h = W x + b of consecutive layers; ``activations[0]`` is layer 1, the linear layer of
        ``sf.propagate``. Same inputs in every layer; the theory assumes inputs of (about) equal norm
        and pairwise correlation.
    act, sigma_w2, sigma_b2 : the activation and variances the network was initialised with.
    width : int, optional
        n of the bands; default the most common width of the recorded layers.
    q0, qab0 : float, optional
        Input norm ``|x|^2/n0`` and mean input overlap x_a.x_b/n0; by default from layer 1's measurement,
        q0 = (q^(1) - sigma_b2)/sigma_w2 (so layer 1 agrees by construction).
    residual : float, optional
        alpha of residual blocks, passed to the theory.
    z : float, optional
        Band half-width in standard deviations. Default: the family-wise z of :func:`family_z` over the m
        compared bands (a correct theory flags a network with probability <= 5 %; z = 2.865 for m = 12;
        measured coverage in :func:`family_z`).
    bands : bool
        False skips the finite-width theory (``sf.gram_fluctuations`` takes ~20 s for tanh).
    precision : dtype, optional
        Float type the network ran in; default each recorded array's dtype (numpy or torch). Sets the
        rounding floor of 1 - c (:func:`precision_floor`) below which c and gamma are reported as saturated
        (status 4) instead of compared.

    Returns
    -------
    Diagnosis
        Arrays per layer, ``flags``, ``ok`` and ``table()`` (also ``str()``).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> X = rng.standard_normal((4, 256))
    >>> hs, h = [], X
    >>> for l in range(3):
    ...     h = (np.maximum(h, 0) if l else h) @ rng.standard_normal((256, 256)) * std("relu", 256)
    ...     hs.append(h)
    >>> diagnose(hs, "relu", 2.0, 0.0).ok
    True
    """
    F = "init.diagnose"
    sw = float(check.real(F, "sigma_w2", sigma_w2, lo=0, lo_open=True))
    sb = float(check.real(F, "sigma_b2", sigma_b2, lo=0))
    if z is not None:
        z = float(check.real(F, "z", z, lo=0, lo_open=True))
    A = _act(act)
    Hs, eps, P = _recorded(activations, precision)
    n = Counter(h.shape[1] for h in Hs).most_common(1)[0][0] if width is None else width
    n = check.integer(F, "width", n, lo=1)
    meas = np.array([_measure(h) for h in Hs])
    depth = len(Hs)
    q0, qab0 = _inputs(meas, q0, qab0, sw, sb, P)
    p = propagate(A, sw, sb, depth, q0=q0, qab0=qab0, residual=residual)
    qt, qabt = np.asarray(p.q, float).reshape(depth), np.asarray(p.qab, float).reshape(depth)
    with np.errstate(invalid="ignore", divide="ignore"):
        ct = qabt / qt if P > 1 else np.full(depth, np.nan)
        gt = finite_data_gamma(qt, qabt, P)[2] if P > 1 else np.full(depth, np.nan)
        (qm, qsd, cm, csd, gm, gsd), note = _bands(A, sw, sb, depth, q0, qab0, P, n, residual, bands)
    d = Diagnosis(layers=np.arange(1, depth + 1), q=meas[:, 0], c=meas[:, 1], gamma=meas[:, 2],
                  q_theory=qt, c_theory=ct, gamma_theory=gt, q_mean=qm, q_sd=qsd, c_mean=cm, c_sd=csd,
                  gamma_mean=gm, gamma_sd=gsd, z=2.0 if z is None else z, note=note, eps=eps,
                  params=dict(act=A.name, sigma_w2=sw, sigma_b2=sb, width=n, n_inputs=P, q0=q0, qab0=qab0,
                              residual=residual, z_rule="given" if z is not None else "family-wise 5 %"))
    if z is None:
        d = replace(d, z=family_z(sum(int(d.compared(s).sum()) for s in STATS)))
    return d
