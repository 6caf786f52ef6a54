"""simulate / class_gradients: finite-width Monte Carlo networks against independent oracles.

Oracles: exact identities (orthonormal inputs, PSD square roots, the finite-data formulas), the
explicit-weight network (two-sample Kolmogorov-Smirnov tests of every per-layer statistic against
the Gram reparametrisation), finite differences of an independently written forward pass
(backpropagation), and sf.propagate (infinite width).

Monte Carlo criteria, stated once:
- KS: every p-value above KS_ALPHA / (number of tests) (Bonferroni at family-wise level KS_ALPHA).
- Per-network statistics (log q, log gamma): |t| <= T_MAX with t = (mean over networks - theory)/(sd/sqrt(n)),
  n = 8 networks (P(|t_7| > 5) = 0.0016 per tested layer).
- Correlation band: the infinite-width c^(l) lies inside the pooled 5-95% band of c_ab over pairs and
  networks, widened by C_SLACK = 1e-12, the float64 resolution of 1 - c from a Gram matrix.
"""
import importlib

import numpy as np
import pytest
from scipy import stats

import symfield as sf
from symfield.simulate import class_gradients, finite_data_gamma, simulate

S = importlib.import_module("symfield.simulate")   # the module (sf.simulate may be the exported function)
KS_ALPHA = 1e-3
T_MAX = 5.0
C_SLACK = 1e-12


# ---------------------------------------------------------------- exact pieces
def test_psd_sqrt_singular_and_stacked():
    rng = np.random.default_rng(0)
    A = rng.standard_normal((3, 6, 2))                 # rank-2 6x6 Gram matrices (singular)
    M = A @ A.transpose(0, 2, 1) + 0.3                 # + sigma_b2 11^T
    L = S._psd_sqrt(M)
    assert np.allclose(L @ L.transpose(0, 2, 1), M, atol=1e-12 * np.abs(M).max())
    ones = np.full((1, 4, 4), 2.0)                     # c = 1 exactly: rank one
    L1 = S._psd_sqrt(ones)
    assert np.all(np.isfinite(L1)) and np.allclose(L1 @ L1.transpose(0, 2, 1), ones, atol=1e-14)


def test_inputs_and_first_layer_exact():
    """Orthonormal inputs: X X^T = d I (q0_aa = 1, q0_ab = 0 exactly), so layer 1 has conditional covariance
    sigma_w2 I + sigma_b2 11^T exactly: q_cond^(1) = sigma_w2 + sigma_b2."""
    s = simulate("tanh", 64, 2, 1.7, 0.2, 5, n_networks=3, seed=4, input_dim=9)
    X = s.inputs
    assert X.shape == (5, 9)
    assert np.allclose(X @ X.T, 9 * np.eye(5), atol=1e-12)
    assert s.q_cond[0] == pytest.approx(1.9, abs=1e-14)
    g = simulate("tanh", 64, 2, 1.7, 0.2, 5, seed=4, inputs="gaussian", input_dim=400)
    assert g.inputs.shape == (5, 400)
    # gaussian inputs: q0_aa = |x|^2/d = 1 only on average (chi^2_400/400: sd 0.07 per input)
    assert abs((g.inputs**2).mean() - 1) < 5 * np.sqrt(2 / 2000)
    a = simulate("relu", 32, 2, 2.0, 0.0, None, inputs=np.eye(3) * np.sqrt(3), seed=1)
    assert a.q_cond[0] == pytest.approx(2.0, abs=1e-14) and a.params["n_inputs"] == 3


def test_finite_data_formulas_exact():
    """E[V] = (q - qab)(1 - 1/P), E[Vtilde] = qab + (q - qab)/P for i.i.d. Gaussian node vectors of covariance
    q I + qab (11^T - I) (direct numpy sampling, 5 standard errors)."""
    q, qab, P, n = 2.0, 1.4, 6, 200_000
    rng = np.random.default_rng(11)
    cov = qab + (q - qab) * np.eye(P)
    h = rng.standard_normal((n, P)) @ np.linalg.cholesky(cov).T
    v, vt = h.var(axis=1), h.mean(axis=1) ** 2   # about the known mean 0 of mu_i
    EV, EVt, g = finite_data_gamma(q, qab, P)
    assert abs(v.mean() - EV) < 5 * v.std() / np.sqrt(n)
    assert abs(vt.mean() - EVt) < 5 * vt.std() / np.sqrt(n)
    assert g == pytest.approx(EVt / EV)


