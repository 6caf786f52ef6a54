"""Diagnosis of recorded pre-activations against the mean-field theory (docs/theory.md sections 9 and 10):
the per-layer q, c and gamma of a real network inside the finite-width bands of the theory, with a
family-wise band width and the recording precision's floor.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np

from symfield.core import validate as check
from symfield.core.dataset import ToXarray, flags
from symfield.core.errors import InvalidValue, Unsupported
from symfield.init.gains import as_activation
from symfield.simulate import finite_data_gamma, simulate
from symfield.theory import norm as nm
from symfield.theory.finite_width import finite_width
from symfield.theory.gram import gram_fluctuations
from symfield.theory.propagate import propagate

DIAGNOSIS_STATUS = {0: "inside the band", 1: "outside the band", 2: "non-finite measurement",
                    3: "not compared (no band)", 4: "c and gamma beyond the recording precision (e.g. float32)"}
DIAGNOSIS_STATUS_NAMES = ("inside_band", "outside_band", "non_finite_measurement", "not_compared",
                          "beyond_recording_precision")
STATS = ("q", "c", "gamma")
FAMILY_ALPHA = 0.05     # z=None: P(any band misses | the theory holds) <= 5 % (Bonferroni over the compared bands)
RESOLUTION = 1e3        # 1 - c below RESOLUTION eps^2 is rounding noise of the recording's float type,
RESOLUTION_C = 100      # and below RESOLUTION_C eps64 that of c = Q_ab/sqrt(Q_aa Q_bb) computed in float64


def precision_floor(eps):
    """Smallest 1 - c a recording in a float type of machine epsilon ``eps`` resolves:
    max(RESOLUTION eps^2, RESOLUTION_C eps64); 1.42e-11 for float32, 2.22e-14 for float64.

    Inputs whose pre-activations differ by a relative delta have 1 - c ~ delta^2/2; a float type stores
    each entry to a relative eps/2, so 1 - c below ~eps^2 is rounding (measured gamma ~ 1/eps^2 ~ 1e14 in
    float32 however ordered the network), and c itself, a ratio computed in float64, is exact to ~eps64."""
    return np.maximum(RESOLUTION * np.asarray(eps, float) ** 2, RESOLUTION_C * np.finfo(float).eps)


def family_z(m: int, alpha: float = FAMILY_ALPHA) -> float:
    """Half-width in sd of m two-sided normal bands that together miss with probability <= alpha (Bonferroni):
    z = Phi^{-1}(1 - alpha/(2m)); 1.96 for m = 1, 2.865 for m = 12, 3.19 for m = 72.

    One 2-sd band covers ~95 %, but 12 of them all cover one network only ~91 % of the time: over 1000
    seeded torch relu networks (width 256, depth 4, 4 inputs; docs/scripts/diagnose_coverage.py) the q bands
    of :func:`diagnose` covered 95.4-97.5 %, the c and gamma bands 99.7-100 % (their sd is one pair's, an
    upper bound for the mean over pairs); all 12 at z = 2: 90.8 % of networks, at family_z(12): 99.5 %.

    Examples
    --------
    >>> round(family_z(12), 3)
    2.865
    """
    from statistics import NormalDist
    m = max(int(m), 1)
    return NormalDist().inv_cdf(1 - alpha / (2 * m))


def _layer_eps(h, precision):
    """Machine epsilon of one recorded layer: ``precision`` when given, else its float dtype's (torch dtypes by
    name; bfloat16 2^-7), float64's for anything else."""
    d = precision if precision is not None else getattr(h, "dtype", None)
    name = str(d).replace("torch.", "")
    if name == "bfloat16":
        return 2.0 ** -7
    try:
        dt = np.dtype(name) if d is not None else np.dtype(float)
    except TypeError:
        dt = None
    if dt is None or not np.issubdtype(dt, np.floating):
        if precision is not None:
            raise InvalidValue(f"The 'precision' parameter of init.diagnose must be a float dtype (e.g. 'float32'). "
                               f"Got {precision!r} instead.")
        dt = np.dtype(float)
    return float(np.finfo(dt).eps)


