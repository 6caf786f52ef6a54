"""Two-input finite-width theory (sf.gram_fluctuations, sf.width_gain) against exact identities,
mpmath quadrature of the defining integrals and seeded simulations of real finite networks."""
import mpmath as mp
import numpy as np
import pytest
import sympy as sp

import symfield as sf
from symfield.numeric.evaluate import evaluate
from symfield.symbolic import gaussian as G
from symfield.symbolic.formula import X as x
from symfield.symbolic.gram_moments import VARS, gram_moments

IDX = ((0, 0), (1, 1), (0, 1))


def inputs(qa, qb, qab, d=50):
    """Two inputs with |x_a|^2/d = qa, |x_b|^2/d = qb, x_a.x_b/d = qab."""
    X = np.zeros((2, d))
    X[0, 0] = np.sqrt(qa * d)
    X[1, 0] = qab * d / X[0, 0]
    X[1, 1] = np.sqrt(qb * d - X[1, 0] ** 2)
    return X


def simulated(act, sw, sb, depth, q0, width, nets, seed):
    sim = sf.simulate(act, width, depth, sw, sb, n_inputs=2, n_networks=nets, seed=seed, inputs=inputs(*q0))
    E = np.stack([sim.gram[:, :, i, j] for i, j in IDX], axis=-1)          # (nets, depth, 3)
    cov = np.stack([np.cov(E[:, l].T) for l in range(depth)]) * width
    c = sim.gram[:, :, 0, 1] / np.sqrt(sim.gram[:, :, 0, 0] * sim.gram[:, :, 1, 1])
    return E.mean(0), cov, c.var(0, ddof=1)


def angular_oracle(f, g, n, m, a, b, ab):
    """E[f(u) g(v)] for f, g homogeneous of degrees n, m: in polar coordinates the radial integral is
    int r^(n+m+1) e^(-r^2/2) dr (mpmath.quad here, not a formula) times the angular mean of
    f(cos t) g(cos(t - theta)), a 1-D mpmath.quad split where the signs change."""
    F, Gf = sp.lambdify(x, f, "mpmath"), sp.lambdify(x, g, "mpmath")
    with mp.workdps(25):
        th = mp.acos(mp.mpf(ab) / mp.sqrt(mp.mpf(a) * b))
        pts = [-mp.pi / 2, th - mp.pi / 2, mp.pi / 2, th + mp.pi / 2, 3 * mp.pi / 2]
        ang = mp.quad(lambda t: F(mp.cos(t)) * Gf(mp.cos(t - th)), pts) / (2 * mp.pi)
        rad = mp.quad(lambda r: r ** (n + m + 1) * mp.exp(-r * r / 2), [0, mp.inf])
        return ang * rad * mp.mpf(a) ** (mp.mpf(n) / 2) * mp.mpf(b) ** (mp.mpf(m) / 2)


def hermite_oracle(f, g, a, b, ab, nodes=160):
    """E[f(u) g(v)] for smooth f, g by a tensor Gauss-Hermite rule in the Cholesky coordinates."""
    z, w = np.polynomial.hermite_e.hermegauss(nodes)
    w = w / np.sqrt(2 * np.pi)
    c = ab / np.sqrt(a * b)
    u = np.sqrt(a) * z[:, None]
    v = np.sqrt(b) * (c * z[:, None] + np.sqrt(1 - c * c) * z[None, :])
    return float(np.sum(w[:, None] * w[None, :] * f(u) * g(v)))


