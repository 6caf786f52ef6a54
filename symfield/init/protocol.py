"""The initialisation protocol (docs/theory.md section 10.1): the per-layer statistics a practitioner records on
one fixed batch before any update, over one or several seeds, each against its mean-field prediction and, where
one can be derived, a finite-width band.

Measured per layer l (pre-activations h, activations phi(h), gradients g = dL/dh from one backward pass):

- ``q`` = mean of h^2 over units and batch, against q^(l) of ``sf.propagate`` (band: ``sf.finite_width``);
- ``mean`` of h, against 0 (band: the units of a layer are i.i.d. given the previous layer);
- ``zero_fraction`` P(h <= 0) for activations that vanish on x <= 0 (relu family), against 1/2;
- ``saturation`` P(h < -t_minus or h > t_plus) for saturating phi (tanh, sigmoid, erf), against erfc;
- ``grad_ratio`` |g^(l)|^2 / |g^(l+1)|^2 (summed over batch and units), against chi1 at q^(l);
- ``zero_grad``, the fraction of exactly-zero gradients, against P(phi'(h) = 0) (1/2 or 0);

plus descriptive statistics without a band (min, max, RMS of h and phi(h), RMS of g) and the non-finite counts.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from symfield.core import validate as check
from symfield.core.dataset import ToXarray, flags
from symfield.core.errors import InvalidValue, Unsupported
from symfield.init.diagnosis import family_z
from symfield.init.gains import as_activation
from symfield.numeric.evaluate import NUMPY_MODULES, vectorised
from symfield.symbolic.activation import Activation
from symfield.symbolic.activation import x as X
from symfield.theory.finite_width import finite_width
from symfield.theory.maps import V as v_map
from symfield.theory.maps import chi1, map_value
from symfield.theory.propagate import propagate

PROTOCOL_STATUS = {0: "inside every band", 1: "outside a band", 2: "non-finite values recorded",
                   3: "not compared (no band)"}
PROTOCOL_STATUS_NAMES = ("inside_band", "outside_band", "non_finite_values", "not_compared")
PROTOCOL_STATS = ("q", "mean", "zero_fraction", "saturation", "grad_ratio", "zero_grad")
DESCRIBE = ("h_min", "h_max", "h_rms", "act_mean", "act_rms", "act_min", "act_max", "grad_rms")
SATURATION_RATIO = 0.1    # default saturation: |phi'(h)| below 10 % of |phi'(0)|
SATURATION_REACH = 50.0   # phi is "saturating" when |phi'(+-50)| < 1e-3 |phi'(0)| on both sides
_F = "init.protocol"
_LONG = {"q": "mean of h^2 over units and batch", "mean": "mean of h over units and batch",
         "zero_fraction": "fraction of pre-activations h <= 0 (relu units at zero)",
         "saturation": "fraction of saturated units (|phi'(h)| below the ratio of |phi'(0)|)",
         "grad_ratio": "ratio |dL/dh^(l)|^2 / |dL/dh^(l+1)|^2", "zero_grad": "fraction of exactly-zero dL/dh"}


HEALTH_GAIN = 100.0   # Protocol.health: gradients or signal beyond this factor from their reference layer

@dataclass(frozen=True)
class Protocol(ToXarray):
    """The protocol's per-layer statistics, pooled over seeds (``measured[name]``, shape (depth,)), per seed
    (``per_seed[name]``, (seeds, depth)), the infinite-width ``theory``, and the finite-width band
    ``band_mean`` +- ``z`` ``band_sd`` (NaN where no band: not compared). ``p.q``, ``p.q_theory``,
    ``p.q_mean``, ``p.q_sd``, ``p.q_seeds`` are shorthands (any name of ``stats``).

    ``describe``: min, max, RMS of h and phi(h), RMS of g, pooled over seeds (``describe_theory`` holds
    sqrt(q^(l)), E phi and sqrt(E phi^2) at q^(l); no band). ``nonfinite_h``, ``nonfinite_grad``: counts of
    non-finite recorded values per layer (summed over seeds). ``status`` per layer (PROTOCOL_STATUS),
    ``reasons`` in words, ``ok``: False when a layer is flagged or non-finite, None when nothing was compared.
    """
    layers: np.ndarray
    measured: dict
    per_seed: dict
    theory: dict
    band_mean: dict
    band_sd: dict
    describe: dict
    describe_theory: dict
    nonfinite_h: np.ndarray
    nonfinite_grad: np.ndarray | None = None
    z: float = 2.0
    params: dict = field(default_factory=dict)
    notes: tuple = ()
    STATUS = PROTOCOL_STATUS

    def __getattr__(self, name):
        d = self.__dict__
        if name.startswith("_") or "measured" not in d:
            raise AttributeError(name)
        for suffix, where in (("_theory", "theory"), ("_mean", "band_mean"), ("_sd", "band_sd"),
                              ("_seeds", "per_seed"), ("", "measured")):
            if name.endswith(suffix) and name[: len(name) - len(suffix)] in d[where]:
                return d[where][name[: len(name) - len(suffix)]]
        raise AttributeError(f"Protocol has no statistic {name!r}; it holds {self.stats}")

    @property
    def stats(self) -> tuple:
        """The statistics measured here (a subset of PROTOCOL_STATS, in that order)."""
        return tuple(n for n in PROTOCOL_STATS if n in self.measured)

    def compared(self, name: str) -> np.ndarray:
        """Per layer: ``name`` has a finite band (mean and sd)."""
        return np.isfinite(self.band_mean[name]) & np.isfinite(self.band_sd[name])

    def outside(self, name: str) -> np.ndarray:
        """Per layer: the measurement of ``name`` is compared and not within band_mean +- z band_sd
        (a non-finite measurement where a band exists counts as outside)."""
        x, m, s = self.measured[name], self.band_mean[name], self.band_sd[name]
        with np.errstate(invalid="ignore"):
            return self.compared(name) & ~(np.abs(x - m) <= self.z * s)

    @property
    def nonfinite(self) -> np.ndarray:
        """Per layer: some recorded pre-activation or gradient is NaN or infinite."""
        bad = self.nonfinite_h > 0
        return bad | (self.nonfinite_grad > 0) if self.nonfinite_grad is not None else bad

    @property
    def flags(self) -> np.ndarray:
        """Per layer: non-finite values, or a statistic outside its band."""
        return self.nonfinite | np.any([self.outside(n) for n in self.stats], axis=0)

    @property
    def status(self) -> np.ndarray:
        """Per layer (PROTOCOL_STATUS): 2 non-finite values, else 1 outside a band, else 3 when no statistic had
        a band, else 0."""
        out = np.any([self.outside(n) for n in self.stats], axis=0)
        seen = np.any([self.compared(n) for n in self.stats], axis=0)
        return np.where(self.nonfinite, 2, np.where(out, 1, np.where(seen, 0, 3))).astype(np.int8)

    @property
    def ok(self) -> bool | None:
        """False when a layer is flagged, None when no statistic of any layer was compared, else True."""
        if self.flags.any():
            return False
        return None if (self.status == 3).all() else True

    @property
    def reasons(self) -> list:
        """Per layer, what is off and why ('' when the layer is inside every band)."""
        rows = []
        for i in range(len(self.layers)):
            why = []
            if self.nonfinite_h[i]:
                why.append(f"{int(self.nonfinite_h[i])} non-finite pre-activations (overflow or NaN upstream)")
            if self.nonfinite_grad is not None and self.nonfinite_grad[i]:
                why.append(f"{int(self.nonfinite_grad[i])} non-finite gradients")
            why += [self._why(n, i) for n in self.stats if self.outside(n)[i]]
            if not why and not any(self.compared(n)[i] for n in self.stats):
                why.append("not compared: no band for any statistic of this layer")
            rows.append("; ".join(why))
        return rows

    def _why(self, n, i):
        x, t, m, s = (self.measured[n][i], self.theory[n][i], self.band_mean[n][i], self.band_sd[n][i])
        band = f"[{m - self.z * s:.4g}, {m + self.z * s:.4g}]"
        hint = {"q": "weight or bias variance (or the input norm) differs from sigma_w2, sigma_b2",
                "mean": "a non-zero mean of the biases or weights",
                "zero_fraction": "biased pre-activations (bias mean, or inputs not centred)",
                "saturation": "the variance q is off (too large: saturation; too small: linear regime)",
                "grad_ratio": "sigma_w2 of the next layer or phi' differ from the ones given",
                "zero_grad": "dead units, or phi' rounding to 0 in the recording precision"}[n]
        return f"{n} = {x:.4g} outside {band} (theory {t:.4g}, {abs(x - m) / s if s > 0 else math.inf:.3g} sd): {hint}"

    @property
    def health(self) -> list:
        """The initialisation's health, measured (whatever the theory says): one line per layer whose gradient RMS
        differs from the last layer's, or whose mean h^2 differs from layer 1's, by more than HEALTH_GAIN either way
        (vanishing or exploding gradients, a collapsing or exploding signal), with the per-layer factor behind it."""
        d, q, out = self.describe, self.measured["q"], []
        g = d.get("grad_rms")
        ratio = self.measured.get("grad_ratio")
        for i, l in enumerate(self.layers):
            why = []
            if g is not None and np.isfinite(g[i]) and np.isfinite(g[-1]) and g[-1] > 0:
                gain = g[i] / g[-1]
                if not 1 / HEALTH_GAIN <= gain <= HEALTH_GAIN:
                    r = ratio[i] if ratio is not None and np.isfinite(ratio[i]) else math.nan
                    why.append(f"gradient RMS {gain:.3g} x the last layer's: {'vanishing' if gain < 1 else 'exploding'} "
                               f"gradients (mean-square ratio per layer {r:.4g}; chi1 {'<' if gain < 1 else '>'} 1)")
            if np.isfinite(q[i]) and q[0] > 0 and not 1 / HEALTH_GAIN <= q[i] / q[0] <= HEALTH_GAIN:
                why.append(f"mean h^2 {q[i] / q[0]:.3g} x layer 1's: the signal {'collapses' if q[i] < q[0] else 'explodes'}")
            if why:
                out.append(f"layer {l}: " + "; ".join(why))
        return out

    def table(self) -> str:
        """Per layer: each statistic measured / theory / band, a status word; then one line per flagged layer
        saying what is off and why, and the descriptive statistics."""
        p, stats = self.params, self.stats
        head = (f"protocol: {p['act']}, sigma_w2={p['sigma_w2']:g}, sigma_b2={p['sigma_b2']:g}, {p['seeds']} seed(s) x "
                f"batch {p['batch']}, widths {p['widths']}, q0={p['q0']:.6g}; band = mean +- {self.z:.4g} sd "
                f"({p.get('z_rule', 'given')})")
        cols = f"{'layer':>5} | " + " | ".join(f"{n:>13} {'theory':>9} {'band':>19} " for n in stats) + " | status"
        rows, word = [head, cols, "-" * len(cols)], {0: "ok", 1: "OUTSIDE", 2: "NON-FINITE", 3: "not compared"}
        status, marks = self.status, {n: self.outside(n) for n in stats}
        for i, l in enumerate(self.layers):
            cells = []
            for n in stats:
                m, s = self.band_mean[n][i], self.band_sd[n][i]
                band = f"[{m - self.z * s:.4g}, {m + self.z * s:.4g}]" if np.isfinite(m) and np.isfinite(s) else ""
                cells.append(f"{self.measured[n][i]:13.5g} {self.theory[n][i]:9.4g} {band:>19}{'*' if marks[n][i] else ' '}")
            rows.append(f"{l:>5} | " + " | ".join(cells) + f" | {word[int(status[i])]}")
        rows += [f"layer {l}: {r}" for l, r, s in zip(self.layers, self.reasons, status) if s in (1, 2)]
        verdict = {True: "ok", False: "NOT ok", None: "inconclusive (nothing compared)"}[self.ok]
        rows.append(f"{int((status == 1).sum())} of {len(self.layers)} layers outside a band, "
                    f"{int((status == 2).sum())} non-finite, {int((status == 3).sum())} not compared: {verdict}.")
        health = self.health
        rows.append(f"initialisation health (measured, independent of the theory check): "
                    + (f"{len(health)} layer(s) flagged" if health else f"no layer beyond a factor {HEALTH_GAIN:g}"))
        rows += health + list(self.notes) + [self._describe_table()]
        return "\n".join(rows)

    def _describe_table(self):
        d, t = self.describe, self.describe_theory
        rows = [f"{'layer':>5} | {'h: min':>9} {'max':>9} {'rms':>9} {'(theory)':>9} | {'phi(h): mean':>12} "
                f"{'(theory)':>9} {'rms':>9} {'(theory)':>9} {'min':>9} {'max':>9} | {'grad rms':>9}"]
        for i, l in enumerate(self.layers):
            rows.append(f"{l:>5} | {d['h_min'][i]:9.4g} {d['h_max'][i]:9.4g} {d['h_rms'][i]:9.4g} {t['h_rms'][i]:9.4g}"
                        f" | {d['act_mean'][i]:12.4g} {t['act_mean'][i]:9.4g} {d['act_rms'][i]:9.4g} "
                        f"{t['act_rms'][i]:9.4g} {d['act_min'][i]:9.4g} {d['act_max'][i]:9.4g} | {d['grad_rms'][i]:9.4g}")
        return "\n".join(rows)

    __str__ = table

    def dataset_parts(self) -> dict:
        """The arrays, coordinates, dims and parameters of :meth:`to_xarray` (for symfield.io.output.save)."""
        data, dims, va = {}, {}, {"status": {"long_name": "layer status (see flag_meanings)",
                                             **flags(PROTOCOL_STATUS_NAMES)}}
        for n in self.stats:
            for suffix, src, what in (("", self.measured, "measured, pooled over seeds"),
                                      ("_theory", self.theory, "infinite-width theory"),
                                      ("_mean", self.band_mean, "band centre"),
                                      ("_sd", self.band_sd, "band standard deviation (half-width / z)")):
                data[n + suffix] = np.asarray(src[n], float)
                va[n + suffix] = {"long_name": f"{_LONG[n]}: {what}", "units": "1"}
            data[n + "_seeds"], dims[n + "_seeds"] = np.asarray(self.per_seed[n], float), ("seed", "layer")
            va[n + "_seeds"] = {"long_name": f"{_LONG[n]}, per seed", "units": "1"}
            data[n + "_flag"] = self.outside(n).astype(np.int8)
            va[n + "_flag"] = {"long_name": f"{n} outside its band", "units": "1", **flags(("not_flagged", "flagged"))}
        data.update({k: np.asarray(v, float) for k, v in self.describe.items()})
        data.update({f"{k}_theory": np.asarray(v, float) for k, v in self.describe_theory.items()})
        data.update(status=self.status, nonfinite_h=np.asarray(self.nonfinite_h, np.int64))
        if self.nonfinite_grad is not None:
            data["nonfinite_grad"] = np.asarray(self.nonfinite_grad, np.int64)
        dims.update({k: ("layer",) for k in data if k not in dims})
        params = {**{k: v for k, v in self.params.items() if v is not None}, "z": self.z, "note": " ".join(self.notes)}
        coords = {"layer": np.asarray(self.layers), "seed": np.arange(self.params.get("seeds", 1))}
        return dict(data=data, coords=coords, dims=dims, params=params, var_attrs=va)


# ---------------------------------------------------------------- inputs
def _as_layers(value, name):
    """One seed's recording: a list of float64 (batch, width) arrays (trailing axes flattened)."""
    if isinstance(value, np.ndarray) and value.ndim == 2:
        value = [value]
    if not isinstance(value, (list, tuple)) or not value:
        check.fail(_F, name, "a non-empty list of arrays (batch, width), one per layer (or a list of such lists, "
                   "one per seed)", value, TypeError if not isinstance(value, (list, tuple)) else ValueError)
    out = []
    for l, h in enumerate(value):
        if h is None:
            check.fail(_F, name, "an array for every layer (None: no backward pass reached that layer)",
                       f"None at layer {l + 1}")
        try:
            a = np.asarray(h, dtype=float)
        except (TypeError, ValueError):
            check.fail(_F, name, "arrays of real numbers", type(h).__name__, TypeError)
        if a.ndim < 2 or a.shape[0] < 1 or a.size == 0:
            check.fail(_F, name, "arrays of shape (batch, width, ...)", f"shape {a.shape} at layer {l + 1}")
        out.append(a.reshape(a.shape[0], -1))
    return out