@dataclass(frozen=True)
class Diagnosis(ToXarray):
    """Measured per-layer statistics against the mean-field theory; arrays of shape (depth,).

    ``q``, ``c``, ``gamma``: measured (q = mean_a ``|h_a|^2/n``; c = mean over pairs a < b of
    Q_ab/sqrt(Q_aa Q_bb), Q = H H^T/n; gamma = Vtilde/V, the estimator of ``sf.simulate``).
    ``*_theory``: infinite width (``sf.propagate``; gamma by ``sf.finite_data_gamma`` at P inputs).
    ``*_mean``, ``*_sd``: the width-n mean and standard deviation (``sf.finite_width`` for one input,
    ``sf.gram_fluctuations`` for several; NaN where not available). ``*_flag``: outside mean +- z sd, or
    not finite (c and gamma need two inputs). ``status`` per layer (DIAGNOSIS_STATUS), ``reasons`` in words;
    ``ok`` is False when a layer is flagged, None when nothing was compared (no band), else True.
    ``eps``: machine epsilon of each recorded layer; where the measured 1 - c is below :func:`precision_floor`
    the inputs' pre-activations agree to rounding (float32 saturation of an ordered network): c and gamma
    are not compared there (status 4), instead of a false alarm against a band the recording cannot resolve.
    ``to_xarray()``: every array over ``layer``, ``status`` with CF flags.
    """
    layers: np.ndarray
    q: np.ndarray
    c: np.ndarray
    gamma: np.ndarray
    q_theory: np.ndarray
    c_theory: np.ndarray
    gamma_theory: np.ndarray
    q_mean: np.ndarray
    q_sd: np.ndarray
    c_mean: np.ndarray
    c_sd: np.ndarray
    gamma_mean: np.ndarray
    gamma_sd: np.ndarray
    z: float = 2.0
    params: dict = field(default_factory=dict)
    note: str = ""
    eps: np.ndarray | None = None
    STATUS = DIAGNOSIS_STATUS

    def _applies(self, name: str) -> bool:
        return name == "q" or self.params.get("n_inputs", 2) > 1

    @property
    def beyond_precision(self) -> np.ndarray:
        """Per layer: 1 - c (measured) < :func:`precision_floor`, the rounding floor of the recording."""
        if not self._applies("c"):
            return np.zeros(len(self.layers), bool)
        eps = np.full(len(self.layers), np.finfo(float).eps) if self.eps is None else np.asarray(self.eps, float)
        with np.errstate(invalid="ignore"):
            return np.isfinite(self.q) & np.isfinite(self.c) & (1 - self.c < precision_floor(eps))

    def _skip(self, name):
        return np.zeros(len(self.layers), bool) if name == "q" else self.beyond_precision

    def nonfinite(self, name: str) -> np.ndarray:
        """Per layer: the measured statistic ``name`` is NaN or infinite (where it applies and is resolvable)."""
        if not self._applies(name):
            return np.zeros(len(self.layers), bool)
        return ~np.isfinite(getattr(self, name)) & ~self._skip(name)

    def compared(self, name: str) -> np.ndarray:
        """Per layer: a finite band exists for ``name`` and the recording resolves it."""
        band = np.isfinite(getattr(self, f"{name}_mean")) & np.isfinite(getattr(self, f"{name}_sd"))
        return band & ~self._skip(name) if self._applies(name) else np.zeros(len(self.layers), bool)

    def outside(self, name: str) -> np.ndarray:
        """Per layer: the finite measurement lies outside mean +- z sd."""
        x, mean, sd = (getattr(self, f"{name}{s}") for s in ("", "_mean", "_sd"))
        with np.errstate(invalid="ignore"):
            return self.compared(name) & np.isfinite(x) & (np.abs(x - mean) > self.z * sd)

    def _flag(self, name):
        return self.outside(name) | self.nonfinite(name)

    @property
    def q_flag(self):
        return self._flag("q")

    @property
    def c_flag(self):
        return self._flag("c")

    @property
    def gamma_flag(self):
        return self._flag("gamma")

    @property
    def flags(self):
        """Per layer: True where q, c or gamma lies outside its band or is not finite."""
        return self.q_flag | self.c_flag | self.gamma_flag

    @property
    def status(self) -> np.ndarray:
        """Per layer (DIAGNOSIS_STATUS): 2 a non-finite measurement, else 1 outside a band, else 4 when c and
        gamma are beyond the recording precision, else 3 when no statistic had a band, else 0."""
        bad = np.any([self.nonfinite(n) for n in STATS], axis=0)
        out = np.any([self.outside(n) for n in STATS], axis=0)
        seen = np.any([self.compared(n) for n in STATS], axis=0)
        code = np.where(bad, 2, np.where(out, 1, np.where(self.beyond_precision, 4, np.where(seen, 0, 3))))
        return code.astype(np.int8)

    @property
    def reasons(self) -> list:
        """Per layer, why it is flagged or not compared ('' when inside every band)."""
        rows, status = [], self.status

        def band(n, i):
            m, s = getattr(self, n + "_mean")[i], self.z * getattr(self, n + "_sd")[i]
            return f"[{m - s:.6g}, {m + s:.6g}]"

        for i in range(len(self.layers)):
            why = [f"{n} = {getattr(self, n)[i]:g} is not finite" for n in STATS if self.nonfinite(n)[i]]
            why += [f"{n} = {getattr(self, n)[i]:.6g} outside {band(n, i)}" for n in STATS if self.outside(n)[i]]
            if not why and status[i] == 3:
                why = ["not compared: no finite-width band"]
            if self.beyond_precision[i]:
                why.append(self._precision_reason(i))
            rows.append("; ".join(why))
        return rows

    def _precision_reason(self, i):
        eps = float(self.eps[i]) if self.eps is not None else float(np.finfo(float).eps)
        kind = {float(np.finfo(t).eps): t.__name__ for t in (np.float16, np.float32, np.float64)}.get(eps, "bfloat16"
                                                                                                      if eps == 2.0 ** -7 else f"eps {eps:.3g}")
        return (f"{kind} saturation: measured 1 - c = {1 - self.c[i]:.3g} < {float(precision_floor(eps)):.3g} "
                f"(precision_floor), the inputs agree to rounding, so c and gamma (= {self.gamma[i]:.3g}) "
                f"are not measurable here (theory 1 - c = {1 - self.c_theory[i]:.3g}); q is still compared")

    @property
    def ok(self) -> bool | None:
        """False when a layer is flagged (outside a band or non-finite), None when no layer was compared with
        a band (e.g. bands=False), else True."""
        if self.flags.any():
            return False
        return None if (self.status == 3).all() else True

    def table(self) -> str:
        """A per-layer table: measured, infinite-width theory, width-n band, and a flag column."""
        p = self.params
        head = (f"diagnose: {p['act']}, sigma_w2={p['sigma_w2']:g}, sigma_b2={p['sigma_b2']:g}, width={p['width']}, "
                f"{p['n_inputs']} inputs, q0={p['q0']:.6g}, qab0={p['qab0']:.6g}; band = width-{p['width']} "
                f"mean +- {self.z:.4g} sd ({p.get('z_rule', 'given')})")

        def cell(x, t, m, s, f):
            band = "" if not np.isfinite(s) else f"[{m - self.z * s:.4g}, {m + self.z * s:.4g}]"
            return f"{x:9.4g} {t:9.4g} {band:>21}{'*' if f else ' '}"

        cols = f"{'layer':>5} | {'q':>9} {'theory':>9} {'band':>21}  | {'c':>9} {'theory':>9} {'band':>21}  |" \
               f" {'gamma':>9} {'theory':>9} {'band':>21}  | flag"
        rows = [head, cols, "-" * len(cols)]
        word = {0: "ok", 1: "OUTSIDE", 2: "NON-FINITE", 3: "not compared", 4: "ok (c, gamma beyond precision)"}
        marks, status = {n: self._flag(n) for n in STATS}, self.status
        for i, l in enumerate(self.layers):
            rows.append(f"{l:>5} | " + " | ".join(cell(getattr(self, n)[i], getattr(self, n + "_theory")[i],
                                                       getattr(self, n + "_mean")[i], getattr(self, n + "_sd")[i],
                                                       marks[n][i]) for n in STATS)
                        + " | " + word[int(status[i])])
        counts = [int((status == k).sum()) for k in (1, 2, 3, 4)]
        verdict = {True: "ok", False: "NOT ok", None: "inconclusive (nothing compared)"}[self.ok]
        sat = (f" {counts[3]} with c and gamma beyond the recording precision (float saturation, see reasons)."
               if counts[3] else "")
        rows.append(f"{counts[0]} of {len(self.layers)} layers outside the band, {counts[1]} non-finite, "
                    f"{counts[2]} not compared (* marks the statistic): {verdict}." + sat
                    + (f" {self.note}" if self.note else ""))
        return "\n".join(rows)

    __str__ = table

    def dataset_parts(self) -> dict:
        """The arrays, coordinates, dims and parameters of :meth:`to_xarray` (for symfield.io.output.save)."""
        data = {f"{n}{s}": np.asarray(getattr(self, f"{n}{s}"), dtype=float) for n in STATS
                for s in ("", "_theory", "_mean", "_sd")}
        data.update({f"{n}_flag": self._flag(n).astype(np.int8) for n in STATS}, status=self.status)
        if self.eps is not None:
            data["eps"] = np.asarray(self.eps, float)
        va = {"status": {"long_name": "layer status (see flag_meanings)", **flags(DIAGNOSIS_STATUS_NAMES)}}
        for n, what in (("q", "variance q"), ("c", "correlation c"), ("gamma", "gamma")):
            va[n] = {"long_name": f"measured {what}", "units": "1"}
            va[f"{n}_theory"] = {"long_name": f"infinite-width theory of {what}", "units": "1"}
            va[f"{n}_mean"] = {"long_name": f"width-n mean of {what} (band centre)", "units": "1"}
            va[f"{n}_sd"] = {"long_name": f"width-n standard deviation of {what} (band half-width / z)", "units": "1"}
            va[f"{n}_flag"] = {"long_name": f"{what} outside its band or not finite", "units": "1",
                               **flags(("not_flagged", "flagged"))}
        params = {**{k: v for k, v in self.params.items() if v is not None}, "z": self.z, "note": self.note}
        va["eps"] = {"long_name": "machine epsilon of the recorded layer's float type", "units": "1"}
        return dict(data=data, coords={"layer": np.asarray(self.layers)}, params=params, var_attrs=va)


