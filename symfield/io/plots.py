"""Figures (matplotlib, imported only when a plot is asked for; headless "Agg" backend).

The phase diagram follows the paper's layout: sigma_b2 on x, sigma_w2 on y, one colour per
phase of docs/theory.md section 6, the edge-of-chaos curve (solid) and the neutrality line (dashed).
"""
from __future__ import annotations

from symfield.core.errors import InvalidValue, Unsupported
import numpy as np

from symfield.theory.phases import PHASES
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
    except (Unsupported, ValueError):
        return None


def _inside(mask):
    """Grid index (i, j) of the point of a region farthest from its boundary and the plot's edges, where its
    label reads best: the distance to the nearest cell outside along the row and along the column (in axis
    fractions), the nearer of the two, ties going to the larger sum (the middle of a long region)."""
    padded = np.pad(mask, 1)
    dy, dx = (_distance_along(padded, axis) for axis in (0, 1))
    d = (np.minimum(dy, dx) + 1e-3 * (dy + dx))[1:-1, 1:-1]
    return np.unravel_index(np.argmax(d), d.shape)


def _distance_along(mask, axis):
    """Per cell, the distance along ``axis`` to the nearest False cell, in fractions of the axis (0 on False)."""
    m = np.moveaxis(mask, axis, 0)
    n = m.shape[0]
    i = np.arange(n).reshape((n,) + (1,) * (m.ndim - 1))
    before = np.maximum.accumulate(np.where(m, -n, i), axis=0)
    after = np.flip(np.minimum.accumulate(np.flip(np.where(m, 2 * n, i), 0), axis=0), 0)
    return np.moveaxis(np.minimum(i - before, after - i) / n, 0, axis)


def _legend_below(ax, handles, **kw):
    """A legend under ``ax``'s x tick labels and x label (not over them): anchored at the axes' bottom edge,
    moved down by their height in inches, so it stays clear when the axes are resized or composed."""
    from matplotlib.transforms import ScaledTranslation
    fig = ax.figure
    try:
        renderer = fig.canvas.get_renderer()
    except AttributeError:                 # a canvas without one: the figure's (matplotlib >= 3.6)
        renderer = fig._get_renderer()
    box = ax.xaxis.get_tightbbox(renderer)
    gap = (max(ax.bbox.y0 - box.y0, 0.0) if box is not None else 0.0) / fig.dpi + 0.06
    where = ax.transAxes + ScaledTranslation(0, -gap, fig.dpi_scale_trans)
    return ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), bbox_transform=where,
                     frameon=False, **kw)


LEGENDS = ("below", "inside", False)


def _check_legend(legend):
    if legend not in LEGENDS and legend is not None:
        raise InvalidValue(f"The 'legend' parameter of plots must be one of {LEGENDS} (None = False). "
                           f"Got {legend!r} instead.")


def _visible_line(y, ax_range):
    """True when the curve y has a finite point inside the plotted range (lo, hi)."""
    y = np.asarray(y, float)
    return bool(np.any(np.isfinite(y) & (y >= ax_range[0]) & (y <= ax_range[1])))


def phase_diagram(pd, path=None, ax=None, title=None, act=None, dpi=None, legend="below"):
    """Draw a :class:`symfield.PhaseDiagram` on ``ax`` (default: a new figure); save to ``path``
    (.png at ``dpi``, vector .pdf/.svg) when given. Returns the figure.

    Regions are labelled inside the plot; the legend, below the axes so that it never covers the
    lines, names the lines and only the phases too small to carry a label.
    With ``act`` (the activation of ``pd``) positively homogeneous, the variance criterion
    q_growth = 1 is drawn as well (dash-dot): below it q converges, above it q grows geometrically.
    For plain ReLU it is the chi1 = 1 line; for pooled ReLU the two differ (docs/theory.md section 2).
    The legend lists only lines and phases the panel shows; ``legend="below"`` (default) puts it under
    the x label (composed subplots keep it off their axis labels), "inside" at the best corner, False
    draws none. The phase mesh is rasterised in vector files (a .pdf of a 401 x 201 grid stays small)."""
    from matplotlib.colors import BoundaryNorm, ListedColormap
    from matplotlib.patches import Patch
    _check_legend(legend)
    fig, ax, own = _own(ax, (6.4, 5.2))
    cmap = ListedColormap([COLOURS[p] for p in PHASES])
    norm = BoundaryNorm(np.arange(len(PHASES) + 1) - 0.5, cmap.N)
    ax.pcolormesh(pd.sigma_b2, pd.sigma_w2, pd.codes, cmap=cmap, norm=norm, shading="nearest", alpha=0.85,
                  rasterized=True)
    if np.isfinite(pd.eoc).sum() >= 2:
        _eoc_line(ax, pd, "k")
    elif np.nanmin(pd.slope) < 1 < np.nanmax(pd.slope):  # no EOC curve (e.g. ReLU): the chi1 = 1 boundary
        ax.contour(pd.sigma_b2, pd.sigma_w2, pd.slope, levels=[1.0], colors="k", linewidths=2)
        ax.plot([], [], "k-", lw=2, label="order/chaos boundary ($\\chi_1 = 1$)")
    crit = _variance_criterion(act)
    if crit is not None and pd.sigma_w2.min() <= crit <= pd.sigma_w2.max():
        ax.axhline(crit, color="k", ls="-.", lw=1.2, label=f"variance criterion ($q$ growth = 1, $\\sigma_w^2$ = {crit:.4g})")
    if _visible_line(pd.neutrality, (pd.sigma_w2.min(), pd.sigma_w2.max())):
        ax.plot(pd.sigma_b2, pd.neutrality, "k--", lw=2, label="neutrality ($c^* = 1/2$)")
    line_h, _ = ax.get_legend_handles_labels()
    unlabelled = []
    for i, p in enumerate(PHASES):  # label each region inside it; the legend names only the rest
        mask = pd.codes == i
        if not mask.any() or (p == "edge-of-chaos" and line_h):     # EOC: the line's legend entry
            continue
        if p == "edge-of-chaos" or mask.sum() < 0.02 * mask.size:
            unlabelled.append(Patch(color=COLOURS[p], label=p))
            continue
        w, b = _inside(mask)
        ax.text(pd.sigma_b2[b], pd.sigma_w2[w], SHORT[p], ha="center", va="center", fontsize=9,
                bbox=dict(boxstyle="round", fc="white", alpha=0.7, lw=0))
    ax.set_xlabel("$\\sigma_b^2$")
    ax.set_ylabel("$\\sigma_w^2$")
    ax.set_xlim(pd.sigma_b2.min(), pd.sigma_b2.max())
    ax.set_ylim(pd.sigma_w2.min(), pd.sigma_w2.max())
    ax.set_title(title or f"{pd.act}: phases at initialisation")
    if (line_h or unlabelled) and legend == "below":   # under the x label: never over the lines or the regions
        _legend_below(ax, line_h + unlabelled, fontsize=8, ncol=2)
    elif (line_h or unlabelled) and legend == "inside":
        ax.legend(handles=line_h + unlabelled, fontsize=8, loc="best", framealpha=0.85)
    return _finish(fig, path, dpi, own)