# ---------------------------------------------------------------- exact identities
def test_relu_single_input_vertex_is_5_l_minus_1():
    g = sf.gram_fluctuations("relu", 2.0, 0.0, depth=7, q0=(1.0, 1.0, 0.25))
    assert g.moments.closed_form
    l = np.arange(1, 8)
    np.testing.assert_allclose(g.metric_cov[:, 0, 0] / g.K[:, 0] ** 2, 5 * (l - 1), rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(g.K1[:, :2], 0, atol=1e-13)   # <relu^2>_K = K/2 is linear: no mean shift
    # Wishart part of the empirical Gram: n Var(Ghat_aa) = V + 2 K^2
    np.testing.assert_allclose(g.gram_cov[:, 0, 0] / g.K[:, 0] ** 2, 5 * (l - 1) + 2, rtol=1e-13)


def test_relu_vertex_at_dps30_to_28_digits():
    g = sf.gram_fluctuations("relu", 2.0, 0.0, depth=5, q0=(1.0, 1.0, 0.3), dps=30)
    with mp.workdps(30):
        for l in range(5):
            assert abs(g.metric_cov[l, 0, 0] / g.K[l, 0] ** 2 - 5 * l) < mp.mpf(10) ** -28
    f = sf.gram_fluctuations("relu", 2.0, 0.0, depth=5, q0=(1.0, 1.0, 0.3))
    np.testing.assert_allclose(f.gram_cov.astype(float), g.gram_cov.astype(float), rtol=1e-12)


@pytest.mark.parametrize("act", ["erf", "tanh"])
def test_diagonal_is_the_single_input_theory(act):
    g = sf.gram_fluctuations(act, 1.7, 0.1, depth=4, q0=(0.8, 1.3, 0.2))
    for col, q in ((0, 0.8), (1, 1.3)):
        fw = sf.finite_width(act, 1.7, 0.1, 4, q0=q)
        np.testing.assert_allclose(g.K[:, col], fw.K, rtol=1e-13)
        np.testing.assert_allclose(g.metric_cov[:, col, col], fw.V, rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(g.K1[:, col], fw.K1, rtol=1e-10, atol=1e-14)


def test_higher_arc_cosine_kernels_against_mpmath():
    relu, leaky = sp.Max(x, 0), sp.Max(x, 0) + sp.Min(x, 0) / 5
    for f, g_, n, m in ((relu**2, relu**2, 2, 2), (relu**3, relu, 3, 1), (relu, relu**3, 1, 3),
                        (leaky**2, leaky**2, 2, 2), (sp.Abs(x) ** 3, sp.Abs(x), 3, 1), (relu**4, relu**0 * 1, 4, 0)):
        e = G.expect2(f, g_)
        assert e.method in ("arccos", "basis"), e.method
        for pt in ((1.3, 0.7, 0.4), (2.0, 0.5, -0.6), (1.0, 1.0, 0.999)):
            val = float(e.value.subs(dict(zip(VARS, pt))))
            ref = float(angular_oracle(f, g_, n, m, *pt))
            assert abs(val - ref) <= 1e-13 * abs(ref), (f, g_, pt, val, ref)


def test_tanh_moments_and_derivatives():
    """Fourth moments against a Gauss-Hermite oracle; the Price/scale-identity gradient and Hessian
    of C against Richardson differences of C's own quadrature (two independent routes)."""
    gm = gram_moments("tanh")
    pt = (1.1, 0.6, 0.35)
    for expr, (i, j) in ((gm.m22, (2, 2)), (gm.m31, (3, 1)), (gm.m13, (1, 3))):
        val = float(evaluate(expr, VARS, pt))
        ref = hermite_oracle(lambda t: np.tanh(t) ** i, lambda t: np.tanh(t) ** j, *pt)
        assert abs(val - ref) < 1e-12 * abs(ref)
    from symfield.theory.gram import _fd   # noqa: PLC0415
    g, H, err = _fd(lambda a, b, c: evaluate(gm.C, VARS, (a, b, c)), np.array([pt]))
    assert err[0] < 1e-8
    np.testing.assert_allclose([float(evaluate(e, VARS, pt)) for e in gm.grad], g[0], rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose([[float(evaluate(e, VARS, pt)) for e in row] for row in gm.hess], H[0],
                               rtol=1e-7, atol=1e-9)


def test_max_pool_numeric_derivative_agrees_with_the_argmax_integral():
    """relu+max2: the Richardson gradient in q12 against dC/dq12 = the argmax (Price) integral."""
    act = sf.activation("relu", pool="max", k=2)
    gm = gram_moments(act)
    assert gm.grad is None
    g = sf.gram_fluctuations(act, 1.2, 0.1, depth=2, q0=(1.0, 0.7, 0.3))
    K = g.K[0]
    dC = float(evaluate(sf.kernel(act).dC, VARS, tuple(K), sf.kernel(act).kinks))
    from symfield.theory.gram import _Eval   # noqa: PLC0415  (the layer terms at layer 1)
    _, J, H, S, st = _Eval(act, None).layer_terms(K[None])
    assert st[0] == 0
    assert abs(J[0, 2, 2] - dC) < 1e-9 * abs(dC)


# ---------------------------------------------------------------- against seeded simulations
CASES = [  # act, sigma_w2, sigma_b2, q0, width, networks, layers checked, tol on the relative Frobenius error
    ("relu", 2.0, 0.0, (1.0, 1.0, 0.3), 2000, 3000, (1, 3), 0.08),
    ("tanh", 1.5, 0.1, (1.0, 0.8, 0.3), 200, 4000, (1, 3), 0.08),
    pytest.param(("gelu", 1.8, 0.05, (1.0, 1.0, 0.5), 2000, 3000, (1, 3), 0.08), marks=pytest.mark.slow),
    (sf.activation("relu", pool="max", k=2), 1.0, 0.1, (1.0, 1.0, 0.3), 200, 3000, (1, 2), 0.10),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: str(c[0]))
def test_gram_covariance_against_seeded_simulations(case):
    act, sw, sb, q0, n, nets, layers, tol = case
    depth = max(layers) + 1
    g = sf.gram_fluctuations(act, sw, sb, depth, q0=q0)
    assert (g.status == 0).all()
    mean, cov, cvar = simulated(act, sw, sb, depth, q0, n, nets, seed=11)
    for l in layers:
        err = np.linalg.norm(cov[l] - g.gram_cov[l]) / np.linalg.norm(g.gram_cov[l])
        assert err < tol, (l, err, cov[l], g.gram_cov[l])
        # Var(c_hat) at width n: sampling error of a variance over `nets` networks ~ sqrt(2/nets)
        assert abs(cvar[l] / g.c_var(n)[l] - 1) < 4 * np.sqrt(2 / nets) + 5.0 / n * (l + 1)
        # mean Gram within 4 standard errors of K + K1/n
        se = np.sqrt(np.diagonal(g.gram_cov[l]) / n / nets)
        assert np.all(np.abs(mean[l] - g.mean(n)[l]) < 4 * se + 2.0 / n**2)


def test_width_gain_relu_is_exact_and_tanh_removes_the_drift():
    assert sf.width_gain("relu", 2.0, 0.0, width=64, depth=10).relative == 0.0
    wg = sf.width_gain("tanh", 1.0, 0.0, width=32, depth=8)
    assert wg.sigma_w2 > 1.0 and abs(wg.std(100) - np.sqrt(wg.sigma_w2 / 100)) < 1e-15
    nets = 40_000
    drift = {}
    for sw in (1.0, wg.sigma_w2):
        sim = sf.simulate("tanh", 32, 8, sw, 0.0, n_inputs=1, n_networks=nets, seed=5)
        q = sim.networks.q[:, -1]
        drift[sw] = (q.mean() / wg.K - 1, q.std() / np.sqrt(nets) / wg.K)
    raw, corrected = drift[1.0], drift[wg.sigma_w2]
    assert raw[0] < -6 * raw[1]                    # the uncorrected mean drifts (by about -4 %)
    assert abs(corrected[0]) < 4 * corrected[1]    # the corrected one does not, within 4 standard errors


@pytest.mark.parametrize("kw, name", [(dict(q0=(1.0, 1.0, 2.0)), "'q0'"), (dict(q0=(1.0, 2.0)), "q0"),
                                      (dict(depth=0), "depth"), (dict(sigma_w2=-1.0), "sigma_w2")])
def test_bad_input_names_the_parameter(kw, name):
    args = dict(act="relu", sigma_w2=2.0, sigma_b2=0.0, depth=3)
    args.update(kw)
    with pytest.raises((ValueError, TypeError), match=name):
        sf.gram_fluctuations(**args)


def test_cli_gram_json_and_bad_input(capsys, tmp_path):
    import json

    from symfield.cli import main
    assert main(["gram", "relu", "--sigma-w2", "2", "--sigma-b2", "0", "--depth", "4", "--width", "100",
                 "--q0", "1,1,0.3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    l = np.arange(4)
    np.testing.assert_allclose(np.array(out["cov_aa_aa"]) / np.array(out["K_aa"]) ** 2, 5 * l + 2, rtol=1e-12)
    assert main(["gram", "relu", "--sigma-w2", "2", "--sigma-b2", "0", "--width", "100", "--q0", "1,1,3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'q0'" in err[0]
    png = tmp_path / "g.png"
    assert main(["gram", "relu", "--sigma-w2", "2", "--sigma-b2", "0", "--depth", "3", "--width", "50",
                 "--n-networks", "20", "--plot", str(png)]) == 0
    assert png.stat().st_size > 10_000
