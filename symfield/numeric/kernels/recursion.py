"""The layer recursion, written once: one step per layer, and the grid kernel that runs it at many points.

    layer 1 (linear):  q = sigma_w2 q0 + sigma_b2,  q12 = sigma_w2 q12_0 + sigma_b2,  d = sigma_w2 d0
    layer l >= 2:      q' = sigma_w2 V(q) + sigma_b2,  q12' = sigma_w2 C + sigma_b2,  d' = sigma_w2 D
    residual alpha:    q' = q + alpha^2 (sigma_w2 V(q) + sigma_b2)   (likewise q12 and d)

    NTK (ntk True, equal norms; docs/theory.md section 13), with g = alpha^2 and s = 1 under residual, else 1 and 0:
        Theta^(1) = K^(1);  Theta_aa' = (s + g sigma_w2 P(q)) Theta_aa + g (sigma_w2 V + sigma_b2)
        Theta_ab' = (s + g sigma_w2 T(q, q12)) Theta_ab + g (sigma_w2 C + sigma_b2)
        d_Theta'  = (s + g sigma_w2 P(q)) d_Theta + g sigma_w2 (D + 2 dT(q, q12, d) Theta_ab)
    with P = E[psi'^2], T = E[psi'(u) psi'(v)] = dC/dq12 and dT = P - T evaluated without cancellation as c -> 1.

    LayerNorm before phi (norm 1):  the state enters the step as (1, 1, c, 2 (1 - c))
    LayerNorm after phi (norm 2):   q' = sigma_w2 + sigma_b2, q12' = sigma_w2 c_hat + sigma_b2, d' = 2 sigma_w2 (1 - c_hat)

(docs/theory.md sections 1, 2, 7, 8, 12 and 13). The maps V(M, q), C(M, q1, q2, q12), D(M, q1, q2, q12, d),
in_domain(M, qa, qb, qab), their values at equal norms C_equal(M, q, q12), D_equal(M, q, q12, d), and the NTK's P(N, q),
joint_branch(q, d) and joint_rows (C, D, T, dT by branch) are globals of whatever
runs this code: the generated module (closed forms, or the table maps of :mod:`.table_maps`, with M their
data), or :func:`symfield.numeric.codegen.step_functions` (NumPy quadrature, mpmath). The stand-ins below
only name them for readers and linters.
"""
from __future__ import annotations

import math

import numpy as np

from symfield.numeric.kernels.jit import OPTS, njit, prange
from symfield.numeric.kernels.layout import DOMAIN, LEFT_TABLE, OK, OVERFLOW, PAUSED, TINY, UNDERFLOW


def V(M, q):               # stand-in: bound by the module that runs the recursion
    raise NotImplementedError


def C(M, q1, q2, q12):     # stand-in
    raise NotImplementedError


def D(M, q1, q2, q12, d):  # stand-in
    raise NotImplementedError


def in_domain(M, qa, qb, qab):   # stand-in
    raise NotImplementedError


def P(N, q):               # stand-in: E[psi'^2](q)
    raise NotImplementedError


def joint_branch(q, d):     # stand-in: which formulas joint_rows uses at equal norms q and distance d (an int)
    raise NotImplementedError


def joint_rows(k, m, q, q12, d, rows, branch):   # stand-in: (C, D, T, dT) at equal norms by the formulas of
    raise NotImplementedError                   # branch k where branch[j] == k: rows[:4, j], from rows[4:, j] = (V, P)


def C_equal(M, q, q12):    # stand-in: C(M, q, q, q12) without the dispatch (closed forms: the printed C)
    raise NotImplementedError


def D_equal(M, q, q12, d):  # stand-in: D(M, q, q, q12, d) where c >= 1/2, without the dispatch
    raise NotImplementedError


UNIFORM = False   # stand-ins: the maps module says whether a block may run as one loop without branches,
NTK_MAPS = False  # whether it has the NTK's maps (module constants: numba compiles no code under a False one),
MEMO_V = True     # and whether the block loops keep V per point in the memo (V not vectorised: exp, erf, ...)


# ---- compiled ----
BLOCK_POINTS = 16   # grid points advanced together, layer by layer


@njit(inline="always", **OPTS)
def near(dd, qa, q2):
    """c >= 1/2 (d <= (qa + q2)/2): the distance map is used, else the covariance map."""
    return dd <= 0.5 * (qa + q2)