FORMATS = (".png", ".pdf", ".svg")   # by the path's suffix: raster png at dpi, vector pdf and svg


def _metadata(suffix, call):
    """Provenance for the file's metadata (PNG text chunks, PDF info, SVG metadata): symfield's version and
    the call that drew the figure (and the command line when drawn by the CLI)."""
    from symfield.core.version import __version__
    what = f"symfield {__version__}"
    text = call or "symfield.plots"
    if PROVENANCE.get("command"):
        text += f"; command: {PROVENANCE['command']}"
    if suffix == ".png":
        return {"Software": what, "Description": text}
    if suffix == ".pdf":
        return {"Creator": what, "Subject": text}
    return {"Creator": what, "Description": text}


PROVENANCE: dict = {}     # {"command": "symfield phase ..."} set by the CLI for the figures it saves


def _save(fig, path, dpi=None, call=None):
    """savefig to a temporary file next to ``path``, then renamed into place (never a partial image).
    The format is the suffix's (.pdf/.svg: vector; .png: raster at ``dpi``, default the figure's)."""
    import os

    from symfield.core.files import replacing
    import matplotlib
    kw = dict(bbox_inches="tight", dpi="figure" if dpi is None else dpi)
    fonts = {"pdf.fonttype": 42, "ps.fonttype": 42}     # TrueType (Type 42) fonts, not Type 3: venues reject those
    if not isinstance(path, (str, os.PathLike)):    # an open file object: the caller owns it
        with matplotlib.rc_context(fonts):
            fig.savefig(path, **kw)
        return
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    if suffix not in FORMATS:
        raise InvalidValue(f"path must end in one of {', '.join(FORMATS)}; got {os.fspath(path)!r}")
    if dpi is not None and not (isinstance(dpi, (int, float)) and dpi > 0):
        raise InvalidValue(f"dpi must be a number > 0; got {dpi!r}")
    with replacing(path) as tmp, matplotlib.rc_context(fonts):
        fig.savefig(tmp, metadata=_metadata(suffix, call), **kw)


def _own(ax, figsize, ncols=1):
    """(figure, axes, whether the figure is ours): a new figure of ``ncols`` panels when ``ax`` is None,
    else the caller's axes (a sequence of ``ncols`` axes when ncols > 1) and their figure."""
    if ax is None:
        fig, ax = _pyplot().subplots(1, ncols, figsize=figsize, dpi=120)
        return fig, ax, True
    first = ax if ncols == 1 else ax[0]
    return first.figure, ax, False


def _finish(fig, path, dpi=None, own=True):
    """Save ``fig`` to ``path`` when given (closing it when it is ours), and return it. The file's metadata
    names the plotting function that called this one (provenance)."""
    if path is not None:
        import sys
        _save(fig, path, dpi, call=f"symfield.plots.{sys._getframe(1).f_code.co_name}")
        if own:
            _pyplot().close(fig)
    return fig


def _title(act=None, sigma_w2=None, sigma_b2=None, **more):
    """'tanh, σ_w² = 1.5, σ_b² = 0.05, width 1000' from whichever parameters are known."""
    parts = [str(act)] if act else []
    if sigma_w2 is not None:
        parts.append(f"$\\sigma_w^2$ = {float(sigma_w2):.4g}")
    if sigma_b2 is not None:
        parts.append(f"$\\sigma_b^2$ = {float(sigma_b2):.4g}")
    parts += [f"{k.replace('_', ' ')} {v}" for k, v in more.items() if v is not None]
    return ", ".join(parts)


