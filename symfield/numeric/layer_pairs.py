"""Gaussian expectations over one node of a residual network seen at two depths (docs/theory.md section 9.3).

A node of two inputs (a, b) is y = z^(m) ~ N(0, K) at layer m and w = z^(l) = y + Delta at a later
layer l, with the increment Delta ~ N(0, D), D = K^(l) - K^(m), independent of y. Expectations of
products of functions of y_a, y_b, w_a, w_b (and Delta) are four-dimensional; they are taken by nested
one-dimensional Gauss-Legendre rules in the order Delta_a, Delta_b | Delta_a, y_a, y_b | y_a, split at
the kinks of the integrand, where a conditional mean crosses a kink, and around smooth bends, so that
every piece is analytic (docs/numerics.md section 8). The relative error is about 1e-6 for relu and tanh
(tests/theory/test_gram.py). :func:`pair_nodes` returns nodes and weights that any such product can be
summed against; :func:`pair_moments` the covariances the residual Gram theory needs.

For activations without kinks :func:`tensor_moments` takes the same expectations faster: y and Delta are
independent, so on fixed tensor grids in (y_a, y_b) and (Delta_a, Delta_b) (short equal pieces, which
resolve phi's bends wherever y + Delta puts them) the four-dimensional sum of a product
A(y_a, Delta_a) B(y_b, Delta_b) is the matrix contraction sum A * (rho_K B rho_D^T), rho the weighted
densities; phi is evaluated on two 2-D grids instead of at every 4-D node.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

CUT = 8.5                  # standard deviations kept on each side (mass outside: 2e-17)
TAIL = 3.5                 # every level is also split at mean +- TAIL sd (the Gaussian's own bend)
PRUNE = 1e-20              # nodes lighter than this are dropped
ORDER = 8                  # Gauss-Legendre nodes per piece (relative error ~1e-6; see tests)


@dataclass(frozen=True)
class PairNodes:
    """Nodes of the four-dimensional rule: y_a, y_b, d_a, d_b (w = y + d) and their weights."""
    ya: np.ndarray
    yb: np.ndarray
    da: np.ndarray
    db: np.ndarray
    w: np.ndarray

    @property
    def wa(self):
        return self.ya + self.da

    @property
    def wb(self):
        return self.yb + self.db

    def mean(self, *factors):
        """Sum of weight x product of the given node arrays."""
        out = self.w
        for f in factors:
            out = out * f
        return float(out.sum())


def _level(mu, s, splits, order):
    """Nodes and weights of N(mu, s^2) on mu +- CUT s, split at ``splits`` and at mu +- TAIL s.

    mu: (M,), splits: (M, S). Returns the parent index, x and w of the nodes that carry weight."""
    M = len(mu)
    if s <= 0:                                   # a degenerate direction: the conditional mean, weight 1
        return np.arange(M), mu.copy(), np.ones(M)
    t, om = np.polynomial.legendre.leggauss(order)
    lo, hi = (mu - CUT * s)[:, None], (mu + CUT * s)[:, None]
    tails = mu[:, None] + s * np.array([-TAIL, TAIL])
    B = np.sort(np.concatenate([lo, np.clip(np.concatenate([splits, tails], axis=1), lo, hi), hi], axis=1), axis=1)
    half, mid = (B[:, 1:] - B[:, :-1]) / 2, (B[:, 1:] + B[:, :-1]) / 2
    x = (mid[:, :, None] + half[:, :, None] * t).reshape(M, -1)
    z = (x - mu[:, None]) / s
    w = (half[:, :, None] * om).reshape(M, -1) * np.exp(-z * z / 2) / (s * np.sqrt(2 * np.pi))
    keep = np.flatnonzero(w > 0)
    return keep // x.shape[1], x.ravel()[keep], w.ravel()[keep]


def _cond(S, i, j):
    """Regression coefficient of coordinate j on i and the conditional standard deviation."""
    rho = S[i, j] / S[i, i] if S[i, i] > 0 else 0.0
    return rho, float(np.sqrt(max(S[j, j] - rho * S[i, j], 0.0)))


def _prune(*cols, w):
    """Drop nodes of weight below PRUNE (their children weigh less still): the mass lost is below
    (number of nodes) x PRUNE, ~1e-15 here, and about half the nodes go."""
    keep = w > PRUNE
    return tuple(c[keep] for c in cols) + (w[keep],)


def _const(values, M):
    v = np.unique(np.asarray(values, dtype=float))
    return np.broadcast_to(v, (M, len(v)))


def _around(points, panels):
    """points (M, k) and points +- each panel width: the pieces next to a bend stay short."""
    return np.concatenate([points] + [points + sgn * p for p in panels for sgn in (-1, 1)], axis=1)


def pair_nodes(K, D, kinks=(), order=ORDER, panels=()) -> PairNodes:
    """Rule for E[f(y, y + Delta)], y ~ N(0, K), Delta ~ N(0, D) (2x2 each, (a, b) order).

    ``panels``: extra split distances around every kink in the y levels, for activations that bend
    smoothly (tanh has poles at +-i pi/2: pieces of length ~1 next to its bend keep the rule geometric)."""
    K, D = np.asarray(K, dtype=float), np.asarray(D, dtype=float)
    kap = np.unique(np.concatenate([[0.0], np.asarray(kinks, dtype=float)]))
    diff = np.unique((kap[:, None] - kap[None, :]).ravel())
    rD, sD = _cond(D, 0, 1)
    rK, sK = _cond(K, 0, 1)
    near = diff / rD if abs(rD) > 1e-12 else np.zeros(0)
    _, da, w = _level(np.zeros(1), np.sqrt(D[0, 0]), _const(np.concatenate([diff, near]), 1), order)
    par, db, w2 = _level(rD * da, sD, _const(diff, len(da)), order)
    da, db, w = _prune(da[par], db, w=w[par] * w2)
    M = len(da)
    own = np.broadcast_to(kap, (M, len(kap)))
    sp_a = [_around(own, panels), _around(kap[None, :] - da[:, None], panels)]
    if abs(rK) > 1e-12:
        sp_a += [own / rK, (kap[None, :] - db[:, None]) / rK]
    par, ya, w3 = _level(np.zeros(M), np.sqrt(K[0, 0]), np.concatenate(sp_a, axis=1), order)
    da, db, ya, w = _prune(da[par], db[par], ya, w=w[par] * w3)
    M = len(ya)
    sp_b = np.concatenate([_around(np.broadcast_to(kap, (M, len(kap))), panels),
                           _around(kap[None, :] - db[:, None], panels)], axis=1)
    par, yb, w4 = _level(rK * ya, sK, sp_b, order)
    ya, yb, da, db, w = _prune(ya[par], yb, da[par], db[par], w=w[par] * w4)
    return PairNodes(ya, yb, da, db, w)


@dataclass(frozen=True)
class PairMoments:
    """Covariances of one node's products at layers m < l (index order (aa, bb, ab) throughout).

    QPP[r, t] = Cov(P_r(y), P_t(w)),  QPZ[r, t] = Cov(P_r(y), Z_t(w)),
    R[s, t, r] = d/dD_s Cov(P_r(y), P_t(w))   (y held fixed, the increment's covariance D moved),
    with P(v) = (phi(v_a)^2, phi(v_b)^2, phi(v_a) phi(v_b)) and Z(v) = (v_a^2, v_b^2, v_a v_b)."""
    QPP: np.ndarray
    QPZ: np.ndarray
    R: np.ndarray
    norm_error: float          # |sum of weights - 1|: the rule's error on the Gaussian itself


CHUNK = 1 << 18            # nodes per block of the weighted sums


def _block_sums(P, phi, dphi, lo, hi):
    """sum_nodes w g_k f_j over nodes lo:hi, g = (1, P(y)) and f = the 12 integrand columns (one matrix
    product of rows written in place: no stacked copies of the node arrays)."""
    ya, yb, da, db = P.ya[lo:hi], P.yb[lo:hi], P.da[lo:hi], P.db[lo:hi]
    wa, wb = ya + da, yb + db
    pa, pb, qa, qb, ra, rb = phi(ya), phi(yb), phi(wa), phi(wb), dphi(wa), dphi(wb)
    w = P.w[lo:hi]
    g, f = np.empty((4, w.size)), np.empty((12, w.size))
    g[0] = w
    np.multiply(w * pa, pa, out=g[1])
    np.multiply(w * pb, pb, out=g[2])
    np.multiply(w * pa, pb, out=g[3])
    f[0] = 1.0                                                     # 1, P(w), Z(w)
    for row, (x, y) in enumerate(((qa, qa), (qb, qb), (qa, qb), (wa, wa), (wb, wb), (wa, wb), (ra, rb)), 1):
        np.multiply(x, y, out=f[row])                              # ..., d_a d_b P_ab(w)
    np.multiply(2 * da * qa, ra, out=f[8])                         # Delta_a d_a P_aa, P_ab
    np.multiply(da * ra, qb, out=f[9])
    np.multiply(2 * db * qb, rb, out=f[10])                        # Delta_b d_b P_bb, P_ab
    np.multiply(db * qa, rb, out=f[11])
    return g @ f.T


def pair_moments(K, D, phi, dphi, kinks=(), order=ORDER, panels=()) -> PairMoments:
    """:class:`PairMoments` at y ~ N(0, K), w = y + Delta, Delta ~ N(0, D) (2x2 matrices).

    The D-derivatives come from Price's theorem, d/dD_ab E[g f] = E[g d_a d_b f], and the scale
    identity d/dt E[g f(y_a + t Delta_a, w_b)] at t = 1: E[g Delta_a d_a f] = 2 D_aa d/dD_aa + D_ab d/dD_ab,
    so only phi' is needed (phi' may jump at a kink). Covariances are formed from sums over the same
    nodes, so the rule's error on the Gaussian itself cancels to first order."""
    D = np.asarray(D, dtype=float)
    P = pair_nodes(K, D, kinks, order, panels)
    S = sum(_block_sums(P, phi, dphi, lo, lo + CHUNK) for lo in range(0, len(P.w), CHUNK))   # (g, f) = (4, 12)
    return _from_sums(S, D, abs(P.w.sum() - 1))


