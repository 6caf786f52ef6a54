"""Residual blocks at finite width (sf.gram_fluctuations(residual=alpha), docs/theory.md 9.3): the
four-point pair rule against independent oracles, the exact linear case, and seeded simulations."""
import numpy as np
import pytest

import symfield as sf
from symfield.numeric.layer_pairs import pair_moments, pair_nodes

from test_gram import IDX, angular_oracle, inputs

K = np.array([[1.3, 0.4], [0.4, 0.9]])
D = np.array([[0.2, 0.15], [0.15, 0.3]])
relu, step = (lambda v: np.maximum(v, 0.0)), (lambda v: (v > 0) * 1.0)
dtanh = lambda v: 1 - np.tanh(v) ** 2  # noqa: E731


# ---------------------------------------------------------------- the pair rule
def test_pair_rule_two_dimensional_entries_against_arc_cosine_quadrature():
    """E[relu(y_a)^2 relu(w_b)^2] and E[relu(y_a) relu(w_a)] only see a 2-D Gaussian (Cov(y_a, w_b) =
    K_ab): mpmath quadrature in polar coordinates is the oracle."""
    import sympy as sp
    from symfield.symbolic.formula import X as x
    r = sp.Max(x, 0)
    P = pair_nodes(K, D, (0.0,))
    v = P.mean(relu(P.ya) ** 2, relu(P.wb) ** 2)
    ex = angular_oracle(r ** 2, r ** 2, 2, 2, K[0, 0], K[1, 1] + D[1, 1], K[0, 1])
    assert abs(v - float(ex)) < 2e-6 * float(ex)
    v = P.mean(relu(P.ya), relu(P.wa))
    ex = angular_oracle(r, r, 1, 1, K[0, 0], K[0, 0] + D[0, 0], K[0, 0])
    assert abs(v - float(ex)) < 2e-6 * float(ex)
    assert abs(P.w.sum() - 1) < 1e-6


@pytest.mark.slow        # ~11 s; the relu case above stays in the default run
def test_pair_rule_four_dimensional_tanh_against_gauss_hermite():
    """Tanh is analytic: a 50^4 Gauss-Hermite rule in Cholesky coordinates of (y, Delta) is the oracle
    (at 0.4 K, 0.4 D, where it has converged to ~1e-11: the poles at +-i pi/2 are far in sd units)."""
    Ks, Ds = 0.4 * K, 0.4 * D
    z, w = np.polynomial.hermite_e.hermegauss(50)
    w = w / np.sqrt(2 * np.pi)
    S = np.zeros((4, 4))
    S[:2, :2], S[2:, 2:] = Ks, Ds
    Z = np.stack(np.meshgrid(z, z, z, z, indexing="ij"), -1).reshape(-1, 4) @ np.linalg.cholesky(S).T
    W = np.einsum("i,j,k,l->ijkl", w, w, w, w).ravel()
    ya, yb, da, db = Z.T
    ex = float((W * np.tanh(ya) * np.tanh(yb) * np.tanh(ya + da) * np.tanh(yb + db)).sum())
    for order, tol in ((8, 1e-6), (12, 1e-9)):
        P = pair_nodes(Ks, Ds, (), order, panels=(1.5,))
        v = P.mean(np.tanh(P.ya), np.tanh(P.yb), np.tanh(P.wa), np.tanh(P.wb))
        assert abs(v - ex) < tol * abs(ex), (order, v, ex)


def test_pair_rule_four_dimensional_relu_against_seeded_monte_carlo():
    rng = np.random.default_rng(7)
    S = np.zeros((4, 4))
    S[:2, :2], S[2:, 2:] = K, D
    L = np.linalg.cholesky(S)
    est = []
    for _ in range(8):
        ya, yb, da, db = (rng.standard_normal((1_000_000, 4)) @ L.T).T
        est.append((relu(ya) * relu(yb) * relu(ya + da) * relu(yb + db)).mean())
    mc, se = np.mean(est), np.std(est, ddof=1) / np.sqrt(len(est))
    P = pair_nodes(K, D, (0.0,))
    v = P.mean(relu(P.ya), relu(P.yb), relu(P.wa), relu(P.wb))
    assert abs(v - mc) < 4 * se and se < 2e-3 * mc