def _recorded(value, name):
    """(seeds x layers of (batch, width) arrays), same shapes in every seed."""
    seeds = value if (isinstance(value, (list, tuple)) and value
                      and all(isinstance(s, (list, tuple)) for s in value)) else [value]
    runs = [_as_layers(s, name) for s in seeds]
    shapes = [[h.shape for h in r] for r in runs]
    if any(s != shapes[0] for s in shapes) or any(h[0] != shapes[0][0][0] for h in shapes[0]):
        check.fail(_F, name, "the same layers of the same shapes (batch, width) in every seed, one batch size",
                   f"shapes {shapes}")
    return runs


def _grads(grads, runs):
    if grads is None:
        return None
    g = _recorded(grads, "grads")
    if [[h.shape for h in r] for r in g] != [[h.shape for h in r] for r in runs]:
        check.fail(_F, "grads", "dL/dh of the recorded layers: the shapes of 'forward', seed by seed",
                   f"shapes {[[h.shape for h in r] for r in g]}")
    return g


# ---------------------------------------------------------------- the activation's shape
def _kind(A):
    """(phi, phi', relu family, saturating) of a single-node activation as numpy functions and flags."""
    import sympy as sp
    if A.pool is not None:
        raise Unsupported(f"init.protocol supports single-node activations; {A.name} is a {A.pool}-pool (record "
                          "and compare its pre-activations with init.diagnose instead)")
    phi, dphi = vectorised(A.expr, NUMPY_MODULES), vectorised(sp.diff(A.expr, X), NUMPY_MODULES)
    neg = phi(np.array([-1e-3, -0.5, -1.0, -2.0, -10.0]))
    relu_family = bool(np.all(neg == 0) and phi(np.array([1.0]))[0] != 0)
    d0 = abs(float(dphi(np.array([0.0]))[0]))
    far = np.abs(dphi(np.array([-SATURATION_REACH, SATURATION_REACH])))
    saturating = bool(d0 > 0 and np.all(far < 1e-3 * d0))
    return phi, dphi, relu_family, saturating


