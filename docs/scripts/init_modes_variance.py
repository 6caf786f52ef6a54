"""Output variance of real torch and Flax layers initialised by sf.init in each mode (issue 33).

Var(y)/E[x^2] per layer, mean +- standard error over seeded layers; the theory is gain^2 fan_in/n with n the
mode's count (relu: gain^2 = 2). usage: PYTHONPATH=. python3 docs/scripts/init_modes_variance.py
"""
import math

import numpy as np
import torch

import symfield as sf


def mean_se(v):
    v = np.asarray(v, float)
    return v.mean(), v.std(ddof=1) / math.sqrt(v.size)


print("torch Linear(256, 512), 40 layers x 64 inputs:")
for mode, n in (("fan_in", 256), ("fan_out", 512), ("fan_avg", 384)):
    r = []
    for seed in range(40):
        torch.manual_seed(seed)
        lin = sf.init.torch_(torch.nn.Linear(256, 512, bias=False), "relu", mode=mode).double()
        x = torch.randn(64, 256, dtype=torch.float64)
        with torch.no_grad():
            r.append((lin(x) ** 2).mean().item() / (x ** 2).mean().item())
    m, se = mean_se(r)
    print(f"  {mode:8s} measured {m:.4f} +- {se:.4f}   theory 2*256/{n} = {2 * 256 / n:.4f}")

print("torch ConvTranspose2d(64, 32, k, stride=2), interior outputs, 30 layers x 8 inputs 16x16:")
for k, pad, op in ((4, 1, 0), (3, 1, 1)):
    r = []
    for seed in range(30):
        torch.manual_seed(seed)
        layer = sf.init.torch_(torch.nn.ConvTranspose2d(64, 32, k, stride=2, padding=pad, output_padding=op,
                                                        bias=False), "relu").double()
        x = torch.randn(8, 64, 16, 16, dtype=torch.float64)
        with torch.no_grad():
            y = layer(x)[..., 2:-2, 2:-2]
        r.append((y ** 2).mean().item() / (x ** 2).mean().item())
    m, se = mean_se(r)
    naive = torch.nn.init._calculate_fan_in_and_fan_out(layer.weight)[0]
    print(f"  k={k} pad={pad} output_padding={op}: fan_in {sf.init.torch_fan_in(layer):g} (torch's count {naive}); "
          f"measured {m:.4f} +- {se:.4f}, theory 2; with torch's count it would be {m * sf.init.torch_fan_in(layer) / naive:.4f}")

import jax  # noqa: E402
import flax.linen as nn  # noqa: E402
print("flax Dense(512) on 256 inputs, 30 layers x 64 inputs:")
for mode, n in (("fan_in", 256), ("fan_out", 512), ("fan_avg", 384)):
    r = []
    for seed in range(30):
        layer = nn.Dense(512, use_bias=False, kernel_init=sf.init.jax("relu", mode=mode))
        x = np.asarray(jax.random.normal(jax.random.PRNGKey(100 + seed), (64, 256)))
        y = np.asarray(layer.apply(layer.init(jax.random.PRNGKey(seed), x), x), float)
        r.append((y ** 2).mean() / (x.astype(float) ** 2).mean())
    m, se = mean_se(r)
    print(f"  {mode:8s} measured {m:.4f} +- {se:.4f}   theory 2*256/{n} = {2 * 256 / n:.4f}")
print("output_bias(0.01) =", sf.init.output_bias(0.01), "; with logit_var=2:", sf.init.output_bias(0.01, logit_var=2.0))
