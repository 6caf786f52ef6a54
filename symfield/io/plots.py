"""Figures (matplotlib, imported only when a plot is asked for; headless "Agg" backend).

The phase diagram follows the paper's layout: sigma_b2 on x, sigma_w2 on y, one colour per
phase of docs/theory.md section 6, the edge-of-chaos curve (solid) and the neutrality line (dashed).
"""
from __future__ import annotations

import numpy as np

from symfield.simulate import finite_data_gamma
from symfield.theory import igb
from symfield.theory.fixedpoint import PHASES
from symfield.theory.maps import q_growth

COLOURS = {  # ordered, EOC, chaotic, prejudice, neutrality
    "ordered-deep-prejudice": "#4c72b0", "edge-of-chaos": "#000000", "chaotic-deep-prejudice": "#c44e52",
    "prejudice": "#dd8452", "neutrality": "#55a868"}
SHORT = {"ordered-deep-prejudice": "ordered\ndeep prejudice", "edge-of-chaos": "EOC",
         "chaotic-deep-prejudice": "chaotic\ndeep prejudice", "prejudice": "prejudice", "neutrality": "neutrality"}


def _pyplot():
    import os

    import matplotlib
    name = matplotlib.get_backend().lower()     # notebooks: "inline" (IPython 9) or "module://...inline"
    if "inline" not in name and name != "agg" and not os.environ.get("DISPLAY"):
        matplotlib.use("Agg")                   # headless: never try a GUI backend
    import matplotlib.pyplot as plt
    return plt


def _variance_criterion(act):
    """sigma_w2 where q_growth = sigma_w2 V(q)/q = 1 for positively homogeneous psi, else None."""
    if act is None:
        return None
    try:
        return 1.0 / float(q_growth(act, 1.0))
    except (NotImplementedError, ValueError):
        return None


def _inside(mask):
    """Grid index (i, j) of the point of a region farthest from its boundary and the plot's edges
    (distances measured in axis fractions), where its label reads best."""
    from scipy.ndimage import distance_transform_edt
    padded = np.pad(mask, 1)
    d = distance_transform_edt(padded, sampling=(1 / padded.shape[0], 1 / padded.shape[1]))[1:-1, 1:-1]
    return np.unravel_index(np.argmax(d), d.shape)


def phase_diagram(pd, path=None, ax=None, title=None, act=None):
    """Draw a :class:`symfield.PhaseDiagram`; save to ``path`` (png/pdf/svg) when given. Returns ax.

    With ``act`` (the activation of ``pd``) positively homogeneous, the variance criterion
    q_growth = 1 is drawn as well (dash-dot): below it q converges, above it q grows geometrically.
    For plain ReLU it is the chi1 = 1 line; for pooled ReLU the two differ (docs/theory.md section 2)."""
    plt = _pyplot()
    from matplotlib.colors import BoundaryNorm, ListedColormap
    from matplotlib.patches import Patch
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(6.4, 4.8), dpi=120)
    cmap = ListedColormap([COLOURS[p] for p in PHASES])
    norm = BoundaryNorm(np.arange(len(PHASES) + 1) - 0.5, cmap.N)
    ax.pcolormesh(pd.sigma_b2, pd.sigma_w2, pd.codes, cmap=cmap, norm=norm, shading="nearest", alpha=0.85)
    if np.isfinite(pd.eoc).sum() >= 2:
        ax.plot(pd.sigma_b2, pd.eoc, "k-", lw=2, label="edge of chaos ($\\chi_1 = 1$)")
    elif np.nanmin(pd.slope) < 1 < np.nanmax(pd.slope):  # no EOC curve (e.g. ReLU): the chi1 = 1 boundary
        ax.contour(pd.sigma_b2, pd.sigma_w2, pd.slope, levels=[1.0], colors="k", linewidths=2)
        ax.plot([], [], "k-", lw=2, label="order/chaos boundary ($\\chi_1 = 1$)")
    crit = _variance_criterion(act)
    if crit is not None and pd.sigma_w2.min() <= crit <= pd.sigma_w2.max():
        ax.axhline(crit, color="k", ls="-.", lw=1.2, label=f"variance criterion ($q$ growth = 1, $\\sigma_w^2$ = {crit:.4g})")
    if np.isfinite(pd.neutrality).any():
        ax.plot(pd.sigma_b2, pd.neutrality, "k--", lw=2, label="neutrality ($c^* = 1/2$)")
    for i, p in enumerate(PHASES):  # label each region at its median point
        mask = pd.codes == i
        if p == "edge-of-chaos" or mask.sum() < 0.02 * mask.size:
            continue
        w, b = _inside(mask)
        ax.text(pd.sigma_b2[b], pd.sigma_w2[w], SHORT[p], ha="center", va="center", fontsize=9,
                bbox=dict(boxstyle="round", fc="white", alpha=0.7, lw=0))
    handles = [Patch(color=COLOURS[p], label=p) for i, p in enumerate(PHASES) if (pd.codes == i).any()]
    line_h, _ = ax.get_legend_handles_labels()
    ax.legend(handles=handles + line_h, fontsize=7, loc="upper right", framealpha=0.9)
    ax.set_xlabel("$\\sigma_b^2$")
    ax.set_ylabel("$\\sigma_w^2$")
    ax.set_xlim(pd.sigma_b2.min(), pd.sigma_b2.max())
    ax.set_ylim(pd.sigma_w2.min(), pd.sigma_w2.max())
    ax.set_title(title or f"{pd.act}: phases at initialisation")
    if path is not None:
        _save(fig or ax.figure, path)
        if fig is not None:
            plt.close(fig)
    return ax