def _threshold(dphi, ratio, side):
    """The first t > 0 (scanned on a fine grid, then bisected) where |phi'(side t)| <= ratio |phi'(0)|."""
    d0 = abs(float(dphi(np.array([0.0]))[0]))
    grid = np.linspace(0, SATURATION_REACH, 50001)
    below = np.abs(dphi(side * grid)) <= ratio * d0
    k = int(np.argmax(below))
    lo, hi = grid[max(k - 1, 0)], grid[k]
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if abs(float(dphi(np.array([side * mid]))[0])) <= ratio * d0 else (mid, hi)
    return hi


def _thresholds(dphi, saturating, threshold, ratio):
    """(t_minus, t_plus) of the saturation fraction, or None when it is not measured."""
    if threshold is not None:
        t = check.real(_F, "threshold", threshold, lo=0, lo_open=True)
        t = np.broadcast_to(t, (2,)) if t.ndim == 0 else t
        if t.shape != (2,):
            check.fail(_F, "threshold", "a float t > 0 or a pair (t_minus, t_plus)", threshold)
        return float(t[0]), float(t[1])
    if not saturating:
        return None
    r = float(check.real(_F, "saturation_ratio", ratio, lo=0, lo_open=True, hi=1))
    return _threshold(dphi, r, -1.0), _threshold(dphi, r, 1.0)


