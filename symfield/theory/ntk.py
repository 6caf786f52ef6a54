"""The neural tangent kernel (NTK) of a deep wide network at initialisation, two inputs of equal norm.

NTK parameterisation (layer 1 linear; T = E[psi(u) psi(v)] = C, Tdot = E[grad psi(u) . grad psi(v)] = dC):

    Theta^(1) = K^(1) = sigma_w2 q0 + sigma_b2                      (entrywise: aa and ab)
    Theta^(l+1) = K^(l+1) + sigma_w2 Tdot(K^(l)) Theta^(l),   K^(l+1) = sigma_w2 T(K^(l)) + sigma_b2

with residual and "standard" (fan-in) variants (docs/theory.md section 13). gamma_Theta is kept exact as
c -> 1 by the NTK distance d_Theta = 2 (Theta_aa - Theta_ab) and its own recursion, with
dTdot = Tdot_aa - Tdot_ab = E[|grad psi(u) - grad psi(v)|^2]/2:

    d_Theta' = sigma_w2 D + sigma_w2 Tdot_aa d_Theta + 2 sigma_w2 dTdot Theta_ab,

D the engine's distance map of psi; dTdot is half the distance map of phi' for a single node, that over k
for avg-pools, and the plain difference for max-pools (``exact`` False).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import mpmath
import numpy as np
from numpy.typing import ArrayLike

from symfield.core import validate as check
from symfield.numeric.evaluate import GUARD_DIGITS, to_mpf
from symfield.numeric.maps import maps
from symfield.symbolic.activation import Activation
from symfield.symbolic.kernel import kernel
from symfield.theory.ntk_core import Coefficients, terms_f64, terms_mp, theta_f64, theta_mp
from symfield.theory.propagate import propagate

_F = "ntk"
PARAMETERIZATIONS = ("ntk", "standard")


@dataclass(frozen=True)
class NTK:
    """Per-layer NTK of two inputs of equal norm; row i is layer ``layers[i]`` (1-based).

    ``theta_aa``, ``theta_ab``, ``d_theta`` (= 2 (theta_aa - theta_ab), its own recursion), ``gamma_theta``
    (= theta_ab/(theta_aa - theta_ab) = 2 theta_ab/d_theta), the NNGP kernel ``q``, ``qab``, ``d`` beside it,
    ``shares_aa``/``shares_ab``: the share of each layer's parameters in Theta at the last layer (rows: layers
    1..depth, summing to 1), ``status`` ("ok", or why later layers are NaN/inf), ``exact`` (gamma_theta keeps
    its relative accuracy as c -> 1), ``how`` (the paths of dTdot), ``precision``.
    """
    theta_aa: np.ndarray
    theta_ab: np.ndarray
    d_theta: np.ndarray
    q: np.ndarray
    qab: np.ndarray
    d: np.ndarray
    layers: np.ndarray
    shares_aa: np.ndarray
    shares_ab: np.ndarray
    status: str
    exact: bool
    how: str
    precision: str
    params: dict = field(default_factory=dict, repr=False)

    @property
    def gamma_theta(self) -> np.ndarray:
        """gamma_Theta = Theta_ab/(Theta_aa - Theta_ab) = 2 Theta_ab / d_Theta per layer."""
        if self.precision != "float64":
            return np.array([2 * a / b if b != 0 else mpmath.inf for a, b in zip(self.theta_ab, self.d_theta)],
                            dtype=object)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return 2 * self.theta_ab / self.d_theta

    @property
    def gamma(self) -> np.ndarray:
        """The NNGP drift ratio gamma = 2 q_ab/d per layer (for comparison)."""
        if self.precision != "float64":
            return np.array([2 * a / b if b != 0 else mpmath.inf for a, b in zip(self.qab, self.d)], dtype=object)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return 2 * self.qab / self.d

    def kappa(self, m: int) -> np.ndarray:
        """Condition number of the NTK on m equicorrelated inputs: eigenvalues Theta_aa + (m-1) Theta_ab (once)
        and Theta_aa - Theta_ab (m-1 times), so kappa = 1 + m gamma_Theta."""
        m = check.integer("NTK.kappa", "m", m, lo=2)
        return 1 + m * self.gamma_theta

    def lambda_max(self, m: int) -> np.ndarray:
        """Largest NTK eigenvalue on m equicorrelated inputs: Theta_aa + (m - 1) Theta_ab."""
        m = check.integer("NTK.lambda_max", "m", m, lo=1)
        return self.theta_aa + (m - 1) * self.theta_ab

    def lr_max(self, m: int) -> np.ndarray:
        """Largest stable gradient-descent learning rate on the loss sum_i (f(x_i) - y_i)^2 / 2 over m
        equicorrelated inputs: eta < 2/lambda_max (the linearised dynamics f <- f - eta Theta (f - y))."""
        return 2 / self.lambda_max(m)


def _check(sigma_w2, sigma_b2, depth, q0, qab0, layers, residual, parameterization, width, dps):
    sw = float(check.real(_F, "sigma_w2", sigma_w2, lo=0, lo_open=True))
    sb = float(check.real(_F, "sigma_b2", sigma_b2, lo=0))
    for name, v in (("sigma_w2", sigma_w2), ("sigma_b2", sigma_b2), ("q0", q0), ("qab0", qab0)):
        if np.ndim(v) != 0:
            check.fail(_F, name, "a scalar (a finite float)", v, TypeError)
    depth = check.integer(_F, "depth", depth, lo=1)
    q0 = float(check.real(_F, "q0", q0, lo=0, lo_open=True))
    qab0 = float(check.real(_F, "qab0", qab0))
    if abs(qab0) > q0:
        check.fail(_F, "qab0", f"a covariance with |qab0| <= q0 = {q0!r}", qab0)
    if parameterization not in PARAMETERIZATIONS:
        check.fail(_F, "parameterization", f"one of {PARAMETERIZATIONS}", parameterization)
    width = float(check.real(_F, "width", width, lo=0, lo_open=True))
    alpha = None if residual is None else float(check.real(_F, "residual", residual, lo=0))
    if layers is None:
        store = np.arange(1, depth + 1)
    else:
        arr = np.asarray(layers)
        if arr.dtype.kind not in "iu" or arr.ndim > 1 or arr.size == 0 or np.any((arr < 1) | (arr > depth)):
            check.fail(_F, "layers", f"a list of layer indices in 1..depth = 1..{depth}", layers)
        store = np.unique(arr.ravel().astype(np.int64))
    return sw, sb, depth, q0, qab0, store, alpha, width, check.dps(_F, dps)


def ntk(act: str | Activation, sigma_w2: float, sigma_b2: float, depth: int, q0: float = 1.0, qab0: float = 0.0,
        layers: ArrayLike | None = None, residual: float | None = None, parameterization: Literal["ntk", "standard"] = "ntk",
        dps: int | None = None, width: float = 1.0) -> NTK:
    """The NTK Theta^(l) of two inputs (variance q0, covariance qab0) through ``depth`` layers.

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation` (pools included).
    sigma_w2 : float
        Weight variance (> 0).
    sigma_b2 : float
        Bias variance (>= 0).
    depth : int
        Layers L >= 1; layer 1 is linear, Theta^(1) = K^(1).
    q0, qab0 : float
        The inputs' variance and covariance (abs(qab0) <= q0).
    layers : array_like of int, optional
        Layers (1..depth) to return; default all.
    residual : float, optional
        alpha >= 0: blocks z + alpha (W psi(z) + b) after the first layer.
    parameterization : {'ntk', 'standard'}
        "standard": neural-tangents' standard parameterisation with fan-in ``width`` in every layer.
    dps : int, optional
        None: float64 (gamma_theta exact as c -> 1 except for max-pools); N: mpmath at N digits.
    width : float
        Fan-in n of the standard parameterisation (ignored for "ntk").

    Returns
    -------
    NTK
        ``.theta_aa``, ``.theta_ab``, ``.gamma_theta``, ``.kappa(m)``, ``.lr_max(m)``, ``.shares_aa``, ``.status``.

    Examples
    --------
    >>> r = sf.ntk("relu", 2.0, 0.0, depth=10, q0=1.0, qab0=0.5)
    >>> float(r.theta_aa[-1]), round(float(r.theta_ab[-1]), 12)
    (20.0, 7.585388712435)
    """
    sw, sb, depth, q0, qab0, store, alpha, width, dps = _check(
        sigma_w2, sigma_b2, depth, q0, qab0, layers, residual, parameterization, width, dps)
    K = kernel(act)
    if dps is None:
        q, qab, d, status = _nngp_f64(act, sw, sb, depth, q0, qab0, alpha)
        terms, how, exact = terms_f64(K, q, qab, d)
    else:
        q, qab, d = _nngp_mp(K, sw, sb, depth, q0, qab0, alpha, dps)
        status = "ok"
        terms, how, exact = terms_mp(K, q, qab, d, dps), f"mpmath at dps={dps} (dTdot at extra digits)", True
    cw, cb = (sw, sb) if parameterization == "ntk" else (width, 1.0)
    coef = Coefficients(sw, cw, cb, alpha)
    first = (cw * q0 + cb, cw * qab0 + cb, cw * (2 * q0 - 2 * qab0))
    if dps is not None:
        with mpmath.workdps(dps + GUARD_DIGITS):
            coef = Coefficients(*(to_mpf(v) if v is not None else None for v in (sw, cw, cb, alpha)))
            first = (coef.cw * to_mpf(q0) + coef.cb, coef.cw * to_mpf(qab0) + coef.cb,
                     2 * coef.cw * (to_mpf(q0) - to_mpf(qab0)))
            taa, tab, dth, shares = theta_mp(first, terms, coef)
    else:
        taa, tab, dth, shares = theta_f64(first, terms, coef)
        if status == "ok" and not np.all(np.isfinite(taa)):
            status = f"Theta overflowed float64 after layer {int(np.argmax(~np.isfinite(taa)))} (use dps)"
    idx = store - 1
    return NTK(theta_aa=taa[idx], theta_ab=tab[idx], d_theta=dth[idx], q=q[idx], qab=qab[idx], d=d[idx],
               layers=store, shares_aa=shares[0], shares_ab=shares[1], status=status, exact=exact, how=how,
               precision="float64" if dps is None else f"mpmath(dps={dps})",
               params=dict(act=K.act.name, sigma_w2=sw, sigma_b2=sb, depth=depth, q0=q0, qab0=qab0,
                           residual=alpha, parameterization=parameterization, width=width))


# ------------------------------------------------------------------------------------------- the NNGP kernel
# paired with _nngp_mp: float64 reads propagate's compiled recursion, mpmath steps the maps (docs/numerics.md section 7)
def _nngp_f64(act, sw, sb, depth, q0, qab0, alpha):
    """q, q_ab, d per layer from :func:`propagate` (its compiled recursion, d by the distance map)."""
    P = propagate(act, sw, sb, depth, q0=q0, qab0=qab0, residual=alpha)
    status = "ok"
    if P.n_failed:
        code = int(np.ravel(P.status)[0])
        status = f"{P.STATUS[code]}; last finite gamma at layer {int(np.ravel(P.last_finite)[0])}"
    return P.q.reshape(depth), P.qab.reshape(depth), P.d.reshape(depth), status


def _nngp_mp(K, sw, sb, depth, q0, qab0, alpha, dps):
    """q, q_ab, d per layer in mpmath at dps digits (the engine's step: d by the distance map)."""
    first_layer, layer_step = maps(K, dps).step()
    q, qab, d = [], [], []
    with mpmath.workdps(dps + GUARD_DIGITS):
        sw_, sb_ = to_mpf(sw), to_mpf(sb)
        a2 = 0 if alpha is None else to_mpf(alpha) ** 2
        qa0, qc0 = to_mpf(q0), to_mpf(qab0)
        state = first_layer(qa0, qa0, qc0, 2 * (qa0 - qc0), sw_, sb_)
        for layer in range(depth):
            qa, _, qc, dd = state
            q.append(qa), qab.append(qc), d.append(dd)
            if layer + 1 < depth:
                state = layer_step(qa, qa, qc, dd, sw_, sb_, a2, alpha is not None, False, None)
    return (np.array(v, dtype=object) for v in (q, qab, d))