@pytest.mark.parametrize("act", ["relu", pytest.param("tanh", marks=pytest.mark.slow)])
def test_increment_derivatives_agree_with_differences_of_the_covariance(act):
    """R = d/dD Cov(P(y), P(w)) comes from Price's theorem and the scale identity; central differences
    of QPP in D (the same rule, no derivative formula) must agree."""
    phi, dphi, kk, pan = (relu, step, (0.0,), ()) if act == "relu" else (np.tanh, dtanh, (), (1.5,))
    order = 10 if act == "relu" else 12
    base = pair_moments(K, D, phi, dphi, kk, order, pan)
    h = 1e-3
    for s, (i, j) in enumerate(((0, 0), (1, 1), (0, 1))):
        E = np.zeros((2, 2))
        E[i, j] = E[j, i] = h
        plus, minus = (pair_moments(K, D + sg * E, phi, dphi, kk, order, pan).QPP for sg in (1, -1))
        fd = (plus - minus) / (2 * h)                          # (r, t)
        np.testing.assert_allclose(base.R[s].T, fd, atol=2e-6 * np.abs(base.QPP).max() / h ** 0 + 1e-6)


# ---------------------------------------------------------------- exact linear blocks
def test_linear_residual_blocks_match_the_product_of_independent_factors():
    """phi(x) = x, sigma_b2 = 0: |z + alpha W z|^2 = |z|^2 (1 + 2 alpha u/|z| + alpha^2 chi^2/n ...) with
    u ~ N(0, sigma_w2 |z|^2/n) and chi^2 ~ sigma_w2 chi^2_n independent of z's direction, so each block
    multiplies q by an independent factor of relative variance (4s + 2s^2)/((1 + s)^2 n), s = alpha^2
    sigma_w2, and n Var(q^(l))/K^2 = 2 + (l - 1)(4s + 2s^2)/(1 + s)^2; no mean shift."""
    sw, alpha = 1.5, 0.5
    g = sf.gram_fluctuations("linear", sw, 0.0, 5, q0=(1.0, 1.2, 0.3), residual=alpha)
    s = alpha ** 2 * sw
    want = 2 + np.arange(5) * (4 * s + 2 * s * s) / (1 + s) ** 2
    for e in (0, 1):
        np.testing.assert_allclose(g.gram_cov[:, e, e] / g.K[:, e] ** 2, want, rtol=1e-6)
    assert np.abs(g.K1).max() < 1e-5 * g.K.max()
    assert (g.status == 0).all() and g.metric_cov is None


def test_small_alpha_keeps_layer_one():
    g = sf.gram_fluctuations("relu", 1.5, 0.1, 3, q0=(1.0, 1.0, 0.3), residual=1e-3)
    np.testing.assert_allclose(g.gram_cov[2], g.gram_cov[0], rtol=1e-4)


# ---------------------------------------------------------------- against seeded simulations
RES_CASES = [  # act, sigma_w2, sigma_b2, alpha, width, networks, layers, tol (relative Frobenius error)
    ("relu", 2.0, 0.0, 0.5, 200, 3000, (1, 3), 0.08),
    pytest.param(("tanh", 1.5, 0.1, 0.5, 200, 4000, (1, 3), 0.08), marks=pytest.mark.slow),
    pytest.param(("gelu", 1.8, 0.05, 0.7, 2000, 3000, (1, 3), 0.08), marks=pytest.mark.slow),
]


@pytest.mark.parametrize("case", RES_CASES, ids=lambda c: str(c[0]))
def test_residual_gram_covariance_against_seeded_simulations(case):
    act, sw, sb, alpha, n, nets, layers, tol = case
    q0 = (1.0, 1.2, 0.3)
    depth = max(layers) + 1
    g = sf.gram_fluctuations(act, sw, sb, depth, q0=q0, residual=alpha)
    assert (g.status == 0).all()
    sim = sf.simulate(act, n, depth, sw, sb, n_inputs=2, n_networks=nets, seed=11, inputs=inputs(*q0),
                      residual=alpha)
    E = np.stack([sim.gram[:, :, i, j] for i, j in IDX], axis=-1)
    c = sim.gram[:, :, 0, 1] / np.sqrt(sim.gram[:, :, 0, 0] * sim.gram[:, :, 1, 1])
    for l in layers:
        cov = np.cov(E[:, l].T) * n
        err = np.linalg.norm(cov - g.gram_cov[l]) / np.linalg.norm(g.gram_cov[l])
        assert err < tol, (l, err, cov, g.gram_cov[l])
        assert abs(c[:, l].var(ddof=1) / g.c_var(n)[l] - 1) < 4 * np.sqrt(2 / nets) + 5.0 / n * (l + 1)
    # the plain-network theory at the same parameters is far off: the test can tell them apart
    plain = sf.gram_fluctuations(act, sw, sb, depth, q0=q0)
    l = max(layers)
    assert np.linalg.norm(np.cov(E[:, l].T) * n - plain.gram_cov[l]) / np.linalg.norm(plain.gram_cov[l]) > 2 * tol


