"""Figures are written and matplotlib stays out of `import symfield`."""
import subprocess
import sys

import numpy as np

import symfield as sf
from symfield.io import plots


def test_import_does_not_load_matplotlib():
    code = "import sys, symfield; assert 'matplotlib' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def _png(path):
    data = path.read_bytes()
    return data[:4] == b"\x89PNG" and len(data) > 10_000


def test_figures_are_written(tmp_path):
    pd = sf.phase_diagram("erf", np.linspace(0.5, 4, 12), np.linspace(0, 0.2, 6))
    plots.phase_diagram(pd, tmp_path / "a.png")
    plots.phase_diagram(sf.phase_diagram("relu", np.linspace(1, 3, 5), np.linspace(0, 0.2, 3)), tmp_path / "r.png")
    plots.g0_densities(path=tmp_path / "b.png")
    plots.divergence(sf.divergence("relu", 1.5, 0.1, depth=60), path=tmp_path / "c.png")
    plots.depth_curves(sf.propagate("erf", 3.0, 0.1, 30), path=tmp_path / "d.png")
    assert all(_png(tmp_path / f) for f in ("a.png", "r.png", "b.png", "c.png", "d.png"))


def test_pooled_phase_diagram_draws_the_variance_criterion(tmp_path):
    act = sf.activation("relu", pool="avg", k=2)
    pd = sf.phase_diagram(act, np.linspace(0.5, 5, 10), np.linspace(0, 0.2, 3))
    fig = plots.phase_diagram(pd, tmp_path / "p.png", act=act)
    lines = [l for l in fig.axes[0].get_lines() if "variance criterion" in l.get_label()]
    assert len(lines) == 1 and np.allclose(lines[0].get_ydata(), 4 * np.pi / (np.pi + 1))   # docs/theory.md section 5
    assert abs(plots._variance_criterion(sf.activation("relu", pool="max", k=2)) - 4 * np.pi / (3 * np.pi + 2)) < 1e-12
    assert plots._variance_criterion(sf.activation("tanh")) is None and _png(tmp_path / "p.png")


def test_class_gradient_and_simulation_figures(tmp_path):
    g = sf.class_gradients("relu", width=64, depth=5, sigma_w2=2.5, sigma_b2=0.1, n_inputs=16, n_networks=3)
    fig = plots.class_gradients(g, path=tmp_path / "g.png")
    labels = [l.get_label() for l in fig.axes[0].get_lines()]
    assert labels == ["unfavoured class", "favoured class", "all samples"] and _png(tmp_path / "g.png")
    sim = sf.simulate("tanh", 300, 6, 2.5, 0.1, 16, n_networks=3)
    fig = plots.depth_curves(sf.propagate("tanh", 2.5, 0.1, 6), sim=sim, path=tmp_path / "s.png")
    assert "infinite width, P = 16" in [l.get_label() for l in fig.axes[1].get_lines()] and _png(tmp_path / "s.png")


# ---------------------------------------------------------------- paper-ready figures (issue 19)
def _public_plot_functions():
    import inspect
    return {n: f for n, f in vars(plots).items() if inspect.isfunction(f) and not n.startswith("_")
            and f.__module__ == plots.__name__}


def test_every_plot_function_takes_ax_and_dpi():
    import inspect
    funcs = _public_plot_functions()
    assert {"phase_diagram", "depth_curves", "g0_densities", "divergence", "class_gradients", "gram_bands",
            "jacobian_spectrum", "jacobian_depth", "isometry_map"} <= set(funcs)
    for name, f in funcs.items():
        params = inspect.signature(f).parameters
        assert "ax" in params or "axes" in params, name
        assert "dpi" in params and "path" in params, name