@njit(inline="always", **OPTS)
def first_layer(qa0, qb0, qab0, d0, sw, sb):
    """Layer l = 1 is linear: q1 = sigma_w2 q0 + sigma_b2, d1 = sigma_w2 d0."""
    return sw * qa0 + sb, sw * qb0 + sb, sw * qab0 + sb, sw * d0


@njit(inline="always", **OPTS)
def near_maps(qa, qab, dd, va, M):
    """(C, D) at equal norms (qb = qa), c >= 1/2, given va = V(qa): the distance map D and C = (2 V(qa) - D)/2 (no
    cancellation as c -> 1). D_equal has no dispatch on the norms, so a loop of it over points vectorises."""
    dv = D_equal(M, qa, qab, dd)
    return 0.5 * (va + va - dv), dv


@njit(inline="always", **OPTS)
def far_maps(qa, qab, dd, va, M):
    """(C, D) at equal norms, c < 1/2, given va = V(qa): the covariance map C and D = 2 V(qa) - 2C."""
    cv = C_equal(M, qa, qab)
    return cv, va + va - 2.0 * cv


@njit(inline="always", **OPTS)
def layer_maps(qa, qb, qab, dd, va, sw, sb, general, M, close):
    """Layer l >= 2 without the residual, given va = V(qa): (sigma_w2 va + sigma_b2, .. V(qb) .., sigma_w2 C + sigma_b2,
    sigma_w2 D).
    One 2-D map per layer, by ``close`` (c >= 1/2): the distance map D and C = (V(qa) + V(qb) - D)/2, else the
    covariance map C and D = V(qa) + V(qb) - 2C. With general False the inputs have equal norm: :func:`near_maps`,
    :func:`far_maps`."""
    if general:
        vb = V(M, qb)
        if close:
            dv = D(M, qa, qb, qab, dd)
            cv = 0.5 * (va + vb - dv)
        else:
            cv = C(M, qa, qb, qab)
            dv = va + vb - 2.0 * cv
    else:
        vb = va
        cv, dv = near_maps(qa, qab, dd, va, M) if close else far_maps(qa, qab, dd, va, M)
    return sw * va + sb, sw * vb + sb, sw * cv + sb, sw * dv


@njit(inline="always", **OPTS)
def layer_step(qa, qb, qab, dd, sw, sb, alpha2, residual, general, M):
    """Layer l >= 2 (:func:`layer_maps`; residual: q + alpha^2 times the map, likewise q12 and d)."""
    fa, fb, fab, fd = layer_maps(qa, qb, qab, dd, V(M, qa), sw, sb, general, M, near(dd, qa, qb if general else qa))
    if residual:
        return qa + alpha2 * fa, qb + alpha2 * fb, qab + alpha2 * fab, dd + alpha2 * fd
    return fa, fb, fab, fd


@njit(inline="always", **OPTS)
def ntk_step(p, t, dt, taa, tab, dth, fa, fab, fd, sw, alpha2, residual):
    """The NTK's layer l -> l+1 at equal norms (module docstring), from the maps (P, T, dT) at layer l's kernel, its
    (Theta_aa, Theta_ab, d_Theta) and the NNGP map's (fa, fab, fd) = (sigma_w2 V + sigma_b2, sigma_w2 C + sigma_b2,
    sigma_w2 D)."""
    g = alpha2 if residual else 1.0
    s = 1.0 if residual else 0.0
    a_aa = s + g * sw * p
    a_ab = s + g * sw * t
    return a_aa * taa + g * fa, a_ab * tab + g * fab, a_aa * dth + g * (fd + 2.0 * sw * dt * tab)


@njit(inline="always", **OPTS)
def theta_status(taa, tab, dth):
    """The NTK's share of point_status: OVERFLOW (a Theta non-finite), UNDERFLOW (gamma_Theta = 2 Theta_ab/d_Theta
    beyond float64: d_Theta below the smallest normal float, or below 0 where a plain dTdot difference lost every
    digit), else OK."""
    if not (math.isfinite(taa) and math.isfinite(tab) and math.isfinite(dth)):
        return OVERFLOW
    if not (dth >= TINY and abs(tab) <= 0.5 * dth * 1.7976931348623157e308):   # 2 Theta_ab/d_Theta finite
        return UNDERFLOW
    return OK


