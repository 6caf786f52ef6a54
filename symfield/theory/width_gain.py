"""Width-aware weight variance: the sigma_w2 whose width-n mean equals the infinite-width variance.

At width n, E[Ghat_aa^(L)] = K^(L)(sigma_w2) + K1^(L)(sigma_w2)/n (sf.finite_width). Choosing
sigma_w2' = sigma_w2 + delta with delta = -K1^(L)/(n dK^(L)/dsigma_w2) gives
E[Ghat^(L)](sigma_w2') = K^(L)(sigma_w2) + O(1/n^2). The sensitivity is exact, by the chain rule:

    dK^(l+1)/dsigma_w2 = <psi^2>_K + sigma_w2 (d<psi^2>/dK) dK^(l)/dsigma_w2,   dK^(1)/dsigma_w2 = q0.

For ReLU-like (degree-1 homogeneous) activations d^2<psi^2>/dK^2 = 0, so K1 = 0 and the gain
of a plain network needs no width correction at all. Residual blocks are different: a node's own
contribution to the metric of its later increments makes K1 > 0 even for ReLU (docs/theory.md 9.3).
"""
from __future__ import annotations

from symfield.core.errors import InvalidValue, PrecisionError
import math
import warnings
from dataclasses import dataclass, field

import numpy as np

from symfield.core import validate as check
from symfield.core.dataset import ToXarray
from symfield.symbolic import gaussian as G
from symfield.symbolic.activation import Activation, activation
from symfield.theory.finite_width import coefficients, finite_width, layer_variances
from symfield.theory.gram import gram_fluctuations
from symfield.numeric.maps import maps
from symfield.symbolic.kernel import kernel

_F = "width_gain"


EXPANSION_MAX = 0.2     # warn above this V/(n K^2): the neglected O(1/n^2) terms are then a sizeable part


class ExpansionWarning(UserWarning):
    """The width is too small for the leading 1/n expansion behind sf.width_gain."""


@dataclass(frozen=True)
class WidthGain(ToXarray):
    """``sigma_w2``: the width-corrected weight variance; ``sigma_w2_inf``: the one it stands in for.

    ``expansion`` = V^(L)/(n K^(L)^2), the relative variance of the layer metric at width n (a third of the
    excess kurtosis): the parameter of the 1/n expansion. The neglected terms are of relative size
    ~ expansion; above EXPANSION_MAX = 0.2 (metric sd above 45 % of its mean; widths 1 and 2 at any depth
    >= 3 for relu and tanh) an :class:`ExpansionWarning` says so. ``to_xarray()``: the scalars as 0-d variables."""
    sigma_w2: float
    sigma_w2_inf: float
    width: int
    depth: int
    K: float                 # K^(depth)(sigma_w2_inf), the target
    K1: float                # its 1/n shift at sigma_w2_inf
    dK_dsigma_w2: float
    params: dict = field(default_factory=dict)
    expansion: float = 0.0   # V/(n K^2) at the matched layer

    def dataset_parts(self) -> dict:
        """The arguments of :func:`symfield.core.dataset.build` for :meth:`to_xarray`."""
        names = ("sigma_w2", "sigma_w2_inf", "K", "K1", "dK_dsigma_w2", "expansion", "relative", "gain")
        long = {"sigma_w2": "width-corrected weight variance", "sigma_w2_inf": "infinite-width weight variance aimed at",
                "K": "target variance K^(depth)(sigma_w2_inf)", "K1": "1/n shift of the variance at sigma_w2_inf",
                "dK_dsigma_w2": "dK^(depth)/dsigma_w2", "expansion": "V/(n K^2): the 1/n expansion parameter",
                "relative": "sigma_w2/sigma_w2_inf - 1", "gain": "sqrt(sigma_w2)"}
        return dict(data={k: np.asarray(float(getattr(self, k))) for k in names}, coords={},
                    params=dict(self.params), var_attrs={k: {"long_name": v} for k, v in long.items()})

    @property
    def gain(self) -> float:
        """sqrt(sigma_w2), the multiplier of 1/sqrt(fan_in) in a fan-in initialiser."""
        return math.sqrt(self.sigma_w2)

    @property
    def relative(self) -> float:
        """sigma_w2/sigma_w2_inf - 1."""
        return self.sigma_w2 / self.sigma_w2_inf - 1

    def std(self, fan_in: int) -> float:
        """Standard deviation of a weight with ``fan_in`` inputs: sqrt(sigma_w2/fan_in)."""
        fan_in = check.integer("WidthGain.std", "fan_in", fan_in, lo=1)
        return math.sqrt(self.sigma_w2 / fan_in)


