"""Phase diagrams on (sigma_w2, sigma_b2) grids (Table 1 of Bassi et al.; docs/theory.md section 6).

Every grid point is classified from its fixed points, computed for the whole grid at once
(vectorised bracketing root finders of :mod:`symfield.theory.qstar`, ``eoc``, ``cstar``, ``neutrality``): q* from the variance map,
c* the stable fixed point of the c-map reached from c^(1), gamma* = c*/(1 - c*) and the slope
chi1 = sigma_w2 E[psi'^2](q*). The EOC curve (chi1 = 1) and the neutrality line (c* = 1/2) are
root-found per sigma_b2, never read off the grid.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

from symfield.core import validate as check
from symfield.core.dataset import ToXarray
from symfield.symbolic.activation import Activation
from symfield.symbolic.kernel import kernel
from symfield.theory import norm as nm
from symfield.theory.eoc import eoc_line
from symfield.theory.neutrality import neutrality_line
from symfield.theory.phases import PHASES, phase_fields
from symfield.theory.qstar import q_slope
from symfield.theory.propagate import propagate
from symfield.theory.trainability import depth_scale_fields


@dataclass(frozen=True)
class PhaseDiagram(ToXarray):
    """Fields have shape (len(sigma_w2), len(sigma_b2)); ``codes`` index PHASES.

    ``eoc`` and ``neutrality`` give sigma_w2 of those lines at each sigma_b2 (NaN where the
    line does not exist, the neutrality line also where it lies beyond the largest sigma_w2 drawn;
    positively homogeneous psi: the EOC is 1/E[psi'^2] at every sigma_b2);
    ``eoc_stable`` says where the EOC's q* is a stable fixed point (sigma_w2 V'(q*) <= 1). Where it
    is not (gelu, silu at small sigma_b2), no network reaches it: the labels follow the fixed point
    reached from q^(1), and the realised order/chaos boundary is the chi1 = 1 contour of ``slope``.
    With ``depth`` set, ``c_depth``/``gamma_depth`` hold c and gamma at that layer (sf.propagate),
    the finite-depth picture the paper plots. ``to_xarray()``: dims (sigma_w2, sigma_b2); ``codes``
    carries CF flag_values/flag_meanings (the names of PHASES; -1 "failed" when present)."""
    act: str
    sigma_w2: np.ndarray
    sigma_b2: np.ndarray
    codes: np.ndarray
    q_star: np.ndarray
    c_star: np.ndarray
    gamma_star: np.ndarray
    slope: np.ndarray
    eoc: np.ndarray
    neutrality: np.ndarray
    eoc_tol: float
    depth: int | None = None
    c_depth: np.ndarray | None = field(default=None, repr=False)
    gamma_depth: np.ndarray | None = field(default=None, repr=False)
    eoc_stable: np.ndarray | None = field(default=None, repr=False)
    norm: str | None = None
    depth_scale: np.ndarray | None = field(default=None, repr=False)
    chi_c_star: np.ndarray | None = field(default=None, repr=False)
    kappa: np.ndarray | None = field(default=None, repr=False)
    m: int | None = None

    @property
    def labels(self) -> np.ndarray:
        """Phase names per grid point ("failed" where a sweep tile could not be computed, code -1)."""
        names = np.asarray(PHASES, dtype=object)[np.maximum(self.codes, 0)]
        names[self.codes < 0] = "failed"
        return names.astype(str)

    def dataset_parts(self) -> dict:
        """The arrays, coordinates, dims and parameters of :meth:`to_xarray` (for symfield.io.output.save)."""
        names = ("codes", "q_star", "c_star", "gamma_star", "slope", "eoc", "neutrality")
        data = {n: np.asarray(getattr(self, n)) for n in names}
        if self.depth is not None:
            data.update(c_depth=np.asarray(self.c_depth), gamma_depth=np.asarray(self.gamma_depth))
        data.update({n: np.asarray(getattr(self, n)) for n in ("depth_scale", "chi_c_star", "kappa")
                     if getattr(self, n) is not None})
        params = dict(act=self.act, eoc_tol=self.eoc_tol, depth=self.depth, m=self.m, norm=self.norm or "")
        return dict(data=data, coords={"sigma_w2": self.sigma_w2, "sigma_b2": self.sigma_b2},
                    dims={"eoc": ("sigma_b2",), "neutrality": ("sigma_b2",)}, params=params,
                    phases=list(PHASES), var_attrs={"c_depth": {"long_name": f"correlation c at layer {self.depth}"},
                                                    "gamma_depth": {"long_name": f"gamma at layer {self.depth}"}})

    def counts(self) -> dict:
        """Number of grid points per phase."""
        return {p: int(np.count_nonzero(self.codes == i)) for i, p in enumerate(PHASES)}


def _axis(name, v):
    arr = check.real("phase_diagram", name, v, lo=0)
    if arr.ndim > 1 or arr.size == 0:
        check.fail("phase_diagram", name, "a non-empty 1-D array of values >= 0", v)
    return np.atleast_1d(arr).astype(float)


def neutrality_drawn(K, sb_axis, sw_max):
    """The neutrality line at each sigma_b2 of the axis where it is drawn: sigma_w2 <= sw_max (NaN beyond, at
    sigma_b2 = 0 and where there is none). Bounding it keeps its bracket at the diagram's q, not at the
    q of sigma_w2 = 50, which lies far above the shipped tables for bounded phi."""
    neut = np.full(sb_axis.shape, np.nan)
    pos = sb_axis > 0
    if pos.any() and sw_max > 0:
        neut[pos] = neutrality_line(K, sb_axis[pos], sw_max)[0]
    return neut


def _normed_diagram(K, opts, W, B, sb_axis, depth, tol):
    """Fields of a phase diagram under a normalisation: all points at once by :func:`symfield.theory.norm.normed_phases`,
    the edge of chaos per sigma_b2 (LayerNorm before phi: the ray sigma_w2 = sigma_b2/ratio), no
    neutrality line (NaN)."""
    qs, cs, gamma, slope = nm.normed_phases(K, opts, W.ravel(), B.ravel())
    codes = np.array([nm.phase_code(c, s, tol) for c, s in zip(cs, slope)])
    eoc = np.array([nm.eoc_sigma_w2(K, opts, float(b)) for b in sb_axis])
    c_d = g_d = None
    if depth is not None:
        r = propagate(K.act, W, B, depth, layers=[depth], norm=opts.kind, norm_at=opts.at, batch=opts.batch)
        c_d, g_d = r.c[0], r.gamma[0]
    return codes, qs, cs, gamma, slope, eoc, np.full(sb_axis.shape, np.nan), c_d, g_d


def phase_diagram(act: str | Activation, sigma_w2: ArrayLike, sigma_b2: ArrayLike, depth: int | None = None,
                  eoc_tol: float = 1e-6, norm: str | None = None, norm_at: str = "before",
                  batch: int | None = None, ntk: bool = False, m: int = 10) -> PhaseDiagram:
    """Classify every point of the grid sigma_w2 x sigma_b2 (1-D axes) into the five phases.

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation` (pools included).
    sigma_w2, sigma_b2 : array_like
        1-D axes of weight and bias variances (>= 0); the grid is their outer product.
    depth : int, optional
        Also record c and gamma at this layer (``c_depth``, ``gamma_depth``).
    eoc_tol : float
        Edge-of-chaos band abs(chi1 - 1) <= eoc_tol (as in :func:`phase`).
    norm, norm_at, batch : optional
        Normalisation (docs/theory.md section 12), as in :func:`phase`; the ``eoc`` line is then the
        LayerNorm ray or curve (NaN under BatchNorm) and ``neutrality`` is NaN.
    ntk : bool
        Also the NTK depth scale per cell (``depth_scale``: xi_1 ordered, xi* chaotic, inf on the edge; the
        trainable depth is proportional to it, Xiao et al. 2020), ``chi_c_star`` and, with ``depth``, the NTK
        condition number ``kappa`` = 1 + m gamma_Theta on m equicorrelated inputs at that layer.
    m : int
        Number of inputs for ``kappa`` (>= 2).

    Returns
    -------
    PhaseDiagram
        ``codes`` into PHASES (``labels`` gives names), q*, c*, gamma*, slope on the grid, and the
        ``eoc`` and ``neutrality`` lines over sigma_b2.

    Examples
    --------
    >>> sf.phase_diagram("tanh", [1.5, 2.5], [0.05]).labels.ravel().tolist()
    ['ordered-deep-prejudice', 'neutrality']
    """
    K = kernel(act)
    sw_axis, sb_axis = _axis("sigma_w2", sigma_w2), _axis("sigma_b2", sigma_b2)
    tol = float(check.real("phase_diagram", "eoc_tol", eoc_tol, lo=0))
    if depth is not None:
        depth = check.integer("phase_diagram", "depth", depth, lo=1)
    W, B = np.meshgrid(sw_axis, sb_axis, indexing="ij")
    shape = W.shape
    opts = nm.options("phase_diagram", norm, norm_at, batch)
    if opts is not None and ntk:
        check.fail("phase_diagram", "ntk", "False when norm is set (the NTK under normalisation is not derived)", ntk)
    if opts is not None:
        codes, qs, cs, gamma, slope, eoc, neut, c_d, g_d = _normed_diagram(K, opts, W, B, sb_axis, depth, tol)
        return PhaseDiagram(K.act.name, sw_axis, sb_axis, codes.reshape(shape), qs.reshape(shape),
                            cs.reshape(shape), gamma.reshape(shape), slope.reshape(shape), eoc, neut,
                            tol, depth, c_d, g_d, np.ones(sb_axis.shape, bool), opts.label)
    codes, qs, cs, gamma, slope = phase_fields(K, W.ravel(), B.ravel(), tol)
    eoc, qe = eoc_line(K, sb_axis)      # NaN where there is no EOC (e.g. x erf(x) at sigma_b2 = 0)
    stable = np.ones(sb_axis.shape, bool)
    fin = np.nonzero((qe > 0) & (qe < np.inf))[0]
    if fin.size:        # sigma_w2 V'(q*) <= 1: the EOC's q* attracts (q_slope)
        stable[fin] = q_slope(K, eoc[fin], qe[fin]) <= 1
    neut = neutrality_drawn(K, sb_axis, float(sw_axis.max()))
    c_d = g_d = None
    if depth is not None:
        r = propagate(K.act, W, B, depth, layers=[depth])
        c_d, g_d = r.c[0], r.gamma[0]
    extra = {}
    if ntk:
        m = check.integer("phase_diagram", "m", m, lo=2)
        chi_c, xi = depth_scale_fields(K, W.ravel(), qs, cs, slope, tol)
        extra = dict(depth_scale=xi.reshape(shape), chi_c_star=chi_c.reshape(shape), m=m)
        if depth is not None:
            r = propagate(K.act, W, B, depth, layers=[depth], ntk=True)
            extra["kappa"] = 1 + m * r.gamma_theta[0]
    return PhaseDiagram(K.act.name, sw_axis, sb_axis, codes.reshape(shape), qs.reshape(shape),
                        cs.reshape(shape), gamma.reshape(shape), slope.reshape(shape), eoc, neut,
                        tol, depth, c_d, g_d, stable, **extra)