@njit(inline="always", **OPTS)
def pre_norm(norm, qa, qb, qab, dd):
    """The state a layer's maps see: under LayerNorm before phi (norm == 1) each sample rescaled to variance 1,
    (1, 1, c, 2 (1 - c)) with 2 (1 - c) = (d - (sqrt qa - sqrt qb)^2)/sqrt(qa qb) (no cancellation as c -> 1);
    otherwise the state itself."""
    if norm != 1:
        return qa, qb, qab, dd
    ra = math.sqrt(qa)
    rb = math.sqrt(qb)
    root = ra * rb
    diff = (qa - qb) / (ra + rb)
    return 1.0, 1.0, qab / root, (dd - diff * diff) / root


@njit(inline="always", **OPTS)
def ln_after(cv, dv, close, sw, sb, mean, var):
    """LayerNorm after phi at equal norms (docs/theory.md section 12.2) from the plain step's C = cv and D = dv at
    (qa, qa, qab, d) (sigma_w2 = 1, sigma_b2 = 0), with mean = E psi and var = Var psi at qa: for c >= 1/2
    (``close``, where the step evaluated D) 1 - c_hat = D/(2 var), no cancellation as c -> 1; else
    c_hat = (C - mean^2)/var."""
    if close:
        gap = dv / (2.0 * var)
        ch = 1.0 - gap
    else:
        ch = (cv - mean * mean) / var
        gap = 1.0 - ch
    qn = sw + sb
    return qn, qn, sw * ch + sb, 2.0 * sw * gap


@njit(inline="always", **OPTS)
def point_status(qa, qb, qab, dd):
    """OK, OVERFLOW (q or q12 non-finite), DOMAIN (q < 0, d NaN or < 0) or UNDERFLOW (gamma beyond float64)."""
    if not (math.isfinite(qa) and math.isfinite(qb) and math.isfinite(qab)):
        return OVERFLOW
    if not (qa >= 0.0 and qb >= 0.0 and dd >= 0.0):
        return DOMAIN
    if not (dd >= TINY and math.isfinite(qab / (0.5 * dd))):   # gamma = q12 / (d/2), as Propagation computes it
        return UNDERFLOW
    return OK


@njit(inline="always", **OPTS)
def memo_v(M, memo, j, a):
    """V(a) at point j, evaluated again only where q moved: memo[j] = (q, V(q)) at the last q the maps saw there (once
    q has settled on its fixed point, most layers; the same numbers bit for bit)."""
    if not (a == memo[j, 0] and a != 0.0):    # (0.0 == -0.0, whose V may differ in sign)
        memo[j, 0] = a
        memo[j, 1] = V(M, a)
    return memo[j, 1]


@njit(inline="always", **OPTS)
def _block_layer(layer, i0, m, first, live, qa, qb, qab, dd, sw, sb, alpha2, residual, M, N, ntk, th, rows, side, act,
                 memo):
    """Layer l >= 2 at the block's live points that have started (equal norms, no norm layer; UNIFORM: maps without
    data lookups, inside their domain everywhere) as loops over all m points without a branch, which LLVM vectorises:
    V (and P), then each branch of the maps' formulas that a point takes (the side of c = 1/2; with the NTK,
    joint_branch) evaluated at every point and kept where it applies, then the step, kept at the points that run --
    the arithmetic of layer_maps and ntk_step, bit for bit. rows (6, BLOCK_POINTS), side and act (BLOCK_POINTS)
    are scratch. V and P are evaluated at every point (a vectorised V costs less than the memo of _advance; where V
    calls a function without a vector form, MEMO_V, the memo is kept). In a module without the NTK's maps Theta is
    NaN."""
    nclose = 0
    nfar = 0
    seen = 0
    for j in range(m):
        act[j] = live[j] and layer >= first[j]
        rows[4, j] = memo_v(M, memo, j, qa[j]) if MEMO_V else V(M, qa[j])
    if NTK_MAPS and ntk:
        for j in range(m):
            k = joint_branch(qa[j], dd[j])
            side[j] = k
            seen |= (1 << k) if act[j] else 0
            rows[5, j] = P(N, qa[j])
    else:
        for j in range(m):
            close = near(dd[j], qa[j], qa[j])
            nclose += close and act[j]
            nfar += act[j] and not close
            side[j] = close
    if NTK_MAPS and ntk:
        for k in range(6):
            if seen & (1 << k):
                joint_rows(k, m, qa, qab, dd, rows, side)
    else:
        if nclose > 0:
            for j in range(m):
                cv, dv = near_maps(qa[j], qab[j], dd[j], rows[4, j], M)
                if side[j]:
                    rows[0, j], rows[1, j] = cv, dv
        if nfar > 0:
            for j in range(m):
                cv, dv = far_maps(qa[j], qab[j], dd[j], rows[4, j], M)
                if not side[j]:
                    rows[0, j], rows[1, j] = cv, dv
    for j in range(m):
        a, ab, d = qa[j], qab[j], dd[j]
        w, b, va = sw[i0 + j], sb[i0 + j], rows[4, j]
        fa, fab, fd = w * va + b, w * rows[0, j] + b, w * rows[1, j]
        if NTK_MAPS and ntk:
            t0, t1, t2 = ntk_step(rows[5, j], rows[2, j], rows[3, j], th[0, j], th[1, j], th[2, j], fa, fab, fd, w,
                                  alpha2, residual)
            if act[j]:
                th[0, j], th[1, j], th[2, j] = t0, t1, t2
        elif ntk and act[j]:
            th[0, j] = th[1, j] = th[2, j] = math.nan
        if residual:
            fa, fab, fd = a + alpha2 * fa, ab + alpha2 * fab, d + alpha2 * fd
        if act[j]:
            qa[j], qb[j], qab[j], dd[j] = fa, fa, fab, fd


