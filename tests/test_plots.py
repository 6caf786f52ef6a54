"""Figures are written and matplotlib stays out of `import symfield`."""
import subprocess
import sys

import numpy as np

import symfield as sf
from symfield import plots


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
