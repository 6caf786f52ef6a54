"""Execute the notebooks at full size and stamp them, so stale committed outputs can be detected.

    python notebooks/run.py                      # every notebook, in place, full size
    python notebooks/run.py 04_new_activation    # one (name with or without .ipynb)
    python notebooks/run.py --check              # report stale notebooks, exit 1 if any

A run executes every cell top to bottom with nbclient (``SYMFIELD_NB_SMALL`` removed from the kernel's
environment, so full sizes), tidies the stream outputs (consecutive stdout/stderr pieces merged, the
carriage-return redraws of progress bars collapsed to their final state) and records in the notebook's
metadata

    nb.metadata["symfield"] = {"version": symfield.__version__,
                               "code_sha256": code_sha256(nb),    # of the code cells, see below
                               "executed": UTC time (ISO 8601), "seconds": wall time, "small": False}

:func:`staleness` compares that record with the notebook as it is now: a code cell edited (or added,
removed, reordered) after the run changes the hash; a new package version changes the version. Either
means the committed outputs no longer show what the code does. ``tests/package/test_notebooks.py`` runs it on
every committed notebook.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import os
import re
import sys
import time
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
KEY = "symfield"              # the metadata entry
CELL_TIMEOUT = 3600           # seconds per cell (a full run of notebook 01 builds tables the first time)
SEPARATOR = "\n\x00\n"        # between code cells in the hash (cannot occur in a cell's source)


def code_sha256(nb) -> str:
    """sha256 (hex) of the notebook's code-cell sources in order, joined by SEPARATOR. Markdown,
    outputs and metadata do not enter: only a change of what runs makes the outputs stale."""
    sources = [c.source if isinstance(c.source, str) else "".join(c.source)
               for c in nb.cells if c.cell_type == "code"]
    return hashlib.sha256(SEPARATOR.join(sources).encode("utf-8")).hexdigest()


def package_version() -> str:
    import symfield
    return symfield.__version__


def staleness(nb, version: str | None = None) -> list[str]:
    """Why the notebook's outputs are stale ([] when they are current): no stamp, a stamp from a small
    run, code cells changed since the run, another package version, or cells not run in order 1..n."""
    if isinstance(nb, (str, Path)):
        nb = nbformat.read(nb, as_version=4)
    version = package_version() if version is None else version
    meta = nb.metadata.get(KEY)
    if not meta:
        return ["no run record (metadata.symfield): not executed with notebooks/run.py"]
    problems = []
    if meta.get("small", True):
        problems.append("executed at small sizes (SYMFIELD_NB_SMALL=1)")
    if meta.get("code_sha256") != code_sha256(nb):
        problems.append("code cells changed since the recorded run (code_sha256 differs)")
    if meta.get("version") != version:
        problems.append(f"run with symfield {meta.get('version')}, the package is {version}")
    counts = [c.get("execution_count") for c in nb.cells if c.cell_type == "code"]
    if counts != list(range(1, len(counts) + 1)):
        problems.append(f"code cells not executed once each, top to bottom (execution counts {counts})")
    return problems


def stamp(nb, seconds: float, small: bool = False) -> None:
    """Record the run in ``nb.metadata["symfield"]`` (call right after executing every cell)."""
    nb.metadata[KEY] = {"version": package_version(), "code_sha256": code_sha256(nb),
                        "executed": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                        "seconds": round(seconds, 1), "small": small}


def _terminal(text: str) -> str:
    """What a terminal would show: per line, only the text after the last carriage return."""
    lines = text.split("\n")
    return "\n".join(line.rstrip("\r").rsplit("\r", 1)[-1] for line in lines)


def tidy_streams(nb) -> None:
    """Keep what a terminal would show at the end: a progress bar's redraw (a write starting with a carriage
    return) replaces the unfinished line its stream wrote last, even when other output came in between;
    then consecutive stream outputs of the same name are merged and the empty ones dropped."""
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        last = {}          # stream name -> its latest output
        for out in cell.outputs:
            if out.output_type != "stream":
                continue
            prev = last.get(out.name)
            if prev is not None and out.text.startswith("\r") and not prev.text.endswith("\n"):
                prev.text = prev.text[:prev.text.rfind("\n") + 1]      # the redrawn line is overwritten
            last[out.name] = out
        outputs = [o for o in cell.outputs if not (o.output_type == "stream" and not o.text)]
        merged = []
        for out in outputs:
            if (out.output_type == "stream" and merged and merged[-1].output_type == "stream"
                    and merged[-1].name == out.name):
                merged[-1].text += out.text
            else:
                merged.append(out)
        for out in merged:
            if out.output_type == "stream":
                out.text = _terminal(out.text)
                out.text = re.sub(r"(?m)^[ \t]+$\n?", "", out.text)   # lines a closed bar blanked
        cell.outputs = [o for o in merged if not (o.output_type == "stream" and not o.text.strip())]


def execute(path, small: bool = False, out=None, timeout: int = CELL_TIMEOUT) -> float:
    """Run notebook ``path`` top to bottom in a fresh kernel (its own folder as working directory),
    tidy its streams, stamp it and write it to ``out`` (default: in place). Returns the wall time (s)."""
    import nbclient

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    saved = {k: os.environ.get(k) for k in ("SYMFIELD_NB_SMALL", "MPLBACKEND")}
    os.environ.pop("SYMFIELD_NB_SMALL", None)
    if small:
        os.environ["SYMFIELD_NB_SMALL"] = "1"
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    t0 = time.perf_counter()
    try:
        nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}}).execute()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    seconds = time.perf_counter() - t0
    tidy_streams(nb)
    stamp(nb, seconds, small)
    nbformat.write(nb, Path(out) if out else path)
    return seconds


def _paths(names):
    if not names:
        return sorted(HERE.glob("*.ipynb"))
    paths = []
    for n in names:
        n = n if n.endswith(".ipynb") else n + ".ipynb"
        paths.append(Path(n) if Path(n).exists() else HERE / Path(n).name)   # a path, or a name in notebooks/
    return paths


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="notebooks to run (default: all in notebooks/)")
    ap.add_argument("--check", action="store_true", help="only report stale notebooks; exit 1 if any")
    ap.add_argument("--small", action="store_true", help="small sizes (for trying; stamps small=True, "
                    "which --check reports as stale)")
    args = ap.parse_args(argv)
    stale = 0
    for path in _paths(args.names):
        if args.check:
            problems = staleness(path)
            stale += bool(problems)
            print(f"{path.name}: " + ("; ".join(problems) if problems else "current"))
            continue
        print(f"{path.name}: running ...", file=sys.stderr, flush=True)
        seconds = execute(path, small=args.small)
        size = path.stat().st_size
        print(f"{path.name}: {seconds:.1f} s, {size / 1e6:.2f} MB")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