PERCENTILE_MIN = 20     # fewer samples than this: a band is their min-max, not 5-95 percentiles


def _spread(v, what):
    """(lo, hi, label) of the rows of ``v`` (samples x layers): the 5-95 percentiles when there are at least
    PERCENTILE_MIN samples, else the min-max (a 5 % quantile of 4 values is not a percentile band)."""
    n = v.shape[0]
    if n >= PERCENTILE_MIN:
        lo, hi = np.nanquantile(v, [0.05, 0.95], axis=0)
        return lo, hi, f"5-95 % over {n} {what}"
    return np.nanmin(v, axis=0), np.nanmax(v, axis=0), f"min-max over {n} {what}"


def depth_curves(prop, sim=None, path=None, title=None, axes=None, dpi=None):
    """c^(l) and gamma^(l) against depth for one initialisation, on two panels (``axes``: two axes, default
    a new figure): the infinite-width recursion (a :class:`symfield.propagate` result at a single grid
    point) and, when ``sim`` (a :func:`symfield.simulate` result) is given, the simulated mean, median
    and 5-95 % band of c_ab over input pairs and networks, and gamma with its spread over networks
    (min-max when fewer than 20). Saved to ``path`` (.png at ``dpi``, .pdf/.svg) when given. Returns the figure."""
    from symfield.simulate import finite_data_gamma
    fig, (a1, a2), own = _own(axes, (10, 4.2), ncols=2)
    layers = np.asarray(prop.layers)
    c, g = np.asarray(prop.c).reshape(layers.size, -1)[:, 0], np.asarray(prop.gamma).reshape(layers.size, -1)[:, 0]
    a1.plot(layers, c, "k-", lw=2, label="infinite width")
    a2.semilogy(layers, g, "k-", lw=2, label="infinite width")
    if sim is not None:
        ls, sp = np.asarray(sim.layers), sim.params
        P, nets = sp.get("n_inputs", 0), sp.get("n_networks", 0)
        pairs = f"{P * (P - 1) // 2} pairs x {nets} networks"
        a1.fill_between(ls, sim.c05, sim.c95, color="#4c72b0", alpha=0.3, label=f"5-95 % of $c_{{ab}}$ over {pairs}")
        a1.plot(ls, sim.c50, color="#4c72b0", lw=1, label=f"median of $c_{{ab}}$, width {sp.get('width')}")
        per_net = np.asarray(sim.networks.gamma)
        if per_net.shape[0] >= 2:  # spread of gamma over the simulated networks
            lo, hi, what = _spread(per_net, "networks")
            a2.fill_between(ls, lo, hi, color="#4c72b0", alpha=0.3, label=f"$\\gamma$ per network: {what}")
        a2.semilogy(ls, sim.gamma, color="#4c72b0", lw=1, label=f"simulated, width {sp.get('width')}")
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
    point = {k: np.ravel(getattr(prop, k))[0] for k in ("sigma_w2", "sigma_b2") if getattr(prop, k, None) is not None}
    p = {**(getattr(prop, "params", {}) or {}), **point, **(sim.params if sim is not None else {})}
    fig.suptitle(title or _title(p.get("act"), p.get("sigma_w2"), p.get("sigma_b2"), width=p.get("width"),
                                 networks=p.get("n_networks"), inputs=p.get("n_inputs"),
                                 residual=p.get("residual")) + ": depth profile")
    return _finish(fig, path, dpi, own)


def g0_densities(gammas=(0.1, 0.5, 1.0, 2.0, 10.0), path=None, ax=None, dpi=None):
    """Densities of G0, the fraction of inputs assigned to class 0 (docs/theory.md section 10), for
    several drift ratios gamma: peaked at 1/2 (gamma < 1), uniform (gamma = 1), pushed to 0 and 1.
    On ``ax`` (default: a new figure); saved to ``path`` (.png at ``dpi``, .pdf/.svg). Returns the figure."""
    from symfield.theory import igb
    fig, ax, own = _own(ax, (6, 4))
    g = np.linspace(1e-4, 1 - 1e-4, 801)
    for gam in gammas:
        ax.plot(g, igb.g0_pdf(g, gam), label=f"$\\gamma = {gam:g}$")
    ax.set_ylim(0, 4)
    ax.set_xlabel("$G_0$ (fraction of inputs in class 0)")
    ax.set_ylabel("density")
    ax.legend(fontsize=8)
    ax.set_title("Initial guessing bias: distribution of $G_0$")
    return _finish(fig, path, dpi, own)


