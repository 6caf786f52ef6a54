"""Finite-width fluctuations of the Gram matrix of two inputs (docs/theory.md sections 9.1 and 9.3).

Entries ordered (aa, bb, ab). With F(G) = (<psi_a^2>, <psi_b^2>, <psi_a psi_b>) at covariance G,
J = sigma_w2 dF/dG, H = sigma_w2 d^2F/dG^2 and Sigma(G) = Cov(psi_a^2, psi_b^2, psi_a psi_b), to leading
order in 1/n (plain network):

    K^(l+1)  = sigma_b2 + sigma_w2 F(K^(l))
    V^(l+1)  = sigma_w2^2 k Sigma(K^(l)) + J V^(l) J^T           V = lim n Cov G   (metric_cov)
    K1^(l+1) = J K1^(l) + (1/2) H : V^(l)                         E G = K + K1/n

and lim n Cov Ghat = V + W(K), W_(ab)(cd) = K_ac K_bd + K_ad K_bc (Ghat is Wishart given G). c_hat and
gamma_hat get their mean and variance by the delta method. Residual blocks: docs/theory.md section 9.3;
the ingredients near c = 1: docs/numerics.md section 8.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import math
from functools import cached_property

import mpmath
import numpy as np
import sympy as sp
from numpy.typing import NDArray

from symfield.core import validate as check
from symfield.core.dataset import ToXarray, flags
from symfield.core.progress import bar
from symfield.numeric import gram_near as near
from symfield.numeric.evaluate import GUARD_DIGITS, NUMPY_MODULES, to_mpf, vectorised
from symfield.numeric.maps import maps
from symfield.numeric.layer_pairs import T_ORDER, pair_moments, tensor_grid, tensor_moments
from symfield.symbolic import gaussian as G
from symfield.symbolic.activation import Activation, activation
from symfield.symbolic.formula import X
from symfield.symbolic.gram_moments import VARS, GramMoments, gram_moments
from symfield.symbolic.kernel import kernel
from symfield.theory.finite_width import coefficients

_F = "gram_fluctuations"
FD_TOL = 1e-7          # numeric derivatives (max-pools): flag a layer whose Richardson estimate exceeds this
PAIR_ORDER = 8         # Gauss-Legendre nodes per piece of the residual pair rule (numeric.layer_pairs)
PAIR_PANELS = (1.5,)   # ... and the piece length next to the bends of a smoothly bending activation
PAIR_TOL = 1e-5        # residual layers are flagged when the pair rule's error estimate exceeds this


STATUS_NAMES = ("ok", "error_estimate_above_tolerance", "non_finite", "c_equals_one")
TINY_D = 1e-150         # d below this (relative to q): c = 1 in float64 terms (status 3; d^2 would underflow)


@dataclass(frozen=True)
class GramFluctuations(ToXarray):
    """Leading-order finite-width statistics of the (aa, bb, ab) Gram entries; row i is layer i + 1.

    The recursion runs in the rotated basis x = (u + v)/2, y = u - v (``Kr``, ``K1r``, ``covr``: entries
    (xx, yy, xy), yy = d; symfield.numeric.gram_near), where the entries that vanish as c -> 1 keep their
    relative digits; c and gamma statistics are taken from it. ``status``: 0 ok; 1 an error estimate
    above its tolerance (numeric derivatives, the residual pair rule, the near-c = 1 rule's finer rerun,
    or (aa, bb, ab) ingredients used where 1 - c is too small for them); 2 non-finite; 3 d = 0 in float64
    terms (identical inputs, or 1 - c below 1e-150): c = 1, gamma = inf, the Gram entries and covariances
    stay accurate (gamma_mean inf, gamma_var NaN).

    ``to_xarray()``: ``K``, ``K1`` over (layer, entry), ``gram_cov``, ``metric_cov`` over (layer, entry,
    entry2), ``status``, ``c``, ``one_minus_c`` and ``gamma`` over (layer,); entry = ("aa", "bb", "ab").
    With dps, the values are float64 plus ``<name>_mp`` text to dps digits."""
    K: np.ndarray            # (depth, 3) infinite-width Gram
    K1: np.ndarray           # (depth, 3): E[Ghat] = K + K1/n
    gram_cov: np.ndarray     # (depth, 3, 3): lim n Cov(Ghat)
    metric_cov: np.ndarray   # (depth, 3, 3): lim n Cov(G)
    status: np.ndarray       # (depth,) see the class docstring (STATUS_NAMES)
    layers: np.ndarray
    moments: GramMoments = field(repr=False)
    params: dict = field(default_factory=dict)
    Kr: np.ndarray | None = field(default=None, repr=False)     # K in (xx, yy, xy)
    K1r: np.ndarray | None = field(default=None, repr=False)
    covr: np.ndarray | None = field(default=None, repr=False)   # gram_cov in (xx, yy, xy)

    ENTRIES = ("aa", "bb", "ab")
    STATUS_NAMES = STATUS_NAMES

    def dataset_parts(self) -> dict:
        """The arrays, coordinates, dims and parameters of :meth:`to_xarray` (for symfield.io.output.save)."""
        data = {"K": self.K, "K1": self.K1, "gram_cov": self.gram_cov, "metric_cov": self.metric_cov,
                "status": self.status, "c": self.c, "one_minus_c": self.one_minus_c, "gamma": self.gamma}
        data = {k: v for k, v in data.items() if v is not None}
        dims = {"K": ("layer", "entry"), "K1": ("layer", "entry"), "gram_cov": ("layer", "entry", "entry2"),
                "metric_cov": ("layer", "entry", "entry2"), "status": ("layer",), "c": ("layer",),
                "one_minus_c": ("layer",), "gamma": ("layer",)}
        params = {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.params.items()}
        return dict(data=data, coords={"layer": np.asarray(self.layers), "entry": np.array(self.ENTRIES),
                                       "entry2": np.array(self.ENTRIES)},
                    dims=dims, params=params, dps=self.params.get("dps"),
                    var_attrs={"K": {"long_name": "infinite-width Gram entry K"},
                               "status": status_attrs(np.asarray(self.status).dtype)})

    def mean(self, n: float) -> NDArray[Any]:
        """E[Ghat] at width n to first order: K + K1/n."""
        return self.K + self.K1 / n

    def _rot(self):
        if self.Kr is not None:
            return self.Kr, self.K1r, self.covr
        return near.rotate(self.K), near.rotate(self.K1), near.rotate_cov(self.gram_cov)

    def _omega(self):
        return near.omega(self._rot()[0])

    @property
    def one_minus_c(self) -> NDArray[Any]:
        """1 - c, with its relative digits as c -> 1 (det K/(s (s + K_ab)), s = sqrt(K_aa K_bb))."""
        return self._omega()[0]

    @property
    def c(self) -> NDArray[Any]:
        """Infinite-width correlation K_ab/sqrt(K_aa K_bb) (never above 1)."""
        return 1 - self.one_minus_c

    def one_minus_c_mean(self, n: float) -> NDArray[Any]:
        """E[1 - c_hat] at width n: w + (grad w . K1 + (1/2) hess w : gram_cov)/n, w = 1 - c (rotated basis)."""
        w, g, h = self._omega()
        _, K1r, covr = self._rot()
        return w + ((g * K1r).sum(axis=1) + (h * covr).sum(axis=(1, 2)) / 2) / n

    def c_mean(self, n: float) -> NDArray[Any]:
        """E[c_hat] at width n: c + (grad c . K1 + (1/2) hess c : gram_cov)/n."""
        return 1 - self.one_minus_c_mean(n)

    def c_var(self, n: float) -> NDArray[Any]:
        """Var[c_hat] at width n: grad c^T gram_cov grad c / n."""
        _, g, _ = self._omega()
        covr = self._rot()[2]
        return (g[:, :, None] * covr * g[:, None, :]).sum(axis=(1, 2)) / n

    @property
    def gamma(self) -> NDArray[Any]:
        """Infinite-width gamma = c/(1 - c) (inf where c = 1)."""
        w = self.one_minus_c
        return _where_zero(w, (1 - w) / _nonzero(w), np.inf)

    def gamma_mean(self, n: float) -> NDArray[Any]:
        """E[gamma_hat], gamma_hat = c_hat/(1 - c_hat): gamma(c) + gamma'(c) (E c_hat - c) + gamma''(c) Var c_hat/2."""
        w, wm, wv = self.one_minus_c, self.one_minus_c_mean(n), self.c_var(n)
        nz = _nonzero(w)
        out = _where_zero(w, 1 / nz - 1 - (wm - w) / nz ** 2 + wv / nz ** 3, np.inf)
        return self._out_of_range(out, np.inf)

    def gamma_var(self, n: float) -> NDArray[Any]:
        """Var[gamma_hat] = gamma'(c)^2 Var c_hat, gamma'(c) = 1/(1 - c)^2."""
        w = self.one_minus_c
        out = _where_zero(w, self.c_var(n) / _nonzero(w) ** 4, np.nan)
        return self._out_of_range(out, np.nan)

    def _out_of_range(self, out, at_zero):
        """NaN (``at_zero`` where d = 0) in the status-3 layers: their 1 - c is below 1e-150."""
        bad = np.asarray(self.status) == 3
        if bad.any():
            out = out.copy()
            out[bad] = [at_zero if v == 0 else np.nan for v in np.asarray(self.one_minus_c)[bad]]
        return out

    def band(self, n: float, z: float = 2.0) -> tuple[NDArray[Any], NDArray[Any]]:
        """(lower, upper) of K + K1/n -/+ z sqrt(diag(gram_cov)/n), shape (depth, 3) each."""
        m = self.mean(n)
        sd = np.sqrt(np.diagonal(self.gram_cov, axis1=1, axis2=2).astype(float) / n)
        return m - z * sd, m + z * sd