def _from_sums(S, D, norm_error) -> PairMoments:
    """:class:`PairMoments` from the weighted sums S[g, f] of :func:`_block_sums` (normalised here)."""
    S = S / S[0, 0]
    zero = np.zeros(4)
    Xab = np.stack([zero, zero, S[:, 7]], axis=1)                  # (g, t)
    Ya = np.stack([S[:, 8], zero, S[:, 9]], axis=1)
    Yb = np.stack([zero, S[:, 10], S[:, 11]], axis=1)
    deriv = np.stack([(Ya - D[0, 1] * Xab) / (2 * D[0, 0]), (Yb - D[0, 1] * Xab) / (2 * D[1, 1]), Xab])  # (s, g, t)
    Eg = S[1:, 0]                                                   # E P_r(y)
    cov = S[1:, 1:7] - Eg[:, None] * S[0, 1:7][None, :]
    R = deriv[:, 1:, :] - Eg[None, :, None] * deriv[:, :1, :]        # (s, r, t)
    return PairMoments(cov[:, :3], cov[:, 3:], np.transpose(R, (0, 2, 1)), norm_error)


# ---------------------------------------------------------------- kink-free activations: tensor grids
T_ORDER = 10        # Gauss-Legendre nodes per piece of the tensor rule
T_PIECE = 1.5       # longest piece: tanh's poles at +-i pi/2 give a per-piece error ~ 4.4^(-2 T_ORDER) ~ 1e-13
T_CUT = 8.0         # sds kept per coordinate (mass outside 1.2e-15)
T_RIDGE = 1.0       # ... and pieces no longer than the coordinate's conditional sd (the density's narrow side)
T_MAX = 800         # nodes per coordinate; beyond it (correlation near +-1) :func:`tensor_moments` declines

