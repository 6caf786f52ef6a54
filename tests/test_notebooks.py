"""Every notebook runs top to bottom (small sizes: SYMFIELD_NB_SMALL=1) without an error and shows
what it is about; the committed copies carry their outputs and stay small."""
from pathlib import Path

import pytest

import nbformat
import nbclient

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
CELL_TIMEOUT = 300

# text that must appear in the outputs of a small run (one per notebook, checking its main result)
EXPECTED = {
    "01_phase_diagrams.ipynb": ["relu+max2", "tanh+max2", "relu+avg2", "tanh+avg2", "EOC     tanh+avg2 / tanh: [2. 2.]"],
    "02_depth_and_simulation.ipynb": ["c* =", "relu sigma_w2 = 1.5: exponential", "G0 per network"],
    "03_g0_distributions.ipynb": ["var G0 theory"],
    "04_new_activation.ipynb": ["RESULT: ", "no edge of chaos at sigma_b2 = 0", "at 30 digits"],
}


def _text(nb):
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            out.append(o.get("text", "") + o.get("data", {}).get("text/plain", ""))
    return "\n".join(out)


def _images(nb):
    return sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))


def test_every_notebook_is_tested():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_notebook_runs_small(name, tmp_path, monkeypatch):
    monkeypatch.setenv("SYMFIELD_NB_SMALL", "1")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert 'SMALL = os.environ.get("SYMFIELD_NB_SMALL") == "1"' in code[0].source
    nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()   # raises on a cell error
    text = _text(nb)
    assert "small sizes" in text
    for expected in EXPECTED[name]:
        assert expected in text, expected
    assert "RESULT: FAIL" not in text   # small runs may end INCONCLUSIVE (1 s per phase), never FAIL
    assert _images(nb) >= 1


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_committed_notebook_has_full_size_outputs(name):
    path = NOTEBOOKS / name
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("execution_count") for c in code), "committed without running every cell"
    assert not any(o.get("output_type") == "error" for c in code for o in c.outputs)
    text = _text(nb)
    assert "full sizes" in text and all(e in text for e in EXPECTED[name])
    assert _images(nb) >= 1 and path.stat().st_size < 2_000_000