def status_attrs(dtype=np.int8) -> dict:
    """CF attributes of the status variable (gram_fluctuations and ``symfield gram``)."""
    return {"long_name": "layer status (see flag_meanings)", **flags(STATUS_NAMES, np.arange(4, dtype=dtype))}


def _nonzero(w):
    """w with exact zeros replaced by 1 (their values are overwritten by the caller)."""
    w = np.asarray(w)
    return np.where(w == 0, 1, w) if w.dtype != object else np.array([v if v != 0 else 1 for v in w], dtype=object)


def _where_zero(w, value, at_zero):
    w = np.asarray(w)
    out = np.array(value, dtype=w.dtype, copy=True)
    out[w == 0] = at_zero if w.dtype != object else mpmath.mpf(at_zero)
    return out


def wishart(K):
    """W(K)_(ab)(cd) = K_ac K_bd + K_ad K_bc in the (aa, bb, ab) order, for K of shape (..., 3)."""
    a, b, ab = K[..., 0], K[..., 1], K[..., 2]
    W = np.zeros(K.shape[:-1] + (3, 3), dtype=K.dtype)
    W[..., 0, 0], W[..., 1, 1], W[..., 2, 2] = 2 * a * a, 2 * b * b, a * b + ab * ab
    W[..., 0, 1] = W[..., 1, 0] = 2 * ab * ab
    W[..., 0, 2] = W[..., 2, 0] = 2 * a * ab
    W[..., 1, 2] = W[..., 2, 1] = 2 * b * ab
    return W


