"""The package's structure, enforced: imports point only down the layers, no import cycles (imports
inside functions included), no private names imported across modules, one .npz writer, one
Chebyshev fitter, one time-limit helper, no function longer than 80 lines, and the public facade."""
import ast
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2] / "symfield"

# lowest first; a module may import only from its own layer or the ones before it
LAYERS = ["core", "symbolic", "numeric", "theory", "simulate", "init", "reports", "io", "sweep", "cli", "facade"]


def _modules():
    out = {}
    for p in sorted(ROOT.rglob("*.py")):
        parts = p.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


MODULES = _modules()


def _layer(name):
    if name in ("symfield", "symfield.__main__"):
        return "facade"
    return name.split(".")[1]


def _imports(name, path):
    """(target module, imported name, line) for every symfield import in the file, at any depth."""
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            if base.split(".")[0] != "symfield":
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                yield (full if full in MODULES else base), alias.name, node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "symfield":
                    yield alias.name, None, node.lineno


EDGES = {n: sorted({t for t, _, _ in _imports(n, p) if t != n}) for n, p in MODULES.items()}


def test_every_layer_is_a_known_folder():
    assert {_layer(n) for n in MODULES} <= set(LAYERS)


def test_imports_point_only_down():
    bad = [f"{a} ({_layer(a)}) imports {b} ({_layer(b)})" for a, ts in EDGES.items() for b in ts
           if LAYERS.index(_layer(b)) > LAYERS.index(_layer(a))]
    assert not bad, "\n".join(bad)


def _cycles(edges):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert _cycles(EDGES) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]


def test_no_private_names_across_modules():
    bad = [f"{n}:{line} imports {name} from {t}" for n, p in MODULES.items() for t, name, line in _imports(n, p)
           if name and name.startswith("_") and not name.startswith("__") and t != n]
    assert not bad, "\n".join(bad)


def _calls(attr_names):
    hits = []
    for n, p in MODULES.items():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
                if name in attr_names:
                    hits.append(f"{n}:{node.lineno} {name}")
    return hits


def test_one_of_each_thing():
    assert _calls({"savez", "savez_compressed"}) == []            # .npz goes through core.files.save_npz
    writers = _calls({"write_array"})
    assert len(writers) == 1 and writers[0].startswith("symfield.core.files"), writers
    alarms = _calls({"setitimer", "alarm"})
    assert alarms == [] or all(a.startswith("symfield.core.timelimit") for a in alarms), alarms
    fits = _calls({"chebfit", "dct"})
    assert all(f.startswith("symfield.numeric.chebyshev") for f in fits), fits


def test_no_function_over_80_lines():
    long = []
    for n, p in MODULES.items():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > 80:
                    long.append(f"{n}.{node.name}: {length} lines")
    assert not long, "\n".join(long)


def test_facade_exports_the_documented_api():
    import symfield as sf
    for name in sf.__all__:
        assert hasattr(sf, name), name
    for name in ("bench", "propagate", "phase_diagram", "verify", "derive", "igb", "sweep", "finite_width"):
        assert name in sf.__all__


def test_import_symfield_loads_no_heavy_library():
    code = ("import sys, symfield; bad = [m for m in sys.modules if m.split('.')[0] in ('numba', 'matplotlib', 'sympy', 'scipy')];"
            "print(bad); raise SystemExit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("path", sorted(p for p in ROOT.parent.rglob("*") if p.suffix in (".py", ".md", ".ipynb")
                                        and ".git" not in p.parts and p.name != "test_layers.py"))
def test_nothing_cites_a_file_outside_the_repository(path):
    assert "MATH.md" not in path.read_text(errors="replace"), f"{path} cites MATH.md; cite docs/theory.md"


_DESCENT = """
import functools, importlib, pkgutil, sys, types
import symfield as sf
for m in [m for m in pkgutil.walk_packages(sf.__path__, "symfield.") if not m.name.endswith("__main__")]:
    importlib.import_module(m.name)
def recorder():
    seen, engine = [], [0]          # closures only: codegen.bind re-runs functions with other globals

    def wrap(f):
        mod = f.__module__
        inner = mod == "symfield.numeric.maps"

        @functools.wraps(f)
        def w(*args, **kwargs):
            here = (mod, engine[0] > 0)
            if not seen or seen[-1] != here:
                seen.append(here)
            engine[0] += inner
            try:
                return f(*args, **kwargs)
            finally:
                engine[0] -= inner
        return w
    return seen, wrap


seen, wrap = recorder()
mods = [m for n, m in sorted(sys.modules.items())          # kernels: compiled code, rebound by codegen
        if n.startswith("symfield") and not n.startswith("symfield.numeric.kernels")]
wrapped = {}
for m in mods:
    for owner in [m] + [c for c in vars(m).values() if isinstance(c, type) and c.__module__ == m.__name__]:
        for k, v in list(vars(owner).items()):
            if isinstance(v, types.FunctionType) and any(v.__module__ == x.__name__ for x in mods):
                wrapped.setdefault(id(v), (v, wrap(v)))
for m in mods:
    for owner in [m] + [c for c in vars(m).values() if isinstance(c, type)]:
        for k, v in list(vars(owner).items()):
            if id(v) in wrapped and wrapped[id(v)][0] is v:
                try:
                    setattr(owner, k, wrapped[id(v)][1])
                except (AttributeError, TypeError):
                    pass
name, pool = sys.argv[1], sys.argv[2]
act = sf.activation(name, pool="max", k=2) if pool else sf.activation(name)
sf.propagate(act, 1.5, 0.05, 3)                          # warm: derive, build or load tables
seen.clear()
sf.propagate(act, 1.5, 0.05, 3)
print(" ".join(m + ("*" if inside else "") for m, inside in seen))
"""


@pytest.mark.parametrize("spec", ["tanh+max2", "tanh", "relu"])
def test_propagate_is_one_descent_through_the_maps_engine(spec, tmp_path):
    """sf.propagate validates, then hands the whole computation to the maps engine, which alone picks the
    path (generated code, a table, quadrature): once the engine is entered, no theory module is entered again.

    The modules a call enters are recorded by wrapping every symfield function in a child process with
    numba's JIT disabled (the kernels then run as the same plain-Python functions). Not sys.setprofile:
    a profile function and the time limits' asynchronous exceptions (core.timelimit) spun CPython 3.11
    forever; a child process with a timeout cannot hang the test run."""
    name, _, pool = spec.partition("+")
    env = dict(os.environ, NUMBA_DISABLE_JIT="1", SYMFIELD_CACHE=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", _DESCENT, name, pool], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    walk = r.stdout.split()          # a module entered while the engine is on the stack ends in *
    print(" -> ".join(m.removeprefix("symfield.") for m in walk))
    assert walk[0] == "symfield.theory.propagate"
    assert "symfield.numeric.maps" in walk
    below = [m.rstrip("*") for m in walk if m.endswith("*")]
    assert below and not [m for m in below if _layer(m) in ("theory", "reports", "io", "cli", "sweep")], walk


def test_tests_mirror_the_layers():
    """Every test module lives in tests/<layer>/ (a package layer, or package/ for whole-package checks)."""
    tests = ROOT.parent / "tests"
    folders = {p.parent.name for p in tests.rglob("test_*.py")}
    loose = sorted(p.name for p in tests.glob("test_*.py"))
    assert not loose and folders <= (set(LAYERS) - {"facade"}) | {"package"}, (loose, folders)
