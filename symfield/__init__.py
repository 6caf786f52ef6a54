"""symfield: exact mean-field theory of wide random neural networks at initialisation.

This module is the public face of the package: it re-exports exactly the documented API
(``__all__``). The layers below it -- ``core`` (validation, version, cache, time limits),
``symbolic`` (formulas, activations, Gaussian expectations, kernels, pools), ``numeric``
(evaluation, quadrature, tables, generated code), ``theory`` (maps, fixed points, phases,
recursions, finite width, IGB), ``simulate``, ``reports``/``io``, ``sweep`` and ``cli`` --
stay importable, and each imports only from the layers before it (tests/package/test_layers.py).
The theory is written up in docs/theory.md.
"""
import importlib
import sys
import types

from symfield.core.errors import SymfieldError
from symfield.core.version import __version__

# The rest of the API is imported on first use (PEP 562), so that a process pays only for the layers it calls.
_MODULES = {"init": "symfield.init",       # sf.init: EOC initialisers for JAX/Flax and PyTorch (lazy imports)
            "plots": "symfield.io.plots",  # figures; matplotlib is imported only when one is drawn
            "igb": "symfield.theory.igb"}
_WHERE = {name: mod for mod, names in {      # name -> the module that defines it
    "symfield.reports.bench": "bench",
    "symfield.reports.derive": "derive",
    "symfield.reports.verify": "verify",
    "symfield.simulate": "class_gradients finite_data_gamma simulate simulate_jacobian",
    "symfield.sweep": "SweepResult sweep",
    "symfield.symbolic.activation": "Activation activation activations",
    "symfield.symbolic.kernel": "Kernel kernel",
    "symfield.theory.divergence": "divergence",
    "symfield.theory.finite_width": "finite_width",
    "symfield.theory.gram": "GramFluctuations gram_fluctuations",
    "symfield.theory.jacobian": "IsometryDiagram JacobianSpectrum isometry_diagram jacobian_spectrum",
    "symfield.theory.width_gain": "WidthGain width_gain",
    "symfield.theory.cstar": "c_star",
    "symfield.theory.eoc": "DepthEOC EOCCurve eoc eoc_curve eoc_depth",
    "symfield.theory.neutrality": "neutrality",
    "symfield.theory.norm": "BatchNormResult batchnorm",
    "symfield.theory.phases": "phase xi_c xi_q",
    "symfield.theory.qstar": "FixedPoints fixed_points q_star",
    "symfield.theory.maps": "C V chi1 chi1_tilde map_value q_growth q_map qab_map",
    "symfield.theory.phase_diagram": "PhaseDiagram phase_diagram",
    "symfield.theory.propagate": "propagate",
    "symfield.theory.ntk": "NTK ntk",
    "symfield.theory.trainability": "Trainability trainability",
}.items() for name in names.split()}


def __getattr__(name):
    if name in _MODULES:
        value = importlib.import_module(_MODULES[name])
    elif name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
    else:
        raise AttributeError(f"module 'symfield' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))


class _Facade(types.ModuleType):
    """``symfield.simulate`` and ``symfield.sweep`` stay the functions when the import system binds the submodules
    of the same names here (as it does when a submodule is first imported)."""

    def __setattr__(self, name, value):
        if not (name in _WHERE and isinstance(value, types.ModuleType)):
            super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Facade

__all__ = [
    "__version__",
    # activations and symbolic kernels
    "Activation", "activation", "activations", "Kernel", "kernel",
    # maps in numbers
    "V", "C", "map_value", "q_map", "qab_map", "chi1", "chi1_tilde", "q_growth",
    # fixed points, lines, phases
    "q_star", "fixed_points", "FixedPoints", "c_star", "xi_q", "xi_c", "eoc", "eoc_curve", "EOCCurve", "eoc_depth", "DepthEOC",
    "neutrality", "phase",
    # normalisation layers (docs/theory.md section 12)
    "batchnorm", "BatchNormResult",
    "PhaseDiagram", "phase_diagram",
    # recursions
    "propagate", "divergence", "finite_width", "igb",
    # neural tangent kernel and trainability (docs/theory.md section 13)
    "ntk", "NTK", "trainability", "Trainability",
    # finite width, two inputs
    "gram_fluctuations", "GramFluctuations", "width_gain", "WidthGain",
    # finite width by simulation
    "simulate", "class_gradients", "finite_data_gamma",
    # Jacobian spectrum (docs/theory.md section 11)
    "jacobian_spectrum", "JacobianSpectrum", "isometry_diagram", "IsometryDiagram", "simulate_jacobian",
    # reports and sweeps
    "derive", "verify", "bench", "sweep", "SweepResult",
    # figures
    "plots",
    # initialisers and diagnosis of recorded networks (symfield/init/)
    "init",
    # the root of every exception symfield raises (symfield/core/errors.py)
    "SymfieldError",
]