def _small_results():
    """One small input for each public plot function: name -> (args, kwargs, panels)."""
    pd = sf.phase_diagram("erf", np.linspace(0.5, 4, 8), np.linspace(0.01, 0.2, 5))
    sim = sf.simulate("tanh", 100, 4, 2.5, 0.1, 8, n_networks=2)
    g = sf.class_gradients("relu", width=32, depth=4, sigma_w2=2.5, sigma_b2=0.1, n_inputs=8, n_networks=2)
    gram = sf.gram_fluctuations("relu", 2.0, 0.1, 3)
    spec = sf.jacobian_spectrum("tanh", 1.2, 0.05, 3)
    iso = sf.isometry_diagram("tanh", np.linspace(0.8, 1.6, 3), np.linspace(0, 0.1, 2), 3)
    return {"phase_diagram": ((pd,), {}, 1), "depth_curves": ((sf.propagate("tanh", 2.5, 0.1, 4),), {"sim": sim}, 2),
            "g0_densities": ((), {}, 1), "divergence": ((sf.divergence("relu", 1.5, 0.1, depth=40),), {}, 2),
            "class_gradients": ((g,), {}, 1), "gram_bands": ((gram,), {"width": 50}, 3),
            "jacobian_spectrum": ((spec,), {}, 1), "jacobian_depth": (([1, 2, 3], [[1, 2, 3]], ["a"]), {}, 1),
            "isometry_map": ((iso,), {}, 1),
            "batchnorm_rates": ((("relu", "linear"), (4, 8)), {"measured": {"relu": ([8], [1.79], [0.01])}}, 1),
            "ntk_depth": ((sf.ntk("relu", 2.0, 0.0, 5, qab0=0.5),), {}, 2),
            "trainability_diagram": ((sf.phase_diagram("erf", np.linspace(0.5, 4, 6), np.linspace(0.01, 0.2, 4),
                                                       ntk=True),), {}, 1),
            "protocol": ((_protocol_result(),), {}, 3),
            "norm_placements": (("relu", 2.0, 0.1), {"depth": 12, "batch": 4}, 1)}


def _protocol_result():
    rng = np.random.default_rng(0)
    hs, h = [], rng.standard_normal((4, 64))
    for layer in range(3):
        h = (np.maximum(h, 0) if layer else h) @ rng.standard_normal((64, 64)) * np.sqrt(2 / 64)
        hs.append(h)
    return sf.init.protocol([hs, [2 * a for a in hs]], "relu", 2.0, 0.0)


def test_each_plot_draws_on_given_axes_and_returns_the_figure(tmp_path):
    import matplotlib.pyplot as plt
    cases = _small_results()
    assert set(cases) == set(_public_plot_functions())
    for name, (args, kw, panels) in cases.items():
        fig, axs = plt.subplots(1, panels, squeeze=False)
        target = {"axes": list(axs[0])} if panels > 1 else {"ax": axs[0, 0]}
        out = getattr(plots, name)(*args, **kw, **target)
        assert out is fig, name                             # the caller's figure, drawn on its axes
        assert any(a.has_data() for a in axs[0]), name
        plt.close(fig)


def test_vector_and_raster_output(tmp_path):
    d = sf.divergence("relu", 1.5, 0.1, depth=40)
    plots.divergence(d, path=tmp_path / "d.pdf")
    plots.divergence(d, path=tmp_path / "d.svg")
    plots.divergence(d, path=tmp_path / "lo.png", dpi=50)
    plots.divergence(d, path=tmp_path / "hi.png", dpi=200)
    assert (tmp_path / "d.pdf").read_bytes()[:5] == b"%PDF-"
    assert b"<svg" in (tmp_path / "d.svg").read_bytes()[:2000]
    from PIL import Image
    w_lo, w_hi = Image.open(tmp_path / "lo.png").size[0], Image.open(tmp_path / "hi.png").size[0]
    assert 3.5 < w_hi / w_lo < 4.5                          # the dpi sets the raster size
    fig = plots.g0_densities(path=tmp_path / "g.svg")
    assert fig.axes and b"<svg" in (tmp_path / "g.svg").read_bytes()[:2000]
    import pytest
    with pytest.raises(ValueError, match="path must end in one of .png, .pdf, .svg"):
        plots.g0_densities(path=tmp_path / "g.gif")
    with pytest.raises(ValueError, match="dpi must be a number > 0"):
        plots.g0_densities(path=tmp_path / "g.png", dpi=-1)


def test_divergence_overlays_the_fitted_law():
    for sw, kind, word in ((1.5, "exponential", "rate"), (2.5, "power-law", "exponent")):
        d = sf.divergence("relu", sw, 0.1, depth=80)
        assert d.kind == kind
        fig = plots.divergence(d, act="relu", sigma_w2=sw, sigma_b2=0.1)
        for ax in fig.axes:
            labels = [l.get_label() for l in ax.get_lines()]
            assert len(labels) == 2 and labels[1].startswith("fit: ") and "layers 41-80" in labels[1], labels
            fit = ax.get_lines()[1]
            x, y = (np.asarray(v, float) for v in fit.get_data())
            gam = np.asarray(d.gamma, float)[x.astype(int) - 1]
            assert np.max(np.abs(np.log(y / gam))) < 0.01       # the law runs through the data it was fitted to
        title = fig._suptitle.get_text()
        assert "relu" in title and "$\\sigma_w^2$ = " + f"{sw:g}" in title and "$\\sigma_b^2$ = 0.1" in title
        assert kind in title and word in title


