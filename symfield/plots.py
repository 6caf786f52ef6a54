"""Figures (matplotlib, imported only when a plot is asked for; headless "Agg" backend).

The phase diagram follows the paper's layout: sigma_b2 on x, sigma_w2 on y, one colour per
phase of MATH.md section 6, the edge-of-chaos curve (solid) and the neutrality line (dashed).
"""
from __future__ import annotations

import numpy as np

from .fixedpoint import PHASES

COLOURS = {  # ordered, EOC, chaotic, prejudice, neutrality
    "ordered-deep-prejudice": "#4c72b0", "edge-of-chaos": "#000000", "chaotic-deep-prejudice": "#c44e52",
    "prejudice": "#dd8452", "neutrality": "#55a868"}
SHORT = {"ordered-deep-prejudice": "ordered\ndeep prejudice", "edge-of-chaos": "EOC",
         "chaotic-deep-prejudice": "chaotic\ndeep prejudice", "prejudice": "prejudice", "neutrality": "neutrality"}


def _pyplot():
    import matplotlib
    if matplotlib.get_backend().lower() not in ("agg", "module://matplotlib_inline.backend_inline"):
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def phase_diagram(pd, path=None, ax=None, title=None):
    """Draw a :class:`symfield.PhaseDiagram`; save to ``path`` (png/pdf/svg) when given. Returns ax."""
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
    if np.isfinite(pd.neutrality).any():
        ax.plot(pd.sigma_b2, pd.neutrality, "k--", lw=2, label="neutrality ($c^* = 1/2$)")
    for i, p in enumerate(PHASES):  # label each region at its median point
        mask = pd.codes == i
        if p == "edge-of-chaos" or mask.sum() < 0.02 * mask.size:
            continue
        w, b = np.nonzero(mask)
        k = np.argsort(w + b * (pd.sigma_w2.size / max(pd.sigma_b2.size, 1)))[w.size // 2]
        ax.text(pd.sigma_b2[b[k]], pd.sigma_w2[w[k]], SHORT[p], ha="center", va="center", fontsize=9,
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
        (fig or ax.figure).savefig(path, bbox_inches="tight")
        if fig is not None:
            plt.close(fig)
    return ax