def _save(fig, path):
    """savefig to a temporary file next to ``path``, then renamed into place (never a partial image)."""
    import os

    from symfield.core.files import replacing
    if not isinstance(path, (str, os.PathLike)):    # an open file object: the caller owns it
        fig.savefig(path, bbox_inches="tight")
        return
    with replacing(path) as tmp:
        fig.savefig(tmp, bbox_inches="tight")


def _finish(fig, path):
    if path is not None:
        _save(fig, path)
        _pyplot().close(fig)
    return fig


def depth_curves(prop, sim=None, path=None, title=None):
    """c^(l) and gamma^(l) against depth for one initialisation: the infinite-width recursion
    (a :class:`symfield.propagate` result at a single grid point) and, when ``sim`` (a
    :func:`symfield.simulate` result) is given, its median and 5-95% band of c over input pairs
    and its gamma. Returns the figure."""
    plt = _pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4), dpi=120)
    layers = np.asarray(prop.layers)
    c, g = np.asarray(prop.c).reshape(layers.size, -1)[:, 0], np.asarray(prop.gamma).reshape(layers.size, -1)[:, 0]
    a1.plot(layers, c, "k-", lw=2, label="infinite width")
    a2.semilogy(layers, g, "k-", lw=2, label="infinite width")
    if sim is not None:
        ls = np.asarray(sim.layers)
        a1.fill_between(ls, sim.c05, sim.c95, color="#4c72b0", alpha=0.3, label="simulation 5-95%")
        a1.plot(ls, sim.c50, color="#4c72b0", lw=1, label="simulation median")
        per_net = np.asarray(sim.networks.gamma)
        if per_net.shape[0] >= 2:  # spread of gamma over the simulated networks
            lo, hi = np.nanquantile(per_net, [0.05, 0.95], axis=0)
            a2.fill_between(ls, lo, hi, color="#4c72b0", alpha=0.3, label="networks 5-95%")
        a2.semilogy(ls, sim.gamma, color="#4c72b0", lw=1, label="simulation")
        P = sim.params.get("n_inputs", 0)
        if P >= 2:  # what the finite-data estimator Vtilde/V averages to at infinite width
            q = np.asarray(prop.q).reshape(layers.size, -1)[:, 0]
            qab = np.asarray(prop.qab).reshape(layers.size, -1)[:, 0]
            a2.semilogy(layers, finite_data_gamma(q, qab, P)[2], "k:", lw=1.5, label=f"infinite width, P = {P}")
    a1.set_xlabel("layer $l$")
    a1.set_ylabel("$c^{(l)}$")
    a2.set_xlabel("layer $l$")
    a2.set_ylabel("$\\gamma^{(l)}$")
    for a in (a1, a2):
        a.legend(fontsize=8)
    p = getattr(prop, "params", {}) or {}
    fig.suptitle(title or f"{p.get('act', '')}: depth profile")
    return _finish(fig, path)


