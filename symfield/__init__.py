"""symfield: exact mean-field theory of wide random neural networks at initialisation.

This module is the public face of the package: it re-exports exactly the documented API
(``__all__``). The layers below it -- ``core`` (validation, version, cache, time limits),
``symbolic`` (formulas, activations, Gaussian expectations, kernels, pools), ``numeric``
(evaluation, quadrature, tables, generated code), ``theory`` (maps, fixed points, phases,
recursions, finite width, IGB), ``simulate``, ``reports``/``io``, ``sweep`` and ``cli`` --
stay importable, and each imports only from the layers before it (tests/package/test_layers.py).
The theory is written up in docs/theory.md.
"""
from symfield.core.errors import SymfieldError
from symfield.core.version import __version__
from symfield import init  # sf.init: EOC initialisers for JAX/Flax and PyTorch (lazy imports)
from symfield.io import plots  # figures; matplotlib is imported only when one is drawn
from symfield.reports.bench import bench
from symfield.reports.derive import derive
from symfield.reports.verify import verify
from symfield.simulate import class_gradients, finite_data_gamma, simulate, simulate_jacobian
from symfield.sweep import SweepResult, sweep
from symfield.symbolic.activation import Activation, activation, activations
from symfield.symbolic.kernel import Kernel, kernel
from symfield.theory import igb
from symfield.theory.divergence import divergence
from symfield.theory.finite_width import finite_width
from symfield.theory.gram import GramFluctuations, gram_fluctuations
from symfield.theory.jacobian import IsometryDiagram, JacobianSpectrum, isometry_diagram, jacobian_spectrum
from symfield.theory.width_gain import WidthGain, width_gain
from symfield.theory.cstar import c_star
from symfield.theory.eoc import DepthEOC, EOCCurve, eoc, eoc_curve, eoc_depth
from symfield.theory.neutrality import neutrality
from symfield.theory.norm import BatchNormResult, batchnorm
from symfield.theory.phases import phase, xi_c, xi_q
from symfield.theory.qstar import FixedPoints, fixed_points, q_star
from symfield.theory.maps import (
    C,
    V,
    chi1,
    chi1_tilde,
    map_value,
    q_growth,
    q_map,
    qab_map,
)
from symfield.theory.phase_diagram import PhaseDiagram, phase_diagram
from symfield.theory.propagate import propagate
from symfield.theory.ntk import NTK, ntk
from symfield.theory.trainability import Trainability, trainability

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
