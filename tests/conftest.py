"""Shared test configuration: the one tolerance table, derived from the promises in README.md.

Errors are measured in each map's natural scale: V, dpsi2, chi1 relative; mean against sqrt(V(q));
C against sqrt(V(q1) V(q2)) and dC against sqrt(dpsi2(q1) dpsi2(q2)) (the Cauchy-Schwarz bounds of
each quantity).  Literals left inline in the tests are tighter than these (kept as measured) or
bound a test's own oracle (finite differences, an oracle's self-check, timing).
"""
import random
import sys
from pathlib import Path

import mpmath as mp
import pytest

from symfield.core import caches

sys.path.insert(0, str(Path(__file__).parent))   # test helpers (oracles, latex_reader) import by name

TOL = {
    # ---- float64 maps, relative to the natural scale
    "closed_float64": 1e-12,    # closed-form map in float64 vs mpmath at dps 30
    "quad_float64": 1e-10,      # README: quadrature-only map in float64 <= 1e-10 against an independent oracle
    #                             (mpmath quadrature, Hoeffding, argmax decomposition, a dps=N value)
    "rounding": 1e-14,          # exact up to rounding: a closed form vs an exact constant, one Gauss rule vs
    #                             an exact value or its doubled resolution (README: quadrature ~1e-14)
    "identity": 1e-13,          # two float64 paths equal in exact arithmetic (c = 0, 1 limits, sigma_w2/k
    #                             scaling, |c| = 1); 1-D level-set maps vs dps=N (numeric/pool/levelsets.py)
    "rule_float64": 1e-12,      # 2-D rules (h_k max_expect2, level sets at k <= 3, |c| <= 0.99) vs exact values
    #                             and each other, 1-D level-set maps vs exact (numeric/quadrature.py, levelsets.py)
    "table_float64": 1e-12,     # README: certified Chebyshev tables (numeric/tables.py), 1e-12 in scale
    "levelset_monotone": 1e-11,  # monotone phi through the level-set code vs the order-statistic code
    #                             (levelsets.py: measured 3e-12 for tanh at k = 8)
    "readback": 1e-9,           # a derived document's display read back and integrated by the test's own rule
    #                             (README: sf.verify's criterion, 1e-9 of scale)
    # ---- Monte Carlo of the defining integral: |value - mean| <= n standard errors + floor
    "mc_sigmas": 6.0,           # kernel maps of single nodes and monotone pools (many comparisons per seed)
    "mc_sigmas_strict": 5.0,    # README: 5 standard errors (sf.verify's criterion)
    "mc_floor": 1e-12,          # rounding floor, times max(1, |mean|) or |mean|, where the sample is constant
    # ---- mpmath: dps=N agrees with dps=N+20 (or an exact value) to N - slack digits, see tol_dps
    "dps_digits_slack": 1,
}


def tol_dps(n, slack=TOL["dps_digits_slack"]):
    """Tolerance of a dps=n result in its natural scale: 10^-(n - slack) (README: an error estimate
    above 10^-N raises ArithmeticError; slack 1 digit by default, 0 to compare with float64)."""
    return mp.mpf(10) ** (slack - n)


# Modules that test how tables are BUILT, cached and rebuilt: they run with the shipped tables off
# (symfield.numeric.shipped), so the builders, not a shipped copy, are exercised. Everything else
# runs as a user's process does, shipped tables on.
BUILDS_TABLES = {"test_tables", "test_tables_distance", "test_table1d", "test_cache_hostile"}



@pytest.fixture
def fresh_caches():
    """For a test that patches the table registry, paths or build constants: every in-process cache empty
    before it (no table, maps engine or 1-D table of an earlier test) and after it (nothing it built under
    its patches outlives it)."""
    caches.clear()
    yield
    caches.clear()


@pytest.fixture(autouse=True, scope="module")
def _shipped_tables(request):
    """Module scope, so module-scoped fixtures (caches built once per module) see it too. Every module
    starts with symfield's in-process caches empty (symfield.core.caches), as in a new process, and leaves
    them empty: no test sees tables, maps or kernels that another module's tests left behind."""
    caches.clear()
    with pytest.MonkeyPatch.context() as mp_:
        if request.module.__name__.rpartition(".")[2] in BUILDS_TABLES:
            mp_.setenv("SYMFIELD_SHIPPED", "0")
        yield
    caches.clear()


@pytest.fixture(autouse=True)
def _mpmath_precision():
    """mpmath's working precision is process-global: a test that sets mp.mp.dps must not change the
    oracles of the tests that run after it in the same worker."""
    prec = mp.mp.prec
    yield
    mp.mp.prec = prec


# ---- test order: `--shuffle SEED` runs the modules, and the tests inside each module, in an order drawn
# from SEED (printed in the header), to show that no test depends on what ran before it.
def pytest_addoption(parser):
    parser.addoption("--shuffle", type=int, default=None, metavar="SEED",
                     help="shuffle the order of test modules and of the tests inside each module with this seed")


def pytest_report_header(config):
    seed = config.getoption("--shuffle")
    if seed is not None:
        return f"test order: shuffled with --shuffle {seed}"


def pytest_collection_modifyitems(config, items):
    seed = config.getoption("--shuffle")
    if seed is None:
        return
    rng = random.Random(seed)
    modules: dict = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    order = list(modules)
    rng.shuffle(order)
    items[:] = [it for m in order for it in rng.sample(modules[m], len(modules[m]))]
