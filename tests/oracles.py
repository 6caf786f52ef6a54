"""Independent oracles for the kernel maps, driven by one registry.

Each entry gives phi and phi' written out by hand (mpmath and numpy versions), the kinks,
and where the literature has them, closed forms of V, C, mean, dpsi2, dC. Three oracles, none
of them through symfield's kernel maps: (a) the literature closed forms here, (b) mpmath
quadrature of the defining integral and (c) seeded Monte Carlo, both from
symfield.reports.oracles (the integrals sf.verify checks against, written from phi alone).
"""
import mpmath as mp
import numpy as np
from scipy import special as sps

from symfield.reports.oracles import mc_expect, mp_expect1, mp_expect2  # noqa: F401  (re-exported)


def _acos_relu(a, b):
    def C(q1, q2, q12):
        S = mp.sqrt(max(q1 * q2 - q12**2, 0))
        th = mp.atan2(S, q12)
        return ((a * a + b * b) * (S + (mp.pi - th) * q12) - 2 * a * b * (S - th * q12)) / (2 * mp.pi)

    def dC(q1, q2, q12):
        th = mp.atan2(mp.sqrt(max(q1 * q2 - q12**2, 0)), q12)
        return ((a * a + b * b) * (mp.pi - th) + 2 * a * b * th) / (2 * mp.pi)
    return dict(
        phi=lambda x: b * x if x > 0 else a * x, dphi=lambda x: b if x > 0 else a,
        np_phi=lambda x: np.where(x > 0, float(b) * x, float(a) * x),
        np_dphi=lambda x: np.where(x > 0, float(b), float(a)) + 0 * x,
        kinks=(0,), V=lambda q: (a * a + b * b) * q / 2, C=C, dC=dC,
        mean=lambda q: (b - a) * mp.sqrt(q / (2 * mp.pi)), dpsi2=lambda q: (a * a + b * b) / mp.mpf(2))


def _erf(a, b, c):
    def C(q1, q2, q12):
        return a * a * 2 / mp.pi * mp.asin(2 * b * b * q12 / mp.sqrt((1 + 2 * b * b * q1) * (1 + 2 * b * b * q2))) + c * c
    return dict(
        phi=lambda x: a * mp.erf(b * x) + c, dphi=lambda x: a * b * 2 / mp.sqrt(mp.pi) * mp.exp(-b * b * x * x),
        np_phi=lambda x: float(a) * sps.erf(float(b) * x) + float(c),
        np_dphi=lambda x: float(a * b) * 2 / np.sqrt(np.pi) * np.exp(-float(b * b) * x * x),
        V=lambda q: C(q, q, q), C=C, mean=lambda q: mp.mpf(c),
        dpsi2=lambda q: a * a * b * b * 4 / mp.pi / mp.sqrt(1 + 4 * b * b * q),
        dC=lambda q1, q2, q12: a * a * b * b * 4 / mp.pi / mp.sqrt((1 + 2 * b * b * q1) * (1 + 2 * b * b * q2) - 4 * b**4 * q12**2))


def _sigmoid(x):
    return 1 / (1 + mp.exp(-x))


