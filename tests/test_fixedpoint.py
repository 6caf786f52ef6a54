"""Variance fixed point q* by bracketing root finding."""
import math

import mpmath as mp
import numpy as np
import pytest

import symfield as sf
from oracles import mp_expect1


def test_relu_q_star_closed_form():
    for sw, sb in [(0.5, 0.1), (1.5, 0.1), (1.9, 2.0)]:
        assert sf.q_star("relu", sw, sb) == pytest.approx(sb / (1 - sw / 2), rel=1e-14)
    assert sf.q_star("relu", 2.5, 0.1) == math.inf          # variance grows geometrically
    assert sf.q_star("relu", 1.5, 0.0) == 0.0


def test_relu_chi1_at_q_star():
    assert sf.chi1("relu", 1.5, 0.1) == pytest.approx(0.75, rel=1e-15)


def test_tanh_public_reference_q_star():
    # MATH.md section 9: tanh EOC at sigma_b2 = 0.05 is sigma_w2 = 1.76095 with q* = 0.57005
    assert sf.q_star("tanh", 1.76095, 0.05) == pytest.approx(0.57005, abs=5e-6)
    assert sf.q_star("tanh", 0.9, 0.0) == 0.0
    assert sf.q_star("tanh", 2.0, 0.0) > 0.5


def test_q_star_dps_solves_the_defining_equation():
    r = sf.q_star("tanh", 1.5, 0.1, dps=30)
    with mp.workdps(30):
        resid = mp.mpf("1.5") * mp_expect1(lambda t: mp.tanh(t) ** 2, r, dps=30) + mp.mpf("0.1") - r
        assert abs(resid) < mp.mpf(10) ** -27
    assert abs(float(r) - sf.q_star("tanh", 1.5, 0.1)) < 1e-13


def test_q_star_broadcasts():
    out = sf.q_star("erf", np.array([[0.5], [1.5]]), np.array([0.0, 0.1]))
    assert out.shape == (2, 2) and out[0, 0] == 0.0 and out[1, 1] > 0