def test_reproducible_and_batch_independent(monkeypatch):
    a = simulate("relu", 60, 6, 2.5, 0.1, 7, n_networks=5, seed=3)
    b = simulate("relu", 60, 6, 2.5, 0.1, 7, n_networks=5, seed=3)
    monkeypatch.setattr(S, "BATCH_ELEMENTS", 7 * 60 * 2)   # batches of 2 networks instead of 5
    c = simulate("relu", 60, 6, 2.5, 0.1, 7, n_networks=5, seed=3)
    for name in ("q", "qab", "c", "c_quantiles", "V", "Vtilde", "gamma", "kurtosis", "q_cond"):
        assert np.array_equal(getattr(a, name), getattr(b, name), equal_nan=True), name
        # other batch shapes may change BLAS summation order: equal up to rounding
        assert np.allclose(getattr(a, name), getattr(c, name), rtol=1e-10, atol=0, equal_nan=True), name
    d = simulate("relu", 60, 6, 2.5, 0.1, 7, n_networks=5, seed=4)
    assert not np.array_equal(a.q, d.q)


# ---------------------------------------------------------------- Gram reparametrisation == explicit weights
STATS = ("q", "qab", "c", "V", "Vtilde", "m4", "g1")


@pytest.mark.parametrize("act, residual", [("relu", None), (("tanh", "max", 2), None),
                                           pytest.param(("relu", "avg", 3), None, marks=pytest.mark.slow),
                                           ("tanh", 0.6)])
def test_gram_equals_weights_in_distribution(act, residual):
    """Width 12, 3 inputs, 4 layers, 600 networks per method: the per-network statistics of every layer
    (q, qab, c, V, Vtilde, E h^4, conditional variance) have the same law under both methods (two-sample KS,
    Bonferroni). Small width makes the statistics strongly non-Gaussian, so the law is tested, not just means."""
    a = sf.activation(act[0], pool=act[1], k=act[2]) if isinstance(act, tuple) else act
    kw = dict(n_networks=600, residual=residual)
    g = simulate(a, 12, 4, 1.8, 0.15, 3, seed=21, method="gram", **kw).networks
    w = simulate(a, 12, 4, 1.8, 0.15, 3, seed=22, method="weights", **kw).networks
    # layer 1's conditional variance is the constant sigma_w2 + sigma_b2 under both methods (to rounding)
    assert np.allclose(g.g1[:, 0], 1.95, rtol=1e-14) and np.allclose(w.g1[:, 0], 1.95, rtol=1e-14)
    pvals = [stats.ks_2samp(getattr(g, n)[:, l], getattr(w, n)[:, l]).pvalue
             for n in STATS for l in range(4) if (n, l) != ("g1", 0)]
    assert min(pvals) > KS_ALPHA / len(pvals), min(pvals)


def test_ks_has_power():
    """The same KS comparison detects a 10% error in the weight variance (sigma_w2 1.8 vs 1.98)."""
    g = simulate("relu", 12, 4, 1.8, 0.15, 3, seed=21, n_networks=600).networks
    w = simulate("relu", 12, 4, 1.98, 0.15, 3, seed=22, n_networks=600, method="weights").networks
    pvals = [stats.ks_2samp(getattr(g, n)[:, l], getattr(w, n)[:, l]).pvalue
             for n in STATS for l in range(4) if (n, l) != ("g1", 0)]
    assert min(pvals) < KS_ALPHA / len(pvals)


# ---------------------------------------------------------------- against the infinite-width theory
def _t(values, ref):
    values = np.asarray(values)
    return (values.mean() - ref) / (values.std(ddof=1) / np.sqrt(values.size))