def saturation_probability(q, t_minus: float, t_plus: float):
    """P(h < -t_minus or h > t_plus) for h ~ N(0, q): (erfc(t_minus/sqrt(2q)) + erfc(t_plus/sqrt(2q)))/2."""
    from scipy.special import erfc
    q = np.asarray(q, float)
    with np.errstate(all="ignore"):
        return (erfc(t_minus / np.sqrt(2 * q)) + erfc(t_plus / np.sqrt(2 * q))) / 2


def _dsat_dq(q, t_minus, t_plus):
    q = np.asarray(q, float)
    with np.errstate(all="ignore"):
        return sum(t * np.exp(-t * t / (2 * q)) / (math.sqrt(math.pi) * (2 * q) ** 1.5) for t in (t_minus, t_plus))


# ---------------------------------------------------------------- measurements
def _metric(H_prev, phi, sw, sb):
    """The metric G_ab = sigma_w2 phi(h_a).phi(h_b)/n_prev + sigma_b2 of the next layer given the recorded layer
    H_prev (batch, n_prev): the exact covariance of every unit of the next layer given this one; None when
    H_prev is not finite."""
    if H_prev is None or not np.all(np.isfinite(H_prev)):
        return None
    Y = phi(H_prev)
    with np.errstate(all="ignore"):
        G = sw * (Y @ Y.T) / H_prev.shape[1] + sb
    return G if np.all(np.isfinite(G)) else None


