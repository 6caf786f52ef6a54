"""Jacobian spectrum at infinite width (docs/theory.md section 11) against independent oracles:
Fuss-Catalan numbers, the orthogonal linear point mass, m_1 as the product of sigma_w2 E[phi'^2] by
mpmath quadrature of the defining integral, the density's own normalisation, and seeded networks."""
import math
from math import comb

import mpmath
import numpy as np
import pytest

import symfield as sf
from symfield.simulate import simulate_jacobian
from symfield.theory.jacobian import isometry_diagram, jacobian_spectrum


def fuss_catalan(L, k):
    return comb((L + 1) * k, k) / (L * k + 1)


@pytest.mark.parametrize("L", [3, 10])
def test_linear_gaussian_fuss_catalan(L):
    r = jacobian_spectrum("linear", 1.0, 0.0, L, density=False)
    assert [float(m) for m in r.moments] == pytest.approx([fuss_catalan(L, k) for k in range(1, 7)], rel=1e-12)


def test_linear_gaussian_fuss_catalan_mpmath():
    r = jacobian_spectrum("linear", 1.0, 0.0, 10, dps=30, density=False)
    assert all(abs(m - fuss_catalan(10, k)) < mpmath.mpf(10) ** -25 * fuss_catalan(10, k)
               for k, m in enumerate(r.moments, 1))


def test_linear_orthogonal_is_a_point_mass():
    r = jacobian_spectrum("linear", 1.0, 0.0, 7, weights="orthogonal")
    assert [float(m) for m in r.moments] == pytest.approx([1.0] * 6, rel=1e-14)
    assert r.atoms == [(1.0, 1.0)] and r.var == 0 and r.condition == 1.0 and r.status == 0


@pytest.mark.parametrize("act,sw,sb,L,q0", [("tanh", 1.3, 0.05, 5, 1.0), ("erf", 2.0, 0.1, 4, 0.5),
                                            ("relu", 1.7, 0.2, 4, 2.0)])
def test_m1_is_the_product_of_layer_gains(act, sw, sb, L, q0):
    """m_1 = sigma_w2 prod_l sigma_w2 E[phi'(z^(l))^2], the expectation by mpmath.quad of the integral."""
    a = sf.activation(act)
    d1 = {"tanh": lambda u: 1 - mpmath.tanh(u) ** 2, "erf": lambda u: 2 / mpmath.sqrt(mpmath.pi) * mpmath.exp(-u * u),
          "relu": lambda u: 1.0 if u > 0 else 0.0}[act]
    q, prod = sw * q0 + sb, sw
    for _ in range(L - 1):
        e = mpmath.quad(lambda z: d1(mpmath.sqrt(q) * z) ** 2 * mpmath.npdf(z), [-mpmath.inf, 0, mpmath.inf])
        prod *= sw * e
        q = float(sf.q_map(a, q, sw, sb))
    r = jacobian_spectrum(act, sw, sb, L, q0=q0, density=False)
    assert float(r.moments[0]) == pytest.approx(float(prod), rel=1e-9)


@pytest.mark.parametrize("act,sw,sb,L,q0,w", [("linear", 1.0, 0.0, 3, 1.0, "gaussian"),
                                              ("relu", 2.0, 0.0, 6, 1.0, "orthogonal"),
                                              ("tanh", 1.0, 1e-4, 8, 0.01, "orthogonal"),
                                              ("tanh", 1.0, 1e-5, 8, 0.01, "orthogonal")])   # once NaN at 0.944
def test_density_is_normalised_with_mean_m1(act, sw, sb, L, q0, w):
    """The density (plus its atom at 0) integrates to 1 with mean m_1 and second moment m_2 (to 5e-3)."""
    r = jacobian_spectrum(act, sw, sb, L, q0=q0, weights=w)
    assert r.status in (0, 3)
    assert r.checks["mass"] == pytest.approx(1, abs=5e-3)
    assert r.checks["mean"] == pytest.approx(float(r.moments[0]), rel=1e-3)
    assert r.checks["second_moment"] == pytest.approx(float(r.moments[1]), rel=1e-3)


def test_fuss_catalan_edge():
    r = jacobian_spectrum("linear", 1.0, 0.0, 3)
    assert r.support[1] == pytest.approx(4 ** 4 / 27, rel=1e-9) and r.support[0] == 0