def _check_theory(act, sw, sb, width, depth, P, nets, seed, layers, residual=None, gamma_layers=None):
    r = sf.propagate(act, sw, sb, depth, residual=residual)
    s = simulate(act, width, depth, sw, sb, P, n_networks=nets, seed=seed, residual=residual)
    inside = (r.c >= s.c05 - C_SLACK) & (r.c <= s.c95 + C_SLACK)
    assert inside.all(), (act, sw, np.where(~inside)[0] + 1)
    _, _, g = finite_data_gamma(r.q, r.qab, P)
    for l in layers:
        assert abs(_t(np.log(s.networks.q[:, l - 1]), np.log(r.q[l - 1]))) <= T_MAX, (act, sw, "q", l)
        if g[l - 1] < 1e8:      # beyond, 1 - c is below what float64 Gram matrices resolve
            assert abs(_t(np.log(s.networks.gamma_norm[:, l - 1]), np.log(g[l - 1]))) <= T_MAX, (act, sw, "gn", l)
            if gamma_layers is None or l in gamma_layers:
                assert abs(_t(np.log(s.networks.gamma[:, l - 1]), np.log(g[l - 1]))) <= T_MAX, (act, sw, "g", l)
    return r, s


SLOW = pytest.mark.slow


@pytest.mark.parametrize("act, sw", [("relu", 0.5), pytest.param("relu", 1.5, marks=SLOW),
                                     pytest.param("relu", 2.5, marks=SLOW), ("relu", 4.0), ("tanh", 1.0),
                                     pytest.param("tanh", 2.0, marks=SLOW), ("tanh", 3.0)])
def test_matches_propagate_small(act, sw):
    """Paper settings (sigma_b2 = 0.1) at width 1000, depth 20, 40 inputs, 8 networks: c^(l) inside the band at
    every layer; q and gamma (finite-data corrected, docs/theory.md section 10) within T_MAX standard errors."""
    _check_theory(act, sw, 0.1, 1000, 20, 40, 8, 100, layers=(1, 2, 3, 5, 10, 15, 20))


@pytest.mark.parametrize("act, alpha", [("relu", 0.3), ("tanh", 0.6)])
def test_residual_matches_propagate(act, alpha):
    """h^(l+1) = h^(l) + alpha (W phi(h^(l)) + b) has the law of sf.propagate(..., residual=alpha)."""
    _check_theory(act, 2.0, 0.1, 800, 15, 30, 8, 200, layers=(2, 5, 10, 15), residual=alpha)


@pytest.mark.slow
@pytest.mark.parametrize("act, sw", [("relu", 0.5), ("relu", 1.5), ("relu", 2.5), ("relu", 4.0),
                                     ("tanh", 1.0), ("tanh", 2.0), ("tanh", 3.0)])
def test_matches_propagate_paper_size(act, sw):
    """Width 10000, depth 100, 200 inputs, 8 networks. Plain gamma is tested to layer 30 in chaotic ReLU: deeper,
    the finite-width drift of the input norms (a 1/N effect, var_a sqrt(q_aa) added to V while q - qab ~ 1/l^2)
    lowers it measurably (see the report); gamma_norm, which removes that drift, is tested at every layer."""
    gl = range(1, 31) if act == "relu" and sw > 2 else None
    _check_theory(act, sw, 0.1, 10000, 100, 200, 8, 300, layers=(1, 2, 5, 10, 20, 30, 50, 75, 100), gamma_layers=gl)


def test_norm_drift_is_finite_width():
    """Deep chaotic ReLU (sigma_w2 = 2.5, sigma_b2 = 0.1, layer 40): the deficit of the plain gamma shrinks with
    width (N = 250 vs 4000, 6 networks each), i.e. it is a finite-width effect, not a bias of the estimator."""
    r = sf.propagate("relu", 2.5, 0.1, 40)
    _, _, g = finite_data_gamma(r.q, r.qab, 20)
    dev = {}
    for N in (250, 4000):
        s = simulate("relu", N, 40, 2.5, 0.1, 20, n_networks=6, seed=9)
        dev[N] = abs(np.log(s.networks.gamma[:, -1]).mean() - np.log(g[-1]))
    assert dev[4000] < 0.5 * dev[250], dev