# ---------------------------------------------------------------- numbers of one layer
# Price's theorem for smooth phi, (u, v) ~ N(0, K): d/dq_ab E[f(u) g(v)] = E[f'(u) g'(v)] and
# d/dq_a E[f(u) g(v)] = E[f''(u) g(v)]/2. C, its gradient in (q_a, q_b, q_ab) and its Hessian (upper
# triangle in HESS_INDEX order) are E[phi^(a)(u) phi^(b)(v)] for (a, b) in PRICE, times PRICE_SCALE; then
# m22, m31, m13 (E[psi(u)^i psi(v)^j]): the row TERMS of :meth:`_Eval.layer_terms`.
HESS_INDEX = ((0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2))
PRICE = ((0, 0), (2, 0), (0, 2), (1, 1), (4, 0), (2, 2), (3, 1), (0, 4), (1, 3), (2, 2))
PRICE_SCALE = np.array([1, 1 / 2, 1 / 2, 1, 1 / 4, 1 / 4, 1 / 2, 1 / 4, 1 / 2, 1, 1, 1, 1])
TERMS = ("C", "dC/dq_a", "dC/dq_b", "dC/dq_ab") + tuple(f"hess {ij}" for ij in HESS_INDEX) + ("m22", "m31", "m13")


class _Eval:

    """Evaluates the ingredients at Gram points K (rows (aa, bb, ab)), float64 or mpmath at ``dps``."""

    def __init__(self, act: Activation, dps):
        self.gm, self.co, self.dps = gram_moments(act), coefficients(act), dps
        self.act, self.M = act, maps(kernel(act), dps)     # every number comes from the maps engine
        self.kk = self.M.K.kinks                           # the kernel's own kinks (phi's, pools included)
        self.tick = lambda: None     # progress: called after every evaluation

    def numeric_phi(self):
        """Vectorised float64 phi and phi' of the single-node activation."""
        e = self.act.expr
        return vectorised(e, NUMPY_MODULES), vectorised(sp.diff(e, X), NUMPY_MODULES)

    def one(self, expr, qv):
        out = self.M.expect(expr, (G.q,), (qv,))
        self.tick()
        return out

    def two(self, expr, K):
        out = self.M.expect(expr, VARS, (K[..., 0], K[..., 1], K[..., 2]))
        self.tick()
        return out

    def F(self, K):
        return [self.one(self.co.psi2, K[0]), self.one(self.co.psi2, K[1]), self.two(self.gm.C, K)]

    def smooth(self) -> bool:
        """float64, one node, no kinks: the two-input terms by tensor grids (:meth:`_tensor_terms`)."""
        return not self.dps and not len(self.kk) and (self.act.pool is None or self.act.k == 1)

    @cached_property
    def _derivs(self):
        """phi and its first four derivatives, vectorised (float64)."""
        e = self.act.expr
        return [vectorised(sp.diff(e, X, n), NUMPY_MODULES) for n in range(5)]

    def _tensor_terms(self, Km):
        """One row of :meth:`layer_terms`' two-input terms (TERMS) at a 2x2 K for a smooth phi: Price's theorem
        (PRICE) on the tensor rule of :func:`symfield.numeric.layer_pairs.tensor_grid`, with 4 more nodes per
        piece as the error estimate; None where the rule declines or the two differ by more than 1e-9 of the
        largest term."""
        rows = []
        for order in (T_ORDER, T_ORDER + 4):
            g = tensor_grid(Km, order)
            if g is None:
                return None
            x, y, rho = g
            fx, fy = [f(x) for f in self._derivs], [f(y) for f in self._derivs]
            E = [fx[a] @ rho @ fy[b] for a, b in PRICE]
            E += [(fx[0] ** 2) @ rho @ (fy[0] ** 2), (fx[0] ** 3) @ rho @ fy[0], fx[0] @ rho @ (fy[0] ** 3)]
            rows.append(np.array(E) * PRICE_SCALE / rho.sum())
        lo, hi = rows
        return hi if np.abs(hi - lo).max() <= 1e-9 * max(np.abs(hi).max(), 1e-300) else None

    def _quad_terms(self, K):
        """:meth:`layer_terms`' two-input terms (TERMS) by the maps engine (symbolic derivatives, or finite
        differences where there are none: status 1 where their estimate exceeds FD_TOL)."""
        gm, L = self.gm, len(K)
        R, status = np.zeros((L, len(TERMS)), dtype=K.dtype), np.zeros(L, dtype=np.int8)
        R[:, 0] = self.two(gm.C, K)
        if gm.grad is not None:
            R[:, 1:4] = np.stack([self.two(e, K) for e in gm.grad], axis=1)
            for n, (i, j) in enumerate(HESS_INDEX):     # the Hessian is symmetric: each entry evaluated once
                R[:, 4 + n] = self.two(gm.hess[i][j], K)
        else:
            if self.dps:
                gC, hC, err = _fd_mp(gm.C, self.M.K, self.dps, K)
            else:
                gC, hC, err = _fd(lambda a, b, c: self.two(gm.C, np.stack([a, b, c], -1)), K)
            R[:, 1:4] = gC
            for n, (i, j) in enumerate(HESS_INDEX):
                R[:, 4 + n] = hC[:, i, j]
            status[err > FD_TOL] = 1
        R[:, 10], R[:, 11], R[:, 12] = self.two(gm.m22, K), self.two(gm.m31, K), self.two(gm.m13, K)
        return R, status

    def layer_terms(self, K):
        """F = (<psi_a^2>, <psi_b^2>, C), J/sigma_w2, H/sigma_w2, Sigma and a status per row of K (shape (L, 3))."""
        L, dt = len(K), K.dtype
        co = self.co
        psi2 = [self.one(co.psi2, K[:, i]) for i in (0, 1)]
        d1 = [self.one(co.dpsi2, K[:, i]) for i in (0, 1)]
        d2 = [self.one(co.d2psi2, K[:, i]) for i in (0, 1)]
        m4 = [self.one(co.psi4, K[:, i]) for i in (0, 1)]
        if self.smooth():
            R, status = np.full((L, len(TERMS)), np.nan), np.zeros(L, dtype=np.int8)
            for n, k in enumerate(K):
                r = self._tensor_terms(_mat(k))
                if r is not None:
                    R[n] = r
            rest = np.isnan(R).any(axis=1)
            if rest.any():
                R[rest], status[rest] = self._quad_terms(K[rest])
        else:
            R, status = self._quad_terms(K)
        C, m22, m31, m13 = R[:, 0], R[:, 10], R[:, 11], R[:, 12]
        J = np.zeros((L, 3, 3), dtype=dt)
        H = np.zeros((L, 3, 3, 3), dtype=dt)
        J[:, 0, 0], J[:, 1, 1], J[:, 2, :] = d1[0], d1[1], R[:, 1:4]
        H[:, 0, 0, 0], H[:, 1, 1, 1] = d2[0], d2[1]
        for n, (i, j) in enumerate(HESS_INDEX):
            H[:, 2, i, j] = H[:, 2, j, i] = R[:, 4 + n]
        S = np.zeros((L, 3, 3), dtype=dt)
        S[:, 0, 0], S[:, 1, 1] = m4[0] - psi2[0] ** 2, m4[1] - psi2[1] ** 2
        S[:, 2, 2] = m22 - C * C
        S[:, 0, 1] = S[:, 1, 0] = m22 - psi2[0] * psi2[1]
        S[:, 0, 2] = S[:, 2, 0] = m31 - psi2[0] * C
        S[:, 1, 2] = S[:, 2, 1] = m13 - psi2[1] * C
        return np.stack([psi2[0], psi2[1], C], axis=1).astype(dt), J, H, S, status