def _compare(act, sw, sb, L, w, width, nets):
    """Simulated m_1, m_2 vs theory: tolerance 4 standard errors (sampling over networks) plus 2 L/width
    of the theory value (the O(L/n) finite-width correction of the moments)."""
    s = simulate_jacobian(act, width, L, sw, sb, n_networks=nets, seed=11, weights=w)
    r = jacobian_spectrum(act, sw, sb, L, weights=w, density=False)
    for k in (1, 2):
        th = float(r.moments[k - 1])
        assert abs(s.mean(k) - th) <= 4 * s.stderr(k) + 2 * L / width * th, (k, s.mean(k), s.stderr(k), th)


def test_relu_gaussian_simulation():
    _compare("relu", 2.0, 0.0, 6, "gaussian", 300, 12)


@pytest.mark.slow
def test_relu_orthogonal_simulation():
    _compare("relu", 2.0, 0.0, 6, "orthogonal", 300, 12)


@pytest.mark.slow
@pytest.mark.parametrize("w", ["gaussian", "orthogonal"])
def test_tanh_eoc_simulation(w):
    sw = float(sf.eoc("tanh", 0.01).sigma_w2)
    _compare("tanh", sw, 0.01, 8, w, 300, 12)


def test_isometry_diagram_matches_pointwise():
    d = isometry_diagram("tanh", [1.0, 2.0], [0.0, 0.1], 4, weights="orthogonal")
    r = jacobian_spectrum("tanh", 2.0, 0.1, 4, weights="orthogonal", density=False)
    assert d.m2[1, 1] == pytest.approx(float(r.moments[1]), rel=1e-8) and d.status.max() == 0


@pytest.mark.parametrize("kw,name", [(dict(sigma_w2=-1.0), "sigma_w2"), (dict(depth=0), "depth"),
                                     (dict(weights="haar"), "weights"), (dict(q0=0.0), "q0"),
                                     (dict(sigma_b2=float("nan")), "sigma_b2")])
def test_bad_input(kw, name):
    args = dict(act="tanh", sigma_w2=1.0, sigma_b2=0.0, depth=3)
    args.update(kw)
    with pytest.raises(ValueError, match=f"'{name}' parameter of jacobian_spectrum"):
        jacobian_spectrum(**args)


def test_pools_are_refused():
    with pytest.raises(ValueError, match="'act' parameter"):
        jacobian_spectrum(sf.activation("relu", pool="max", k=2), 2.0, 0.0, 3)


# ---------------------------------------------------------------- the command line: symfield jacobian
def _main(capsys, *argv):
    from symfield.cli.main import main
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:   # argparse errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("L", [3, 10])
def test_cli_json_moments_are_fuss_catalan(capsys, L):
    import json
    code, out, err = _main(capsys, "jacobian", "linear", "--sigma-w2", 1, "--sigma-b2", 0, "--depth", L, "--json")
    assert code == 0 and err == "", err
    d = json.loads(out)
    assert [d[f"m{k}"] for k in range(1, 7)] == pytest.approx([fuss_catalan(L, k) for k in range(1, 7)], rel=1e-12)
    assert d["support"][0] == 0 and d["status"] == 0 and d["var"] == pytest.approx(fuss_catalan(L, 2) - 1)
    if L == 3:   # upper edge of the Fuss-Catalan law: (L+1)^(L+1)/L^L
        assert d["support"][1] == pytest.approx(4 ** 4 / 27, rel=1e-9)
        assert d["checks"]["mass"] == pytest.approx(1, abs=5e-3) and len(d["x"]) == len(d["pdf"]) > 100


def test_cli_dps_moments_to_all_digits(capsys):
    code, out, _ = _main(capsys, "jacobian", "linear", "--sigma-w2", 1, "--sigma-b2", 0, "--depth", 10, "--dps", 30)
    text = dict(line.split(None, 1) for line in out.strip().splitlines())
    assert code == 0
    for k in range(1, 7):
        assert len(text[f"m{k}"].replace(".", "").lstrip("0")) >= 30
        with mpmath.workdps(40):
            assert abs(mpmath.mpf(text[f"m{k}"]) / fuss_catalan(10, k) - 1) < mpmath.mpf(10) ** -28


