"""The public API stays typed and documented: every function in ``symfield.__all__`` has complete type
hints and a numpy-style docstring (Parameters / Returns / Examples), the public methods of the exported
result classes are typed, the docstring examples run, and the Sphinx reference in docs/api builds
offline with warnings as errors and names every exported object."""
import doctest
import inspect
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import symfield as sf

ROOT = pathlib.Path(__file__).resolve().parents[2]
FUNCTIONS = {n: getattr(sf, n) for n in sf.__all__ if inspect.isfunction(getattr(sf, n))}
CLASSES = {n: getattr(sf, n) for n in sf.__all__ if inspect.isclass(getattr(sf, n))}


def _missing_hints(func):
    sig = inspect.signature(func)
    out = [p.name for p in sig.parameters.values()
           if p.annotation is inspect.Parameter.empty and p.name not in ("self", "cls")]
    if sig.return_annotation is inspect.Signature.empty:
        out.append("return")
    return out


def _methods(cls):
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(member, property):
            yield f"{cls.__name__}.{name}", member.fget
        elif isinstance(member, (staticmethod, classmethod)):
            yield f"{cls.__name__}.{name}", member.__func__
        elif inspect.isfunction(member):
            yield f"{cls.__name__}.{name}", member


def test_the_public_api_is_found():
    assert len(FUNCTIONS) >= 35 and len(CLASSES) >= 8


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_public_functions_have_complete_type_hints(name):
    assert not _missing_hints(FUNCTIONS[name]), f"{name}: no type hint for {_missing_hints(FUNCTIONS[name])}"


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_public_methods_of_exported_classes_have_type_hints(name):
    bad = {m: _missing_hints(f) for m, f in _methods(CLASSES[name]) if _missing_hints(f)}
    assert not bad, bad


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_public_functions_have_numpy_docstrings(name):
    doc = inspect.getdoc(FUNCTIONS[name]) or ""
    wanted = ["Returns\n-------", "Examples\n--------"]
    if inspect.signature(FUNCTIONS[name]).parameters:
        wanted.insert(0, "Parameters\n----------")
        params = [p.name for p in inspect.signature(FUNCTIONS[name]).parameters.values()]
        section = doc.split("Parameters\n----------")[-1].split("Returns\n-------")[0]
        undocumented = [p for p in params if p not in section]
        assert not undocumented, f"{name}: parameters not in its Parameters section: {undocumented}"
    assert all(w in doc for w in wanted), f"{name}: docstring lacks {[w.split()[0] for w in wanted if w not in doc]}"


def test_docstring_examples_run():
    """The Examples of every exported function (cheap by design: the whole set runs in seconds)."""
    finder, runner = doctest.DocTestFinder(recurse=False), doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    globs = {"sf": sf, "np": np, **{n: getattr(sf, n) for n in sf.__all__}}
    for name, func in sorted(FUNCTIONS.items()):
        for test in finder.find(func, name, globs=dict(globs)):
            runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.attempted > 0 and result.failed == 0, result


def test_api_reference_builds_without_warnings(tmp_path):
    pytest.importorskip("sphinx")
    out = tmp_path / "html"
    run = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                          str(ROOT / "docs" / "api"), str(out)], capture_output=True, text=True, timeout=240,
                         cwd=ROOT)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-8000:]
    html = (out / "index.html").read_text()
    absent = [n for n in sf.__all__ if f'id="symfield.{n}"' not in html and n not in html]
    assert not absent, f"not in the API reference: {absent}"
    for name in list(FUNCTIONS) + list(CLASSES):
        assert f'id="symfield.{name}"' in html, name
    # the modules exported as modules: every public function of sf.init, sf.plots and sf.igb has an entry
    for mod, path in ((sf.init, "symfield.init"), (sf.plots, "symfield.io.plots"), (sf.igb, "symfield.theory.igb")):
        public = [n for n, f in vars(mod).items() if inspect.isfunction(f) and not n.startswith("_")
                  and f.__module__.split(".")[:mod.__name__.count(".") + 1] == mod.__name__.split(".")]
        missing = [n for n in public if f'id="{path}.{n}"' not in html]
        assert len(public) >= 9 and not missing, (path, missing)
    assert "eoc_homogeneous" not in html                 # an internal helper, not part of the API
    assert "&#169;." not in html and "symfield authors" in html.split("footer")[-1]   # once a bare "©."
