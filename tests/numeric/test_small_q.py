"""V and the mean at small q (symfield.numeric.small_q): float64 against mpmath at 30 digits."""
import mpmath as mp
import numpy as np
import pytest
import sympy as sp

import symfield as sf
from symfield.core.errors import PrecisionError
from symfield.numeric.context import Mp
from symfield.numeric.maps import maps
from symfield.numeric.small_q import Q_SMALL, small_q
from symfield.numeric.table1d import TOL
from symfield.symbolic.kernel import kernel

QS = np.array([1e-14, 1e-12, 1e-9, 1e-6, 1e-4, 1e-2, 0.09, Q_SMALL, 0.3])
ZERO_AT_ZERO = ["relu", "abs", "leaky_relu", "linear", "elu", "erf", "gelu", "silu", "mish", "tanh", "sin",
                "monomial"]


def worst(act, name):
    K = kernel(sf.activation(act))
    got = getattr(maps(K), name)(QS)
    want = getattr(maps(K, 30), name)(np.array([mp.mpf(q) for q in QS], dtype=object))
    scale = [max(abs(w), mp.mpf(q)) for w, q in zip(want, QS)]     # odd phi: mean 0, compared on the scale q
    return max(float(abs(g - w) / s) for g, w, s in zip(got, want, scale))


@pytest.mark.parametrize("act", ZERO_AT_ZERO)
def test_variance_map_keeps_its_digits_as_q_goes_to_0(act):
    """Old code: elu 7.7e-5 and sin 2.2e-5 relative at q = 1e-12 (O(1) terms of the closed form cancelling).
    Closed forms and the rule: 2e-15; integrals read from their 1-D table: its certified TOL per panel."""
    K = kernel(sf.activation(act))
    assert worst(act, "V") < (2e-15 if not K.V.has(sp.Integral) else 10 * TOL)
    assert (small_q(K) is not None) == (act in ("elu", "sin"))     # the rule only where the closed form loses


@pytest.mark.parametrize("act", ["elu", "gelu", "relu", "sin", "tanh"])
def test_mean_at_small_q(act):
    """elu's closed-form mean lost 8.9e-5 at q = 1e-12; the folded rule keeps 1e-10 (its two halves, each
    O(sqrt q), still cancel to O(q)); the others keep their closed forms or quadrature."""
    assert worst(act, "mean") < 1e-10


def test_elu_q_star_is_zero_at_1_0():
    """Old code: q* = 1.4e-11 (float64) and a ValueError from inside mpmath.findroot at dps = 30."""
    assert sf.q_star("elu", 1.0, 0.0) == 0.0
    assert sf.q_star("elu", 1.0, 0.0, dps=30) == 0
    assert float(sf.q_star("elu", 1.2, 0.0, dps=30)) == pytest.approx(sf.q_star("elu", 1.2, 0.0), rel=1e-12)


def test_a_bracket_without_a_root_is_a_precision_error():
    with pytest.raises(PrecisionError, match="no root found at dps=20"):
        Mp(20).root(lambda t: t * t + 1, mp.mpf(0), mp.mpf(1), "test")
