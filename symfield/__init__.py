"""symfield: exact mean-field theory of wide random neural networks at initialisation."""
from . import igb
from .activation import Activation, activation, activations
from .divergence import divergence
from .fixedpoint import c_star, eoc, eoc_curve, neutrality, phase, q_star, xi_c, xi_q
from .phase_diagram import PhaseDiagram, phase_diagram
from .kernel import Kernel, kernel
from .maps import C, V, chi1, chi1_tilde, map_value, q_growth, q_map, qab_map
from .propagate import propagate

__version__ = "0.1.0"
