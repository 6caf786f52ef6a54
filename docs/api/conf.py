"""Sphinx configuration of the symfield API reference (offline: autodoc + napoleon, built-in theme).

Build: ``python -m sphinx -W --keep-going -b html docs/api <outdir>`` (tests/package/test_api_docs.py).
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import symfield  # noqa: E402

project = "symfield"
author = "symfield authors"
copyright = "2026, symfield authors"   # the footer; unset, alabaster prints a bare "©."
release = version = symfield.__version__
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_type_aliases = {"ArrayLike": "ArrayLike", "NDArray": "NDArray"}
autodoc_default_options = {"members": False}
html_theme = "alabaster"
html_static_path: list = []
exclude_patterns = ["_build"]