def _divergence_fit(d, gam, l):
    """(layers, fitted gamma, label) of the law :func:`symfield.divergence` fitted: over the second half
    of the layers, log gamma = a + r l + e/l (exponential) or a + p log l + e/l (power law), with its
    slope r or p; a and e are refitted here with the slope fixed (the same least-squares optimum).
    For a finite limit: the constant gamma*."""
    if d.kind == "finite":
        return l, np.full(l.size, float(d.gamma_star)), f"limit $\\gamma^*$ = {float(d.gamma_star):.4g}"
    sel = (l > l.size // 2) & np.isfinite(gam) & (gam > 0)
    slope = float(d.rate if d.kind == "exponential" else d.exponent)
    x = l if d.kind == "exponential" else np.log(l)
    A = np.vstack([np.ones(sel.sum()), 1 / l[sel]]).T
    (a, e), *_ = np.linalg.lstsq(A, np.log(gam[sel]) - slope * x[sel], rcond=None)
    law = (f"$\\gamma \\propto e^{{{slope:.4g}\\,l}}$" if d.kind == "exponential"
           else f"$\\gamma \\propto l^{{{slope:.4g}}}$")
    return l[sel], np.exp(a + slope * x[sel] + e / l[sel]), f"fit: {law} (1 + O(1/l)), layers {l[sel][0]}-{l[-1]}"


def divergence(d, path=None, title=None, axes=None, dpi=None, act=None, sigma_w2=None, sigma_b2=None):
    """gamma^(l) of a :func:`symfield.divergence` result on semi-log (exponential growth is a
    line) and log-log (power law is a line) axes (``axes``: two axes, default a new figure), with the
    fitted law overlaid (red) and the classification, activation and sigmas (``act``, ``sigma_w2``,
    ``sigma_b2``: those of the result) in the title. Saved to ``path`` (.png at ``dpi``, .pdf/.svg) when
    given. Returns the figure."""
    fig, (a1, a2), own = _own(axes, (10, 4.2), ncols=2)
    gam = np.asarray(d.gamma, dtype=float)
    l = np.arange(1, gam.size + 1)
    lf, fit, label = _divergence_fit(d, gam, l)
    for a, name, draw in ((a1, "semi-log", "semilogy"), (a2, "log-log", "loglog")):
        getattr(a, draw)(l, gam, "k.-", ms=2.5, lw=0.8, zorder=3, label=f"$\\gamma^{{(l)}}$ ({d.precision})")
        getattr(a, draw)(lf, fit, "-", color="#c44e52", lw=5, alpha=0.45, zorder=2, label=label)  # under the data
        a.set_xlabel("layer $l$")
        a.set_ylabel("$\\gamma^{(l)}$")
        a.set_title(name, fontsize=9)
        a.legend(fontsize=8, loc="best")    # the corner the curves leave empty (it differs per panel and law)
    what = {"exponential": ("rate", d.rate), "power-law": ("exponent", d.exponent),
            "finite": ("$\\gamma^*$", d.gamma_star)}[d.kind]
    what = f"{what[0]} {float(what[1]):.4g}"
    head = _title(getattr(act, "name", act), sigma_w2, sigma_b2)
    fig.suptitle(title or (f"{head}: " if head else "") + f"$\\gamma$ divergence {d.kind} ({what})")
    return _finish(fig, path, dpi, own)


def class_gradients(g, path=None, title=None, ax=None, dpi=None):
    """Per-class mean squared gradients (1/N) ``|dl/dh^(l)|^2`` against layer l from a
    :func:`symfield.class_gradients` result: favoured class (the one the network assigns most
    inputs to at initialisation), unfavoured class and all samples; median over networks with
    a band across networks when there are several (5-95 % from 20 networks on, min-max below: the
    legend says which). On ``ax`` (default: a new figure); saved to ``path`` (.png at ``dpi``, .pdf/.svg).
    Returns the figure."""
    fig, ax, own = _own(ax, (6.4, 4.6))
    layers = np.asarray(g.layers)
    for name, colour in (("unfavoured", "#c44e52"), ("favoured", "#4c72b0"), ("all", "#555555")):
        v = np.asarray(getattr(g, name), dtype=float)
        ax.semilogy(layers, np.nanmedian(v, axis=0), color=colour, lw=2 if name != "all" else 1,
                    ls="-" if name != "all" else "--", label=f"{name} class" if name != "all" else "all samples")
        if v.shape[0] >= 2:
            lo, hi, what = _spread(v, "networks")
            ax.fill_between(layers, lo, hi, color=colour, alpha=0.2,
                            label=f"bands: {what} (median line)" if name == "unfavoured" else None)
    ax.set_xlabel("layer $l$")
    ax.set_ylabel("mean $(\\partial \\ell / \\partial h^{(l)})^2$")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, frameon=False)  # bands fill the axes
    p = getattr(g, "params", {}) or {}
    head = _title(p.get("act"), p.get("sigma_w2"), p.get("sigma_b2"), width=p.get("width"),
                  inputs=p.get("n_inputs"), residual=p.get("residual"))
    ax.set_title(title or f"{head}: gradients per class at initialisation", fontsize=9)
    return _finish(fig, path, dpi, own)