@njit(inline="always", **OPTS)
def _all_ok(m, act, qa, qb, qab, dd, ntk, th):
    """point_status (and with ntk theta_status) is OK at all m points that ran (act), in one loop: _check would change
    nothing."""
    bad = 0
    for j in range(m):
        good = point_status(qa[j], qb[j], qab[j], dd[j]) == OK
        if ntk:
            good = good and theta_status(th[0, j], th[1, j], th[2, j]) == OK
        bad += act[j] and not good
    return bad == 0


@njit(inline="always", **OPTS)
def _load(i0, m, depth, start, st_qa, st_qb, st_qab, st_d, qa, qb, qab, dd, first, live, ntk, st_th, th):
    """The block's points that run (start > 0) with their state; returns (number live, first layer)."""
    nlive = 0
    lmin = depth + 1
    for j in range(m):
        s = start[i0 + j]
        if s > 0:
            first[j] = s
            live[j] = True
            nlive += 1
            lmin = min(lmin, s)
            qa[j] = st_qa[i0 + j]
            qb[j] = st_qb[i0 + j]
            qab[j] = st_qab[i0 + j]
            dd[j] = st_d[i0 + j]
            if ntk:
                for t in range(3):
                    th[t, j] = st_th[i0 + j, t]
    return nlive, lmin


@njit(inline="always", **OPTS)
def _stop(i0, j, layer, qa, qb, qab, dd, start, st_qa, st_qb, st_qab, st_d, ntk, st_th, th):
    """Keep point j's state before ``layer`` for a continuation from that layer."""
    start[i0 + j] = layer
    st_qa[i0 + j] = qa[j]
    st_qb[i0 + j] = qb[j]
    st_qab[i0 + j] = qab[j]
    st_d[i0 + j] = dd[j]
    if ntk:
        for t in range(3):
            st_th[i0 + j, t] = th[t, j]


@njit(inline="always", **OPTS)
def _advance(layer, i0, m, first, live, qa, qb, qab, dd, sw, sb, inputs, alpha2, residual, general,
             M, norm, aux, N, ntk, th, memo, start, st_qa, st_qb, st_qab, st_d, st_th, status):
    """One layer at the block's live points; a point outside in_domain stops (LEFT_TABLE) with the layer to
    continue from and its state. norm: 0 none, 1 LayerNorm before phi, 2 LayerNorm after phi (equal norms;
    aux[i] = (mean, var) of psi at layer 1's q, then at q* = sigma_w2 + sigma_b2). ntk (norm 0, equal norms):
    th[:, j] = (Theta_aa, Theta_ab, d_Theta): its layer 1 here; later layers run in :func:`_block_layer` (a module
    with the NTK's maps), so here they are NaN (never silently the last layer's). inputs = (qa0, qb0, qab0, d0)
    (one argument: a call of 30 or more arguments compiles to a *args call, which numba cannot inline).
    memo: V per point (:func:`memo_v`).
    Returns how many stopped."""
    stopped = 0
    for j in range(m):
        if live[j] and layer >= first[j]:
            if layer == 1:
                qa[j], qb[j], qab[j], dd[j] = first_layer(inputs[0], inputs[1], inputs[2], inputs[3], sw[i0 + j],
                                                          sb[i0 + j])
                if ntk:
                    th[0, j] = qa[j]
                    th[1, j] = qab[j]
                    th[2, j] = dd[j]
                continue
            a, b, ab, d = pre_norm(norm, qa[j], qb[j], qab[j], dd[j])
            if in_domain(M, a, b, ab):
                if ntk:
                    th[0, j] = th[1, j] = th[2, j] = math.nan
                after = norm == 2          # one inlined copy of the maps: the plain step at (1, 0), then c_hat
                g = general and not after
                f = layer_maps(a, b, ab, d, memo_v(M, memo, j, a), 1.0 if after else sw[i0 + j],
                               0.0 if after else sb[i0 + j], g, M, near(d, a, b if g else a))
                if after:
                    k = 0 if layer == 2 else 2
                    f = ln_after(f[2], f[3], near(d, a, a), sw[i0 + j], sb[i0 + j], aux[i0 + j, k], aux[i0 + j, k + 1])
                else:
                    if residual:
                        f = (a + alpha2 * f[0], b + alpha2 * f[1], ab + alpha2 * f[2], d + alpha2 * f[3])
                qa[j], qb[j], qab[j], dd[j] = f
            else:
                live[j] = False
                stopped += 1
                status[i0 + j] = LEFT_TABLE
                _stop(i0, j, layer, qa, qb, qab, dd, start, st_qa, st_qb, st_qab, st_d, ntk, st_th, th)
    return stopped