def _layer(H, phi, ths, G=None):
    """One seed's forward statistics of one layer H (batch, n), and the variances of the mean and the zero
    fraction given the layer's metric G (units i.i.d. given the previous layer): G from the previous recorded
    layer (:func:`_metric`), exact given that layer, else (layer 1, or a non-finite previous layer) read off H
    itself, H H^T/n: a self-normalised estimate from the same n units (coverage close to nominal)."""
    B, n = H.shape
    fin = np.isfinite(H)
    y = phi(H[fin]) if fin.any() else np.array([np.nan])
    with np.errstate(all="ignore"):
        Q = H @ H.T / n if G is None else G
        d = np.sqrt(np.diag(Q))
        c = np.clip(Q / np.outer(d, d), -1, 1)
        out = dict(q=float(np.mean(H * H)), mean=float(H.mean()), zero_fraction=float(np.mean(H <= 0)),
                   mean_var=float(Q.sum() / (n * B * B)),
                   zero_var=float(np.arcsin(c).sum() / (2 * math.pi * n * B * B)),
                   h_min=float(H.min()), h_max=float(H.max()), act_mean=float(y.mean()), act_sq=float(np.mean(y * y)),
                   act_min=float(y.min()), act_max=float(y.max()), nonfinite_h=int((~fin).sum()))
    if ths is not None:
        out["saturation"] = float(np.mean((H < -ths[0]) | (H > ths[1])))
    return out


