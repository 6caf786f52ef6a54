"""init.diagnose under LayerNorm and BatchNorm (docs/theory.md sections 10 and 12): the theory columns against
closed forms, and the Monte Carlo bands against seeded numpy networks with real normalisation layers written
here (not sf.simulate)."""
import math

import numpy as np
import pytest

import symfield as sf


def normalised(H, kind):
    axis = -1 if kind == "layer" else 0          # LayerNorm over the units of a sample, BatchNorm over the batch
    Z = H - H.mean(axis=axis, keepdims=True)
    return Z / np.sqrt((Z * Z).mean(axis=axis, keepdims=True))


def network(seed, act, sw, sb, norm, at, width=192, depth=6, P=4, scale=1.0):
    """Pre-activations of a seeded MLP [norm] -> phi -> [norm] -> W . + b on P orthonormal inputs (|x|^2 = width)."""
    rng = np.random.default_rng(seed)
    phi = {"relu": lambda v: np.maximum(v, 0), "tanh": np.tanh}[act]
    X = np.linalg.qr(rng.standard_normal((width, P)))[0].T * math.sqrt(width)
    h = X @ rng.standard_normal((width, width)) * math.sqrt(sw / width) + math.sqrt(sb) * rng.standard_normal(width)
    hs = [h]
    for _ in range(depth - 1):
        y = phi(normalised(h, norm) if at == "before" else h)
        y = normalised(y, norm) if at == "after" else y
        h = y @ rng.standard_normal((width, width)) * math.sqrt(scale * sw / width) + math.sqrt(sb) * rng.standard_normal(width)
        hs.append(h)
    return hs


def test_theory_columns_against_closed_forms():
    """relu: LayerNorm before phi gives q = sigma_w2/2 + sigma_b2 from layer 2 on; BatchNorm before phi (batch = the
    P = 4 inputs) gives the arc-cosine kernel at correlation -1/(P - 1): q_ab = sigma_w2 (sqrt(1 - r^2) + (pi - acos r) r)/(2 pi) + sigma_b2."""
    sw, sb = 2.0, 0.1
    d = sf.init.diagnose(network(0, "relu", sw, sb, "layer", "before"), "relu", sw, sb, q0=1.0, qab0=0.0, norm="layer")
    assert d.q_theory[0] == pytest.approx(sw + sb, rel=1e-15)
    assert np.allclose(d.q_theory[1:], sw / 2 + sb, rtol=1e-14)
    d = sf.init.diagnose(network(0, "relu", sw, sb, "batch", "before"), "relu", sw, sb, q0=1.0, qab0=0.0, norm="batch")
    r = -1 / 3
    qab = sw * (math.sqrt(1 - r * r) + (math.pi - math.acos(r)) * r) / (2 * math.pi) + sb
    assert np.allclose(d.c_theory[1:], qab / (sw / 2 + sb), rtol=1e-13)
    assert d.params["norm"] == "batch" and d.params["batch"] == 4 and "seeded networks" in d.note


@pytest.mark.parametrize("act,norm,at", [("tanh", "layer", "before"), ("relu", "layer", "after"),
                                         ("relu", "batch", "before"), ("tanh", "batch", "after")])
def test_bands_hold_the_true_model_and_flag_a_wrong_one(act, norm, at):
    """Twelve seeded networks of the stated model: at most two flagged (family-wise 5 %: 0.6 expected; P(>= 3)
    < 2 %); run at twice the stated sigma_w2 (layers >= 2), every one of three networks is flagged."""
    sw, sb = 1.5, 0.1
    true = [sf.init.diagnose(network(100 + s, act, sw, sb, norm, at), act, sw, sb, q0=1.0, qab0=0.0,
                             norm=norm, norm_at=at).ok for s in range(12)]
    assert sum(not ok for ok in true) <= 2, true
    wrong = [sf.init.diagnose(network(200 + s, act, sw, sb, norm, at, scale=2.0), act, sw, sb, q0=1.0, qab0=0.0,
                              norm=norm, norm_at=at).ok for s in range(3)]
    assert not any(wrong), wrong


def test_bad_norm_arguments_of_diagnose():
    hs = network(0, "relu", 2.0, 0.0, "layer", "before")
    with pytest.raises(ValueError, match="'norm' parameter of init.diagnose"):
        sf.init.diagnose(hs, "relu", 2.0, 0.0, norm="group")
    with pytest.raises(ValueError, match="'norm_at' parameter of init.diagnose"):
        sf.init.diagnose(hs, "relu", 2.0, 0.0, norm="layer", norm_at="middle")
    with pytest.raises(ValueError, match="'batch' parameter of init.diagnose"):
        sf.init.diagnose(hs, "relu", 2.0, 0.0, norm="batch", batch=8)
