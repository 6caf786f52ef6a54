"""The package's structure, enforced: imports point only down the layers, no import cycles (imports
inside functions included), no private names imported across modules, one .npz writer, one
Chebyshev fitter, one time-limit helper, no function longer than 80 lines, and the public facade."""
import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "symfield"

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


def test_import_symfield_loads_neither_numba_nor_matplotlib():
    code = ("import sys, symfield; bad = [m for m in sys.modules if m.split('.')[0] in ('numba', 'matplotlib')];"
            "print(bad); raise SystemExit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("path", sorted(p for p in ROOT.parent.rglob("*") if p.suffix in (".py", ".md", ".ipynb")
                                        and ".git" not in p.parts and p.name != "test_layers.py"))
def test_nothing_cites_a_file_outside_the_repository(path):
    assert "MATH.md" not in path.read_text(errors="replace"), f"{path} cites MATH.md; cite docs/theory.md"


def _descent(fn):
    """The symfield modules a call enters, in order (consecutive repeats collapsed), by sys.setprofile."""
    seen = []

    def prof(frame, event, arg):
        if event == "call":
            mod = frame.f_globals.get("__name__", "")
            if mod.startswith("symfield") and (not seen or seen[-1] != mod):
                seen.append(mod)
    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


@pytest.mark.parametrize("spec", ["tanh+max2", "tanh", "relu"])
def test_propagate_is_one_descent_through_the_maps_engine(spec):
    """sf.propagate validates, then hands the whole computation to the maps engine, which alone picks the
    path (generated code, a table, quadrature): once the engine is entered, no theory module is entered again."""
    import symfield as sf
    name, _, pool = spec.partition("+")
    act = sf.activation(name, pool="max", k=2) if pool else sf.activation(name)
    sf.propagate(act, 1.5, 0.05, 3)                         # warm: compile, load tables
    walk = _descent(lambda: sf.propagate(act, 1.5, 0.05, 3))
    print(" -> ".join(m.removeprefix("symfield.") for m in walk))
    i = walk.index("symfield.numeric.maps")
    assert walk[0] == "symfield.theory.propagate"
    assert not [m for m in walk[i:] if _layer(m) in ("theory", "reports", "io", "cli", "sweep")], walk