def gram_bands(g, sim=None, width=None, path=None, axes=None, title=None, dpi=None):
    """Finite-width Gram entries per layer: the theory band K + K1/n +- 2 sqrt(diag(gram_cov)/n) of a
    :func:`symfield.gram_fluctuations` result ``g`` and, with ``sim`` (a :func:`symfield.simulate`
    result on two inputs), every simulated network's entries (dots) and their mean (crosses).
    ``width`` defaults to the simulation's. Three panels (``axes``: three axes, default a new figure):
    Ghat_aa, Ghat_bb, Ghat_ab. Saved to ``path`` (.png at ``dpi``, .pdf/.svg) when given. Returns the figure."""
    n = width if width is not None else (sim.params["width"] if sim is not None else None)
    if n is None:
        raise InvalidValue("gram_bands: give width= (or a simulation) to draw the width-n band")
    fig, axes, own = _own(axes, (12, 3.6), ncols=3)
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
                 f"width {n}, inputs $q_0$ = {tuple(p.get('q0', ()))}"
                 + (f", residual $\\alpha$ = {p['residual']}" if p.get("residual") else ""), y=1.03)
    return _finish(fig, path, dpi, own)


def _log_spectrum(ax, spec, sim):
    """Density of log10(lambda) (lambda rho(lambda) ln 10) over the simulated log10 values: for spectra
    reaching 0 (a density diverging there, an atom at 0) or spanning decades."""
    hi, f = spec.support[1], np.nan_to_num(spec.x * spec.pdf)
    keep = (spec.x >= 1e-12 * hi) & (np.cumsum(f >= 1e-3 * f.max()) > 0)   # from where it is visible
    if sim is not None:
        vals = np.asarray(sim.sv2).ravel()
        lo = np.log10(spec.x[keep][0]) if keep.any() else np.log10(1e-12 * hi)
        u = np.log10(vals[vals > 0])
        counts, edges = np.histogram(u[(u >= lo) & (u <= np.log10(1.5 * hi))], bins=80)
        ax.stairs(counts / (vals.size * np.diff(edges)), edges, fill=True, color="#c44e52", alpha=0.35,
                  label=f"simulated, width {sim.params['width']} ({sim.params['n_networks']} networks)")
    ax.plot(np.log10(spec.x[keep]), spec.x[keep] * spec.pdf[keep] * np.log(10), "k-", lw=1.5,
            label="infinite width (free probability)")
    for loc, mass in spec.atoms:
        ax.plot([], [], " ", label=f"+ atom at $\\lambda$ = {loc:.3g} of mass {mass:.3g}")
    ax.set_xlabel("$\\log_{10} \\lambda$, $\\lambda$ = squared singular value of $J$")
    ax.set_ylabel("density of $\\log_{10} \\lambda$")


def jacobian_spectrum(spec, sim=None, ax=None, path=None, title=None, log=None, dpi=None):
    """Density of the squared singular values of J (a :func:`symfield.jacobian_spectrum` result), atoms
    as vertical arrows with their mass, over the histogram of a :func:`symfield.simulate_jacobian`
    result ``sim`` when given. ``log=True`` draws the density of log10(lambda) instead (default: when the
    support reaches 0 or spans more than two decades). On ``ax`` (default: a new figure); saved to ``path``
    (.png at ``dpi``, .pdf/.svg) when given. Returns the figure."""
    fig, ax, own = _own(ax, (6.4, 4.2))
    lo, hi = spec.support
    if log is None:
        log = bool(len(spec.x)) and np.isfinite(hi) and not lo > 0.01 * hi
    if log:
        _log_spectrum(ax, spec, sim)
        sim = None
    if sim is not None:
        vals = np.asarray(sim.sv2).ravel()
        top = spec.support[1] if np.isfinite(spec.support[1]) else vals.max()
        ax.hist(vals[vals <= 1.5 * top], bins=80, density=True, color="#c44e52", alpha=0.35,
                label=f"simulated, width {sim.params['width']} ({sim.params['n_networks']} networks)")
    if len(spec.x) and not log:
        ax.plot(spec.x, spec.pdf, "k-", lw=1.5, label="infinite width (free probability)")
    for loc, mass in ([] if log else spec.atoms):
        ax.annotate(f"atom {mass:.3g}", (loc, 0), (loc, ax.get_ylim()[1] * 0.8), arrowprops=dict(arrowstyle="->"),
                    fontsize=8)
    if not log:
        ax.set_xlabel("squared singular value $\\lambda$ of $J$")
        ax.set_ylabel("density")
    p = spec.params
    ax.set_title(title or f"{p['act']}, {p['weights']} weights, $\\sigma_w^2$={p['sigma_w2']:.4g}, "
                          f"$\\sigma_b^2$={p['sigma_b2']:.4g}, L={p['depth']}: var {spec.var:.3g}", fontsize=9)
    ax.legend(fontsize=8)
    return _finish(fig, path, dpi, own)


def jacobian_depth(depths, variances, labels, ax=None, path=None, dpi=None):
    """Spectrum variance m_2 - m_1^2 (or any per-depth statistic) against depth, one curve per label.
    On ``ax`` (default: a new figure); saved to ``path`` (.png at ``dpi``, .pdf/.svg). Returns the figure."""
    fig, ax, own = _own(ax, (5.6, 4.0))
    for v, lab in zip(variances, labels):
        ax.plot(depths, v, "o-", ms=3, label=lab)
    ax.set_xlabel("depth $L$")
    ax.set_ylabel("variance of the squared singular values")
    ax.legend(fontsize=8)
    return _finish(fig, path, dpi, own)