# g = (1, P(y)) and the 12 columns f of _block_sums, each as (a-side, b-side) factors; "2dqr" is 2 Delta q r
_G = (((), ()), (("p2",), ()), ((), ("p2",)), (("p",), ("p",)))
_F = (((), ()), (("q2",), ()), ((), ("q2",)), (("q",), ("q",)), (("w2",), ()), ((), ("w2",)), (("w",), ("w",)),
      (("r",), ("r",)), (("2dqr",), ()), (("dr",), ("q",)), ((), ("2dqr",)), (("q",), ("dr",)))
_PAIRS = [[(ga + fa, gb + fb) for fa, fb in _F] for ga, gb in _G]


def _axis(s, cond, order, piece, max_nodes=T_MAX):
    """Gauss-Legendre nodes and weights on [-T_CUT s, T_CUT s] in equal pieces of length at most
    min(piece, T_RIDGE cond); None when that needs more than ``max_nodes`` nodes."""
    h = min(piece, T_RIDGE * cond)
    n = max(1, math.ceil(2 * T_CUT * s / h)) if h > 0 else max_nodes + 1
    if n * order > max_nodes:
        return None
    t, om = np.polynomial.legendre.leggauss(order)
    B = np.linspace(-T_CUT * s, T_CUT * s, n + 1)
    half, mid = (B[1:] - B[:-1]) / 2, (B[1:] + B[:-1]) / 2
    return (mid[:, None] + half[:, None] * t).ravel(), (half[:, None] * om).ravel()