def _measure(H):
    """(q, c, gamma) of one layer's pre-activations H (P, n)."""
    P, n = H.shape
    with np.errstate(all="ignore"):          # a non-finite layer gives non-finite statistics (flagged)
        Q = H @ H.T / n
        q = float(np.trace(Q) / P)
        if P < 2:
            return q, math.nan, math.nan, math.nan
        i, j = np.triu_indices(P, 1)
        d = np.diag(Q)
        c = float(np.mean(Q[i, j] / np.sqrt(d[i] * d[j])))
        gamma = float(H.mean(axis=0).var() / H.var(axis=0).mean())
        return q, c, gamma, float(Q[i, j].mean())


def _bands(A, sw, sb, depth, q0, qab0, P, n, residual, bands):
    """Width-n means and sds of (q, c, gamma); NaN arrays (and a note) where the theory is not available."""
    nan = np.full(depth, np.nan)
    if not bands:
        return (nan,) * 6, "bands=False: no finite-width bands."
    try:
        if P == 1 and residual is None:
            fw = finite_width(A, sw, sb, depth, q0)
            return (fw.G(n), np.sqrt((2 * fw.K**2 + fw.V) / n), nan, nan, nan, nan), ""
        g = gram_fluctuations(A, sw, sb, depth, q0=(q0, q0, qab0), residual=residual)
    except (Unsupported, ArithmeticError, ValueError) as exc:
        return (nan,) * 6, f"no finite-width bands: {exc}"
    m, cov = g.mean(n), g.gram_cov
    q_mean = m[:, 0]
    q_sd = np.sqrt((cov[:, 0, 0] + (P - 1) * cov[:, 0, 1]) / (P * n))    # mean of P exchangeable q_aa
    if P == 1:
        return (q_mean, q_sd, nan, nan, nan, nan), ""
    c_mean, c_sd = g.c_mean(n), np.sqrt(g.c_var(n))                      # one pair: bounds the pair mean's sd
    gamma_mean = finite_data_gamma(q_mean, m[:, 2], P)[2]
    gamma_sd = P / ((P - 1) * (1 - c_mean) ** 2) * c_sd                 # delta method, d gamma/dc
    return (q_mean, q_sd, c_mean, c_sd, gamma_mean, gamma_sd), ""