@njit(inline="always", **OPTS)
def _store(k, layer, i0, m, first, live, qa, qb, qab, dd, general, out_qa, out_qb, out_qab, out_d, ntk, th, out_th):
    """Row k of the outputs at the block's points that have started (NaN for those that stopped)."""
    for j in range(m):
        if first[j] > 0 and layer >= first[j]:
            out_qa[k, i0 + j] = qa[j] if live[j] else math.nan
            out_qab[k, i0 + j] = qab[j] if live[j] else math.nan
            out_d[k, i0 + j] = dd[j] if live[j] else math.nan
            if general:
                out_qb[k, i0 + j] = qb[j] if live[j] else math.nan
            if ntk:
                for t in range(3):
                    out_th[t, k, i0 + j] = th[t, j] if live[j] else math.nan


@njit(inline="always", **OPTS)
def _check(layer, i0, m, first, live, qa, qb, qab, dd, depth, status, last, ntk, th):
    """point_status (and with ntk theta_status, the worse of the two) after a layer: UNDERFLOW records the last
    finite layer, OVERFLOW/DOMAIN stop the point. Returns how many stopped."""
    stopped = 0
    for j in range(m):
        if live[j] and layer >= first[j]:
            code = point_status(qa[j], qb[j], qab[j], dd[j])
            if ntk and (code == OK or code == UNDERFLOW):
                tc = theta_status(th[0, j], th[1, j], th[2, j])
                if tc != OK:
                    code = tc
            if code == UNDERFLOW:
                if last[i0 + j] == depth:
                    last[i0 + j] = layer - 1
            elif code != OK:
                live[j] = False
                stopped += 1
                status[i0 + j] = code
                if last[i0 + j] == depth:
                    last[i0 + j] = layer - 1
    return stopped


@njit(inline="always", **OPTS)
def _finish(k, i0, m, first, live, qa, qb, qab, dd, store, stop, depth, general, out_qa, out_qb, out_qab, out_d,
            start, st_qa, st_qb, st_qab, st_d, status, last, ntk, th, st_th, out_th):
    """Rows after a stopped point's last are NaN; live points end OK/UNDERFLOW, or PAUSED with their state."""
    for kk in range(k, store.shape[0]):
        for j in range(m):
            if first[j] > 0 and not live[j] and store[kk] >= first[j]:
                out_qa[kk, i0 + j] = math.nan
                out_qab[kk, i0 + j] = math.nan
                out_d[kk, i0 + j] = math.nan
                if general:
                    out_qb[kk, i0 + j] = math.nan
                if ntk:
                    for t in range(3):
                        out_th[t, kk, i0 + j] = math.nan
    for j in range(m):
        if live[j]:
            if stop < depth:
                status[i0 + j] = PAUSED
                if first[j] <= stop:     # else it has not started yet: start, st_* stay as they are
                    _stop(i0, j, stop + 1, qa, qb, qab, dd, start, st_qa, st_qb, st_qab, st_d, ntk, st_th, th)
            else:
                status[i0 + j] = UNDERFLOW if last[i0 + j] < depth else OK


