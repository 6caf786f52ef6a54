"""A high-precision oracle for the two-input finite-width recursion of tanh at equal norms, near c = 1.

None of it goes through symfield. Every ingredient of one layer at the symmetric point (q, q, s) is a
Gaussian expectation E[f(u) g(v)] with Var u = Var v = q and Cov(u, v) = s, where f and g are products of
derivatives of tanh. Those are polynomials in t = tanh with integer coefficients (d/dx P(t) = P'(t)(1 - t^2)).
Price's theorem, d/ds E[f(u) g(v)] = E[f'(u) g'(v)], expands about s = q (u = v):

    E[f(u) g(v)] = sum_n (-delta)^n / n! E_q[f^(n) g^(n)],      delta = q - s,

and E_q[P(t)] = sum_k P_k T_k(q), T_k(q) = E[tanh(sqrt(q) Z)^k] (trapezoidal rule, exponentially accurate
for an integrand analytic in a strip). The series is asymptotic; it is summed until two successive terms
fall below 10^-(digits + 5) of the sum, and :class:`NotConverged` is raised if that needs more than N_MAX
terms. The layer recursion is written out plainly in the (aa, bb, ab) basis at ``digits`` + 40 digits:

    K' = sigma_b2 + sigma_w2 F(K),  V' = sigma_w2^2 Sigma(K) + J V J^T,  K1' = J K1 + H:V/2,
    J = sigma_w2 dF/dK,  H = sigma_w2 d^2F/dK^2,  lim n Cov Ghat = V + W(K).
"""
import math

import mpmath as mp
import numpy as np

N_MAX = 80


class NotConverged(ArithmeticError):
    pass


# ---------------------------------------------------------------- integer polynomials in t = tanh(x)
def _mul(a, b):
    out = [0] * (len(a) + len(b) - 1)
    for i, x in enumerate(a):
        if x:
            for j, y in enumerate(b):
                out[i + j] += x * y
    return out


def _d(p):
    """d/dx P(tanh x) = P'(t) (1 - t^2)."""
    dp = [k * p[k] for k in range(1, len(p))] or [0]
    return [a - b for a, b in zip(dp + [0, 0], [0, 0] + dp)]


def _phi(k, cache={0: [0, 1]}):  # noqa: B006
    if k not in cache:
        cache[k] = _d(_phi(k - 1))
    return cache[k]


def _prod(*orders):
    out = [1]
    for k in orders:
        out = _mul(out, _phi(k))
    return out


class _Pair:
    """f(u) g(v) with f, g products of tanh derivatives (``orders``); its terms D^n f D^n g, built lazily."""

    def __init__(self, f, g):
        self.fn, self.gn, self.terms = [f], [g], []

    def term(self, n):
        while len(self.terms) <= n:
            m = len(self.terms)
            if m:
                self.fn.append(_d(self.fn[-1]))
                self.gn.append(_d(self.gn[-1]))
            self.terms.append(_mul(self.fn[m], self.gn[m]))
        return self.terms[n]


# ---------------------------------------------------------------- one layer
class TanhLayer:
    def __init__(self, digits):
        self.digits = digits
        self.pairs, self._c = {}, {}
        self._T = None
        self._close = mp.mpf(10) ** -(digits + 15)     # q this close to the last one: reuse T_k and the series

    def _moments(self, q, kmax):
        """T_k(q) for k <= kmax (trapezoidal rule in z, step from the poles of tanh at Im z = pi/(2 sqrt q))."""
        if self._T is not None and abs(self._T[0] - q) <= self._close * q and len(self._T[1]) > kmax:
            return self._T[1]
        self._c = {}
        D = self.digits + 10
        a = mp.pi / (2 * mp.sqrt(q))
        h = 2 * mp.pi * a / (D * math.log(10) + 10)
        zmax = math.sqrt(2 * (D * math.log(10) + 10))
        n = int(zmax / h) + 1
        T = [mp.mpf(0)] * (kmax + 1)
        sq = mp.sqrt(q)
        for j in range(0, n + 1):
            z = j * h
            w = (1 if j == 0 else 2) * mp.exp(-z * z / 2)
            t, p = mp.tanh(sq * z), w
            for k in range(0, kmax + 1, 2):       # odd moments vanish
                T[k] += p
                p *= t * t
        T = [v * h / mp.sqrt(2 * mp.pi) for v in T]
        self._T = (q, T)
        return T

    def expect(self, f, g, q, delta):
        """E[f(u) g(v)] at Var = q, Cov = q - delta (f, g: tuples of derivative orders)."""
        key = (f, g)
        if key not in self.pairs:
            self.pairs[key] = _Pair(_prod(*f), _prod(*g))
        pair = self.pairs[key]
        tol = mp.mpf(10) ** -(self.digits + 5)
        total, small, fact = mp.mpf(0), 0, mp.mpf(1)
        for n in range(N_MAX):
            P = pair.term(n)
            T = self._moments(q, len(P) - 1)
            c = self._c.get((key, n))
            if c is None:
                c = self._c[key, n] = mp.fsum(P[k] * T[k] for k in range(0, len(P), 2))
            term = c * fact
            total += term
            small = small + 1 if abs(term) <= tol * abs(total) else 0
            if small == 2:
                return total
            fact *= -delta / (n + 1)
        raise NotConverged(f"series in delta = {mp.nstr(delta, 5)} not converged in {N_MAX} terms")

    def terms(self, K):
        """F, J/sigma_w2, H/sigma_w2 and Sigma at a symmetric Gram point K = (q, q, s)."""
        q, qb, s = K
        assert q == qb
        delta = q - s
        E = lambda f, g: self.expect(f, g, q, delta)          # noqa: E731
        E1 = lambda *f: self.expect(f, (), q, 0)              # noqa: E731  one point: n = 0 only
        m2, C = E1(0, 0), E((0,), (0,))
        F = [m2, m2, C]
        J = mp.zeros(3, 3)
        J[0, 0] = J[1, 1] = E1(1, 1) + E1(0, 2)                    # (1/2) E[(phi^2)'']
        J[2, 0] = J[2, 1] = E((2,), (0,)) / 2                       # dC/dq_a = E[phi'' phi]/2
        J[2, 2] = E((1,), (1,))                                     # dC/dq_ab = E[phi' phi']
        H = [mp.zeros(3, 3) for _ in range(3)]
        for i in (0, 1):                                            # (1/4) E[(phi^2)'''']
            H[i][i, i] = (2 * E1(0, 4) + 8 * E1(1, 3) + 6 * E1(2, 2)) / 4
        C40, C22, C31, C11 = E((4,), (0,)) / 4, E((2,), (2,)) / 4, E((3,), (1,)) / 2, E((2,), (2,))
        h = H[2]
        h[0, 0] = h[1, 1] = C40
        h[0, 1] = h[1, 0] = C22
        h[0, 2] = h[2, 0] = h[1, 2] = h[2, 1] = C31
        h[2, 2] = C11
        m4, m22, m31 = E1(0, 0, 0, 0), E((0, 0), (0, 0)), E((0, 0, 0), (0,))
        S = mp.matrix([[m4 - m2 * m2, m22 - m2 * m2, m31 - m2 * C],
                       [m22 - m2 * m2, m4 - m2 * m2, m31 - m2 * C],
                       [m31 - m2 * C, m31 - m2 * C, m22 - C * C]])
        return F, J, H, S