MC_NETWORKS = 256     # seeded networks of the Monte Carlo bands under a normalisation


def _mc_bands(A, sw, sb, depth, q0, qab0, P, n, opts, bands, seed=0):
    """Width-n means and sds of (q, c, gamma) under a normalisation: no finite-width expansion is derived with
    LayerNorm or BatchNorm, so the bands come from MC_NETWORKS seeded networks of the same architecture
    (``sf.simulate`` with real norm layers) on P inputs of Gram matrix (q0 - qab0) I + qab0 1 1^T. The band sd
    includes the Monte Carlo error of its centre, sd sqrt(1 + 1/M)."""
    nan = np.full(depth, np.nan)
    if not bands:
        return (nan,) * 6, "bands=False: no finite-width bands."
    if qab0 * (P - 1) <= -q0 or qab0 >= q0:
        return (nan,) * 6, f"no finite-width bands: the inputs' Gram (q0 = {q0:.6g}, qab0 = {qab0:.6g}) is singular"
    G0 = (q0 - qab0) * np.eye(P) + qab0
    X = np.linalg.cholesky(G0) * math.sqrt(P)        # rows with X X^T / P = G0 (input dimension P)
    sim = simulate(A, n, depth, sw, sb, n_inputs=P, n_networks=MC_NETWORKS, seed=seed, inputs=X, progress=False,
                   norm=opts.kind, norm_at=opts.at, batch=opts.batch)
    k = math.sqrt(1 + 1 / MC_NETWORKS)
    net = sim.networks
    out = [net.q.mean(0), net.q.std(0, ddof=1) * k]
    if P > 1:
        g = net.Vtilde / net.V
        out += [net.c.mean(0), net.c.std(0, ddof=1) * k, g.mean(0), g.std(0, ddof=1) * k]
    else:
        out += [nan] * 4
    return tuple(out), (f"{opts.label}: bands from {MC_NETWORKS} seeded networks of width {n} with real "
                        f"normalisation layers (no finite-width expansion under a norm)")


