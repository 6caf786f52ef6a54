"""Edge-of-chaos initialisers for JAX/Flax and PyTorch, neural-tangents conversions, and a diagnosis
of recorded pre-activations against the mean-field theory (docs/theory.md sections 2, 5, 9, 10).

``gains``: gain = sqrt(sigma_w2) at the edge of chaos and the weight scales and fans built on it;
``frameworks``: the jax/torch adapters (jax and torch are imported only inside them; neither is a dependency);
``diagnosis``: :func:`diagnose`, a recorded network's per-layer q, c and gamma against the theory's finite-width bands;
``protocol``: :func:`protocol`, the practitioner's per-layer statistics (q, zero and saturated fractions, gradient
ratios, non-finite counts) over seeds against their mean-field predictions and bands.
"""
from symfield.init.diagnosis import (DIAGNOSIS_STATUS, DIAGNOSIS_STATUS_NAMES, FAMILY_ALPHA, RESOLUTION,
                                    RESOLUTION_C, STATS, Diagnosis, diagnose, family_z, precision_floor)
from symfield.init.frameworks import (jax, jax_bias, record_flax, record_torch, record_torch_grads, torch_, torch_fan_in,
                                     torch_fans)
from symfield.init.protocol import (PROTOCOL_STATS, PROTOCOL_STATUS, PROTOCOL_STATUS_NAMES, SATURATION_RATIO,
                                   Protocol, protocol)
from symfield.init.gains import (DISTRIBUTIONS, MAX_STD, MODES, TRUNCATION, NTStd, Variances, bias_std, fan,
                                 from_nt, gain, kernel_fan_in, kernel_fans, output_bias, std, to_nt,
                                 truncated_variance)

__all__ = ["DIAGNOSIS_STATUS", "DIAGNOSIS_STATUS_NAMES", "DISTRIBUTIONS", "Diagnosis", "FAMILY_ALPHA", "MAX_STD",
           "MODES", "NTStd", "RESOLUTION", "RESOLUTION_C", "STATS", "TRUNCATION", "Variances", "bias_std",
           "diagnose", "family_z", "fan", "from_nt", "gain", "jax", "jax_bias", "kernel_fan_in", "kernel_fans",
           "output_bias", "precision_floor", "PROTOCOL_STATS", "PROTOCOL_STATUS", "PROTOCOL_STATUS_NAMES",
           "Protocol", "protocol", "record_flax", "record_torch", "record_torch_grads", "SATURATION_RATIO", "std", "to_nt", "torch_", "torch_fan_in",
           "torch_fans", "truncated_variance"]