def _eoc_line(ax, pd, colour):
    """The edge-of-chaos curve: solid where its q* is stable; dotted where q* is unstable (no network
    reaches it), with the realised order/chaos boundary, the chi1 = 1 contour at the reached q*."""
    from matplotlib import patheffects
    stable = np.ones(pd.eoc.shape, bool) if pd.eoc_stable is None else np.asarray(pd.eoc_stable, bool)
    halo = [patheffects.withStroke(linewidth=3.6, foreground="k")] if colour in ("w", "white") else None
    ax.plot(pd.sigma_b2, np.where(stable, pd.eoc, np.nan), "-", color=colour, lw=2, path_effects=halo or [],
            label="edge of chaos ($\\chi_1 = 1$)")
    if not stable.all() and np.isfinite(pd.eoc[~stable]).any():
        ax.plot(pd.sigma_b2, np.where(~stable, pd.eoc, np.nan), ":", color=colour, lw=2,
                label="edge of chaos at an unstable $q^*$ (not reached)")
        if np.nanmin(pd.slope) < 1 < np.nanmax(pd.slope):
            ax.contour(pd.sigma_b2, pd.sigma_w2, pd.slope, levels=[1.0], colors=colour, linewidths=1.2,
                       linestyles="-.")
            ax.plot([], [], "-.", color=colour, lw=1.2, label="$\\chi_1 = 1$ at the reached $q^*$")


def _boundary(ax, pd, colour):
    """The edge-of-chaos curve of a phase diagram (or its chi1 = 1 contour when there is no curve)."""
    if np.isfinite(pd.eoc).sum() >= 2:
        _eoc_line(ax, pd, colour)
    elif np.nanmin(pd.slope) < 1 < np.nanmax(pd.slope):
        ax.contour(pd.sigma_b2, pd.sigma_w2, pd.slope, levels=[1.0], colors=colour, linewidths=2)
        ax.plot([], [], "-", color=colour, lw=2, label="order/chaos boundary ($\\chi_1 = 1$)")


def isometry_map(diagram, pd=None, ax=None, path=None, title=None, act=None, dpi=None):
    """log10 of the relative variance m_2/m_1^2 - 1 of the squared singular values of J (a
    :func:`symfield.isometry_diagram` result) with a colorbar, sigma_b2 on x and sigma_w2 on y as in
    :func:`phase_diagram`, the contour m_1 = 1 (dashed) and, with ``pd`` (a :func:`symfield.phase_diagram`
    on the same grid), the edge of chaos. Without ``ax`` and with ``pd``, the phase diagram (``act`` as
    there) is drawn in a panel on the left. Dark = near-isometric. Saved to ``path`` (.png at ``dpi``,
    .pdf/.svg) when given. Returns the figure."""
    plt = _pyplot()
    fig = None
    if ax is None:
        fig, axes = plt.subplots(1, 1 if pd is None else 2, figsize=(6.6 if pd is None else 13.2, 4.8), dpi=120,
                                 squeeze=False)
        ax = axes[0, -1]
        if pd is not None:
            phase_diagram(pd, ax=axes[0, 0], act=act)
    rel = np.where(diagram.status == 0, diagram.rel_var, np.nan)
    with np.errstate(all="ignore"):
        z = np.log10(np.maximum(rel, 1e-16))
    mesh = ax.pcolormesh(diagram.sigma_b2, diagram.sigma_w2, z, shading="nearest", cmap="viridis", rasterized=True)
    (ax.figure if fig is None else fig).colorbar(mesh, ax=ax, label="$\\log_{10}(m_2/m_1^2 - 1)$")
    with np.errstate(all="ignore"):
        lm1 = np.log(np.where(diagram.status == 0, diagram.m1, np.nan))
    if diagram.sigma_b2.size > 1 and np.nanmin(lm1) < 0 < np.nanmax(lm1):
        ax.contour(diagram.sigma_b2, diagram.sigma_w2, lm1, levels=[0.0], colors="#dd8452", linestyles="--",
                   linewidths=1.5)
        ax.plot([], [], "--", color="#dd8452", lw=1.5, label="$m_1 = 1$ (mean squared singular value)")
    if pd is not None:
        _boundary(ax, pd, "w")
    ax.set_xlabel("$\\sigma_b^2$")
    ax.set_ylabel("$\\sigma_w^2$")
    if ax.get_legend_handles_labels()[0]:          # off the map, under the x label
        _legend_below(ax, ax.get_legend_handles_labels()[0], fontsize=7, ncol=2)
    p = diagram.params
    ax.set_title(title or f"{p.get('act', '')}, {p.get('weights', '')} weights, L = {p.get('depth', '')}: "
                          "spread of the Jacobian spectrum", fontsize=9)
    return _finish(fig or ax.figure, path, dpi, own=fig is not None)