def _recorded(activations, precision):
    """(layers as float64 (P, n) arrays, machine epsilon per layer, P) of diagnose's ``activations``."""
    F = "init.diagnose"
    if isinstance(activations, np.ndarray) and activations.ndim == 2:
        activations = [activations]
    eps = np.array([_layer_eps(h, precision) for h in activations])
    Hs = [np.asarray(h, dtype=float) for h in activations]
    if not Hs:
        raise InvalidValue(f"The 'activations' parameter of {F} must hold at least one layer. Got [] instead.")
    P = Hs[0].shape[0] if Hs[0].ndim else 0
    if any(h.ndim < 2 or h.shape[0] != P for h in Hs) or P < 1:
        raise InvalidValue(f"The 'activations' parameter of {F} must be arrays of shape (n_inputs, width) with the "
                           f"same n_inputs. Got shapes {[h.shape for h in Hs]} instead.")
    return [h.reshape(P, -1) for h in Hs], eps, P


def _inputs(meas, q0, qab0, sw, sb, P):
    """(q0, qab0) of diagnose: given, or from layer 1's measured q and mean overlap, (m - sigma_b2)/sigma_w2."""
    F = "init.diagnose"
    if (q0 is None or (qab0 is None and P > 1)) and not np.all(np.isfinite(meas[0, [0, 3] if P > 1 else [0]])):
        raise InvalidValue(f"The 'activations' parameter of {F} must be finite in layer 1 when q0 and qab0 come from "
                           f"it. Got q = {meas[0, 0]:g}, mean overlap = {meas[0, 3]:g} there instead; pass q0 and qab0.")
    q0 = (meas[0, 0] - sb) / sw if q0 is None else float(check.real(F, "q0", q0, lo=0, lo_open=True))
    if qab0 is None:
        qab0 = (meas[0, 3] - sb) / sw if P > 1 else 0.0
    qab0 = float(check.real(F, "qab0", qab0))
    if not q0 > 0 or abs(qab0) > q0:
        raise InvalidValue(f"{F}: layer 1 implies q0 = {q0:.6g}, qab0 = {qab0:.6g} (not a covariance); "
                           "pass q0 and qab0, or check sigma_w2 and sigma_b2.")
    return q0, qab0


