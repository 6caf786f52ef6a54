"""Every notebook runs top to bottom (small sizes: SYMFIELD_NB_SMALL=1) without an error and shows
what it is about; the committed copies carry their outputs, stay small and are not stale: they were run by
notebooks/run.py, which records the package version and a hash of the code cells in the notebook's
metadata, and neither has changed since."""
import copy
import importlib.util
from pathlib import Path

import pytest

import nbformat
import nbclient

import symfield

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
CELL_TIMEOUT = 300

_spec = importlib.util.spec_from_file_location("notebooks_run", NOTEBOOKS / "run.py")
run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run)

# text that must appear in the outputs of a small run (one per notebook, checking its main result)
EXPECTED = {
    "01_phase_diagrams.ipynb": ["relu+max2", "tanh+max2", "relu+avg2", "tanh+avg2", "EOC     tanh+avg2 / tanh: [2. 2.]"],
    "02_depth_and_simulation.ipynb": ["c* =", "relu sigma_w2 = 1.5: exponential", "G0 per network"],
    "03_g0_distributions.ipynb": ["var G0 theory"],
    "04_new_activation.ipynb": ["RESULT: ", "no edge of chaos at sigma_b2 = 0", "at 30 digits"],
    "05_jacobian_spectrum.ipynb": ["near-isometric: True", "2L - 1 at every depth: True", "theory vs simulation",
                                   "atom at 0 of mass 0.5"],
    "06_where_to_put_the_norm.ipynb": ["LN after", "BN before", "lambda_B at B = 4, 8, 32, 128, inf"],
    "07_trainability.ipynb": ["edge-of-chaos", "erf: depth scale at", "relu+max2 finite depth scales", "limit 0.25000"],
    "08_init_protocol.ipynb": ["torch default: theory check ok", "vanishing gradients", "flax sf.init: theory check ok",
                               "Flax nn.gelu default vs exact"],
}


def _text(nb):
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            out.append(o.get("text", "") + o.get("data", {}).get("text/plain", ""))
    return "\n".join(out)


def _images(nb):
    return sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))


# 04 (verify) takes ~40 s, 05, 06 and 08 10-20 s each: the slow suite; 01, 02, 03 and 07 stay in the default run
SLOW_NOTEBOOKS = ("04_", "05_", "06_", "08_")


def test_every_notebook_is_tested():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n[:3] in SLOW_NOTEBOOKS else n
                                  for n in sorted(EXPECTED)])
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
    assert "IProgress" not in text and "ipywidgets" not in text   # tqdm.auto without ipywidgets would warn
    assert _images(nb) >= 1


def _narrated(nb):
    """Every code cell is preceded by a markdown cell (the narrative)."""
    return all(i > 0 and nb.cells[i - 1].cell_type == "markdown"
               for i, c in enumerate(nb.cells) if c.cell_type == "code")


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
    assert "IProgress" not in text and "ipywidgets" not in text


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_committed_notebook_is_current(name):
    """The recorded run (notebooks/run.py) matches the code cells and the package version."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    assert run.staleness(nb) == [], f"{name} is stale: rerun `python notebooks/run.py {name}`"
    meta = nb.metadata["symfield"]
    assert meta["version"] == symfield.__version__ and meta["code_sha256"] == run.code_sha256(nb)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_notebook_is_narrated(name):
    assert _narrated(nbformat.read(NOTEBOOKS / name, as_version=4))


def test_stale_copy_fails_the_check(tmp_path):
    """A copy with one code cell edited and not re-run is reported stale; so is another package version."""
    src = NOTEBOOKS / "03_g0_distributions.ipynb"
    nb = nbformat.read(src, as_version=4)
    run.stamp(nb, seconds=0.0)                        # current, whatever the committed copy's state
    assert run.staleness(nb) == []
    stale = copy.deepcopy(nb)
    cell = [c for c in stale.cells if c.cell_type == "code"][-1]
    cell.source = cell.source.replace("seed=0", "seed=1")
    assert cell.source != [c for c in nb.cells if c.cell_type == "code"][-1].source
    path = tmp_path / src.name
    nbformat.write(stale, path)                       # outputs and metadata unchanged: as if committed unrun
    problems = run.staleness(path)
    assert any("code_sha256" in p for p in problems), problems
    assert run.main(["--check", str(path)]) == 1      # the script's exit status says so too

    assert any("package is 99.0" in p for p in run.staleness(nb, version="99.0"))
    unstamped = copy.deepcopy(nb)
    del unstamped.metadata["symfield"]
    assert run.staleness(unstamped)
    reordered = copy.deepcopy(nb)
    [c for c in reordered.cells if c.cell_type == "code"][1].execution_count = 7   # one cell re-run by hand
    assert any("execution counts" in p for p in run.staleness(reordered))