def test_cli_orthogonal_linear_is_one_atom(capsys):
    import json
    code, out, _ = _main(capsys, "jacobian", "linear", "--sigma-w2", 1, "--sigma-b2", 0, "--depth", 4,
                         "--weights", "orthogonal", "--json")
    d = json.loads(out)
    assert code == 0 and [d[f"m{k}"] for k in range(1, 7)] == [1.0] * 6 and d["atoms"] == [[1.0, 1.0]]
    assert d["condition"] == 1.0 and d["var"] == 0


@pytest.mark.parametrize("argv,name", [(("--sigma-w2", -1), "sigma_w2"), (("--depth", 0), "depth"),
                                       (("--sigma-w2", "0:2:3"), "--sigma-w2"), (("--weights", "haar"), "--weights"),
                                       (("--q0", 0), "q0"), (("--n-networks", -1), "--n-networks"),
                                       (("--sigma-b2", "x"), "--sigma-b2"), (("--map", "--dps", 30), "--dps")])
def test_cli_bad_input_one_line_exit_2(capsys, argv, name):
    args = {"--sigma-w2": 1, "--sigma-b2": 0, "--depth": 3}
    flat = [a for k, v in args.items() if k not in argv for a in (k, v)]
    code, out, err = _main(capsys, "jacobian", "tanh", *flat, *argv)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and name in lines[0], err


def test_cli_flagged_status_exits_4(capsys, monkeypatch):
    import dataclasses

    import symfield.theory.jacobian as J
    real = J.jacobian_spectrum
    monkeypatch.setattr(J, "jacobian_spectrum", lambda *a, **k: dataclasses.replace(real(*a, **k), status=2))
    code, out, err = _main(capsys, "jacobian", "linear", "--sigma-w2", 1, "--sigma-b2", 0, "--depth", 2)
    assert code == 4 and "status 2" in err and len(err.strip().splitlines()) == 1 and "m1" in out


def test_cli_relu_plot_over_simulation(capsys, tmp_path):
    """relu: atom 1/2 at 0, condition inf (status 3 is a result: exit 0); --plot writes a PNG."""
    import json
    png = tmp_path / "relu.png"
    code, out, err = _main(capsys, "jacobian", "relu", "--sigma-w2", 2, "--sigma-b2", 0, "--depth", 3, "--width", 60,
                           "--n-networks", 2, "--plot", png, "--json")
    d = json.loads(out)
    assert code == 0 and err == "" and d["atoms"] == [[0.0, 0.5]] and d["condition"] == "inf" and d["status"] == 3
    assert d["m1"] == pytest.approx(2.0) and d["rel_var"] == pytest.approx(2 * 3 - 1)   # 2L - 1 at (2, 0)
    assert d["simulation"]["n_networks"] == 2 and png.stat().st_size > 10_000


def test_cli_map_matches_pointwise_and_plots(capsys, tmp_path):
    import json
    png = tmp_path / "iso.png"
    code, out, err = _main(capsys, "jacobian", "tanh", "--map", "--sigma-w2", "0.8:1.6:3", "--sigma-b2", "0:0.1:2",
                           "--depth", 4, "--weights", "orthogonal", "--plot", png, "--json")
    assert code == 0 and err == "", err
    d = json.loads(out)
    r = jacobian_spectrum("tanh", 1.6, 0.1, 4, weights="orthogonal", density=False)
    m1, m2 = float(r.moments[0]), float(r.moments[1])
    assert d["grid"] == [3, 2] and d["m1"][2][1] == pytest.approx(m1, rel=1e-8)
    assert d["rel_var"][2][1] == pytest.approx(m2 / m1 ** 2 - 1, rel=1e-8) and png.stat().st_size > 10_000


# ---------------------------------------------------------------- issue 28: q -> 0, per-point status, atoms away from 0
def _mp_layers(phi, dphi, sw, L, q0=1.0, stop=1e-40):
    """Independent oracle (mpmath quadrature of the defining integrals, 60 digits; the kink of elu at 0 is a
    breakpoint): the layer variances q^(l) while q > stop, and the relative variance of J J^T with Gaussian
    weights, rel_var = L + sum_l (d_2/d_1^2 - 1): for unit-mean free factors mu_2(a b) = mu_2(a) + mu_2(b) - 1,
    a Marchenko-Pastur factor has mu_2 = 2. Below stop, d_2/d_1^2 - 1 = O(q) adds < 1e-39."""
    with mpmath.workdps(60):
        E = lambda f, q: mpmath.quad(lambda z: f(mpmath.sqrt(q) * z) * mpmath.npdf(z), [-mpmath.inf, -8, 0, 8, mpmath.inf])
        q, qs, rel = mpmath.mpf(sw) * q0, [], mpmath.mpf(L)
        for _ in range(1, L):
            if q < stop:
                break
            qs.append(q)
            d1, d2 = E(lambda u: dphi(u) ** 2, q), E(lambda u: dphi(u) ** 4, q)
            rel += d2 / d1 ** 2 - 1
            q = sw * E(lambda u: phi(u) ** 2, q)
        return [float(v) for v in qs], float(rel)