def _sensitivity(act, sigma_w2, K, q0, alpha=None) -> np.ndarray:
    """dK^(l)/dsigma_w2 for l = 1..depth along the variances K^(l) (float64, exact chain rule);
    residual blocks: dK^(l+1) = dK^(l) + alpha^2 (<psi^2> + sigma_w2 d<psi^2>/dK dK^(l))."""
    co, M = coefficients(act), maps(kernel(act))
    depth = len(K)
    m2 = M.expect(co.psi2, (G.q,), (K,))
    d1 = M.expect(co.dpsi2, (G.q,), (K,))
    out = np.empty(depth)
    out[0] = q0
    for l in range(depth - 1):
        step = m2[l] + sigma_w2 * d1[l] * out[l]
        out[l + 1] = step if alpha is None else out[l] + alpha**2 * step
    return out


def width_gain(act: str | Activation, sigma_w2: float, sigma_b2: float, width: int, depth: int, q0: float = 1.0,
               residual: float | None = None) -> WidthGain:
    """The sigma_w2 for which E[Ghat_aa^(depth)] at ``width`` equals K^(depth)(sigma_w2, sigma_b2), to O(1/n).

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation` (pools included).
    sigma_w2, sigma_b2 : float
        The infinite-width weight and bias variances aimed at.
    width : int
        Hidden width n (>= 1).
    depth : int
        The layer whose mean variance is matched (>= 1; row convention of sf.finite_width).
    q0 : float
        Input norm x.x/n0 (> 0).
    residual : float, optional
        None, or alpha > 0 for residual blocks z + alpha (W phi(z) + b); K1 then comes from
        sf.gram_fluctuations(..., residual=alpha) and is not zero for ReLU (a node's own feedback).

    Returns
    -------
    WidthGain
        ``sigma_w2`` (corrected), ``gain``, ``std(fan_in)`` and ``relative``.

    Examples
    --------
    >>> width_gain("relu", 2.0, 0.0, width=128, depth=4).relative
    0.0
    """
    sw = float(check.real(_F, "sigma_w2", sigma_w2, lo=0, lo_open=True))
    sb = float(check.real(_F, "sigma_b2", sigma_b2, lo=0))
    n = check.integer(_F, "width", width, lo=1)
    depth = check.integer(_F, "depth", depth, lo=1)
    q0 = float(check.input_gram(_F, "q0", q0, pair=False))
    act = activation(act) if not isinstance(act, Activation) else act
    layer_variances(act, sw, sb, depth, q0, _F)          # refuses variances that leave float64's range
    if residual is None:
        fw = finite_width(act, sw, sb, depth, q0)
        K, K1, alpha = fw.K, float(fw.K1[-1]), None
        V = float(fw.V[-1])
    else:
        g = gram_fluctuations(act, sw, sb, depth, q0=(q0, q0, 0.0), residual=residual)
        if g.status[-1]:
            raise PrecisionError(f"width_gain: the residual theory flagged layer {depth} (status {g.status[-1]})")
        K, K1, alpha = g.K[:, 0], float(g.K1[-1, 0]), g.params["residual"]
        V = float(g.gram_cov[-1, 0, 0]) - 2 * float(K[-1]) ** 2      # n Var(Ghat) minus its Wishart part
    if not float(np.min(K)) ** 2 >= np.finfo(float).tiny:     # the 1/n terms are of order K^2
        check.fail(_F, "q0", f"large enough that every squared layer variance K^2 is a normal float64 "
                             f"(K^(l) = {float(np.min(K)):.3g} at its smallest; use larger q0 or sigma_b2)", q0)
    eps = V / (n * float(K[-1]) ** 2)
    if eps > EXPANSION_MAX:
        warnings.warn(f"width_gain: width {n} is too small for the 1/n expansion at depth {depth}: the layer "
                      f"metric's relative variance V/(n K^2) is {eps:.3g} > {EXPANSION_MAX} (terms of order 1/n^2 "
                      "are not negligible); the corrected sigma_w2 is only indicative", ExpansionWarning, stacklevel=2)
    dK = _sensitivity(act, sw, K, q0, alpha)[-1]
    new = sw - K1 / (n * dK) if K1 else sw
    if not (math.isfinite(new) and new > 0):
        raise InvalidValue(f"width_gain: no positive correction at width={n}, depth={depth} "
                         f"(K1={K1:.6g}, dK/dsigma_w2={dK:.6g}); the 1/n expansion does not hold there.")
    return WidthGain(new, sw, n, depth, float(K[-1]), K1, float(dK),
                     dict(act=act.name, sigma_w2=sw, sigma_b2=sb, width=n, depth=depth, q0=q0, residual=alpha), eps)