# ---------------------------------------------------------------- the recursion
def wishart(K):
    a, b, ab = K
    return mp.matrix([[2 * a * a, 2 * ab * ab, 2 * a * ab], [2 * ab * ab, 2 * b * b, 2 * b * ab],
                      [2 * a * ab, 2 * b * ab, a * b + ab * ab]])


def recursion(sw, sb, q0, depth, digits=30, every=None):
    """K, K1 and lim n Cov Ghat at layers 1..depth (rows (aa, bb, ab)), mpmath at digits + 40, from the
    binary floats sw, sb, q0 (read exactly). Returns object arrays (depth, 3), (depth, 3), (depth, 3, 3)
    keeping only the layers in ``every`` (all if None)."""
    keep = set(range(depth)) if every is None else set(every)
    with mp.workdps(digits + 40):
        lay = TanhLayer(digits + 20)
        sw, sb = mp.mpf(sw), mp.mpf(sb)
        K = [sw * mp.mpf(v) + sb for v in q0]
        V, K1 = mp.zeros(3, 3), mp.zeros(3, 1)
        out = {}
        for l in range(depth):
            if l in keep:
                cov = V + wishart(K)
                out[l] = ([+v for v in K], [K1[i] for i in range(3)], [[cov[i, j] for j in range(3)] for i in range(3)])
            if l == depth - 1:
                break
            F, J, H, S = lay.terms(K)
            J, H = sw * J, [sw * h for h in H]
            K1 = J * K1 + mp.matrix([sum(H[r][i, j] * V[i, j] for i in range(3) for j in range(3)) / 2
                                     for r in range(3)])
            V = sw * sw * S + J * V * J.T
            K = [sb + sw * F[0], sb + sw * F[1], sb + sw * F[2]]
        ls = sorted(out)
        arr = lambda i: np.array([out[l][i] for l in ls], dtype=object)   # noqa: E731
        return np.array(ls) + 1, arr(0), arr(1), arr(2)


def c_statistics(K, K1, cov, n):
    """1 - c, E[1 - c_hat] and Var c_hat at width n by the delta method, c = K_ab/sqrt(K_aa K_bb), from the
    gradient and Hessian of c written out (rows of the arrays :func:`recursion` returns)."""
    out = []
    with mp.workdps(mp.mp.dps + 40):
        for (a, b, ab), k1, V in zip(K, K1, cov):
            r = mp.sqrt(a * b)
            c = ab / r
            g = [-c / (2 * a), -c / (2 * b), 1 / r]
            h = [[3 * c / (4 * a * a), c / (4 * a * b), -1 / (2 * a * r)],
                 [c / (4 * a * b), 3 * c / (4 * b * b), -1 / (2 * b * r)],
                 [-1 / (2 * a * r), -1 / (2 * b * r), 0]]
            w = (r - ab) / r
            shift = sum(g[i] * k1[i] for i in range(3)) + sum(h[i][j] * V[i][j] for i in range(3) for j in range(3)) / 2
            var = sum(g[i] * V[i][j] * g[j] for i in range(3) for j in range(3)) / n
            out.append((w, w - shift / n, var))
    return out
