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
    ax = plots.phase_diagram(pd, tmp_path / "p.png", act=act)
    lines = [l for l in ax.get_lines() if "variance criterion" in l.get_label()]
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