def _grid(S, order, piece, max_nodes=T_MAX):
    """Tensor rule for N(0, S), S 2x2 positive definite: the two axes and the weighted density
    rho_ij = w_i w_j pdf(x_i, y_j); None when an axis declines."""
    det = S[0, 0] * S[1, 1] - S[0, 1] ** 2
    if not (det > 0):
        return None
    axes = [_axis(np.sqrt(S[i, i]), np.sqrt(det / S[1 - i, 1 - i]), order, piece, max_nodes) for i in (0, 1)]
    if axes[0] is None or axes[1] is None:
        return None
    (x, wx), (y, wy) = axes
    X, Y = x[:, None], y[None, :]
    quad = (S[1, 1] * X * X - 2 * S[0, 1] * X * Y + S[0, 0] * Y * Y) / det
    return x, y, wx[:, None] * wy[None, :] * np.exp(-quad / 2) / (2 * np.pi * np.sqrt(det))


def _factors(y, d, phi, dphi):
    """The one-side factors of _G and _F on the grid y_i + d_k (rows i: y, columns k: Delta)."""
    p = phi(y)[:, None]
    w = y[:, None] + d[None, :]
    q, r = phi(w), dphi(w)
    return {"p": p, "p2": p * p, "q": q, "q2": q * q, "w": w, "w2": w * w, "r": r, "2dqr": 2 * d * q * r,
            "dr": d * r}


def _product(f, parts, shape):
    """The product of the named factors (1 for none), of the grid's shape."""
    out = np.ones(shape)
    for part in parts:
        out = out * f[part]
    return out


def tensor_moments(K, D, phi, dphi, order=T_ORDER, piece=T_PIECE) -> PairMoments | None:
    """:class:`PairMoments` of a kink-free activation by tensor grids, or None where K or D is too
    strongly correlated for them (use :func:`pair_moments`).

    E[g(y) f(y + Delta)] for g f = A(y_a, Delta_a) B(y_b, Delta_b) is sum_ik A_ik (rho_K B rho_D^T)_ik with
    rho_K, rho_D the weighted densities of y ~ N(0, K) and Delta ~ N(0, D) on their grids."""
    K, D = np.asarray(K, dtype=float), np.asarray(D, dtype=float)
    gy, gd = _grid(K, order, piece), _grid(D, order, piece)
    if gy is None or gd is None:
        return None
    (ya, yb, rK), (da, db, rD) = gy, gd
    fa, fb = _factors(ya, da, phi, dphi), _factors(yb, db, phi, dphi)
    an = sorted({tuple(sorted(a)) for row in _PAIRS for a, _ in row})
    bn = sorted({tuple(sorted(b)) for row in _PAIRS for _, b in row})
    A = {n: _product(fa, n, (len(ya), len(da))) for n in an}
    B = np.stack([_product(fb, n, (len(yb), len(db))) for n in bn], axis=1)          # (y_b, nb, Delta_b)
    M = (rK @ B.reshape(len(yb), -1)).reshape(-1, len(db)) @ rD.T                   # (y_a nb, Delta_a)
    M = np.ascontiguousarray(M.reshape(len(ya), len(bn), len(da)).transpose(1, 0, 2))
    at = {n: k for k, n in enumerate(bn)}
    S = np.array([[np.einsum("ik,ik->", A[tuple(sorted(a))], M[at[tuple(sorted(b))]]) for a, b in row] for row in _PAIRS])
    return _from_sums(S, D, abs(S[0, 0] - 1))



def tensor_grid(K, order=T_ORDER, piece=T_PIECE, max_nodes=4 * T_MAX):
    """The tensor rule of N(0, K) for smooth integrands: axes x, y and weights rho (E[f(u) g(v)] ~
    f(x) rho g(y) / rho.sum()); None where K is too strongly correlated for ``max_nodes`` per axis."""
    return _grid(np.asarray(K, dtype=float), order, piece, max_nodes)