def _steps(K, eps0=2e-2):
    a, b, ab = K[:, 0], K[:, 1], K[:, 2]
    s = np.sqrt(a * b)
    eps = np.minimum(eps0, (1 - np.abs(ab) / s) / 4)
    return eps[:, None] * np.stack([a, b, s], axis=1)


def _central(fn, K, h):
    """Central-difference gradient and Hessian of fn at rows of K with steps h (L, 3)."""
    L = len(K)
    f0 = fn(K[:, 0], K[:, 1], K[:, 2])

    def at(di):
        P = K + di
        return fn(P[:, 0], P[:, 1], P[:, 2])
    E = [np.zeros((L, 3)) for _ in range(3)]
    for i in range(3):
        E[i][:, i] = h[:, i]
    g, Hs = np.zeros((L, 3)), np.zeros((L, 3, 3))
    plus = [at(E[i]) for i in range(3)]
    minus = [at(-E[i]) for i in range(3)]
    for i in range(3):
        g[:, i] = (plus[i] - minus[i]) / (2 * h[:, i])
        Hs[:, i, i] = (plus[i] - 2 * f0 + minus[i]) / h[:, i] ** 2
        for j in range(i):
            v = (at(E[i] + E[j]) - at(E[i] - E[j]) - at(E[j] - E[i]) + at(-E[i] - E[j])) / (4 * h[:, i] * h[:, j])
            Hs[:, i, j] = Hs[:, j, i] = v
    return g, Hs


def _fd(fn, K):
    """Gradient, Hessian and an error estimate by central differences with two Richardson steps."""
    h = _steps(K)
    lv = [_central(fn, K, h / 2**r) for r in range(3)]
    r1 = [((4 * lv[r + 1][i] - lv[r][i]) / 3) for r in range(2) for i in range(2)]   # (g, H) at r=0, then r=1
    g = (16 * r1[2] - r1[0]) / 15
    H = (16 * r1[3] - r1[1]) / 15
    scale = np.maximum(np.abs(H).max(axis=(1, 2)), np.abs(g).max(axis=1))
    err = np.maximum(np.abs(g - r1[2]).max(axis=1), np.abs(H - r1[3]).max(axis=(1, 2))) / np.where(scale > 0, scale, 1)
    return g, H, err


