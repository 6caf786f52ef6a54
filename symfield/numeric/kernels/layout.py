"""Names for the numbers compiled code exchanges: the packed table's header and the status codes.

A certified table (:mod:`symfield.numeric.tables`) is packed into one float64 array M (one cheap argument
for compiled code): a header of HEADER numbers, then the V coefficients (N_T per q-panel), the index of
each panel's first theta-cell (and an end), the cell edges (2 per cell), the cell coefficients (BLOCK
per cell), and the same three parts for the cells of the distance map's R (when HAS_R).
"""
# ---- compiled ----
NT = 16           # Chebyshev nodes per q-panel and per theta-cell (compiled evaluation fixed at this size)

# header fields of M
KIND = 0          # 1.0 homogeneous, 0.0 general
PARITY = 1        # 0 none, 1 odd, 2 even
P_LO = 2          # first and last q-panel stored (general kind)
P_HI = 3
E0 = 4            # panel 0 is q in [0, 2^E0]
DEGREE = 5        # homogeneous degree n
SCALED = 6        # 1.0: V = q v(x), C = q w g (psi(0) = 0); 0.0: V = v, C = g
V1 = 7            # V(1) (homogeneous kind)
PSI0SQ = 8        # psi(0)^2 (C at q = 0)
Q0 = 9            # 2^E0
SQ0 = 10          # 2^(E0/2)
OFF_V = 11        # offsets into M: V coefficients,
OFF_FIRST = 12    # per-panel first cell index,
OFF_EDGES = 13    # cell edges,
OFF_COEF = 14     # cell coefficients;
BLOCK = 15        # coefficients per cell
HAS_R = 16        # 1.0 when the R cells of the distance map are packed
OFF_RFIRST = 17   # offsets of the R cells' first index, edges and coefficients
OFF_REDGES = 18
OFF_RCOEF = 19
HEADER = 20

# status of a grid point in the compiled recursion: OK..UNDERFLOW end a point (public codes 0-3);
# LEFT_TABLE and PAUSED stop it with its state for the caller to continue
OK = 0            # done
OVERFLOW = 1      # q or q12 non-finite; later rows NaN
DOMAIN = 2        # outside the maps' domain (q < 0, d NaN or < 0); later rows NaN
UNDERFLOW = 3     # done, but d underflowed (gamma beyond float64) after layer last
LEFT_TABLE = 4    # stopped where in_domain is False (outside the table): extend it and continue
PAUSED = 5        # paused after layer stop < depth (a chunk of layers ended): continue

TINY = 2.2250738585072014e-308   # smallest normal float64: below it d has lost relative precision