ELU = (lambda u: u if u > 0 else mpmath.expm1(u), lambda u: 1 if u > 0 else mpmath.exp(u))
TANH = (mpmath.tanh, lambda u: 1 / mpmath.cosh(u) ** 2)


@pytest.mark.parametrize("act,fns", [pytest.param("tanh", TANH, marks=pytest.mark.slow), ("elu", ELU)])   # tanh ~11 s
def test_variance_decaying_to_zero_is_evaluated_by_its_exact_limit(act, fns):
    """sigma_w2 = 0.01, sigma_b2 = 0: q^(l) ~ 0.01^l underflows to 0 near layer 155. Once failed with
    "The 'q' parameter of q_map must be a finite float > 0" (or a quadrature error at q = 3e-314). Now the
    q -> 0 limit carries on (elu: kinked at 0, one-sided series); m_1 ~ 1e-400 is flagged as out of the
    float64 range (status 4) while rel_var, computed from the normalised moments, matches the oracle."""
    r = jacobian_spectrum(act, 0.01, 0.0, 200, density=False)
    qs, rel = _mp_layers(*fns, 0.01, 200)
    assert r.status == 4 and float(r.moments[0]) == 0.0 and "float64 range" in r.message
    assert r.rel_var == pytest.approx(rel, rel=1e-13)
    np.testing.assert_allclose([float(v) for v in r.q[:len(qs)]], qs, rtol=1e-12)
    assert float(r.q[-1]) == 0.0


def test_map_with_underflowing_points_exits_4_with_a_count(capsys):
    """The issue's map (shrunk): once exit 2 for the whole grid; now every point has a status, the points whose
    m1 or m2 leave the float64 range are counted on one stderr line, and rel_var is given at each of them."""
    import csv
    import io
    code, out, err = _main(capsys, "jacobian", "tanh", "--map", "--sigma-w2", "0.01:2.01:3", "--sigma-b2", "0:0.1:2",
                           "--depth", 200)
    rows = list(csv.DictReader(io.StringIO(out.split("\n", 1)[1])))
    assert code == 4 and len(err.strip().splitlines()) == 1, err
    flagged = [r for r in rows if r["status"] == "4"]
    assert f"of 6 grid points, {len(flagged)} have m1 or m2 outside the float64 range" in err and flagged
    assert all(np.isfinite(float(r["rel_var"])) for r in rows)
    one = jacobian_spectrum("tanh", 0.01, 0.0, 200, density=False)
    assert float(rows[0]["rel_var"]) == pytest.approx(one.rel_var, rel=1e-12) and rows[0]["status"] == "4"


ROOTISH = "x + abs(x)**1.5"   # not analytic at 0: no q -> 0 limit, so a variance that underflows cannot go on


def test_a_point_that_cannot_be_computed_gets_status_5_and_names_the_users_parameters(capsys):
    d = isometry_diagram(ROOTISH, [0.5], [0.0, 0.01], 1100, q0=0.01)
    assert d.status.tolist() == [[5, 4]]
    assert "layer" in d.errors[0, 0] and "not available" in d.errors[0, 0] and d.errors[0, 1] == ""
    assert np.isnan(d.m1[0, 0]) and np.isfinite(d.rel_var[0, 1])
    with pytest.raises(ArithmeticError) as e:
        jacobian_spectrum(ROOTISH, 0.5, 0.0, 1100, q0=0.01)
    msg = str(e.value)
    assert "sigma_w2=0.5" in msg and "depth=1100" in msg and "q_map" not in msg and "\n" not in msg
    code, out, err = _main(capsys, "jacobian", ROOTISH, "--map", "--sigma-w2", 0.5, "--sigma-b2", "0:0.01:2",
                           "--depth", 1100, "--q0", 0.01)
    assert code == 4 and "1 could not be computed (status 5" in err and len(err.strip().splitlines()) == 1, err