@pytest.mark.slow
def test_residual_relu_mean_shift_against_seeded_simulations():
    """A node's own feedback on its later increments makes E[Ghat] - K nonzero for ReLU residual
    networks (zero for plain ones): 100000 networks of width 128 resolve K1 at layers 5-6."""
    n, nets, depth = 128, 100_000, 6
    g = sf.gram_fluctuations("relu", 2.0, 0.0, depth, q0=1.0, residual=0.7)
    sim = sf.simulate("relu", n, depth, 2.0, 0.0, n_inputs=1, n_networks=nets, seed=3, residual=0.7,
                      inputs=np.ones((1, 20)))
    q = sim.gram[:, :, 0, 0]
    drift, se = (q.mean(0) - g.K[:, 0]) * n, q.std(0, ddof=1) / np.sqrt(nets) * n
    assert g.K1[-1, 0] > 5 * se[-1]                          # the theory predicts a resolvable shift
    assert np.all(np.abs(drift - g.K1[:, 0]) < 3.5 * se)     # ... and the networks show it
    assert drift[-1] > 3 * se[-1]


def test_residual_width_gain_uses_the_residual_mean_shift():
    wg = sf.width_gain("relu", 2.0, 0.0, width=64, depth=4, residual=0.7)
    g = sf.gram_fluctuations("relu", 2.0, 0.0, 4, q0=1.0, residual=0.7)
    assert wg.K1 == pytest.approx(g.K1[-1, 0]) and wg.K1 > 0
    assert wg.sigma_w2 < 2.0 and wg.params["residual"] == 0.7
    assert sf.width_gain("relu", 2.0, 0.0, width=64, depth=4).relative == 0.0


@pytest.mark.parametrize("kw, name", [(dict(residual=-0.5), "residual"), (dict(residual=0.0), "residual"),
                                      (dict(residual=0.5, dps=20), "dps"),
                                      (dict(act=sf.activation("relu", pool="max", k=2), residual=0.5), "residual")])
def test_residual_bad_input_names_the_parameter(kw, name):
    args = dict(act="relu", sigma_w2=2.0, sigma_b2=0.0, depth=3)
    args.update(kw)
    with pytest.raises(ValueError, match=name):
        sf.gram_fluctuations(**args)


def test_cli_gram_residual_json(capsys):
    import json

    from symfield.cli import main
    assert main(["gram", "linear", "--sigma-w2", "1.5", "--sigma-b2", "0", "--depth", "3", "--width", "100",
                 "--q0", "1,1,0.3", "--residual", "0.5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    s = 0.25 * 1.5
    want = 2 + np.arange(3) * (4 * s + 2 * s * s) / (1 + s) ** 2
    np.testing.assert_allclose(np.array(out["cov_aa_aa"], float) / np.array(out["K_aa"], float) ** 2, want, rtol=1e-5)


def test_tensor_rule_against_the_nested_rule_at_high_order():
    """Kink-free pairs take the tensor rule (layer_pairs.tensor_moments): against the nested rule at order 18
    (converged to ~1e-10 here, a different quadrature), at a moderate and a strongly correlated pair."""
    from symfield.numeric.layer_pairs import tensor_moments
    dphi = lambda x: 1 / np.cosh(x) ** 2  # noqa: E731
    cases = [(np.array([[1.0, 0.5], [0.5, 1.0]]), np.array([[0.2, 0.05], [0.05, 0.3]])),
             (np.array([[2.0, 1.9], [1.9, 2.0]]), np.array([[0.01, 0.009], [0.009, 0.01]]))]
    for Kc, Dc in cases:
        t, ref = tensor_moments(Kc, Dc, np.tanh, dphi), pair_moments(Kc, Dc, np.tanh, dphi, order=18)
        for f in ("QPP", "QPZ", "R"):
            a, b = getattr(t, f), getattr(ref, f)
            assert np.abs(a - b).max() <= 1e-8 * np.abs(b).max(), (f, a, b)


@pytest.mark.parametrize("act", ["tanh", "gelu"])
def test_layer_terms_by_price_match_the_symbolic_derivatives(act):
    """The tensor-grid layer terms (Price's theorem on derivatives of phi) against the maps engine's
    quadrature of sympy's derivatives of C and of the moments m22, m31, m13."""
    from symfield.theory.gram import TERMS, _Eval, _mat
    ev = _Eval(sf.activation(act), None)
    Ks = np.array([[1.0, 1.0, 0.3], [2.0, 1.5, -1.2], [0.5, 0.5, 0.45], [9.0, 9.0, 8.7]])
    fast = np.array([ev._tensor_terms(_mat(k)) for k in Ks])
    slow = ev._quad_terms(Ks)[0]
    assert fast.shape == (4, len(TERMS))
    np.testing.assert_allclose(fast, slow, rtol=1e-9, atol=1e-11 * np.abs(slow).max())