@njit(parallel=True, **OPTS)
def recurse(sw, sb, qa0, qb0, qab0, d0, depth, stop, store, alpha2, residual, general, M, norm, aux, N, ntk,
            start, st_qa, st_qb, st_qab, st_d, st_th, out_qa, out_qb, out_qab, out_d, out_th, status, last):
    """Layers up to ``stop`` (<= depth) at every grid point (parallel over blocks of points, advanced layer by
    layer); rows of out_* at layers ``store``. Callers run long recursions in chunks of layers (stop < depth)
    so that Python can handle signals (Ctrl-C) between chunks; the chunked run is bit-identical to one call
    with stop = depth.

    Point i starts at layer start[i] (1: from the inputs; > 1: from the state st_*[i] of layer start[i] - 1;
    0: skipped, nothing written). On return status[i] is (:mod:`.layout`) OK; OVERFLOW or DOMAIN (that
    layer's value stored as is, later stored rows NaN); UNDERFLOW (done, gamma = 2 q12/d beyond float64
    after layer last[i]; callers set last[i] = depth beforehand, the rows go on); LEFT_TABLE (stopped at a
    layer where in_domain is False: start[i], st_*[i] hold the layer to continue from and the state before
    it, later rows NaN until a continuation fills them); PAUSED (after layer stop < depth: start[i] =
    stop + 1, st_*[i] hold layer stop). Rows of layers before start[i] are never touched. out_qb is written
    only when general (else a placeholder). ``norm`` and ``aux`` (shape (n, 4); (0, 4) unused): see _advance.
    ``ntk`` (norm 0, general False): the NTK goes along, with the maps P, T, dT of data N; st_th (n, 3) its
    state, out_th (3, len(store), n) its rows (Theta_aa, Theta_ab, d_Theta); a non-finite Theta is OVERFLOW, an
    underflowed d_Theta UNDERFLOW (:func:`theta_status`). Without ntk, st_th and out_th are placeholders."""
    n = sw.shape[0]
    nstore = store.shape[0]
    for blk in prange((n + BLOCK_POINTS - 1) // BLOCK_POINTS):
        i0 = blk * BLOCK_POINTS
        m = min(BLOCK_POINTS, n - i0)
        qa = np.empty(BLOCK_POINTS)
        qb = np.empty(BLOCK_POINTS)
        qab = np.empty(BLOCK_POINTS)
        dd = np.empty(BLOCK_POINTS)
        th = np.empty((3, BLOCK_POINTS))
        memo = np.full((BLOCK_POINTS, 2), np.nan)
        rows = np.empty((6, BLOCK_POINTS))
        side = np.empty(BLOCK_POINTS, dtype=np.int64)
        act = np.empty(BLOCK_POINTS, dtype=np.bool_)
        first = np.zeros(BLOCK_POINTS, dtype=np.int64)
        live = np.zeros(BLOCK_POINTS, dtype=np.bool_)
        nlive, lmin = _load(i0, m, depth, start, st_qa, st_qb, st_qab, st_d, qa, qb, qab, dd, first, live, ntk, st_th,
                            th)
        k = 0
        while k < nstore and store[k] < lmin:
            k += 1
        for layer in range(lmin, stop + 1):
            if nlive == 0:
                break
            fast = UNIFORM and norm == 0 and not general and layer > 1
            if fast:
                _block_layer(layer, i0, m, first, live, qa, qb, qab, dd, sw, sb, alpha2, residual, M, N, ntk, th, rows,
                             side, act, memo)
            else:
                nlive -= _advance(layer, i0, m, first, live, qa, qb, qab, dd, sw, sb, (qa0, qb0, qab0, d0), alpha2,
                                  residual, general, M, norm, aux, N, ntk, th, memo, start, st_qa, st_qb, st_qab, st_d,
                                  st_th, status)
            if k < nstore and store[k] == layer:
                _store(k, layer, i0, m, first, live, qa, qb, qab, dd, general, out_qa, out_qb, out_qab, out_d, ntk, th,
                       out_th)
                k += 1
            if not (fast and _all_ok(m, act, qa, qb, qab, dd, ntk, th)):
                nlive -= _check(layer, i0, m, first, live, qa, qb, qab, dd, depth, status, last, ntk, th)
        _finish(k, i0, m, first, live, qa, qb, qab, dd, store, stop, depth, general, out_qa, out_qb, out_qab, out_d,
                start, st_qa, st_qb, st_qab, st_d, status, last, ntk, th, st_th, out_th)
