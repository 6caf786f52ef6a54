"""E[Phi(a Z)^n], Z ~ N(0, 1), for arrays a >= 0: the n-th moment of IGB's G0 (a^2 = gamma, docs/theory.md
section 10) and the probability that n equicorrelated standard normals at correlation c = a^2/(1 + a^2) >= 0 are
all <= 0 (the dead units of BatchNorm after a relu-like phi, docs/theory.md section 12).

a <= 1: Gauss-Hermite in Z. a > 1 (the integrand steps at scale 1/a): x = a Z and Phi(-x) = 1 - Phi(x) give
E = 1/2 + int_0^inf [Phi(-x)^n - (1 - Phi(x)^n)] phi(x/a)/a dx, smooth and Gaussian-decaying, by Gauss-Legendre
on [0, 40].
"""
from __future__ import annotations

import numpy as np


def phi_power_mean(n: int, a, order: int = 200):
    """E[Phi(a Z)^n] for an array a >= 0 (module docstring), float64, ``order`` nodes per rule."""
    from scipy import special
    a = np.asarray(a, float)
    if n == 0:
        return np.ones_like(a)
    a = a[..., None]
    x, w = np.polynomial.hermite_e.hermegauss(order)
    small = special.ndtr(a * x) ** n @ w / np.sqrt(2 * np.pi)
    u, v = np.polynomial.legendre.leggauss(order)
    x, w = 20 * (u + 1), 20 * v
    with np.errstate(divide="ignore", invalid="ignore"):
        dens = np.exp(-0.5 * (x / np.maximum(a, 1)) ** 2) / (np.sqrt(2 * np.pi) * np.maximum(a, 1))
        f = (np.exp(n * special.log_ndtr(-x)) + np.expm1(n * special.log_ndtr(x))) * dens
    return np.where(a[..., 0] <= 1, small, 0.5 + f @ w)
