"""Shared test configuration: the one tolerance table, derived from method and precision."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

# Relative tolerances (errors are measured against the natural scale of each map:
# V and dpsi2 relative, mean against sqrt(V), C against sqrt(V(q1) V(q2)), dC against
# sqrt(dpsi2(q1) dpsi2(q2)) -- the Cauchy-Schwarz bounds of each quantity).
TOL = {
    "closed_float64": 1e-12,      # closed-form map in float64 vs mpmath at dps 30
    "quad_float64": 1e-10,        # quadrature-only map in float64 vs mpmath quadrature
    "mc_sigmas": 6.0,             # Monte Carlo: |value - mean| <= 6 standard errors
    "dps_digits_slack": 1,        # dps=N agrees with dps=N+20 to N-1 digits
}