def test_orthogonal_relu_depth_2_is_two_atoms():
    """L = 2, orthogonal W = sqrt(2) O: J J^T = W_2 D_1 (W_1 W_1^T) D_1 W_2^T = 4 O_2 D_1^2 O_2^T, and D_1^2 is a
    Bernoulli(1/2) mask: eigenvalues exactly {0: 1/2, 4: 1/2} (m_k = 4^k/2). Once status 2 (only the atom at
    0 was seen, the mass check found 1/2); now both atoms, mass 1, mean 2, and status 3 (condition inf)."""
    r = jacobian_spectrum("relu", 2.0, 0.0, 2, weights="orthogonal")
    assert [float(m) for m in r.moments] == [4 ** k / 2 for k in range(1, 7)]
    assert r.atoms == [(0.0, 0.5), (4.0, 0.5)] and r.status == 3 and r.condition == math.inf
    assert r.checks == {"mass": 1.0, "mean": 2.0, "second_moment": 8.0} and len(r.x) == 0


def test_orthogonal_leaky_relu_depth_2_atoms_and_condition():
    """leaky_relu(0.2) at L = 2: D_1^2 in {0.04, 1} with mass 1/2 each, so J J^T = sigma_w2^2 D_1^2 has
    the atoms {0.04 sw^2: 1/2, sw^2: 1/2} and condition sqrt(1/0.04) = 5 (status 0)."""
    sw = 1.7
    r = jacobian_spectrum("leaky_relu(0.2)", sw, 0.0, 2, weights="orthogonal")
    assert [a for a, _ in r.atoms] == pytest.approx([0.04 * sw ** 2, sw ** 2], rel=1e-14)
    assert [m for _, m in r.atoms] == pytest.approx([0.5, 0.5], abs=1e-15)
    assert r.status == 0 and r.condition == pytest.approx(5.0, rel=1e-12)


def test_orthogonal_atom_away_from_0_beside_a_density():
    """phi = max(x, -1), L = 3, orthogonal: D_l^2 is a projection of trace p_l = P(z > -1/sqrt(q^(l))). By the
    free product of two projections (Belinschi's rule), J J^T = sw^3 P Q P has an atom at sw^3 of mass
    p_1 + p_2 - 1 and one at 0 of mass max(1 - p_1, 1 - p_2), the rest continuous; q^(2) by mpmath quadrature."""
    sw, q0 = 1.0, 0.1
    with mpmath.workdps(30):
        q1 = mpmath.mpf(sw) * q0
        q2 = sw * mpmath.quad(lambda z: max(mpmath.sqrt(q1) * z, -1) ** 2 * mpmath.npdf(z),
                              [-mpmath.inf, -1 / mpmath.sqrt(q1), mpmath.inf])
        p1, p2 = (mpmath.ncdf(1 / mpmath.sqrt(q)) for q in (q1, q2))
    r = jacobian_spectrum("max(x,-1)", sw, 0.0, 3, q0=q0, weights="orthogonal")
    (z0, m0), (z1, m1) = r.atoms
    assert z0 == 0 and m0 == pytest.approx(float(max(1 - p1, 1 - p2)), rel=1e-9)
    assert z1 == pytest.approx(sw ** 3, rel=1e-12) and m1 == pytest.approx(float(p1 + p2 - 1), rel=1e-12)
    assert r.status == 0 and r.checks["mass"] == pytest.approx(1, abs=5e-3)
    assert r.checks["mean"] == pytest.approx(float(r.moments[0]), rel=5e-3)


def test_gaussian_weights_have_no_atoms_away_from_0():
    """Marchenko-Pastur factors have no atoms, so with Gaussian weights only the atom at 0 remains."""
    r = jacobian_spectrum("relu", 2.0, 0.0, 2)
    assert r.atoms == [(0.0, 0.5)] and r.status == 3 and r.checks["mass"] == pytest.approx(1, abs=5e-3)


def test_cli_underflow_single_point_exits_4(capsys):
    code, out, err = _main(capsys, "jacobian", "tanh", "--sigma-w2", 0.01, "--sigma-b2", 0, "--depth", 200)
    text = dict(line.split(None, 1) for line in out.strip().splitlines())
    assert code == 4 and "status 4" in err and len(err.strip().splitlines()) == 1
    assert float(text["rel_var"]) == pytest.approx(jacobian_spectrum("tanh", 0.01, 0.0, 200, density=False).rel_var)