def test_bands_say_what_they_are():
    sim = sf.simulate("tanh", 100, 4, 2.5, 0.1, 8, n_networks=3)
    fig = plots.depth_curves(sf.propagate("tanh", 2.5, 0.1, 4), sim=sim)
    labels = [t.get_text() for ax in fig.axes for t in ax.get_legend().get_texts()]
    assert "$\\gamma$ per network: min-max over 3 networks" in labels               # not "5-95 %" over 3
    assert "5-95 % of $c_{ab}$ over 28 pairs x 3 networks" in labels
    assert "tanh" in fig._suptitle.get_text() and "width 100" in fig._suptitle.get_text()
    g = sf.class_gradients("relu", width=32, depth=4, sigma_w2=2.5, sigma_b2=0.1, n_inputs=8, n_networks=20)
    fig = plots.class_gradients(g)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any("5-95 % over 20 networks" in t for t in labels), labels
    assert "$\\sigma_w^2$ = 2.5" in fig.axes[0].get_title() and "width 32" in fig.axes[0].get_title()


def test_phase_legend_covers_neither_lines_nor_repeats_region_labels():
    pd = sf.phase_diagram("tanh", np.linspace(0.05, 4, 41), np.linspace(0, 0.2, 21))
    fig = plots.phase_diagram(pd)
    ax = fig.axes[0]
    fig.canvas.draw()
    legend = ax.get_legend()
    box = legend.get_window_extent()
    texts = [t.get_text() for t in legend.get_texts()]
    region_labels = {t.get_text().replace("\n", " ") for t in ax.texts}
    assert not region_labels & {t.replace("-", " ") for t in texts}, (texts, region_labels)  # no repeats
    neutral = [l for l in ax.get_lines() if l.get_label().startswith("neutrality")]
    assert len(neutral) == 1
    for line in [*neutral, *(l for l in ax.get_lines() if l.get_label().startswith("edge of chaos"))]:
        xy = ax.transData.transform(np.column_stack(line.get_data()))
        xy = xy[np.isfinite(xy).all(axis=1)]
        inside = (xy[:, 0] >= box.x0) & (xy[:, 0] <= box.x1) & (xy[:, 1] >= box.y0) & (xy[:, 1] <= box.y1)
        assert len(xy) > 5 and not inside.any(), line.get_label()


# ---------------------------------------------------------------- issue 33: figures that survive a paper
def _fake_pd(act, nw=36, nb=21, neutrality_at=3.0, chaotic=True):
    """A phase diagram's drawing inputs without computing one: ordered below sigma_w2 = 1.5 + 2 sigma_b2 (the EOC
    line), chaotic deep prejudice above it (or prejudice only), neutrality at ``neutrality_at``."""
    from types import SimpleNamespace

    from symfield.theory.phases import PHASES
    sb, sw = np.linspace(0, 0.2, nb), np.linspace(0.5, 4, nw)
    eoc = 1.5 + 2 * sb
    above = sw[:, None] > eoc[None, :]
    upper = PHASES.index("chaotic-deep-prejudice" if chaotic else "prejudice")
    codes = np.where(above, upper, PHASES.index("ordered-deep-prejudice"))
    if chaotic:
        codes = np.where(sw[:, None] > neutrality_at, PHASES.index("neutrality"), codes)
    return SimpleNamespace(act=act, sigma_b2=sb, sigma_w2=sw, codes=codes, eoc=eoc, eoc_stable=None,
                           slope=np.where(above, 1.5, 0.5), neutrality=np.full(nb, float(neutrality_at)))