def _fd_mp(expr, kern, dps, K):
    """mpmath.diff with C of kernel ``kern`` (its engine at P digits) evaluated at P = 2 dps + 10 digits and
    steps 10^(-P/4) (in units of q1, q2, sqrt(q1 q2)): central differences of order <= 2 then keep about
    P/2 > dps digits."""
    P = 2 * dps + 10
    M = maps(kern, P)
    L = len(K)
    g = np.zeros((L, 3), dtype=object)
    H = np.zeros((L, 3, 3), dtype=object)
    with mpmath.workdps(P):
        h = mpmath.mpf(10) ** (-(P // 4))
        for l in range(L):
            a, b, ab = (mpmath.mpf(v) for v in K[l])
            sc = (a, b, mpmath.sqrt(a * b))
            f = lambda t1, t2, t3: M.expect(expr, VARS, (a + t1 * sc[0], b + t2 * sc[1], ab + t3 * sc[2]))  # noqa: E731
            for i in range(3):
                g[l, i] = mpmath.diff(f, (0, 0, 0), tuple(int(i == m) for m in range(3)), h=h) / sc[i]
                for j in range(i + 1):
                    o = tuple(int(i == m) + int(j == m) for m in range(3))
                    H[l, i, j] = H[l, j, i] = mpmath.diff(f, (0, 0, 0), o, h=h) / (sc[i] * sc[j])
    return g, H, np.zeros(L)


# ---------------------------------------------------------------- the recursion
def gram_fluctuations(act: str | Activation, sigma_w2: float, sigma_b2: float, depth: int,
                      q0: float | tuple[float, float, float] = (1.0, 1.0, 0.0), residual: float | None = None, *,
                      dps: int | None = None) -> GramFluctuations:
    """Leading-order 1/n statistics of the two-input Gram matrix (module docstring for the recursion).

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation` (pools included).
    sigma_w2, sigma_b2 : float
        Weight and bias variances (scalars >= 0, not both 0).
    depth : int
        Number of layers; row 0 is the linear layer 1.
    q0 : float or tuple of float
        (qa0, qb0, qab0) = (x_a.x_a, x_b.x_b, x_a.x_b)/n0 (a scalar q means (q, q, 0)): norms > 0 and
        ``abs(qab0) <= sqrt(qa0 qb0)`` (:func:`symfield.core.validate.input_gram`).
    residual : float, optional
        None (plain network) or alpha > 0: z^(l+1) = z^(l) + alpha (W phi(z^(l)) + b) (float64,
        single-node activations; see :func:`_run_residual`).
    dps : int, optional
        None for float64, else mpmath at ``dps`` digits (near c = 1 each layer's ingredients are
        computed with 2 log10(1/(1 - c)) more digits, so the rotated entries keep dps digits).

    Returns
    -------
    GramFluctuations
        ``K``, ``K1``, ``gram_cov``, ``metric_cov``, ``status`` and ``c_mean(n)``, ``c_var(n)``,
        ``one_minus_c_mean(n)``, ``gamma_mean(n)``, ``gamma_var(n)``, ``band(n)``.

    Examples
    --------
    >>> g = gram_fluctuations("relu", 2.0, 0.0, depth=4, q0=1.0)
    >>> round(float(g.metric_cov[3, 0, 0] / g.K[3, 0] ** 2), 12)    # 5 (l - 1) at l = 4
    15.0
    """
    depth = check.integer(_F, "depth", depth, lo=1)
    sw = float(check.real(_F, "sigma_w2", sigma_w2, lo=0))
    sb = float(check.real(_F, "sigma_b2", sigma_b2, lo=0))
    if sw == 0 and sb == 0:
        check.fail(_F, "sigma_b2", "> 0 when sigma_w2 = 0 (with both 0 every pre-activation is 0 and c is undefined)",
                   sigma_b2)
    q0v = check.input_gram(_F, "q0", q0)
    qa, qb, qab = (float(v) for v in q0v)
    dps = check.dps(_F, dps)
    act = activation(act) if not isinstance(act, Activation) else act
    ev = _Eval(act, dps)
    params = dict(act=act.name, sigma_w2=sw, sigma_b2=sb, depth=depth, q0=(qa, qb, qab), residual=residual, dps=dps)
    if residual is not None:
        alpha = _residual_alpha(residual, act, dps, sw)
        params["residual"] = alpha
        with bar(3 * depth + 24 + depth * (depth - 1) // 2, f"gram_fluctuations of residual {act.name}",
                 "integral", cached=False) as shown:
            ev.tick = shown.update
            return _run_residual(ev, sw, sb, alpha, np.array([qa, qb, qab]), depth, params)
    with bar(3 * depth + 24, f"gram_fluctuations of {act.name}", "integral", cached=False) as shown:
        ev.tick = shown.update
        if dps is None:
            return _run(ev, np.float64(sw), np.float64(sb), np.array([qa, qb, qab]), depth, params)
        with mpmath.workdps(dps + GUARD_DIGITS):
            out = _run(ev, to_mpf(sw), to_mpf(sb), np.array([to_mpf(v) for v in q0v], dtype=object),
                       depth, params)
    with mpmath.workdps(dps):
        rnd = lambda a: np.vectorize(lambda v: +v, otypes=[object])(a)  # noqa: E731
        return GramFluctuations(rnd(out.K), rnd(out.K1), rnd(out.gram_cov), rnd(out.metric_cov), out.status,
                                out.layers, out.moments, params, rnd(out.Kr), rnd(out.K1r), rnd(out.covr))


FAR_TOL = 1e-8          # relative error allowed on the c statistics where (aa, bb, ab) ingredients are used
FAR_EPS = {True: 1e-15, False: 1e-13}   # their relative accuracy: closed forms, quadrature


def _identical(K):
    """Rows where the two inputs coincide in float64 terms: d = 0 and equal norms."""
    Kr = np.asarray(K)
    return np.array([v[1] == 0 and v[2] == 0 for v in Kr], dtype=bool)


def _gap(Kr):
    """min(1 - c, 1 + c) per row (float), the conditioning of the (aa, bb, ab) ingredients."""
    w = np.asarray(near.omega(np.asarray(Kr, dtype=float))[0], dtype=float)
    return np.minimum(w, 2 - w)


def _one_input_terms(ev, a, L, dt):
    """Rotated ingredients of identical inputs: only the xx entries are used (every y entry of the state is 0)."""
    F, J, H, S = (np.zeros(s, dtype=dt) for s in ((L, 3), (L, 3, 3), (L, 3, 3, 3), (L, 3, 3)))
    co = ev.co
    m2 = ev.one(co.psi2, a)
    F[:, 0], J[:, 0, 0], H[:, 0, 0, 0] = m2, ev.one(co.dpsi2, a), ev.one(co.d2psi2, a)
    S[:, 0, 0] = ev.one(co.psi4, a) - m2 * m2
    return F, J, H, S


def _far_F(ev, kr):
    """F~ of one rotated row from the (aa, bb, ab) maps."""
    return near.rotate(np.array([ev.F(near.unrotate(kr[None])[0])], dtype=kr.dtype))[0]


# paired with _step_mp: float64 picks the near rule per row on arrays, mpmath raises the digits per row (docs/numerics.md section 7)
def _step_f64(ev, rule, kr):
    """F~ at one rotated row, float64: identical inputs, the near rule, or the (aa, bb, ab) maps."""
    if kr[1] == 0 and kr[2] == 0:
        return np.array([ev.one(ev.co.psi2, kr[0]), 0.0, 0.0])
    if rule is not None and rule.near(kr[None])[0]:
        ev.tick()
        return rule.second(kr[None])[0]
    return _far_F(ev, kr)


def _terms_f64(ev, rule, Kr):
    """Rotated (F~, J~, H~, Sigma~) and a status per row, float64 (the three kinds of rows of :func:`_step_f64`)."""
    L = len(Kr)
    F, J, H, S = (np.zeros(s) for s in ((L, 3), (L, 3, 3), (L, 3, 3, 3), (L, 3, 3)))
    status = np.zeros(L, dtype=np.int8)
    same = _identical(Kr)
    close = ~same & (rule.near(Kr) if rule is not None else np.zeros(L, bool))
    far = ~same & ~close
    for rows, parts in ((same, lambda: _one_input_terms(ev, Kr[same, 0], int(same.sum()), float)),
                        (close, lambda: rule.terms(Kr[close])),
                        (far, lambda: _far_terms(ev, Kr[far]))):
        if rows.any():
            out = parts()
            for arr, part in zip((F, J, H, S), out):
                arr[rows] = part
            if rows is far:
                status[far] = out[4]
    if close.any():
        status[close] = np.where(rule.estimate(Kr[close]) > FAR_TOL, 1, 0)
        idx = np.flatnonzero(close)
        if rule.error(Kr[sorted({idx[0], idx[-1]})]) > near.CHECK_TOL:
            status[close] = 1
    return F, J, H, S, status


def _far_terms(ev, Kr):
    """The (aa, bb, ab) ingredients at rotated rows, rotated, with status 1 where 1 - c is too small for them."""
    F, J, H, S, st = ev.layer_terms(near.unrotate(Kr))
    eps = FAR_EPS[ev.gm.closed_form]
    st = np.maximum(st, np.where(eps / _gap(Kr) ** 2 > FAR_TOL, 1, 0).astype(np.int8))
    return (near.rotate(F),) + near.rotate_terms(J, H, S) + (st,)


def _work_digits(ev, kr):
    """Digits for the (aa, bb, ab) ingredients at a rotated row: dps + 2 log10(1/gap) + 4 (their entries that
    vanish as c -> 1 are differences of numbers ~ 1/gap^2 larger)."""
    gap = float(_gap(np.asarray([kr], dtype=float))[0])
    return ev.dps + (0 if gap >= 0.25 else 4 * math.ceil(math.log10(1 / max(gap, 1e-300)) / 2) + 4)


def _mp_eval(ev, digits, cache={}):  # noqa: B006 - per-precision evaluators, shared on purpose
    key = (ev.act, digits)
    if key not in cache:
        cache[key] = _Eval(ev.act, digits)
    out = cache[key]
    out.tick = ev.tick
    return out


def _step_mp(ev, kr):
    if kr[1] == 0 and kr[2] == 0:
        return np.array([ev.one(ev.co.psi2, kr[0]), mpmath.mpf(0), mpmath.mpf(0)], dtype=object)
    digits = _work_digits(ev, kr)
    with mpmath.workdps(digits + GUARD_DIGITS):
        return _far_F(_mp_eval(ev, digits), kr)


def _terms_mp(ev, Kr):
    """Rotated ingredients in mpmath, each row's (aa, bb, ab) ingredients at :func:`_work_digits`."""
    L = len(Kr)
    F, J, H, S = (np.zeros(s, dtype=object) for s in ((L, 3), (L, 3, 3), (L, 3, 3, 3), (L, 3, 3)))
    status = np.zeros(L, dtype=np.int8)
    for i, kr in enumerate(Kr):
        if kr[1] == 0 and kr[2] == 0:
            parts = _one_input_terms(ev, np.array([kr[0]], dtype=object), 1, object)
        else:
            digits = _work_digits(ev, kr)
            with mpmath.workdps(digits + GUARD_DIGITS):
                e = _mp_eval(ev, digits)
                K = near.unrotate(kr[None])
                F1, J1, H1, S1, st = e.layer_terms(K)
                status[i] = st[0]
                parts = (near.rotate(F1),) + near.rotate_terms(J1, H1, S1)
        for arr, part in zip((F, J, H, S), parts):
            arr[i] = np.vectorize(lambda v: +v, otypes=[object])(part[0])
    return F, J, H, S, status


def _run(ev, sw, sb, q0, depth, params):
    """The plain recursion in the rotated basis (K~, V~, K1~), mapped back to (aa, bb, ab) at the end."""
    dt, mp = q0.dtype, q0.dtype == object
    rule = None if mp else near.near_rule(ev.act)
    bias = np.array([sb, 0 * sb, 0 * sb], dtype=dt)
    Kr = np.zeros((depth, 3), dtype=dt)
    Kr[0] = sw * near.rotate(q0[None])[0] + bias
    tiny = np.finfo(float).tiny
    for l in range(depth):
        if not mp and not min(Kr[l, 0] + Kr[l, 2] + Kr[l, 1] / 4, Kr[l, 0] - Kr[l, 2] + Kr[l, 1] / 4) >= tiny:
            check.variances_in_range(_F, "sigma_w2", float(sw), near.unrotate(Kr[:l + 1]).min(axis=1))
        if l == depth - 1:
            break
        Fl = _step_mp(ev, Kr[l]) if mp else _step_f64(ev, rule, Kr[l])
        Kr[l + 1] = bias + sw * np.asarray(Fl, dtype=dt)
    V = np.zeros((depth, 3, 3), dtype=dt)
    K1 = np.zeros((depth, 3), dtype=dt)
    status = np.zeros(depth, dtype=np.int8)
    if depth > 1:
        _, J, H, S, st = _terms_mp(ev, Kr[:-1]) if mp else _terms_f64(ev, rule, Kr[:-1])
        J, H = sw * J, sw * H
        status[1:] = st
        with np.errstate(invalid="ignore", over="ignore"):
            for l in range(depth - 1):
                V[l + 1] = sw * sw * ev.gm.k * S[l] + J[l] @ V[l] @ J[l].T
                K1[l + 1] = J[l] @ K1[l] + (H[l] * V[l][None]).sum(axis=(1, 2)) / 2
    covr = V + wishart(Kr)
    K, K1a, cov, Va = near.unrotate(Kr), near.unrotate(K1), near.unrotate_cov(covr), near.unrotate_cov(V)
    finite = np.array([all(np.isfinite(float(v)) for v in row) for row in
                       np.concatenate([Kr, K1, covr.reshape(depth, 9)], axis=1)])
    status[~finite] = 2
    return GramFluctuations(K, K1a, cov, Va, _final_status(status, Kr), np.arange(1, depth + 1), ev.gm, params,
                            Kr, K1, covr)


def _final_status(status, Kr):
    """Flags 1 and 2 taint the layers they feed; 3 (d = 0 in float64 terms) marks the layers left unflagged."""
    status = np.maximum.accumulate(status)
    xx, yy = (np.asarray([float(v) for v in Kr[:, i]]) for i in (0, 1))
    return np.where((status == 0) & (yy <= TINY_D * xx), 3, status).astype(np.int8)


# ---------------------------------------------------------------- residual blocks
ALPHA_MAX = 1e100      # residual: alpha^2 sigma_w2 must stay a float (1e300 overflowed in alpha**2)


def _residual_alpha(residual, act, dps, sw=1.0):
    alpha = float(check.real(_F, "residual", residual, lo=0))
    if alpha <= 0 or alpha > ALPHA_MAX or not math.isfinite(alpha * alpha * max(sw, 1.0)):
        check.fail(_F, "residual", f"alpha with 0 < alpha <= {ALPHA_MAX:g} (or None for a plain network)", residual)
    if act.pool is not None:
        check.fail(_F, "residual", "None for pooled activations (residual blocks are covered for single-node "
                   "activations only)", residual)
    if dps is not None:
        check.fail(_F, "dps", "None with residual blocks (their four-point integrals are float64 only)", dps)
    return alpha


def _mat(k):
    """(aa, bb, ab) -> 2x2 symmetric matrix."""
    return np.array([[k[0], k[2]], [k[2], k[1]]])


def _run_residual(ev, sw, sb, alpha, q0, depth, params, order=PAIR_ORDER):
    """Residual recursion (docs/theory.md section 9.3). With c = alpha^2 sigma_w2, A = I + c J and the
    accumulated metric Sigma^(l) (E Ghat = E Sigma, Ghat = Sigma + noise):

        dSigma^(l+1) = A dSigma^(l) + c N_P^(l),   dM = J dSigma + N_P,   dGhat = dSigma + N_Z,

    where N_f are the node-average noises of independent copies of one node's path, with
    n Cov(N_f^(m), N_g^(l)) = Cov(f(z^(m)), g(z^(l))) for that Gaussian path (Cov z^(m) z^(l) = K^(min)).
    The mean adds (1/2) H : Var dSigma and a node's feedback on its own metric,
    n E N_P^(l) = c sum_(m<l) sum_(s,r) Phi(l, m+1)_sr d/dD_s Cov(P_r(z^(m)), P(z^(l)))."""
    K = np.zeros((depth, 3))
    K[0] = sw * q0 + sb
    for l in range(depth - 1):
        K[l + 1] = K[l] + alpha**2 * (sb + sw * np.array(ev.F(K[l]), dtype=float))
    c = alpha**2 * sw
    VS, K1 = np.zeros((depth, 3, 3)), np.zeros((depth, 3))
    Y = np.zeros((depth, 3, 3))
    status = np.zeros(depth, dtype=np.int8)
    if depth > 1:
        _, J, H, S, st = ev.layer_terms(K[:-1])
        status[1:] = st
        A = np.eye(3)[None] + c * J
        pairs, err = _pairs(ev, K, order)
        for i in range(depth - 1):
            X, EN, Y[i] = _cross(pairs, A, c, i)
            AX = A[i] @ X
            VS[i + 1] = A[i] @ VS[i] @ A[i].T + c * (AX + AX.T) + c * c * S[i]
            K1[i + 1] = K1[i] + c * (J[i] @ K1[i] + (H[i] * VS[i][None]).sum(axis=(1, 2)) / 2 + EN)
        Y[depth - 1] = _cross(pairs, A, c, depth - 1)[2]
        if err > PAIR_TOL:
            status[1:] = 1
        # the c statistics are differences of covariances ~ 1/gap^2 larger: flag where the pair error shows there
        status[1:] = np.maximum(status[1:], np.where(err / _gap(near.rotate(K[1:])) ** 2 > PAIR_TOL, 1, 0))
    cov = VS + Y + np.transpose(Y, (0, 2, 1)) + wishart(K)
    finite = np.isfinite(np.concatenate([K, K1, cov.reshape(depth, 9)], axis=1)).all(axis=1)
    status[~finite] = 2
    Kr = near.rotate(K)
    return GramFluctuations(K, K1, cov, None, _final_status(status, Kr), np.arange(1, depth + 1), ev.gm, params,
                            Kr, near.rotate(K1), near.rotate_cov(cov))


def _pairs(ev, K, order):
    """Pair moments for every m < l (:func:`_pair`), and an error estimate: the largest change, relative to the
    covariances' largest entry (R: that over the increment), when the pairs (0, 1) and (L-2, L-1) (the smallest
    increments) are redone with 2 more nodes per piece."""
    phi, dphi = ev.numeric_phi()
    x = np.linspace(-6.0, 6.0, 97) + 1e-3 * np.pi            # off any kink at a simple number
    curved = np.abs(phi(x + 1e-3) - 2 * phi(x) + phi(x - 1e-3)).max() > 1e-9
    pan = PAIR_PANELS if curved else ()
    depth = len(K)
    pairs = {}
    for l in range(1, depth):
        for m in range(l):
            pairs[m, l] = _pair(ev, _mat(K[m]), _mat(K[l] - K[m]), phi, dphi, order, pan)
            ev.tick()
    err = 0.0
    for m in sorted({0, depth - 2}):
        D = K[m + 1] - K[m]
        hi, lo = _pair(ev, _mat(K[m]), _mat(D), phi, dphi, order, pan, finer=2), pairs[m, m + 1]
        scale = max(np.abs(hi.QPP).max(), np.abs(hi.QPZ).max(), 1e-300)
        err = max(err, np.abs(hi.QPP - lo.QPP).max() / scale, np.abs(hi.QPZ - lo.QPZ).max() / scale,
                  np.abs(hi.R - lo.R).max() / max(np.abs(hi.R).max(), scale / max(D[0], D[1])))
    return pairs, err


def _pair(ev, K, D, phi, dphi, order, pan, finer=0):
    """Pair moments at y ~ N(0, K), Delta ~ N(0, D): the tensor rule for kink-free activations (where K and D
    are not too strongly correlated for it), else the nested rule; ``finer`` more nodes per piece."""
    if not len(ev.kk):
        out = tensor_moments(K, D, phi, dphi, T_ORDER + finer)
        if out is not None:
            return out
    return pair_moments(K, D, phi, dphi, ev.kk, order + finer, pan)


def _cross(pairs, A, c, i):
    """X = n Cov(dSigma^(i), N_P^(i)), n E N_P^(i) and Y = n Cov(dSigma^(i), N_Z^(i)) (0-based layer i)."""
    X, Y, EN = np.zeros((3, 3)), np.zeros((3, 3)), np.zeros(3)
    Phi = np.eye(3)                                # Phi(i, m+1) = A_(i-1) ... A_(m+1)
    for m in range(i - 1, -1, -1):
        p = pairs[m, i]
        X += c * Phi @ p.QPP
        Y += c * Phi @ p.QPZ
        EN += c * np.einsum("sr,str->t", Phi, p.R)
        Phi = Phi @ A[m]
    return X, EN, Y