def _grad_pair(H, G, G_next, dphi, sw):
    """(measured ratio, its mean and variance given h^(l) and g^(l+1)) of |g^(l)|^2 / |g^(l+1)|^2.

    Under gradient independence g^(l)_ai = phi'(h_ai) X_ai with X_a = W^T g^(l+1)_a, W ~ N(0, sw/n) independent
    of the forward pass: the X_ai are Gaussian, independent over units i, Cov(X_ai, X_bi) = (sw/n) g_a.g_b, so
    E = (sw/n) sum_a |g_a|^2 sum_i P_ai / T and Var = 2 sum_ab (P P^T)_ab ((sw/n) g_a.g_b)^2 / T^2 (Isserlis),
    with P = phi'(h)^2 and T = sum_a |g^(l+1)_a|^2."""
    n = H.shape[1]
    with np.errstate(all="ignore"):
        P = dphi(np.where(np.isfinite(H), H, 0.0)) ** 2
        M = G_next @ G_next.T * (sw / n)
        T = float(np.trace(G_next @ G_next.T))
        ratio = float(np.sum(G * G) / T)
        cond_mean = float(np.sum(P.sum(axis=1) * np.diag(M)) / T)
        cond_var = float(2 * np.sum((P @ P.T) * M * M) / T ** 2)
    return ratio, cond_mean, cond_var


def _seed(Hs, Gs, phi, dphi, ths, sw, sb):
    """Per-layer dicts of one seed's statistics (forward, and gradients when ``Gs`` is given)."""
    rows = [_layer(H, phi, ths, _metric(Hs[l - 1], phi, sw, sb) if l else None)
            for l, H in enumerate(Hs)]
    if Gs is not None:
        for l, (H, G) in enumerate(zip(Hs, Gs)):
            with np.errstate(all="ignore"):
                rows[l].update(zero_grad=float(np.mean(G == 0)), grad_sq=float(np.mean(G * G)),
                               nonfinite_grad=int((~np.isfinite(G)).sum()))
            r = _grad_pair(H, G, Gs[l + 1], dphi, sw) if l + 1 < len(Hs) else (math.nan,) * 3
            rows[l].update(grad_ratio=r[0], grad_cond_mean=r[1], grad_cond_var=r[2])
    return {k: np.array([r[k] for r in rows]) for k in rows[0]}


def _theory_q(A, sw, sb, L, q0):
    """(q^(l) of sf.propagate, the finite-width FiniteWidth or None, a note)."""
    p = propagate(A, sw, sb, L, q0=q0)
    qt = np.asarray(p.q, float).reshape(L)
    try:
        return qt, finite_width(A, sw, sb, L, q0), ""
    except (Unsupported, ArithmeticError, ValueError) as exc:
        return qt, None, f"No finite-width bands for q and the saturation fraction: {exc}"


def _q0(meas, q0, sw, sb):
    if q0 is not None:
        return float(check.real(_F, "q0", q0, lo=0, lo_open=True)), False
    q1 = float(np.mean(meas["q"][:, 0]))
    if not (np.isfinite(q1) and q1 > sb):
        raise InvalidValue(f"The 'forward' parameter of {_F} must give a finite layer-1 q = mean h^2 above sigma_b2 "
                           f"(it sets q0 = (q - sigma_b2)/sigma_w2). Got q = {q1:g}, sigma_b2 = {sb:g} instead; "
                           "pass q0.")
    return (q1 - sb) / sw, True


