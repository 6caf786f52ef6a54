"""symfield: exact mean-field theory of wide random neural networks at initialisation."""
from .activation import Activation, activation, activations
from .kernel import Kernel, kernel

__version__ = "0.1.0"
from .maps import C, V, chi1, chi1_tilde, map_value, q_growth, q_map, qab_map
from .fixedpoint import c_star, eoc, eoc_curve, neutrality, phase, q_star
from .propagate import propagate
from .divergence import divergence
from . import igb
