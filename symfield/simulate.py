"""Finite-width Monte Carlo networks at initialisation (float64, NumPy only, seeded).

Network (docs/theory.md sections 1, 4, 8), width N, P inputs: layer 1 linear, then
y = repeat_k(pool_k(phi(h))) and h' = W y + b (plain) or h' = h + alpha (W y + b) (``residual=alpha``),
W_ij ~ N(0, sigma_w2/fan_in), b_i ~ N(0, sigma_b2).

Inputs (``inputs=``): "orthonormal" (default; d = input_dim >= P, default P; q^(0) = I exactly), "gaussian"
(d default 1000; q^(0) = I in expectation) or an explicit (P, d) array, drawn once and shared by all ``n_networks`` networks.

Gram method (default): given layer outputs Y (P x N), the P-vectors of pre-activations of the N output
nodes are i.i.d. N(0, M), M = (sigma_w2/N) Y Y^T + sigma_b2 1 1^T, so H = L Z with L L^T = M has EXACTLY
the joint law of the network with explicit weights, at O(N P^2) per layer. ``method="weights"`` builds
the explicit matrices (to test that claim, and for :func:`class_gradients`). Seeds: one
``numpy.random.SeedSequence(seed)`` child for the inputs/labels and one per network; the same seed gives
identical arrays.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal

import mpmath
import numpy as np
import sympy as sp
from numpy.typing import ArrayLike, NDArray

from symfield.core import validate as check
from symfield.core.dataset import ToXarray
from symfield.core.files import save_npz
from symfield.core.version import provenance
from symfield.core.progress import interactive, tqdm_class
from symfield.symbolic.activation import Activation, activation
from symfield.symbolic.formula import X as x
from symfield.theory import norm as nm

_F = "simulate"
QUANTILES = (0.05, 0.5, 0.95)
PAIR_CAP = 50_000         # at most this many (pair, network) correlations per layer enter the quantiles
GRAM_MAX_INPUTS = 8       # the full per-network Gram matrices are kept for up to 8 inputs
GRAM_MAX_ELEMENTS = 1 << 25  # ... and while they hold at most 32M numbers (256 MB)
BATCH_ELEMENTS = 1 << 22  # networks are batched so that a batch holds ~4M pre-activations


# ---------------------------------------------------------------- activation in numbers
NUMPY_MODULES = [{"Heaviside": lambda a, h=0.5: np.heaviside(a, h)}, "scipy", "numpy"]


def _numpy_fn(expr):
    """Vectorised float64 f(x); entries that overflow in an intermediate are redone in mpmath."""
    fast = sp.lambdify(x, expr, modules=NUMPY_MODULES)
    exact = sp.lambdify(x, expr, modules="mpmath")

    def f(v):
        with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            out = np.asarray(fast(v), dtype=float)
        if out.shape != np.shape(v):
            out = np.broadcast_to(out, np.shape(v)).copy()
        bad = ~np.isfinite(out) & np.isfinite(v)
        if bad.any():
            with mpmath.workdps(30):
                out[bad] = [float(mpmath.mpmathify(exact(mpmath.mpf(float(t))))) for t in np.asarray(v)[bad]]
        return out
    return f


@lru_cache(maxsize=64)
def _act_fns(act: Activation):
    return _numpy_fn(act.expr), _numpy_fn(sp.diff(act.expr, x))


def _pooled(phi_h, pool, k):
    """pool_k over consecutive nodes (last axis): shape (..., N) -> (..., N/k)."""
    if pool is None or k == 1:
        return phi_h
    g = phi_h.reshape(phi_h.shape[:-1] + (phi_h.shape[-1] // k, k))
    return g.max(axis=-1) if pool == "max" else g.mean(axis=-1)


def _pool_backward(grad_y, phi_h, dphi_h, pool, k):
    """dL/dh from dL/dy, y = repeat_k(pool_k(phi(h))): the k copies' gradients add up, then flow
    through the argmax node (max) or 1/k to each node (avg), times phi'(h)."""
    if pool is None or k == 1:
        return grad_y * dphi_h
    shape = grad_y.shape[:-1] + (grad_y.shape[-1] // k, k)
    gsum = grad_y.reshape(shape).sum(axis=-1, keepdims=True)
    if pool == "avg":
        return (np.broadcast_to(gsum / k, shape) * dphi_h.reshape(shape)).reshape(grad_y.shape)
    ph = phi_h.reshape(shape)
    onehot = np.arange(k) == ph.argmax(axis=-1)[..., None]
    return (onehot * gsum * dphi_h.reshape(shape)).reshape(grad_y.shape)


# ---------------------------------------------------------------- BLAS threads
@contextmanager
def _blas_threads(n):
    """Limit BLAS threads to n inside the block (None: leave them alone), whichever BLAS NumPy loaded
    (OpenBLAS, MKL or BLIS): threadpoolctl finds it and restores the old setting on exit."""
    if n is None:
        yield
        return
    from threadpoolctl import threadpool_limits
    with threadpool_limits(limits=n, user_api="blas"):
        yield


# ---------------------------------------------------------------- validation and inputs
def _validate(func, act, width, depth, sigma_w2, sigma_b2, n_inputs, n_networks, seed, residual,
              inputs, input_dim, method=None):
    act = activation(act) if not isinstance(act, Activation) else act
    k = act.k if act.pool is not None else 1
    width = check.integer(func, "width", width, lo=1)
    if width % k:
        check.fail(func, "width", f"a multiple of the pool size k = {k} ({act.name} pools groups of {k} "
                   f"consecutive nodes)", width)
    depth = check.integer(func, "depth", depth, lo=1)
    sw = _scalar(func, "sigma_w2", sigma_w2)
    sb = _scalar(func, "sigma_b2", sigma_b2)
    n_networks = check.integer(func, "n_networks", n_networks, lo=1)
    seed = check.integer(func, "seed", seed, lo=0)
    alpha = None if residual is None else _scalar(func, "residual", residual)
    if method is not None and method not in ("gram", "weights"):
        check.fail(func, "method", "one of 'gram' or 'weights'", method)
    if isinstance(inputs, str):
        n_inputs = check.integer(func, "n_inputs", n_inputs, lo=1)
        if inputs not in ("orthonormal", "gaussian"):
            check.fail(func, "inputs", "'orthonormal', 'gaussian' or an array of shape (n_inputs, d)", inputs)
        d_default = n_inputs if inputs == "orthonormal" else 1000
        d = d_default if input_dim is None else check.integer(func, "input_dim", input_dim, lo=1)
        if inputs == "orthonormal" and d < n_inputs:
            check.fail(func, "input_dim", f"an integer >= n_inputs = {n_inputs} (orthonormal inputs need "
                       f"d >= P)", input_dim)
    else:
        arr = np.asarray(inputs, dtype=float) if _is_numeric(inputs) else None
        if arr is None or arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 1:
            check.fail(func, "inputs", "'orthonormal', 'gaussian' or a real array of shape (n_inputs, d)",
                       inputs if arr is None else np.shape(inputs), TypeError if arr is None else ValueError)
        check.real(func, "inputs", arr)
        if n_inputs is not None and check.integer(func, "n_inputs", n_inputs, lo=1) != arr.shape[0]:
            check.fail(func, "n_inputs", f"None or the number of rows of inputs ({arr.shape[0]})", n_inputs)
        n_inputs, d = arr.shape
    _memory(func, width, depth, n_inputs, n_networks, d, method)
    return act, k, width, depth, sw, sb, n_inputs, n_networks, seed, alpha, d


def _memory(func, N, depth, P, n_networks, d, method):
    """Refuse up front a run whose arrays exceed core.validate.memory_limit: ~6 (P, N) work arrays,
    the inputs (P, d), P x P Gram matrices, per-layer rows and pair correlations; explicit weights add
    two (N, max(N, d)) matrices, and class_gradients (method None) keeps every layer's (P, N) activations."""
    pairs = min(P * (P - 1) // 2 * n_networks, PAIR_CAP + n_networks)
    words = 6 * P * N + P * d + 3 * P * P + depth * (pairs + 16 * n_networks)
    if method != "gram":
        words += 2 * N * max(N, d) + (depth * P * N if method is None else 0)
    check.memory(func, f"width = {N}, n_inputs = {P}, depth = {depth}, n_networks = {n_networks}, "
                 f"input dim = {d} (8-byte floats)", 8 * words)


def _is_numeric(v):
    try:
        return np.asarray(v).dtype.kind in "iuf"
    except Exception:
        return False


def _scalar(func, name, value):
    arr = check.real(func, name, value, lo=0)
    if arr.ndim != 0:
        check.fail(func, name, "a scalar (a finite float >= 0)", value, TypeError)
    return float(arr)


def _make_inputs(inputs, n_inputs, d, rng):
    if not isinstance(inputs, str):
        return np.array(inputs, dtype=float)
    if inputs == "gaussian":
        return rng.standard_normal((n_inputs, d))
    # Haar-random orthonormal rows (QR of a Gaussian matrix, sign-fixed), scaled to |x|^2 = d
    A = rng.standard_normal((d, n_inputs))
    Qm, R = np.linalg.qr(A)
    Qm *= np.sign(np.diag(R))
    return np.sqrt(d) * Qm.T


def _seeds(seed, n_networks):
    root = np.random.SeedSequence(seed)
    data, *nets = root.spawn(n_networks + 1)
    return data, nets


def _psd_sqrt(M):
    """L with L L^T = M for a stack of symmetric PSD matrices (eigh; rounding negatives -> 0)."""
    w, U = np.linalg.eigh(M)
    return U * np.sqrt(np.clip(w, 0.0, None))[..., None, :]


def _gram(A):
    """A A^T for a stack (B, P, n): one einsum for a few inputs, else one 2-D product per item (BLAS syrk)."""
    if A.shape[1] <= 8:
        return np.einsum("bpn,bqn->bpq", A, A)
    return np.stack([a @ a.T for a in A])


def _progress(total, progress, desc):
    show = interactive() if progress is None else bool(progress)
    if not show:
        return None
    return tqdm_class()(total=total, desc=desc, leave=False, file=sys.stderr)


# ---------------------------------------------------------------- results
@dataclass(frozen=True)
class PerNetwork:
    """Per-network statistics, arrays of shape (n_networks, depth)."""
    q: np.ndarray       # mean_a (1/N) sum_i h_ia^2
    qab: np.ndarray     # mean_{a<b} (1/N) sum_i h_ia h_ib
    c: np.ndarray       # mean_{a<b} of qab_ab / sqrt(q_aa q_bb)
    V: np.ndarray       # mean_i var_a h_ia (ddof 0)
    Vtilde: np.ndarray  # var_i mean_a h_ia (ddof 0)
    V_norm: np.ndarray       # V and Vtilde after rescaling each input's pre-activations to the mean norm:
    Vtilde_norm: np.ndarray  # h_ia -> h_ia sqrt(q/q_aa) (removes the finite-width spread of the norms q_aa)
    m4: np.ndarray      # mean_{a,i} h_ia^4
    g1: np.ndarray      # mean_a G_a, G_a = E[h_ia^2 | previous layer] (exact conditional variance)
    g2: np.ndarray      # mean_a G_a^2

    @property
    def gamma(self):
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.Vtilde / self.V

    @property
    def gamma_norm(self):
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.Vtilde_norm / self.V_norm

    @property
    def kurtosis(self):
        """Within-network excess kurtosis m4/q^2 - 3 (about 0: nodes are conditionally Gaussian)."""
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            return self.m4 / self.q**2 - 3


@dataclass(frozen=True)
class Simulation(ToXarray):
    """Per-layer statistics of finite-width networks; row i is layer i + 1 (row 0: linear layer 1).

    ``q``, ``qab``, ``V``, ``Vtilde`` are means over networks; ``gamma = Vtilde/V``;
    ``c`` is the mean of c_ab over input pairs a < b and networks, ``c_quantiles`` (3, depth)
    its 5/50/95% quantiles over the same population. ``gamma_norm`` is gamma after rescaling each
    input's pre-activations to the mean norm: at finite width the norms q_aa of different inputs
    drift apart (a 1/N effect), var_a sqrt(q_aa) adds to V, and gamma falls below the
    infinite-width value where q - qab is tiny (deep chaotic ReLU); gamma_norm removes that part. ``kurtosis`` is the excess kurtosis of
    the pre-activations over the ensemble, E[h^4]/E[h^2]^2 - 3 (raw moments, E h = 0 exactly),
    pooled over networks, inputs and nodes; ``kurtosis_cond = 3 E[G^2]/E[G]^2 - 3`` is its
    Rao-Blackwellised estimate from the exact conditional variances G (plain networks only:
    h | G ~ N(0, G)); ``q_cond = E[G]``. NaN where undefined (pairs need n_inputs >= 2).

    ``to_xarray()``: the means over (layer,), ``c_quantiles`` over (quantile, layer), the per-network
    rows (``networks``) as ``net_<name>`` over (network, layer), ``inputs`` over (input, feature) and,
    when kept, ``gram`` over (network, layer, input, input2); the parameters in ``attrs``.
    """
    q: np.ndarray
    qab: np.ndarray
    c: np.ndarray
    c_quantiles: np.ndarray
    V: np.ndarray
    Vtilde: np.ndarray
    gamma: np.ndarray
    kurtosis: np.ndarray
    gamma_norm: np.ndarray
    q_cond: np.ndarray
    kurtosis_cond: np.ndarray
    networks: PerNetwork = field(repr=False)
    layers: np.ndarray = field(repr=False)
    inputs: np.ndarray = field(repr=False)
    method: str = "gram"
    params: dict = field(default_factory=dict)
    gram: np.ndarray | None = field(default=None, repr=False)   # (n_networks, depth, P, P) or None (docstring)

    @property
    def c05(self):
        return self.c_quantiles[0]

    @property
    def c50(self):
        return self.c_quantiles[1]

    @property
    def c95(self):
        return self.c_quantiles[2]

    MEANS = ("q", "qab", "c", "V", "Vtilde", "gamma", "kurtosis", "gamma_norm", "q_cond", "kurtosis_cond")

    def dataset_parts(self) -> dict:
        """The arrays, coordinates, dims and parameters of :meth:`to_xarray` (for symfield.io.output.save)."""
        data = {n: np.asarray(getattr(self, n)) for n in self.MEANS}
        dims = {n: ("layer",) for n in self.MEANS}
        data["c_quantiles"], dims["c_quantiles"] = self.c_quantiles, ("quantile", "layer")
        for n in PerNetwork.__dataclass_fields__:
            data[f"net_{n}"], dims[f"net_{n}"] = getattr(self.networks, n), ("network", "layer")
        data["inputs"], dims["inputs"] = np.asarray(self.inputs), ("input", "feature")
        P = self.inputs.shape[0]
        coords = {"layer": np.asarray(self.layers), "quantile": np.asarray(QUANTILES),
                  "network": np.arange(self.networks.q.shape[0]), "input": np.arange(P)}
        if self.gram is not None:
            data["gram"], dims["gram"] = self.gram, ("network", "layer", "input", "input2")
            coords["input2"] = np.arange(P)
        return dict(data=data, coords=coords, dims=dims, params={**self.params, "method": self.method})

    def save(self, path):
        """Write every per-layer array, the parameters and the provenance to an .npz file."""
        arrays = {n: getattr(self, n) for n in ("layers", "c_quantiles") + self.MEANS}
        arrays.update({f"net_{n}": getattr(self.networks, n) for n in PerNetwork.__dataclass_fields__})
        save_npz(path, {**arrays, "params": np.array(repr(self.params)),
                        "provenance": np.array(repr(provenance()))})


def finite_data_gamma(q: ArrayLike, qab: ArrayLike,
                      n_inputs: int) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """Expected estimators for P = n_inputs inputs of covariance q I + qab (11^T - I) (docs/theory.md s. 10)::

        E[V] = sigma_y2 (1 - 1/P),  E[Vtilde] = sigma_mu2 + sigma_y2/P,   sigma_y2 = q - qab, sigma_mu2 = qab

    (exact for Gaussian nodes, ddof 0).

    Parameters
    ----------
    q, qab : array_like
        Per-node variance and covariance of two inputs.
    n_inputs : int
        P (>= 2).

    Returns
    -------
    tuple of ndarray
        (E[V], E[Vtilde], E[Vtilde]/E[V]).

    Examples
    --------
    >>> [float(v) for v in sf.finite_data_gamma(1.0, 0.5, 4)]
    [0.375, 0.625, 1.6666666666666667]
    """
    q = check.real("finite_data_gamma", "q", q)
    qab = check.real("finite_data_gamma", "qab", qab)
    P = check.integer("finite_data_gamma", "n_inputs", n_inputs, lo=2)
    sy = q - qab
    EV, EVt = sy * (1 - 1 / P), qab + sy / P
    with np.errstate(invalid="ignore", divide="ignore"):
        return EV, EVt, EVt / EV


# ---------------------------------------------------------------- the simulation
class _Acc:
    """Per-layer accumulators (per-network rows and pooled pair correlations)."""

    def __init__(self, n_networks, depth, P, pair_idx):
        self.rows = {n: np.full((n_networks, depth), np.nan) for n in PerNetwork.__dataclass_fields__}
        self.cvals = [[] for _ in range(depth)]
        self.pair_idx = pair_idx
        keep = P <= GRAM_MAX_INPUTS and n_networks * depth * P * P <= GRAM_MAX_ELEMENTS
        self.gram = np.full((n_networks, depth, P, P), np.nan) if keep else None

    def add(self, layer, nets, H, G):
        """H (B, P, N) pre-activations of layer (0-based) for networks ``nets``; G (B, P) conditional variances."""
        B, P, N = H.shape
        r = self.rows
        H2 = H * H
        r["q"][nets, layer] = H2.mean(axis=(1, 2))
        with np.errstate(over="ignore", invalid="ignore"):
            r["m4"][nets, layer] = (H2 * H2).mean(axis=(1, 2))
        r["g1"][nets, layer] = G.mean(axis=1)
        r["g2"][nets, layer] = (G * G).mean(axis=1)
        Q = _gram(H) / N if P >= 2 or self.gram is not None else None
        if self.gram is not None:
            self.gram[nets, layer] = Q
        if P >= 2:
            diag = np.diagonal(Q, axis1=1, axis2=2)
            i, j = self.pair_idx
            off = Q[:, i, j]
            with np.errstate(invalid="ignore", divide="ignore"):
                cc = off / np.sqrt(diag[:, i] * diag[:, j])
            r["qab"][nets, layer] = off.mean(axis=1)
            r["c"][nets, layer] = cc.mean(axis=1)
            self.cvals[layer].append(cc.ravel())
            r["V"][nets, layer] = H.var(axis=1).mean(axis=-1)
            r["Vtilde"][nets, layer] = H.mean(axis=1).var(axis=-1)
            # rescaled inputs s_a h_a, s_a = sqrt(qbar/q_aa): V = qbar - s^T Q s/P^2, Vtilde = s^T Q s/P^2 - (s.m/P)^2
            with np.errstate(invalid="ignore", divide="ignore"):
                sc = np.sqrt(diag.mean(axis=1, keepdims=True) / diag)
            sQs = np.einsum("ba,bac,bc->b", sc, Q, sc) / P**2
            mbar = (sc * H.mean(axis=2)).sum(axis=1) / P
            r["V_norm"][nets, layer] = diag.mean(axis=1) - sQs
            r["Vtilde_norm"][nets, layer] = sQs - mbar**2

    def result(self, depth, inputs, method, params, conditional):
        n = PerNetwork(**self.rows)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            q, V, Vt = n.q.mean(0), n.V.mean(0), n.Vtilde.mean(0)
            g1, g2 = n.g1.mean(0), n.g2.mean(0)
            quant = np.full((len(QUANTILES), depth), np.nan)
            for l, vals in enumerate(self.cvals):
                if vals:
                    quant[:, l] = np.quantile(np.concatenate(vals), QUANTILES)
            return Simulation(
                q=q, qab=n.qab.mean(0), c=n.c.mean(0), c_quantiles=quant, V=V, Vtilde=Vt, gamma=Vt / V,
                kurtosis=n.m4.mean(0) / q**2 - 3, gamma_norm=n.Vtilde_norm.mean(0) / n.V_norm.mean(0), q_cond=g1,
                kurtosis_cond=3 * g2 / g1**2 - 3 if conditional else np.full(depth, np.nan),
                networks=n, layers=np.arange(1, depth + 1), inputs=inputs, method=method, params=params,
                gram=self.gram)


def simulate(act: str | Activation, width: int, depth: int, sigma_w2: float, sigma_b2: float, n_inputs: int,
             n_networks: int = 1, seed: int = 0, residual: float | None = None, *,
             inputs: Literal["orthonormal", "gaussian"] = "orthonormal", input_dim: int | None = None,
             method: Literal["gram", "weights"] = "gram", progress: bool | None = None,
             blas_threads: int | None = 1, norm: str | None = None, norm_at: str = "before",
             batch: int | None = None) -> Simulation:
    """Simulate ``n_networks`` random networks of width N = ``width`` on P = ``n_inputs`` inputs.

    Per layer l = 1..depth (row 0 = the linear layer 1, as in ``sf.propagate``), with h_ia the
    pre-activation of node i on input a::

        q      = mean_a (1/N) sum_i h_ia^2           qab = mean_{a<b} (1/N) sum_i h_ia h_ib
        c      = mean and 5/50/95% quantiles of qab_ab/sqrt(q_aa q_bb) over pairs and networks
        V      = mean_i var_a h_ia  (ddof 0)         Vtilde = var_i mean_a h_ia  (ddof 0)
        gamma  = Vtilde / V                          kurtosis = E h^4 / (E h^2)^2 - 3

    Infinite width: q, qab, c -> sf.propagate; E[V] = (q - qab)(1 - 1/P) and E[Vtilde] = qab +
    (q - qab)/P (:func:`finite_data_gamma`). With at most 8 inputs (and n_networks x depth x P^2 <= 2^25)
    ``.gram`` holds every network's empirical Gram matrix (1/N) sum_i h_ia h_ib per layer, shape
    (n_networks, depth, P, P); otherwise it is None. ``method="gram"`` (default) samples each layer
    exactly from its P x P Gram matrix (module docstring); ``"weights"`` uses explicit weight
    matrices. ``residual=alpha``: h^(l+1) = h^(l) + alpha (W y^(l) + b) for l >= 1.
    ``blas_threads``: BLAS threads during the run (default 1; None leaves the setting alone). The
    products are P x P x N: on a busy two-core machine two BLAS threads thrash, so one thread is the
    faster default.

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation` (pools included).
    width, depth : int
        Hidden width N and number of layers.
    sigma_w2, sigma_b2 : float
        Weight and bias variances.
    n_inputs : int
        Number of inputs P.
    n_networks, seed : int
        Independent networks, and the seed they derive from.
    residual : float, optional
        alpha for residual blocks.
    inputs : {'orthonormal', 'gaussian'}
        Input design (module docstring); ``input_dim`` (int, optional) is their dimension d.
    method : {'gram', 'weights'}
        Sample from the Gram matrix, or use explicit weight matrices.
    progress : bool, optional
        Progress bar (default: on a terminal or in a notebook).
    blas_threads : int, optional
        BLAS threads during the run.
    norm : {None, 'layer', 'batch'}
        Real normalisation layers in every block ``[norm] -> phi -> [norm] -> W . + b`` (layers >= 2):
        LayerNorm over the N units of each sample (subtract the mean, divide by the standard deviation,
        ddof 0), BatchNorm over the P simulated inputs of each unit (the batch).
    norm_at : {'before', 'after'}
        Normalise the pre-activation h or phi(h) (pooled psi(h) for pools).
    batch : int, optional
        BatchNorm batch size: None or n_inputs (the simulated batch is the set of inputs).

    Returns
    -------
    Simulation
        Per-layer ``q``, ``qab``, ``c`` (and quantiles), ``V``, ``Vtilde``, ``gamma``, ``kurtosis``, ``gram``.

    Examples
    --------
    >>> sf.simulate("relu", 200, 3, 2.0, 0.0, n_inputs=4).q.shape
    (3,)
    """
    act, k, width, depth, sw, sb, P, n_networks, seed, alpha, d = _validate(
        _F, act, width, depth, sigma_w2, sigma_b2, n_inputs, n_networks, seed, residual, inputs, input_dim, method)
    threads = None if blas_threads is None else check.integer(_F, "blas_threads", blas_threads, lo=1)
    nrm = nm.options(_F, norm, norm_at, batch)
    if nrm is not None and nrm.batch is not None and nrm.batch != P:
        check.fail(_F, "batch", f"None or n_inputs = {P} (BatchNorm normalises over the simulated inputs)", batch)
    if nrm is not None and alpha is not None:
        check.fail(_F, "residual", "None with norm (normalised residual blocks are not supported)", residual)
    with _blas_threads(threads):
        return _simulate(act, k, width, depth, sw, sb, P, n_networks, seed, alpha, d, inputs, method, progress, nrm)


def normalised(H, kind, axis_units=-1, axis_batch=-2):
    """LayerNorm (over units, last axis) or BatchNorm (over samples, the axis before) of H: subtract the
    mean, divide by the standard deviation (ddof 0), no learned scale or shift; 0 where H is constant."""
    axis = axis_units if kind == "layer" else axis_batch
    Z = H - H.mean(axis=axis, keepdims=True)
    sd = np.sqrt((Z * Z).mean(axis=axis, keepdims=True))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(sd > 0, Z / np.where(sd > 0, sd, 1.0), 0.0)   # a constant unit gives 0 (eps -> 0)


def _block(phi, pool, k, nrm):
    """H -> repeat_k(norm_after(pool_k(phi(norm_before(H))))) of shape (..., N), the block's output."""
    def f(H):
        if nrm is not None and nrm.at == "before":
            H = normalised(H, nrm.kind)
        Y = _pooled(phi(H), pool, k)
        if nrm is not None and nrm.at == "after":
            Y = normalised(Y, nrm.kind)
        return np.repeat(Y, k, axis=-1) if k > 1 else Y
    return f


def _simulate(act, k, width, depth, sw, sb, P, n_networks, seed, alpha, d, inputs, method, progress, nrm=None):
    data_seed, net_seeds = _seeds(seed, n_networks)
    X = _make_inputs(inputs, P, d, np.random.default_rng(data_seed))
    n_pairs = P * (P - 1) // 2
    iu = np.triu_indices(P, 1)
    if n_pairs * n_networks > PAIR_CAP:  # a fixed, seeded subset of pairs per network for the quantiles
        keep = max(1, PAIR_CAP // n_networks)
        sel = np.sort(np.random.default_rng(data_seed.spawn(1)[0]).choice(n_pairs, keep, replace=False))
        iu = (iu[0][sel], iu[1][sel])
    acc = _Acc(n_networks, depth, P, iu)
    phi, _ = _act_fns(act)
    pool = act.pool
    if nrm is not None:     # the whole block as one map of H; pooling inside it
        phi, pool, k = _block(phi, pool, k, nrm), None, 1
    params = dict(act=act.name, width=width, depth=depth, sigma_w2=sw, sigma_b2=sb, n_inputs=P,
                  n_networks=n_networks, seed=seed, residual=alpha, inputs=inputs if isinstance(inputs, str)
                  else "array", input_dim=d, method=method, norm=None if nrm is None else nrm.kind,
                  norm_at=None if nrm is None else nrm.at)
    batch = max(1, min(n_networks, BATCH_ELEMENTS // (P * width)))
    bar = _progress(n_networks * depth, progress, f"simulate {act.name}")
    M1 = (sw / d) * (X @ X.T) + sb            # layer-1 conditional covariance (inputs fixed)
    for start in range(0, n_networks, batch):
        nets = np.arange(start, min(start + batch, n_networks))
        if method == "gram":
            _run_gram(acc, nets, [net_seeds[i] for i in nets], M1, phi, pool, k, width, depth, sw, sb, alpha, bar)
        else:
            for i in nets:
                _run_weights(acc, i, net_seeds[i], X, phi, pool, k, width, depth, sw, sb, alpha, bar)
    if bar is not None:
        bar.close()
    return acc.result(depth, X, method, params, conditional=alpha is None)


def _run_gram(acc, nets, seeds, M1, phi, pool, k, N, depth, sw, sb, alpha, bar):
    B, P = len(nets), M1.shape[0]
    rngs = [np.random.default_rng(s) for s in seeds]
    Z = np.empty((B, P, N))

    def draw():
        for b, rng in enumerate(rngs):
            rng.standard_normal(out=Z[b])
        return Z

    L1 = _psd_sqrt(M1)
    H = np.matmul(L1, draw())
    G = np.broadcast_to(np.diagonal(M1), (B, P))
    acc.add(0, nets, H, G)
    for layer in range(1, depth):
        Yp = _pooled(phi(H), pool, k)                  # (B, P, N/k); repeating k times is folded into M
        M = (sw / Yp.shape[-1]) * _gram(Yp) + sb       # (sigma_w2/N) Y Y^T + sigma_b2 11^T
        inc = np.matmul(_psd_sqrt(M), draw())
        G = np.diagonal(M, axis1=1, axis2=2)
        if alpha is None:
            H = inc
        else:
            G = (H * H).mean(axis=-1) + alpha**2 * G   # E[h'^2 | previous layer] averaged over nodes
            H = H + alpha * inc
        acc.add(layer, nets, H, G)
        if bar is not None:
            bar.update(B)
    if bar is not None:
        bar.update(B)


def _layer_params(ss, fan_in, N, sw, sb):
    """(W, b) of one layer from its own seed: W (N, fan_in) ~ N(0, sw/fan_in), b ~ N(0, sb)."""
    rng = np.random.default_rng(ss)
    W = rng.standard_normal((N, fan_in)) * np.sqrt(sw / fan_in)
    b = rng.standard_normal(N) * np.sqrt(sb)
    return W, b


def _forward_weights(net_seed, X, phi, pool, k, N, depth, sw, sb, alpha, on_layer):
    """Explicit-weights forward pass; calls on_layer(l, H, G) per layer; returns layer seeds and last H."""
    layer_seeds = net_seed.spawn(depth + 1)            # depth layers + the readout
    W, b = _layer_params(layer_seeds[0], X.shape[1], N, sw, sb)
    H = X @ W.T + b
    on_layer(0, H, (sw / X.shape[1]) * (X * X).sum(axis=1) + sb)
    for layer in range(1, depth):
        Y = np.repeat(_pooled(phi(H), pool, k), k, axis=-1) if k > 1 else phi(H)
        W, b = _layer_params(layer_seeds[layer], N, N, sw, sb)
        G = (sw / N) * (Y * Y).sum(axis=1) + sb
        inc = Y @ W.T + b
        if alpha is None:
            H = inc
        else:
            G = (H * H).mean(axis=-1) + alpha**2 * G
            H = H + alpha * inc
        on_layer(layer, H, G)
    return layer_seeds, H


def _run_weights(acc, i, net_seed, X, phi, pool, k, N, depth, sw, sb, alpha, bar):
    def on_layer(layer, H, G):
        acc.add(layer, np.array([i]), H[None], G[None])
        if bar is not None:
            bar.update(1)
    _forward_weights(net_seed, X, phi, pool, k, N, depth, sw, sb, alpha, on_layer)


# ---------------------------------------------------------------- per-class gradients (docs/theory.md section 6)
@dataclass(frozen=True)
class ClassGradients(ToXarray):
    """Mean squared gradients (1/N) sum_i (dl_a/dh_i^(l))^2 of the per-sample loss, averaged over samples.

    Arrays of shape (n_networks, depth), row index l - 1: ``all`` (every sample), ``favoured``
    (samples labelled with the class the network assigns most inputs to at initialisation),
    ``unfavoured`` (the other class). ``favoured_class`` (n_networks,), ``g0`` = fraction of
    inputs assigned to class 0, ``labels`` (P,).
    """
    all: np.ndarray
    favoured: np.ndarray
    unfavoured: np.ndarray
    favoured_class: np.ndarray
    g0: np.ndarray
    labels: np.ndarray
    layers: np.ndarray
    params: dict = field(default_factory=dict)

    def dataset_parts(self) -> dict:
        """For :meth:`to_xarray`: ``grad_all``/``grad_favoured``/``grad_unfavoured`` over (network, layer),
        ``favoured_class`` and ``g0`` over (network,), ``labels`` over (input,)."""
        data = {f"grad_{n}": getattr(self, n) for n in ("all", "favoured", "unfavoured")}
        dims = {n: ("network", "layer") for n in data}
        data.update(favoured_class=self.favoured_class, g0=self.g0, labels=self.labels)
        dims.update(favoured_class=("network",), g0=("network",), labels=("input",))
        coords = {"layer": np.asarray(self.layers), "network": np.arange(self.g0.shape[0]),
                  "input": np.arange(self.labels.shape[0])}
        return dict(data=data, coords=coords, dims=dims, params=dict(self.params))


def _expit(t):
    """1/(1 + exp(-t)) without overflow (accurate far in both tails)."""
    out = np.empty_like(t)
    pos = t >= 0
    out[pos] = 1 / (1 + np.exp(-t[pos]))
    e = np.exp(t[~pos])
    out[~pos] = e / (1 + e)
    return out


def _logits_and_backprop(net_seed, X, labels, phi, dphi, pool, k, N, depth, sw, sb, alpha, on_delta):
    """Forward pass with explicit weights, readout logits z (P, 2), then backpropagation of the per-sample
    losses; on_delta(l, dl_a/dh^(l)_a as a (P, N) array) for l = depth-1 .. 0 (0-based). Returns z."""
    Hs = [None] * depth

    def store(layer, H, G):
        Hs[layer] = H
    layer_seeds, _ = _forward_weights(net_seed, X, phi, pool, k, N, depth, sw, sb, alpha, store)
    phiL = phi(Hs[-1])
    YL = np.repeat(_pooled(phiL, pool, k), k, axis=-1) if k > 1 else phiL
    Wo, bo = _layer_params(layer_seeds[depth], N, 2, sw, sb)
    z = YL @ Wo.T + bo
    # dl/dz_1 = p_1 - t = sigmoid(z1 - z0) - t, written so that neither tail cancels; dl/dz_0 = -dl/dz_1
    dz1 = np.where(labels == 1, -_expit(z[:, 0] - z[:, 1]), _expit(z[:, 1] - z[:, 0]))
    delta = _pool_backward(np.outer(dz1, Wo[1] - Wo[0]), phiL, dphi(Hs[-1]), pool, k)
    for layer in range(depth - 1, -1, -1):
        on_delta(layer, delta)
        if layer == 0:
            break
        W, _ = _layer_params(layer_seeds[layer], N, N, sw, sb)
        Hp = Hs[layer - 1]
        back = _pool_backward(delta @ W, phi(Hp), dphi(Hp), pool, k)
        delta = back if alpha is None else delta + alpha * back
        Hs[layer] = None
    return z


def class_gradients(act: str | Activation, width: int = 1000, depth: int = 20, sigma_w2: float = 2.0,
                    sigma_b2: float = 0.0, n_inputs: int = 200, n_networks: int = 1, seed: int = 0,
                    residual: float | None = None, *, inputs: Literal["orthonormal", "gaussian"] = "orthonormal",
                    input_dim: int | None = None, progress: bool | None = None,
                    blas_threads: int | None = 1) -> ClassGradients:
    """Per-class gradients at initialisation: the network of :func:`simulate`, a linear readout to two
    logits z = W_out y^(L) + b_out (W_out ~ N(0, sigma_w2/N), b_out ~ N(0, sigma_b2)) and the per-sample
    softmax cross-entropy l_a = -log softmax(z_a)[t_a], labels t_a a seeded random half/half split.

    Backpropagation: dl/dz_1 = sigmoid(z_1 - z_0) - t (evaluated in the tails without cancellation),
    dl/dh^(l) = pool'(h^(l)) (W^(l+1))^T dl/dh^(l+1) (+ the identity path for residual blocks).
    Uses explicit weights, regenerated per layer from per-layer seeds (never all held at once), so
    the default width is smaller than simulate's. Memory O(depth N P) for the stored pre-activations.

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation` (pools included).
    width, depth : int
        Hidden width N and number of layers.
    sigma_w2, sigma_b2 : float
        Weight and bias variances.
    n_inputs : int
        Number of inputs P.
    n_networks, seed : int
        Independent networks, and the seed they derive from.
    residual : float, optional
        alpha for residual blocks.
    inputs : {'orthonormal', 'gaussian'}
        Input design (module docstring); ``input_dim`` (int, optional) is their dimension d.
    progress, blas_threads : bool or int, optional
        As in :func:`simulate`.

    Returns
    -------
    ClassGradients
        Gradient norms per layer: ``all``, ``favoured``, ``unfavoured``; ``favoured_class``, ``g0``, ``labels``.

    Examples
    --------
    >>> sf.class_gradients("tanh", width=50, depth=3, n_inputs=8).layers.size
    3
    """
    func = "class_gradients"
    act, k, width, depth, sw, sb, P, n_networks, seed, alpha, d = _validate(
        func, act, width, depth, sigma_w2, sigma_b2, n_inputs, n_networks, seed, residual, inputs, input_dim)
    if P < 2:
        check.fail(func, "n_inputs", "an integer >= 2 (two classes)", P)
    threads = None if blas_threads is None else check.integer(func, "blas_threads", blas_threads, lo=1)
    with _blas_threads(threads):
        return _class_gradients(act, k, width, depth, sw, sb, P, n_networks, seed, alpha, d, inputs, progress)


def _class_gradients(act, k, width, depth, sw, sb, P, n_networks, seed, alpha, d, inputs, progress):
    data_seed, net_seeds = _seeds(seed, n_networks)
    rng = np.random.default_rng(data_seed)
    X = _make_inputs(inputs, P, d, rng)
    labels = rng.permutation(np.arange(P) % 2)
    phi, dphi = _act_fns(act)
    pool = act.pool
    out = {n: np.full((n_networks, depth), np.nan) for n in ("all", "favoured", "unfavoured")}
    fav = np.zeros(n_networks, dtype=int)
    g0 = np.zeros(n_networks)
    bar = _progress(n_networks * depth, progress, f"class_gradients {act.name}")
    sq = np.empty((depth, P))

    def on_delta(layer, delta):
        sq[layer] = (delta * delta).mean(axis=1)           # per sample, mean over nodes
        if bar is not None:
            bar.update(1)
    for net in range(n_networks):
        z = _logits_and_backprop(net_seeds[net], X, labels, phi, dphi, pool, k, width, depth, sw, sb, alpha, on_delta)
        g0[net] = np.mean(z[:, 1] <= z[:, 0])              # fraction assigned to class 0
        fav[net] = 0 if g0[net] >= 0.5 else 1
        out["all"][net] = sq.mean(axis=1)
        out["favoured"][net] = sq[:, labels == fav[net]].mean(axis=1)
        out["unfavoured"][net] = sq[:, labels != fav[net]].mean(axis=1)
    if bar is not None:
        bar.close()
    params = dict(act=act.name, width=width, depth=depth, sigma_w2=sw, sigma_b2=sb, n_inputs=P,
                  n_networks=n_networks, seed=seed, residual=alpha, input_dim=d)
    return ClassGradients(all=out["all"], favoured=out["favoured"], unfavoured=out["unfavoured"],
                          favoured_class=fav, g0=g0, labels=labels, layers=np.arange(1, depth + 1), params=params)


# ---------------------------------------------------------------- input-output Jacobian (docs/theory.md section 11)
@dataclass
class JacobianSimulation(ToXarray):
    """Squared singular values ``sv2`` (n_networks, width) of J = dz^(L)/dx of real networks, and per
    network m_k = (1/n) tr (J J^T)^k, k = 1..6 (``moments``, shape (n_networks, 6))."""
    sv2: np.ndarray
    moments: np.ndarray
    params: dict

    def mean(self, k):
        return float(self.moments[:, k - 1].mean())

    def dataset_parts(self) -> dict:
        """For :meth:`to_xarray`: ``sv2`` over (network, rank), ``moments`` over (network, moment), moment = k."""
        nets, n = self.sv2.shape
        return dict(data={"sv2": self.sv2, "moments": self.moments},
                    coords={"network": np.arange(nets), "rank": np.arange(n),
                            "moment": np.arange(1, self.moments.shape[1] + 1)},
                    dims={"sv2": ("network", "rank"), "moments": ("network", "moment")}, params=dict(self.params))

    def stderr(self, k):
        n = self.moments.shape[0]
        return float(self.moments[:, k - 1].std(ddof=1) / np.sqrt(n)) if n > 1 else np.nan


def _haar(rng, n):
    """Haar-random orthogonal n x n (QR of a Gaussian matrix, signs fixed by diag R)."""
    qm, r = np.linalg.qr(rng.standard_normal((n, n)))
    return qm * np.sign(np.diag(r))


def simulate_jacobian(act: str | Activation, width: int, depth: int, sigma_w2: float, sigma_b2: float,
                      n_networks: int = 1, seed: int = 0, weights: Literal["gaussian", "orthogonal"] = "gaussian",
                      q0: float = 1.0) -> JacobianSimulation:
    """Jacobians of seeded random networks of constant width (input dimension = width), input x with
    x.x/width = q0: z^(1) = W_1 x + b_1, z^(l+1) = W_{l+1} phi(z^(l)) + b_{l+1}; W Gaussian
    N(0, sigma_w2/width) or sqrt(sigma_w2) x Haar orthogonal; J = W_L D_{L-1} ... D_1 W_1.

    Parameters
    ----------
    act : str or Activation
        A single-node activation.
    width, depth : int
        Width (= input dimension) and number of layers.
    sigma_w2, sigma_b2 : float
        Weight and bias variances.
    n_networks, seed : int
        Independent networks, and the seed they derive from.
    weights : {'gaussian', 'orthogonal'}
        Weight distribution.
    q0 : float
        Input norm x.x/width.

    Returns
    -------
    JacobianSimulation
        ``sv2`` (squared singular values of J per network), their ``moments`` and ``params``.

    Examples
    --------
    >>> sf.simulate_jacobian("relu", 50, 3, 2.0, 0.0).sv2.size
    50
    """
    f = "simulate_jacobian"
    a = act if isinstance(act, Activation) else activation(act)
    if a.pool is not None:
        check.fail(f, "act", "a single-node activation (no pool)", a.name)
    n = check.integer(f, "width", width, lo=2, hi=20_000)
    depth = check.integer(f, "depth", depth, lo=1, hi=10_000)
    nets = check.integer(f, "n_networks", n_networks, lo=1)
    sw = float(_scalar(f, "sigma_w2", sigma_w2))
    sb = float(_scalar(f, "sigma_b2", sigma_b2))
    q0 = float(check.real(f, "q0", q0, lo=0, lo_open=True))
    if weights not in ("gaussian", "orthogonal"):
        check.fail(f, "weights", "one of ('gaussian', 'orthogonal')", weights)
    check.memory(f, f"width = {n}: 3 matrices of width^2 float64", 24 * n * n)
    phi, dphi = _act_fns(a)
    sv2, mom = np.empty((nets, n)), np.empty((nets, 6))
    for i, ss in enumerate(np.random.SeedSequence(seed).spawn(nets)):
        rng = np.random.default_rng(ss)
        draw = (lambda: rng.standard_normal((n, n)) * np.sqrt(sw / n)) if weights == "gaussian" else \
            (lambda: _haar(rng, n) * np.sqrt(sw))
        x0 = rng.standard_normal(n)
        x0 *= np.sqrt(q0 * n) / np.linalg.norm(x0)
        W = draw()
        z, J = W @ x0 + rng.standard_normal(n) * np.sqrt(sb), W
        for _ in range(depth - 1):
            W = draw()
            J = W @ (dphi(z)[:, None] * J)
            z = W @ phi(z) + rng.standard_normal(n) * np.sqrt(sb)
        lam = np.sort(np.linalg.svd(J, compute_uv=False) ** 2)
        sv2[i], mom[i] = lam, [np.mean(lam ** k) for k in range(1, 7)]
    return JacobianSimulation(sv2, mom, dict(act=a.name, width=n, depth=depth, sigma_w2=sw, sigma_b2=sb,
                                             n_networks=nets, seed=seed, weights=weights, q0=q0))