def _bands(S, widths, n_common, qt, fw, ths, meas, measured_q0, relu_family, zero_grad_theory, A, sw, sb):
    """(theory, band_mean, band_sd) dicts of every statistic measured (docs/theory.md section 10.1)."""
    L, nl = len(widths), np.asarray(widths, float)
    nan = np.full(L, np.nan)
    K, V, Kn = (fw.K.astype(float), fw.V.astype(float), fw.G(n_common).astype(float)) if fw is not None else (nan,) * 3
    theory, mean, sd = {}, {}, {}
    theory["q"], mean["q"] = qt, Kn.copy()
    sd["q"] = np.sqrt(2 * K ** 2 / nl + V / n_common) / math.sqrt(S)
    if measured_q0:
        mean["q"][0] = np.nan            # layer 1 sets q0: equal to the theory by construction, not compared
    theory["mean"], mean["mean"] = np.zeros(L), np.zeros(L)
    sd["mean"] = np.sqrt(meas["mean_var"].mean(axis=0) / S)
    zsd = np.sqrt(meas["zero_var"].mean(axis=0) / S)
    if relu_family:
        theory["zero_fraction"], mean["zero_fraction"], sd["zero_fraction"] = np.full(L, 0.5), np.full(L, 0.5), zsd
    if ths is not None:
        p = saturation_probability(Kn, *ths)
        theory["saturation"], mean["saturation"] = saturation_probability(qt, *ths), p
        sd["saturation"] = (np.sqrt(p * (1 - p) / nl) + np.abs(_dsat_dq(K, *ths)) * np.sqrt(V / n_common)) / math.sqrt(S)
    if "grad_ratio" in meas:
        theory["grad_ratio"] = np.append(np.asarray(chi1(A, sw, sb, q=qt[:-1]), float).reshape(L - 1), np.nan)
        mean["grad_ratio"] = meas["grad_cond_mean"].mean(axis=0)
        sd["grad_ratio"] = np.sqrt(meas["grad_cond_var"].sum(axis=0)) / S
        hidden = np.arange(L) < L - 1
        theory["zero_grad"] = np.where(hidden, zero_grad_theory, np.nan)
        mean["zero_grad"] = theory["zero_grad"].copy()
        sd["zero_grad"] = np.where(hidden, zsd if relu_family else 0.0, np.nan)
    return theory, mean, sd


def _describe(meas, A, qt):
    """Descriptive statistics pooled over seeds, and their infinite-width values where the theory has them."""
    with np.errstate(all="ignore"):
        d = dict(h_min=meas["h_min"].min(axis=0), h_max=meas["h_max"].max(axis=0),
                 h_rms=np.sqrt(meas["q"].mean(axis=0)), act_mean=meas["act_mean"].mean(axis=0),
                 act_rms=np.sqrt(meas["act_sq"].mean(axis=0)), act_min=meas["act_min"].min(axis=0),
                 act_max=meas["act_max"].max(axis=0),
                 grad_rms=np.sqrt(meas["grad_sq"].mean(axis=0)) if "grad_sq" in meas else np.full(len(qt), np.nan))
    t = dict(h_rms=np.sqrt(qt))
    try:
        t["act_mean"] = np.asarray(map_value(A, "mean", qt), float).reshape(qt.shape)
        t["act_rms"] = np.sqrt(np.asarray(v_map(A, qt), float).reshape(qt.shape))
    except (Unsupported, ArithmeticError, ValueError):
        t["act_mean"] = t["act_rms"] = np.full(qt.shape, np.nan)
    return d, t


def _zero_grad_theory(dphi, relu_family):
    """P(phi'(h) = 0): 1/2 for the relu family, 0 when phi' vanishes nowhere on a fine grid, else NaN (unknown)."""
    if relu_family:
        return 0.5
    return 0.0 if np.all(dphi(np.linspace(-10, 10, 20001)) != 0) else math.nan


