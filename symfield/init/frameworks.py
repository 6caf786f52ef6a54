"""Framework adapters: JAX/Flax initialisers, PyTorch in-place initialisation and a recorder of a torch
model's pre-activations (for :func:`symfield.init.diagnose`). jax and torch are imported inside the
functions that need them; neither is a dependency of symfield.
"""
from __future__ import annotations

import contextlib
import math


from symfield.core.errors import InvalidType, InvalidValue
from symfield.init.gains import (DISTRIBUTIONS, TRUNCATION, bias_std, draw_scale, fan, gain, kernel_fans)

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
        s = draw_scale(g / math.sqrt(fan(*kernel_fans(shape, in_axis, out_axis, batch_axis), mode)), distribution)
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
    s = draw_scale(gain(act, sigma_b2, width, depth, **kw) / math.sqrt(n), distribution)
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


@contextlib.contextmanager
def record_torch_grads(model, types=None):
    """Context manager recording, in one forward and one backward pass, the outputs h (pre-activations) of
    every Linear/Conv module of ``model`` and the gradients dL/dh of the loss with respect to them.

    Yields ``(forward, grads)``: two lists, one numpy array (batch, -1) per module call in call order (as
    :func:`record_torch`); ``grads[i]`` is filled by a tensor hook on output i when ``loss.backward()`` runs
    inside the block (None for an output the backward pass did not reach, e.g. under ``torch.no_grad()``).
    Pass both to :func:`protocol`. The hooks are removed on exit.

    Examples
    --------
    >>> with record_torch_grads(model) as (acts, grads):             # doctest: +SKIP
    ...     torch.nn.functional.cross_entropy(model(x), y).backward()
    >>> print(protocol(acts, "relu", 2.0, 0.0, grads=grads))          # doctest: +SKIP
    """
    import torch
    types = types or (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
    out, grads, handles = [], [], []

    def as_numpy(t):
        t = t.detach().reshape(t.shape[0], -1).cpu()
        return (t.float() if t.dtype in (torch.float16, torch.bfloat16) else t).numpy()

    def hook(mod, inputs, output):
        i = len(out)
        out.append(as_numpy(output))
        grads.append(None)
        if output.requires_grad:
            def keep(g, i=i):
                grads[i] = as_numpy(g)
            output.register_hook(keep)

    for mod in model.modules():
        if isinstance(mod, types):
            handles.append(mod.register_forward_hook(hook))
    try:
        yield out, grads
    finally:
        for h in handles:
            h.remove()


def record_flax(module, params, x, loss_fn=None, types=None) -> tuple:
    """The pre-activations of every ``nn.Dense``/``nn.Conv`` call of a Flax linen ``module`` on the batch ``x``
    and, with ``loss_fn``, the gradients dL/dh of ``loss_fn(module.apply(params, x))`` with respect to them.

    The outputs are caught with ``nn.intercept_methods``; the gradients are those of the loss with respect to
    a zero perturbation added to each output (``jax.grad`` over the list of perturbations), which equal dL/dh.
    jax and flax are imported here only. Flax's ``nn.gelu`` is the tanh approximation by default
    (``approximate=True``) while symfield's ``"gelu"`` is the exact x Phi(x): use ``nn.gelu(x,
    approximate=False)`` in the model, or pass the tanh formula to :func:`protocol`.

    Parameters
    ----------
    module : flax.linen.Module
    params : dict
        The variables of ``module.init`` (``{"params": ...}``), or the params tree alone.
    x : array
        The fixed batch, first axis the batch.
    loss_fn : callable, optional
        Output -> scalar loss; None records the forward pass only.
    types : tuple of classes, optional
        Default ``(nn.Dense, nn.Conv)``.

    Returns
    -------
    tuple
        ``(forward, grads)``: lists of numpy arrays (batch, -1), one per call in call order; grads is None
        without ``loss_fn``.

    Examples
    --------
    >>> acts, grads = record_flax(mlp, variables, x, lambda out: out.sum())       # doctest: +SKIP
    >>> protocol(acts, "tanh", 1.76, 0.05, grads=grads).ok                       # doctest: +SKIP
    True
    """
    import jax as jx
    import jax.numpy as jnp
    import flax.linen as nn
    import numpy as np
    types = types or (nn.Dense, nn.Conv)
    variables = params if isinstance(params, dict) and "params" in params else {"params": params}

    def run(perturb):
        outs = []

        def catch(next_fun, args, kwargs, context):
            y = next_fun(*args, **kwargs)
            if isinstance(context.module, types) and context.method_name == "__call__":
                if perturb is not None:
                    y = y + perturb[len(outs)]
                outs.append(y)
            return y

        with nn.intercept_methods(catch):
            return module.apply(variables, x), outs

    def flat(a):
        return np.asarray(a, dtype=np.float32 if a.dtype == jnp.bfloat16 else a.dtype).reshape(a.shape[0], -1)

    _, outs = run(None)
    forward = [flat(h) for h in outs]
    if loss_fn is None:
        return forward, None
    grads = jx.grad(lambda p: loss_fn(run(p)[0]))([jnp.zeros_like(h) for h in outs])
    return forward, [flat(g) for g in grads]
