"""symfield: exact mean-field theory of wide random neural networks at initialisation."""
from . import igb
from .activation import Activation, activation, activations
from .derive import derive
from .divergence import divergence
from .finite_width import finite_width
from .fixedpoint import c_star, eoc, eoc_curve, neutrality, phase, q_star, xi_c, xi_q
from .phase_diagram import PhaseDiagram, phase_diagram
from .kernel import Kernel, kernel
from .maps import C, V, chi1, chi1_tilde, map_value, q_growth, q_map, qab_map
from .propagate import propagate
from .simulate import class_gradients, finite_data_gamma, simulate
from .sweep import SweepResult, sweep
from .verify import verify

__version__ = "0.1.0"