def g0_densities(gammas=(0.1, 0.5, 1.0, 2.0, 10.0), path=None):
    """Densities of G0, the fraction of inputs assigned to class 0 (docs/theory.md section 10), for
    several drift ratios gamma: peaked at 1/2 (gamma < 1), uniform (gamma = 1), pushed to 0 and 1."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    g = np.linspace(1e-4, 1 - 1e-4, 801)
    for gam in gammas:
        ax.plot(g, igb.g0_pdf(g, gam), label=f"$\\gamma = {gam:g}$")
    ax.set_ylim(0, 4)
    ax.set_xlabel("$G_0$ (fraction of inputs in class 0)")
    ax.set_ylabel("density")
    ax.legend(fontsize=8)
    ax.set_title("Initial guessing bias: distribution of $G_0$")
    return _finish(fig, path)


def divergence(d, path=None, title=None):
    """gamma^(l) of a :func:`symfield.divergence` result on semi-log (exponential growth is a
    line) and log-log (power law is a line) axes, with the classification in the title."""
    plt = _pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4), dpi=120)
    gam = np.asarray(d.gamma, dtype=float)
    l = np.arange(1, gam.size + 1)
    a1.semilogy(l, gam, "k.-", ms=3)
    a2.loglog(l, gam, "k.-", ms=3)
    for a, name in ((a1, "semi-log"), (a2, "log-log")):
        a.set_xlabel("layer $l$")
        a.set_ylabel("$\\gamma^{(l)}$")
        a.set_title(name, fontsize=9)
    what = {"exponential": ("rate", d.rate), "power-law": ("exponent", d.exponent),
            "finite": ("gamma*", d.gamma_star)}[d.kind]
    what = f"{what[0]} {float(what[1]):.4g}"
    fig.suptitle(title or f"gamma divergence: {d.kind} ({what})")
    return _finish(fig, path)


def class_gradients(g, path=None, title=None):
    """Per-class mean squared gradients (1/N) |dl/dh^(l)|^2 against layer l from a
    :func:`symfield.class_gradients` result: favoured class (the one the network assigns most
    inputs to at initialisation), unfavoured class and all samples; median over networks with
    the 5-95% band across networks when there are several. Returns the figure."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=120)
    layers = np.asarray(g.layers)
    for name, colour in (("unfavoured", "#c44e52"), ("favoured", "#4c72b0"), ("all", "#555555")):
        v = np.asarray(getattr(g, name), dtype=float)
        ax.semilogy(layers, np.nanmedian(v, axis=0), color=colour, lw=2 if name != "all" else 1,
                    ls="-" if name != "all" else "--", label=f"{name} class" if name != "all" else "all samples")
        if v.shape[0] >= 2:
            lo, hi = np.nanquantile(v, [0.05, 0.95], axis=0)
            ax.fill_between(layers, lo, hi, color=colour, alpha=0.2)
    ax.set_xlabel("layer $l$")
    ax.set_ylabel("mean $(\\partial \\ell / \\partial h^{(l)})^2$")
    ax.legend(fontsize=8)
    p = getattr(g, "params", {}) or {}
    ax.set_title(title or f"{p.get('act', '')}: gradients per class at initialisation "
                          f"($\\sigma_w^2$={p.get('sigma_w2', '?')}, $\\sigma_b^2$={p.get('sigma_b2', '?')})", fontsize=9)
    return _finish(fig, path)


def gram_bands(g, sim=None, width=None, path=None, axes=None, title=None):
    """Finite-width Gram entries per layer: the theory band K + K1/n +- 2 sqrt(diag(gram_cov)/n) of a
    :func:`symfield.gram_fluctuations` result ``g`` and, with ``sim`` (a :func:`symfield.simulate`
    result on two inputs), every simulated network's entries (dots) and their mean (crosses).
    ``width`` defaults to the simulation's. Three panels: Ghat_aa, Ghat_bb, Ghat_ab. Returns the figure."""
    plt = _pyplot()
    n = width if width is not None else (sim.params["width"] if sim is not None else None)
    if n is None:
        raise ValueError("gram_bands: give width= (or a simulation) to draw the width-n band")
    if axes is None:
        fig, axes = plt.subplots(1, 3, figsize=(12, 3.6), dpi=120)
    else:
        fig = axes[0].figure
    layers = np.asarray(g.layers)
    lo, hi = g.band(n)
    mean = g.mean(n).astype(float)
    names = ("$\\hat G_{aa}$", "$\\hat G_{bb}$", "$\\hat G_{ab}$")
    for e, (ax, name) in enumerate(zip(axes, names)):
        ax.fill_between(layers, lo[:, e].astype(float), hi[:, e].astype(float), color="#4c72b0", alpha=0.25,
                        label=f"theory: mean $\\pm$ 2 sd at n = {n}")
        ax.plot(layers, np.asarray(g.K[:, e], float), "k-", lw=1.5, label="infinite width $K$")
        ax.plot(layers, mean[:, e], color="#4c72b0", lw=1, ls="--", label="$K + K_1/n$")
        if sim is not None and sim.gram is not None:
            i, j = ((0, 0), (1, 1), (0, 1))[e]
            vals = sim.gram[:, : len(layers), i, j]
            jitter = (np.random.default_rng(0).random(vals.shape) - 0.5) * 0.3
            ax.plot((layers[None, :] + jitter).ravel(), vals.ravel(), ".", color="#c44e52", ms=2, alpha=0.3,
                    label=f"simulated networks ({vals.shape[0]})")
            ax.plot(layers, vals.mean(axis=0), "x", color="#c44e52", ms=6, label="simulated mean")
        ax.set_xlabel("layer $l$")
        ax.set_title(name)
    axes[0].legend(fontsize=7)
    p = g.params
    fig.suptitle(title or f"{p.get('act', '')}: $\\sigma_w^2$ = {p.get('sigma_w2')}, $\\sigma_b^2$ = {p.get('sigma_b2')}, "
                 f"width {n}, inputs $q_0$ = {tuple(p.get('q0', ()))}", y=1.03)
    return _finish(fig, path)
