"""neutrality(dps=N): the float64 root refined by a few full-precision secant steps, checked against
independent high-precision roots of the defining equation (docs/theory.md section 5):
sigma_w2 = (q - sigma_b2)/V(q) with (sigma_w2 C(q, q, q/2) + sigma_b2)/q = 1/2."""
import math

import mpmath
import pytest

import symfield as sf
from symfield.reports.oracles import mp_expect1, mp_expect2
from symfield.theory import neutrality as fp


def _oracle(V, C, sb, q0, dps):
    """sigma_w2 on the neutrality line from the maps V(q), C(q) = C(q, q, q/2), by mpmath.findroot at dps."""
    with mpmath.workdps(dps):
        sb = mpmath.mpf(repr(sb))     # the decimal, as symfield reads python floats

        def h(q):
            return ((q - sb) / V(q) * C(q) + sb) / q - mpmath.mpf(1) / 2
        # stop once a secant step is below 10^(10 - dps): the next iterate is then at the working precision's
        # noise floor (superlinear convergence).  10^(10 - 2 dps) was below that floor, so every call ran all
        # 30 steps (tanh at dps 40: 31 nested quadratures of C instead of 6, past the 600 s hang guard)
        q = mpmath.findroot(h, mpmath.mpf(q0), solver="secant", tol=mpmath.mpf(10) ** (10 - dps))
        return (q - sb) / V(q)


def _erf_oracle(sb, q0, dps=50):
    """erf: V(q) = (2/pi) asin(2q/(1 + 2q)), C(q, q, q/2) = (2/pi) asin(q/(1 + 2q)) (arcsine kernel)."""
    return _oracle(lambda q: 2 / mpmath.pi * mpmath.asin(2 * q / (1 + 2 * q)),
                   lambda q: 2 / mpmath.pi * mpmath.asin(q / (1 + 2 * q)), sb, q0, dps)


def _tanh_oracle(sb, q0, dps, degree):
    """tanh: V and C by the nested Gauss-Legendre oracles of symfield.reports.oracles."""
    return _oracle(lambda q: mp_expect1(lambda x: mpmath.tanh(x) ** 2, q, dps=dps),
                   lambda q: mp_expect2(mpmath.tanh, mpmath.tanh, q, q, q / 2, dps=dps, degree=degree),
                   sb, q0, dps)


def _digits(a, b):
    """Decimal digits of agreement of a with b (compared at 80 digits)."""
    with mpmath.workdps(80):
        return float(-mpmath.log10(abs(a - b) / abs(b))) if a != b else math.inf


@pytest.mark.parametrize("sb", [0.1, 0.5])
def test_erf_dps30_matches_closed_form_root(sb):
    got = sf.neutrality("erf", sb, dps=30)
    q0 = float(sf.q_star("erf", float(got), sb))
    want = _erf_oracle(sb, q0)
    assert isinstance(got, mpmath.mpf)
    assert _digits(got, want) >= 29.5, (sb, got, want)
    assert abs(float(got) - sf.neutrality("erf", sb)) < 1e-9


def test_erf_by_quadrature_matches_closed_form_root(monkeypatch):
    """erf's C at dps by quadrature, as for an activation without a closed form (Mehler's series at
    c = 1/2, every call certified, none declined): the root still has 30 digits of the arcsine kernel's."""
    from symfield.numeric import quadrature as Q
    from symfield.numeric.context import objects
    from symfield.numeric.maps import MpMaps
    series, real = [], Q._e2_mehler
    monkeypatch.setattr(Q, "_e2_mehler", lambda *a: series.append(real(*a)) or series[-1])
    monkeypatch.setattr(MpMaps, "C_eq", lambda self, q, c: objects(
        [Q.expect2(mpmath.erf, mpmath.erf, x, x, c * x, dps=self.dps) for x in q]))
    got = sf.neutrality("erf", 0.1, dps=30)
    assert len(series) >= 2 and None not in series
    assert _digits(got, _erf_oracle(0.1, float(sf.q_star("erf", float(got), 0.1)))) >= 29.5


def test_refinement_takes_few_full_precision_steps(monkeypatch):
    """The mp maps are evaluated a handful of times (secant from the float64 root), not ~30 (bracketing)."""
    calls = []
    from symfield.numeric.maps import MpMaps
    real = MpMaps.C_eq
    monkeypatch.setattr(MpMaps, "C_eq", lambda self, q, c: calls.append(1) or real(self, q, c))
    got = sf.neutrality("erf", 0.3, dps=40)
    assert 2 <= len(calls) <= 4, len(calls)
    q0 = float(sf.q_star("erf", float(got), 0.3))
    assert _digits(got, _erf_oracle(0.3, q0, dps=60)) >= 39.5


def test_unconverged_refinement_raises(monkeypatch):
    """A residual that cannot reach 10^-dps (maps with +-1e-12 noise) is refused, not returned."""
    real, flips = fp.neutral_residual, []

    def off(N, q, sb):
        sw, h = real(N, q, sb)
        if N.dps is None:
            return sw, h
        flips.append(1)
        return sw, h + mpmath.mpf("1e-12") * (-1) ** len(flips)
    monkeypatch.setattr(fp, "neutral_residual", off)
    with pytest.raises(ArithmeticError, match="neutrality"):
        sf.neutrality("erf", 0.2, dps=30)


@pytest.mark.slow
@pytest.mark.parametrize("sb, dps", [(0.1, 15), (0.1, 30)])
def test_tanh_matches_quadrature_oracle(sb, dps):
    got = sf.neutrality("tanh", sb, dps=dps)
    q0 = float(sf.q_star("tanh", float(got), sb))
    want = _tanh_oracle(sb, q0, dps + 10, 4 if dps <= 15 else 5)
    assert _digits(got, want) >= dps - 0.5, (got, want)


@pytest.mark.parametrize("spec", ["tanh", "gelu", "relu+max2", "tanh+avg2", "softplus"])
def test_floor_of_c_at_one_half_is_below_c(spec):
    """The neutrality search skips C where max(E[psi]^2, V - q E[psi'^2]/2) already puts h above 0: that floor
    is below C(q, q, q/2) (against mpmath quadrature of the defining integral for the single-node phi; the
    engine's certified C for the pools), and close to it somewhere (not a vacuous bound)."""
    import numpy as np   # noqa: PLC0415
    import sympy as sp   # noqa: PLC0415

    from symfield.numeric.maps import maps   # noqa: PLC0415
    name, _, pool = spec.partition("+")
    act = sf.activation(name, pool=pool[:3], k=int(pool[3:])) if pool else sf.activation(name)
    N = maps(sf.kernel(act))
    gaps = []
    for q in (0.05, 0.5, 2.0, 8.0):
        v = float(N.V(np.array([q]))[0])
        floor = fp._c_half_floor(N, q, v)
        if pool:
            c = float(N.C_eq(np.array([q]), 0.5)[0])
        else:
            phi = act.expr
            f = sp.lambdify(next(iter(phi.free_symbols)), phi, "mpmath")
            c = float(mp_expect2(f, f, q, q, q / 2, dps=20))
        assert floor <= c + 1e-13 * v, (q, floor, c)
        gaps.append((c - floor) / v)
    assert min(gaps) < 0.2