REGISTRY = {
    "linear": _acos_relu(1, 1),
    "relu": _acos_relu(0, 1),
    "leaky_relu(0.2)": _acos_relu(mp.mpf("0.2"), 1),
    "abs": _acos_relu(-1, 1),
    "abrelu(-0.5, 2)": _acos_relu(mp.mpf("-0.5"), 2),
    "max(x, 0.1*x)": _acos_relu(mp.mpf("0.1"), 1),
    "erf": _erf(1, 1, 0),
    "erf(2, 0.5, 0.1)": _erf(2, mp.mpf("0.5"), mp.mpf("0.1")),
    "sin": dict(phi=mp.sin, dphi=mp.cos, np_phi=np.sin, np_dphi=np.cos,
                V=lambda q: (1 - mp.exp(-2 * q)) / 2, mean=lambda q: mp.mpf(0),
                C=lambda q1, q2, q12: mp.exp(-(q1 + q2) / 2) * mp.sinh(q12),
                dC=lambda q1, q2, q12: mp.exp(-(q1 + q2) / 2) * mp.cosh(q12),
                dpsi2=lambda q: (1 + mp.exp(-2 * q)) / 2),
    "cos": dict(phi=mp.cos, dphi=lambda x: -mp.sin(x), np_phi=np.cos, np_dphi=lambda x: -np.sin(x),
                V=lambda q: (1 + mp.exp(-2 * q)) / 2, mean=lambda q: mp.exp(-q / 2),
                C=lambda q1, q2, q12: mp.exp(-(q1 + q2) / 2) * mp.cosh(q12),
                dpsi2=lambda q: (1 - mp.exp(-2 * q)) / 2),
    "monomial(3)": dict(phi=lambda x: x**3, dphi=lambda x: 3 * x**2, np_phi=lambda x: x**3, np_dphi=lambda x: 3 * x**2,
                        V=lambda q: 15 * q**3, mean=lambda q: mp.mpf(0),
                        C=lambda q1, q2, q12: 9 * q1 * q2 * q12 + 6 * q12**3, dpsi2=lambda q: 27 * q**2),
    "monomial(4)": dict(phi=lambda x: x**4, dphi=lambda x: 4 * x**3, np_phi=lambda x: x**4, np_dphi=lambda x: 4 * x**3,
                        V=lambda q: 105 * q**4, mean=lambda q: 3 * q**2,
                        C=lambda q1, q2, q12: 9 * q1**2 * q2**2 + 72 * q1 * q2 * q12**2 + 24 * q12**4),
    "polynomial(coeffs=(1, 2, 3))": dict(
        phi=lambda x: 1 + 2 * x + 3 * x * x, dphi=lambda x: 2 + 6 * x,
        np_phi=lambda x: 1 + 2 * x + 3 * x * x, np_dphi=lambda x: 2 + 6 * x,
        mean=lambda q: 1 + 3 * q, V=lambda q: 1 + 10 * q + 27 * q * q,
        C=lambda q1, q2, q12: (1 + 3 * q1) * (1 + 3 * q2) + 4 * q12 + 18 * q12**2),
    "tanh": dict(phi=mp.tanh, dphi=lambda x: 1 / mp.cosh(x) ** 2, np_phi=np.tanh, np_dphi=lambda x: 1 / np.cosh(x) ** 2),
    "sigmoid": dict(phi=_sigmoid, dphi=lambda x: _sigmoid(x) * (1 - _sigmoid(x)),
                    np_phi=sps.expit, np_dphi=lambda x: sps.expit(x) * (1 - sps.expit(x))),
    "softplus": dict(phi=lambda x: mp.log(1 + mp.exp(x)), dphi=_sigmoid,
                     np_phi=lambda x: np.logaddexp(0, x), np_dphi=sps.expit),
    "silu": dict(phi=lambda x: x * _sigmoid(x), dphi=lambda x: _sigmoid(x) * (1 + x * (1 - _sigmoid(x))),
                 np_phi=lambda x: x * sps.expit(x), np_dphi=lambda x: sps.expit(x) * (1 + x * (1 - sps.expit(x)))),
    "gelu": dict(phi=lambda x: x * mp.ncdf(x), dphi=lambda x: mp.ncdf(x) + x * mp.npdf(x),
                 np_phi=lambda x: x * sps.ndtr(x), np_dphi=lambda x: sps.ndtr(x) + x * np.exp(-x * x / 2) / np.sqrt(2 * np.pi),
                 mean=lambda q: q / mp.sqrt(2 * mp.pi * (1 + q))),
    "elu": dict(phi=lambda x: x if x > 0 else mp.exp(x) - 1, dphi=lambda x: 1 if x > 0 else mp.exp(x),
                np_phi=lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0))),
                np_dphi=lambda x: np.where(x > 0, 1.0, np.exp(np.minimum(x, 0))), kinks=(0,)),
    "mish": dict(phi=lambda x: x * mp.tanh(mp.log(1 + mp.exp(x))),
                 dphi=lambda x: mp.tanh(mp.log(1 + mp.exp(x))) + x * _sigmoid(x) / mp.cosh(mp.log(1 + mp.exp(x))) ** 2,
                 np_phi=lambda x: x * np.tanh(np.logaddexp(0, x)),
                 np_dphi=lambda x: np.tanh(np.logaddexp(0, x)) + x * sps.expit(x) / np.cosh(np.logaddexp(0, x)) ** 2),
    "x*erf(x)": dict(phi=lambda x: x * mp.erf(x), dphi=lambda x: mp.erf(x) + 2 * x * mp.exp(-x * x) / mp.sqrt(mp.pi),
                     np_phi=lambda x: x * sps.erf(x), np_dphi=lambda x: sps.erf(x) + 2 * x * np.exp(-x * x) / np.sqrt(np.pi),
                     mean=lambda q: 2 * q / mp.sqrt(mp.pi * (1 + 2 * q))),
}


def monte_carlo(f, g, q1, q2, q12, n=400_000, seed=0):
    """Seeded Monte Carlo estimate of E[f(u) g(v)] and its standard error (n samples)."""
    z = np.random.default_rng(seed).standard_normal((2, n))
    return mc_expect(f, g, z, q1, q2, q12)


REGISTRY["swish"] = REGISTRY["silu"]