def _theory_gamma(qab, s, P):
    """finite_data_gamma's E[Vtilde]/E[V] = (qab + s/P)/(s (1 - 1/P)) with s = q - qab = d/2 from the propagated
    distance d, which keeps its relative digits as c -> 1 (q - qab in float64 loses them: 5e-5 relative at
    1 - c = 3e-12)."""
    return (qab + s / P) / (s * (1 - 1 / P))


def _norm(norm, norm_at, batch, P, residual):
    """diagnose's validated normalisation (None without one); BatchNorm's batch is the P recorded inputs."""
    F = "init.diagnose"
    opts = nm.options(F, norm, norm_at, batch)
    if opts is None:
        return None
    if opts.batch is not None and opts.batch != P:
        check.fail(F, "batch", f"None or n_inputs = {P} (BatchNorm normalises over the recorded inputs)", batch)
    if residual is not None:
        check.fail(F, "residual", "None with norm (normalised residual blocks are not supported)", residual)
    return nm.Norm("batch", opts.at, P) if opts.kind == "batch" else opts


def diagnose(activations, act, sigma_w2, sigma_b2, width=None, q0=None, qab0=None, residual=None,
             z=None, bands=True, precision=None, norm=None, norm_at="before", batch=None) -> Diagnosis:
    """Compare pre-activations recorded from any framework with the mean-field theory, layer by layer.

    Parameters
    ----------
    activations : sequence of array-likes
        One per layer, shape (n_inputs, width) (trailing axes are flattened), the pre-activations
        h = W x + b of consecutive layers; ``activations[0]`` is layer 1, the linear layer of
        ``sf.propagate``. Same inputs in every layer; the theory assumes inputs of (about) equal norm
        and pairwise correlation.
    act, sigma_w2, sigma_b2 : the activation and variances the network was initialised with.
    width : int, optional
        n of the bands; default the most common width of the recorded layers.
    q0, qab0 : float, optional
        Input norm ``|x|^2/n0`` and mean input overlap x_a.x_b/n0; by default from layer 1's measurement,
        q0 = (q^(1) - sigma_b2)/sigma_w2 (so layer 1 agrees by construction).
    residual : float, optional
        alpha of residual blocks, passed to the theory.
    z : float, optional
        Band half-width in standard deviations. Default: the family-wise z of :func:`family_z` over the m
        compared bands (a correct theory flags a network with probability <= 5 %; z = 2.865 for m = 12;
        measured coverage in :func:`family_z`).
    bands : bool
        False skips the finite-width theory (``sf.gram_fluctuations``, the slow part for tanh).
    precision : dtype, optional
        Float type the network ran in; default each recorded array's dtype (numpy or torch). Sets the
        rounding floor of 1 - c (:func:`precision_floor`) below which c and gamma are reported as saturated
        (status 4) instead of compared.
    norm, norm_at, batch : optional
        The network's normalisation (docs/theory.md section 12): None, "layer" or "batch", placed "before" or
        "after" phi in layers >= 2; BatchNorm's batch is the recorded inputs (batch None or n_inputs). The
        theory is ``sf.propagate(..., norm=...)``; the bands come from seeded networks with the same norm
        layers (MC_NETWORKS of them), since no finite-width expansion is derived under a norm.

    Returns
    -------
    Diagnosis
        Arrays per layer, ``flags``, ``ok`` and ``table()`` (also ``str()``).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> X = rng.standard_normal((4, 256))
    >>> hs, h = [], X
    >>> for l in range(3):
    ...     h = (np.maximum(h, 0) if l else h) @ rng.standard_normal((256, 256)) * std("relu", 256)
    ...     hs.append(h)
    >>> diagnose(hs, "relu", 2.0, 0.0).ok
    True
    """
    F = "init.diagnose"
    sw = float(check.real(F, "sigma_w2", sigma_w2, lo=0, lo_open=True))
    sb = float(check.real(F, "sigma_b2", sigma_b2, lo=0))
    z = None if z is None else float(check.real(F, "z", z, lo=0, lo_open=True))
    A = as_activation(act)
    Hs, eps, P = _recorded(activations, precision)
    n = Counter(h.shape[1] for h in Hs).most_common(1)[0][0] if width is None else width
    n = check.integer(F, "width", n, lo=1)
    meas = np.array([_measure(h) for h in Hs])
    depth = len(Hs)
    q0, qab0 = _inputs(meas, q0, qab0, sw, sb, P)
    opts = _norm(norm, norm_at, batch, P, residual)
    p = propagate(A, sw, sb, depth, q0=q0, qab0=qab0, residual=residual,
                  **({} if opts is None else dict(norm=opts.kind, norm_at=opts.at, batch=opts.batch)))
    qt, qabt = np.asarray(p.q, float).reshape(depth), np.asarray(p.qab, float).reshape(depth)
    with np.errstate(invalid="ignore", divide="ignore"):
        ct = qabt / qt if P > 1 else np.full(depth, np.nan)
        gt = _theory_gamma(qabt, np.asarray(p.d, float).reshape(depth) / 2, P) if P > 1 else np.full(depth, np.nan)
        (qm, qsd, cm, csd, gm, gsd), note = (_bands(A, sw, sb, depth, q0, qab0, P, n, residual, bands) if opts is None
                                             else _mc_bands(A, sw, sb, depth, q0, qab0, P, n, opts, bands))
    d = Diagnosis(layers=np.arange(1, depth + 1), q=meas[:, 0], c=meas[:, 1], gamma=meas[:, 2],
                  q_theory=qt, c_theory=ct, gamma_theory=gt, q_mean=qm, q_sd=qsd, c_mean=cm, c_sd=csd,
                  gamma_mean=gm, gamma_sd=gsd, z=2.0 if z is None else z, note=note, eps=eps,
                  params=dict(act=A.name, sigma_w2=sw, sigma_b2=sb, width=n, n_inputs=P, q0=q0, qab0=qab0,
                              residual=residual, z_rule="given" if z is not None else "family-wise 5 %",
                              **({} if opts is None else dict(norm=opts.kind, norm_at=opts.at, batch=opts.batch))))
    if z is None:
        d = replace(d, z=family_z(sum(int(d.compared(s).sum()) for s in STATS)))
    return d
