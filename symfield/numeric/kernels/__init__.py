"""Compiled code as plain Python: the kernels numba compiles, in real modules (docs/numerics.md section 2).

Each module here is ordinary Python that runs as it is (tests, the NumPy and mpmath paths) and is copied,
below its ``# ---- compiled ----`` line, into the generated modules that numba compiles
(:mod:`symfield.numeric.codegen`). Above that line: the docstring, imports and stand-ins that the copy
does not need. The decorator ``njit`` of :mod:`.jit` is the identity here and numba's own in the copy.

:mod:`.layout`      the packed table's header fields and the recursion's status codes (one place);
:mod:`.table_maps`  V, C, D of a certified table read from its packed array M;
:mod:`.recursion`   the layer step and the grid kernel, written against maps V, C, D, in_domain.
"""