def _overlaps(a, b):
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_composed_phase_panels_keep_legends_off_axis_labels():
    """Two panels side by side (tanh beside a max-pool panel): each legend sits under its own x label (once
    "edge of chaos (chi_1 = 1)sigma_b^2" overlapped), and lists only what its panel draws (once the max-pool
    panel listed chaotic-deep-prejudice, neutrality and the dashed neutrality line it did not draw)."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    plots.phase_diagram(_fake_pd("tanh"), ax=axes[0])
    plots.phase_diagram(_fake_pd("tanh+max2", neutrality_at=9.0, chaotic=False), ax=axes[1])
    fig.tight_layout()
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    for ax in axes:
        box = ax.get_legend().get_window_extent(r)
        assert not _overlaps(box, ax.xaxis.label.get_window_extent(r))
        assert not any(_overlaps(box, t.get_window_extent(r)) for t in ax.get_xticklabels() if t.get_text())
        assert box.y1 <= ax.xaxis.label.get_window_extent(r).y0 + 1e-6
    texts = [t.get_text() for t in axes[1].get_legend().get_texts()]
    assert not any("neutrality" in t or "chaotic" in t for t in texts), texts
    assert not [l for l in axes[1].get_lines() if l.get_label().startswith("neutrality")]
    assert any("neutrality" in t.get_text() for t in axes[0].get_legend().get_texts())
    plt.close(fig)
    fig, axes = plt.subplots(1, 2)
    plots.phase_diagram(_fake_pd("tanh"), ax=axes[0], legend=False)
    plots.phase_diagram(_fake_pd("tanh"), ax=axes[1], legend="inside")
    assert axes[0].get_legend() is None
    fig.canvas.draw()
    assert axes[1].get_legend().get_window_extent().fully_overlaps(axes[1].bbox)
    plt.close(fig)
    import pytest
    with pytest.raises(ValueError, match="'legend'"):
        plots.phase_diagram(_fake_pd("tanh"), legend="outside")


def test_white_edge_of_chaos_line_has_a_visible_legend_sample():
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots()
    plots._boundary(ax, _fake_pd("tanh"), "w")
    eoc = [l for l in ax.get_lines() if l.get_label().startswith("edge of chaos")]
    assert eoc and eoc[0].get_color() == "w" and eoc[0].get_path_effects()     # a dark outline around white
    plt.close(fig)


def test_pdf_rasterises_the_mesh_embeds_truetype_and_records_provenance(tmp_path):
    pd = _fake_pd("tanh", nw=401, nb=201)
    plots.phase_diagram(pd, tmp_path / "p.pdf")
    data = (tmp_path / "p.pdf").read_bytes()
    assert b"/Type3" not in data and b"/FontFile2" in data          # Type 42 (TrueType) fonts, no Type 3
    assert b"/Subtype /Image" in data and len(data) < 150_000, len(data)   # the 80k-cell mesh is one image
    assert b"/Creator (symfield " + sf.__version__.encode() in data and b"symfield.plots.phase_diagram" in data
    plots.phase_diagram(pd, tmp_path / "p.png", dpi=60)
    from PIL import Image
    meta = Image.open(tmp_path / "p.png").text
    assert meta["Software"] == f"symfield {sf.__version__}" and "symfield.plots.phase_diagram" in meta["Description"]


def test_cli_dpi_and_command_in_the_figure(tmp_path):
    from PIL import Image

    from symfield.cli import main
    for dpi in (40, 80):
        assert main(["divergence", "relu", "--sigma-w2", "1.5", "--sigma-b2", "0.1", "--depth", "30",
                     "--plot", str(tmp_path / f"d{dpi}.png"), "--dpi", str(dpi)]) == 0
    lo, hi = (Image.open(tmp_path / f"d{d}.png") for d in (40, 80))
    assert 1.8 < hi.size[0] / lo.size[0] < 2.2
    assert "symfield divergence relu" in hi.text["Description"] and "--dpi 80" in hi.text["Description"]


def test_norm_placements_draws_the_five_placements(tmp_path):
    """One gamma curve per placement; LayerNorm after relu drives c towards 0 (gamma small, docs/theory.md 12.2)
    while no norm lets gamma grow, and BatchNorm after phi centres the batch, so its gamma is negative."""
    fig = plots.norm_placements("relu", 2.0, 0.1, depth=12, batch=4, path=tmp_path / "n.png")
    lines = {l.get_label(): np.asarray(l.get_ydata(), float) for l in fig.axes[0].get_lines() if l.get_label()[0] != "_"}
    assert len(lines) == 5 and _png(tmp_path / "n.png")
    none, ln_after, bn_after = lines["no norm"], lines[r"LayerNorm after $\phi$"], lines[r"BatchNorm after $\phi$ (B = 4)"]
    assert none[-1] > 10 * none[0] and ln_after[-1] < 0.5 and bn_after[-1] < 0 and bn_after[-1] > -1
