"""sf.igb.class_gradients_theory against sf.class_gradients (seeded finite networks; standard errors over networks).
The theory is the infinite-width limit; the loss factors are 2-D Gaussian integrals checked here by mpmath."""
import math

import mpmath as mp
import numpy as np
import pytest

import symfield as sf
from symfield.theory.igb import class_gradients_theory


@pytest.mark.slow
def test_loss_factors_against_mpmath():      # ~48 s: nested mpmath quadrature
    th = class_gradients_theory("relu", 2.0, 0.0, 6)
    s2, m2 = th["s2"], th["gamma"] * th["s2"]
    sig = lambda x: 1 / (1 + mp.exp(-x))   # noqa: E731
    with mp.workdps(20):
        def factor(sign):
            inner = lambda m: mp.quad(lambda e: sig(sign * m + mp.sqrt(s2) * e) ** 2 * mp.npdf(e), [-mp.inf, 0, mp.inf])  # noqa: E731
            return 2 * mp.quad(lambda m: inner(m) * mp.npdf(m, 0, mp.sqrt(m2)), [0, mp.inf])
        assert th["F"] == pytest.approx(float(factor(-1)), rel=1e-9)
        assert th["U"] == pytest.approx(float(factor(1)), rel=1e-9)


def _compare(depth, width, n_networks, seed):
    th = class_gradients_theory("relu", 2.0, 0.0, depth)
    sim = sf.class_gradients("relu", width=width, depth=depth, sigma_w2=2.0, sigma_b2=0.0, n_inputs=200,
                             n_networks=n_networks, seed=seed)
    n = n_networks
    for name in ("all", "favoured", "unfavoured"):
        v = getattr(sim, name) * width                       # per-node mean -> squared norm
        mean, se = v.mean(0), v.std(0, ddof=1) / math.sqrt(n)
        assert np.all(np.abs(mean - th[name]) <= 4 * se), (name, mean, se, th[name])
    Uv, Fv = sim.unfavoured * width, sim.favoured * width    # ratio of means, delta-method standard error
    R = Uv.mean(0) / Fv.mean(0)
    cov = np.array([np.cov(Uv[:, i], Fv[:, i]) for i in range(depth)])
    var = R ** 2 * (cov[:, 0, 0] / Uv.mean(0) ** 2 + cov[:, 1, 1] / Fv.mean(0) ** 2
                    - 2 * cov[:, 0, 1] / (Uv.mean(0) * Fv.mean(0))) / n
    assert np.all(np.abs(R - th["ratio"]) <= 4 * np.sqrt(var)), (R, np.sqrt(var), th["ratio"])
    return th, R, np.sqrt(var)


def test_class_gradients_theory_small():
    _compare(depth=8, width=400, n_networks=12, seed=3)


@pytest.mark.slow
def test_class_gradients_theory_relu_depth20():
    th, R, se = _compare(depth=20, width=1000, n_networks=12, seed=1)
    print("theory ratio", th["ratio"][0], "simulated", R, "+-", se)