def batchnorm_rates(acts=("relu", "tanh", "gelu", "linear"), batches=(4, 6, 8, 12, 16, 32, 64, 128, 256),
                    measured=None, ax=None, path=None, dpi=None):
    """The BatchNorm gradient rate lambda_B (BN before phi, docs/theory.md section 12.3) against the batch
    size B for each activation, with its B -> infinity limit E[phi'^2]/Var phi dashed; ``measured`` maps an
    activation to (B values, means, standard errors) from networks, drawn as error bars. On ``ax`` (default:
    a new figure); saved to ``path`` (.png at ``dpi``, .pdf/.svg). Returns the figure."""
    from symfield.theory.norm import batchnorm
    fig, ax, own = _own(ax, (5.6, 4.0))
    for act in acts:
        rates = [batchnorm(act, 1.0, 0.0, int(b)).rate for b in batches]
        line, = ax.plot(batches, rates, "o-", ms=3, label=act)
        ax.axhline(batchnorm(act, 1.0, 0.0).rate, color=line.get_color(), ls="--", lw=0.8)
        if measured and act in measured:
            b, m, se = measured[act]
            ax.errorbar(b, m, yerr=se, fmt="x", color=line.get_color(), capsize=2)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size $B$")
    ax.set_ylabel(r"gradient rate $\lambda_B$ per layer")
    ax.set_title(r"BatchNorm before $\phi$ (dashed: $B\to\infty$)", fontsize=9)
    ax.legend(fontsize=8)
    return _finish(fig, path, dpi, own)


PLACEMENTS = ((None, "before", "no norm"), ("layer", "before", r"LayerNorm before $\phi$"),
              ("layer", "after", r"LayerNorm after $\phi$"), ("batch", "before", r"BatchNorm before $\phi$"),
              ("batch", "after", r"BatchNorm after $\phi$"))


def norm_placements(act, sigma_w2, sigma_b2, depth=50, batch=8, ax=None, path=None, dpi=None):
    """gamma^(l) against depth for each placement of the norm (docs/theory.md section 12): none, LayerNorm before
    and after phi, BatchNorm (batch size ``batch``; None: B -> infinity) before and after phi, each from
    ``sf.propagate(..., norm=, norm_at=)``. gamma can be negative under BatchNorm after phi (the batch's units are
    centred), so the y axis is symmetric-log. On ``ax`` (default: a new figure); saved to ``path``. Returns the figure.

    Parameters
    ----------
    act : str or Activation
    sigma_w2, sigma_b2 : float
    depth : int
    batch : int or None
    ax : matplotlib axes, optional
    path : str or path-like, optional
    dpi : float, optional

    Returns
    -------
    matplotlib.figure.Figure

    Examples
    --------
    >>> fig = norm_placements("relu", 2.0, 0.1, depth=30, path="placements.png")    # doctest: +SKIP
    """
    from symfield.theory.propagate import propagate
    fig, ax, own = _own(ax, (6.0, 4.2))
    for norm, at, label in PLACEMENTS:
        r = propagate(act, sigma_w2, sigma_b2, depth, norm=norm, norm_at=at, batch=batch if norm == "batch" else None)
        ax.plot(np.asarray(r.layers), np.asarray(r.gamma, dtype=float), "-", lw=1.5,
                label=label + (f" (B = {batch})" if norm == "batch" and batch else ""))
    ax.set_yscale("symlog", linthresh=1e-2)
    ax.axhline(0, color="0.6", lw=0.6)
    ax.set_xlabel("layer $l$")
    ax.set_ylabel(r"$\gamma^{(l)}$")
    ax.set_title(_title(getattr(act, "name", act), sigma_w2, sigma_b2) + ": where the norm goes", fontsize=9)
    ax.legend(fontsize=7)
    return _finish(fig, path, dpi, own)


def ntk_depth(r, path=None, title=None, axes=None, dpi=None):
    """An :func:`symfield.ntk` result: Theta_aa and Theta_ab per layer (left) and gamma_Theta with the NNGP
    gamma (right, log scale). Saved to ``path`` when given; returns the figure."""
    fig, (a1, a2), own = _own(axes, (10, 4.2), ncols=2)
    layers = np.asarray(r.layers)
    a1.plot(layers, np.asarray(r.theta_aa, dtype=float), "k-", label="$\\Theta_{aa}$")
    a1.plot(layers, np.asarray(r.theta_ab, dtype=float), "-", color="#c44e52", label="$\\Theta_{ab}$")
    a1.set_xlabel("layer $l$")
    a1.set_ylabel("NTK")
    a1.legend(fontsize=8)
    with np.errstate(all="ignore"):
        a2.semilogy(layers, np.asarray(r.gamma_theta, dtype=float), "k-", label="$\\gamma_\\Theta$")
        a2.semilogy(layers, np.asarray(r.gamma, dtype=float), "--", color="#4c72b0", label="$\\gamma$ (NNGP)")
    a2.set_xlabel("layer $l$")
    a2.legend(fontsize=8)
    p = r.params
    fig.suptitle(title or _title(p.get("act"), p.get("sigma_w2"), p.get("sigma_b2")) + f": NTK ({r.precision})")
    return _finish(fig, path, dpi, own)