@pytest.mark.slow
def test_reproducibility_at_full_size():
    """Width 10000, depth 100, 200 inputs: the same seed gives identical arrays (its time is in the bench)."""
    a = simulate("tanh", 10000, 100, 2.0, 0.1, 200, seed=12)
    b = simulate("tanh", 10000, 100, 2.0, 0.1, 200, seed=12)
    for name in ("q", "qab", "c", "c_quantiles", "V", "Vtilde", "kurtosis"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name


# ---------------------------------------------------------------- gradients
def _reference_loss(X, labels, seeds, act, pool, k, N, depth, sw, sb, alpha, layer, h_override):
    """Per-sample losses of the explicit network (independent forward pass), with h^(layer) replaced."""
    import sympy as sp
    x = sorted(act.expr.free_symbols, key=str)[0]
    phi = sp.lambdify(x, act.expr, "numpy")

    def params(ss, fan_in, n_out):
        rng = np.random.default_rng(ss)
        return rng.standard_normal((n_out, fan_in)) * np.sqrt(sw / fan_in), rng.standard_normal(n_out) * np.sqrt(sb)

    def y_of(h):
        v = phi(h)
        if k > 1:
            g = v.reshape(v.shape[0], N // k, k)
            v = np.repeat(g.max(-1) if pool == "max" else g.mean(-1), k, axis=-1)
        return v
    W, b = params(seeds[0], X.shape[1], N)
    h = X @ W.T + b
    for l in range(1, depth + 1):
        if l - 1 == layer:
            h = h_override
        if l == depth:
            break
        W, b = params(seeds[l], N, N)
        h = y_of(h) @ W.T + b if alpha is None else h + alpha * (y_of(h) @ W.T + b)
    Wo, bo = params(seeds[depth], N, 2)
    z = y_of(h) @ Wo.T + bo
    return np.logaddexp(z[:, 0], z[:, 1]) - z[np.arange(len(labels)), labels]


@pytest.mark.parametrize("act, residual", [("tanh", None), (("tanh", "max", 2), None), (("softplus", "avg", 2), None),
                                           ("tanh", 0.5)])
def test_backprop_matches_finite_differences(act, residual):
    """dl_a/dh^(l)_ai from class_gradients' backward pass equals the central difference of the per-sample loss
    of an independently written forward pass (eps = 1e-6, relative error < 1e-6)."""
    a = sf.activation(act[0], pool=act[1], k=act[2]) if isinstance(act, tuple) else sf.activation(act)
    k = a.k if a.pool else 1
    N, P, depth, sw, sb = 6, 4, 3, 1.7, 0.2
    X = np.random.default_rng(1).standard_normal((P, 5))
    labels = np.array([0, 1, 1, 0])
    phi, dphi = S._act_fns(a)
    got = {}
    S._logits_and_backprop(np.random.SeedSequence(77), X, labels, phi, dphi, a.pool, k, N, depth, sw, sb, residual,
                           lambda l, d: got.__setitem__(l, d.copy()))
    seeds = np.random.SeedSequence(77).spawn(depth + 1)
    # pre-activations of the same network (the override path with h = None is not used: rebuild them)
    Hs = []
    S._forward_weights(np.random.SeedSequence(77), X, phi, a.pool, k, N, depth, sw, sb, residual,
                       lambda l, H, G: Hs.append(H.copy()))
    eps = 1e-6
    for layer in range(depth):
        for (i, j) in [(0, 0), (1, 3), (2, 5), (3, 2)]:
            hp, hm = Hs[layer].copy(), Hs[layer].copy()
            hp[i, j] += eps
            hm[i, j] -= eps
            lp = _reference_loss(X, labels, seeds, a, a.pool, k, N, depth, sw, sb, residual, layer, hp)[i]
            lm = _reference_loss(X, labels, seeds, a, a.pool, k, N, depth, sw, sb, residual, layer, hm)[i]
            fd = (lp - lm) / (2 * eps)
            assert abs(got[layer][i, j] - fd) <= 1e-6 * max(1e-3, np.abs(got[layer][i]).max()), (layer, i, j)


def test_class_gradients_chaotic_vs_ordered():
    """ReLU, sigma_b2 = 0.1, width 200, depth 30, 200 inputs, 8 networks.
    Chaotic (sigma_w2 = 4, gamma^(30) ~ 20): in the typical network (median over networks) the favoured class's
    samples get a first-layer gradient at least 1e3 times below the unfavoured class's, and the unfavoured
    gradient grows backwards by chi1 = sigma_w2/2 per layer (geometric mean over layers within 15%).
    Ordered (sigma_w2 = 1): both classes' first-layer gradients are below 1e-6 of their last-layer values
    (chi1^29 = 2e-9), decaying by chi1 = 1/2 per layer."""
    ch = class_gradients("relu", 200, 30, 4.0, 0.1, 200, n_networks=8, seed=5)
    ratio = ch.favoured[:, 0] / ch.unfavoured[:, 0]
    assert np.median(ratio) < 1e-3, ratio
    unf = np.median(ch.unfavoured, axis=0)
    per_layer = np.exp(np.mean(np.log(unf[:-2] / unf[1:-1])))
    assert abs(per_layer / 2.0 - 1) < 0.15, per_layer
    od = class_gradients("relu", 200, 30, 1.0, 0.1, 200, n_networks=8, seed=5)
    for arr in (od.favoured, od.unfavoured):
        m = np.median(arr, axis=0)
        assert m[0] < 1e-6 * m[-1]
        assert abs(np.exp(np.mean(np.log(m[:-2] / m[1:-1]))) / 0.5 - 1) < 0.15
    assert set(np.unique(ch.labels)) == {0, 1} and ch.labels.sum() == 100
    assert np.all((ch.g0 >= 0.5) == (ch.favoured_class == 0))


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("kwargs, exc, text", [
    (dict(act=sf.activation("relu", pool="max", k=3), width=100), ValueError,
     "'width' parameter of simulate must be a multiple of the pool size k = 3"),
    (dict(sigma_w2=-1.0), ValueError, "'sigma_w2' parameter of simulate must be a finite float >= 0"),
    (dict(sigma_b2="a"), TypeError, "'sigma_b2' parameter of simulate must be a finite float"),
    (dict(depth=0), ValueError, "'depth' parameter of simulate must be an integer >= 1"),
    (dict(width=2.5), TypeError, "'width' parameter of simulate must be an integer"),
    (dict(n_inputs=0), ValueError, "'n_inputs' parameter of simulate must be an integer >= 1"),
    (dict(seed=-1), ValueError, "'seed' parameter of simulate must be an integer >= 0"),
    (dict(residual=-0.5), ValueError, "'residual' parameter of simulate must be a finite float >= 0"),
    (dict(inputs="sphere"), ValueError, "'inputs' parameter of simulate must be 'orthonormal', 'gaussian'"),
    (dict(inputs=np.ones((3, 2)), n_inputs=4), ValueError, "'n_inputs' parameter of simulate must be None or"),
    (dict(inputs=np.array([[1.0, np.nan]]), n_inputs=None), ValueError, "'inputs' parameter of simulate must be"),
    (dict(input_dim=2, n_inputs=5), ValueError, "'input_dim' parameter of simulate must be an integer >= n_inputs"),
    (dict(method="fast"), ValueError, "'method' parameter of simulate must be one of 'gram' or 'weights'"),
    (dict(blas_threads=0), ValueError, "'blas_threads' parameter of simulate must be an integer >= 1"),
])
def test_bad_input(kwargs, exc, text):
    args = dict(act="relu", width=10, depth=2, sigma_w2=2.0, sigma_b2=0.0, n_inputs=3)
    args.update(kwargs)
    with pytest.raises(exc, match=text.replace("(", r"\(").replace(")", r"\)")):
        simulate(**args)


def test_blas_threads_restored():
    """blas_threads limits the BLAS (OpenBLAS, MKL or BLIS, through threadpoolctl) only during the call;
    None leaves it alone."""
    from threadpoolctl import threadpool_info

    def blas():
        return [m["num_threads"] for m in threadpool_info() if m["user_api"] == "blas"]
    before = blas()
    if not before:
        pytest.skip("threadpoolctl finds no BLAS in this NumPy build")
    seen = []
    with S._blas_threads(1):
        seen.append(blas())
    with S._blas_threads(None):
        seen.append(blas())
    simulate("relu", 10, 2, 2.0, 0.0, 2, blas_threads=1)
    assert seen == [[1] * len(before), before] and blas() == before


def test_bad_input_gradients():
    with pytest.raises(ValueError, match="'n_inputs' parameter of class_gradients must be an integer >= 2"):
        class_gradients("relu", 10, 2, 2.0, 0.0, 1)
    with pytest.raises(ValueError, match="'width' parameter of class_gradients must be a multiple of the pool size"):
        class_gradients(sf.activation("relu", pool="avg", k=4), 10, 2, 2.0, 0.0, 4)