def protocol(forward: Sequence, act: str | Activation, sigma_w2: float, sigma_b2: float, grads: Sequence | None = None,
             q0: float | None = None, threshold: float | tuple | None = None,
             saturation_ratio: float = SATURATION_RATIO, z: float | None = None) -> Protocol:
    """The initialisation protocol: per-layer statistics of one fixed batch before any update, over one or
    several seeds, each against its mean-field prediction and a finite-width band (formulas and assumptions in
    docs/theory.md section 10.1; bands assume fully connected layers of i.i.d. symmetric weights, zero-mean
    biases and inputs of about equal norm, like :func:`diagnose`):

    - ``q`` = mean h^2 against q^(l) of ``sf.propagate`` (band from ``sf.finite_width``), ``mean`` of h against 0;
    - ``zero_fraction`` P(h <= 0) = 1/2 for relu-family phi (phi = 0 on x <= 0); per input the zero count is
      Binomial(n, 1/2) given the previous layer, and inputs covary by arcsin(c_ab)/(2 pi) (measured c_ab);
    - ``saturation`` P(h < -t_minus or h > t_plus) = (erfc(t_minus/sqrt(2q)) + erfc(t_plus/sqrt(2q)))/2 for
      saturating phi (tanh, sigmoid, erf);
    - with ``grads``: ``grad_ratio`` of the squared gradient norms of layers l and l + 1 against chi1(q^(l)) =
      sigma_w2 E[phi'(h)^2], its band exact under gradient independence given h^(l) and g^(l+1) (valid for a
      zero-mean readout and e.g. cross-entropy; not for a squared loss on a wide output); ``zero_grad`` against
      1/2 (relu family) or 0 (phi' nowhere zero). The last layer's gradients come from the loss: not compared.

    Non-finite values make a layer's status 2 and ``ok`` False; layer 1 sets q0 unless given (then not compared).

    Parameters
    ----------
    forward : list of arrays, or list of such lists
        Pre-activations per layer, shape (batch, width) (trailing axes flattened), layer 1 the linear layer of
        the raw input; a list of such lists is one recording per seed (same batch size and widths).
    act, sigma_w2, sigma_b2 : the activation (single node) and variances the network was initialised with.
    grads : same structure as ``forward``, optional; dL/dh per layer from one backward pass on the same batch.
    q0 : float, optional
        Input norm ``|x|^2/n0``; default from layer 1, (q^(1) - sigma_b2)/sigma_w2.
    threshold : float or (float, float), optional
        Saturation threshold t (or (t_minus, t_plus)); default where ``abs(phi'(t))`` first falls to
        ``saturation_ratio`` ``abs(phi'(0))``: tanh 1.8184, sigmoid 3.6369, erf 1.5174 at ratio 0.1.
    saturation_ratio : float in (0, 1]; see ``threshold``.
    z : float, optional
        Band half-width in sd; default :func:`family_z` over the compared bands (5 % family-wise).

    Returns
    -------
    Protocol
        Per statistic ``measured``, ``per_seed``, ``theory``, ``band_mean``, ``band_sd``; ``ok``, ``table()``.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> hs, h = [], rng.standard_normal((8, 256))
    >>> for l in range(3):
    ...     h = (np.maximum(h, 0) if l else h) @ rng.standard_normal((256, 256)) * std("relu", 256)
    ...     hs.append(h)
    >>> p = protocol(hs, "relu", 2.0, 0.0)
    >>> p.ok, p.zero_fraction_theory[0]
    (True, 0.5)
    """
    sw, sb, z = _scalars(sigma_w2, sigma_b2, z)
    A = as_activation(act)
    runs = _recorded(forward, "forward")
    gruns = _grads(grads, runs)
    phi, dphi, relu_family, saturating = _kind(A)
    ths = _thresholds(dphi, saturating, threshold, saturation_ratio)
    per = [_seed(r, None if gruns is None else gruns[s], phi, dphi, ths, sw, sb) for s, r in enumerate(runs)]
    meas = {k: np.stack([p[k] for p in per]) for k in per[0]}
    S, L, widths = len(runs), len(runs[0]), [h.shape[1] for h in runs[0]]
    n_common = Counter(widths).most_common(1)[0][0]     # n of the finite-width theory
    q0, measured_q0 = _q0(meas, q0, sw, sb)
    qt, fw, note = _theory_q(A, sw, sb, L, q0)
    theory, mean, sd = _bands(S, widths, n_common, qt, fw, ths, meas, measured_q0, relu_family,
                              _zero_grad_theory(dphi, relu_family), A, sw, sb)
    names, (describe, describe_theory) = [n for n in PROTOCOL_STATS if n in theory], _describe(meas, A, qt)
    p = Protocol(layers=np.arange(1, L + 1), measured={n: meas[n].mean(axis=0) for n in names},
                 per_seed={n: meas[n] for n in names}, theory=theory, band_mean={n: mean[n] for n in names},
                 band_sd={n: sd[n] for n in names}, describe=describe, describe_theory=describe_theory,
                 nonfinite_h=meas["nonfinite_h"].sum(axis=0),
                 nonfinite_grad=meas["nonfinite_grad"].sum(axis=0) if gruns is not None else None,
                 z=2.0 if z is None else z, notes=(note,) if note else (),
                 params=dict(act=A.name, sigma_w2=sw, sigma_b2=sb, q0=q0, q0_measured=measured_q0, seeds=S,
                             batch=runs[0][0].shape[0], widths=widths, width=n_common, grads=gruns is not None,
                             threshold=list(ths) if ths is not None else None, relu_family=relu_family,
                             saturating=saturating, z_rule="given" if z is not None else "family-wise 5 %"))
    if z is None:           # family-wise over the compared bands (set once, before the result is handed out)
        object.__setattr__(p, "z", family_z(sum(int(p.compared(n).sum()) for n in names)))
    return p


def _scalars(sigma_w2, sigma_b2, z):
    sw = float(check.real(_F, "sigma_w2", sigma_w2, lo=0, lo_open=True))
    sb = float(check.real(_F, "sigma_b2", sigma_b2, lo=0))
    return sw, sb, None if z is None else float(check.real(_F, "z", z, lo=0, lo_open=True))