def trainability_diagram(pd, path=None, ax=None, title=None, act=None, dpi=None):
    """Xiao-et-al.-style trainability figure of a ``phase_diagram(..., ntk=True)`` result: the NTK depth scale
    (xi_1 in the ordered phase, xi* in the chaotic phase; the trainable depth is a multiple of it) as a colour
    map over (sigma_b2, sigma_w2) on a log scale, with the edge of chaos (where it diverges); cells where it is not
    derived (NaN) stay blank. Returns the figure."""
    if pd.depth_scale is None:
        raise ValueError("trainability_diagram needs phase_diagram(..., ntk=True)")
    fig, ax, own = _own(ax, (6.4, 5))
    xi = np.asarray(pd.depth_scale, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        shown = np.log10(np.clip(np.where(np.isposinf(xi), 1e4, xi), 0.1, 1e4))   # NaN (not derived) stays blank
    mesh = ax.pcolormesh(pd.sigma_b2, pd.sigma_w2, shown, shading="auto", cmap="viridis")
    fig.colorbar(mesh, ax=ax, label="$\\log_{10}$ NTK depth scale ($\\xi_1$ ordered, $\\xi^*$ chaotic)")
    _boundary(ax, pd, "#d62728")
    ax.set_xlabel("$\\sigma_b^2$")
    ax.set_ylabel("$\\sigma_w^2$")
    ax.set_ylim(pd.sigma_w2.min(), pd.sigma_w2.max())
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(title or f"{getattr(act, 'name', act) or pd.act}: trainable depth scale", fontsize=10)
    return _finish(fig, path, dpi, own)


PROTOCOL_LABELS = {"q": "$q$ = mean $h^2$", "mean": "mean of $h$", "zero_fraction": "fraction $h \\leq 0$",
                   "saturation": "saturated fraction", "grad_ratio": "$|g^{(l)}|^2 / |g^{(l+1)}|^2$",
                   "zero_grad": "fraction of zero gradients"}


def _protocol_panel(ax, p, name):
    """One statistic of an init.protocol result against layer: per-seed dots, the pooled value, the theory line
    and the band (log scale for the positive statistics; where the band reaches 0 it is cut at the axis)."""
    layers = np.asarray(p.layers)
    x, t, m, s = p.measured[name], p.theory[name], p.band_mean[name], p.band_sd[name]
    seeds, log = np.asarray(p.per_seed[name]), name != "mean"
    shown = np.isfinite(m) & np.isfinite(s)
    if shown.any():
        lo, hi = m - p.z * s, m + p.z * s
        if log:
            lo = np.where(lo > 0, lo, np.nan)
        ax.fill_between(layers, lo, hi, where=shown, color="#4c72b0", alpha=0.25, label=f"band: mean $\\pm$ {p.z:.3g} sd")
    if np.isfinite(t).any():
        ax.plot(layers, t, "k-", lw=1.5, label="infinite-width theory")
    if seeds.shape[0] > 1:
        ax.plot(np.repeat(layers[None, :], seeds.shape[0], 0).ravel(), seeds.ravel(), ".", color="#c44e52", ms=3,
                alpha=0.5, label=f"per seed ({seeds.shape[0]})")
    flagged = p.outside(name)
    ax.plot(layers, x, "o", color="#c44e52", ms=5, label="measured" + (", pooled" if seeds.shape[0] > 1 else ""))
    if flagged.any():
        ax.plot(layers[flagged], x[flagged], "x", color="k", ms=9, mew=2, label="outside the band")
    log = log and bool(np.any(np.isfinite(x) & (x > 0)))
    if log:
        ax.set_yscale("log")
        seen = np.concatenate([x[np.isfinite(x) & (x > 0)], seeds[np.isfinite(seeds) & (seeds > 0)]])
        lo, hi = ax.get_ylim()      # a theory or band far from every measurement is cut at 1e3 of their range
        ax.set_ylim(max(lo, seen.min() / 1e3), min(hi, seen.max() * 1e3))
    ax.set_xlabel("layer $l$")
    ax.set_title(PROTOCOL_LABELS[name] + (" (0 is not drawn)" if log and np.any(x == 0) else ""), fontsize=9)
    ax.legend(fontsize=7)


def protocol(p, path=None, axes=None, title=None, dpi=None):
    """The statistics of an :func:`symfield.init.protocol` result per layer, one panel each (log scale except
    the mean of h): measured (pooled over seeds, per-seed dots when there are several), the infinite-width
    theory line and the finite-width band, flagged layers crossed. ``axes``: as many axes as ``p.stats``
    (default a new figure). Saved to ``path`` (.png at ``dpi``, .pdf/.svg) when given. Returns the figure.

    Parameters
    ----------
    p : symfield.init.Protocol
    path : str or path-like, optional
    axes : sequence of matplotlib axes, optional
    title : str, optional
    dpi : float, optional

    Returns
    -------
    matplotlib.figure.Figure

    Examples
    --------
    >>> fig = protocol(sf.init.protocol(hs, "relu", 2.0, 0.0), "protocol.pdf")     # doctest: +SKIP
    """
    names = p.stats
    fig, axes, own = _own(axes, (3.4 * len(names), 3.6), ncols=len(names))
    axes = np.atleast_1d(axes)
    if len(axes) != len(names):
        raise InvalidValue(f"The 'axes' parameter of plots.protocol must hold {len(names)} axes (one per statistic "
                           f"{names}). Got {len(axes)} instead.")
    for ax, name in zip(axes, names):
        _protocol_panel(ax, p, name)
    q = p.params
    fig.suptitle(title or _title(q.get("act"), q.get("sigma_w2"), q.get("sigma_b2"), seeds=q.get("seeds"),
                                 batch=q.get("batch")) + f": initialisation protocol ({'ok' if p.ok else 'NOT ok' if p.ok is False else 'nothing compared'})",
                 fontsize=10)
    if own:
        fig.tight_layout()
    return _finish(fig, path, dpi, own)
