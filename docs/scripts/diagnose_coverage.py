"""Coverage of sf.init.diagnose's finite-width bands over seeded torch networks (issue 33).

The network is the one of tests/init/test_init.py::test_record_torch_feeds_diagnose: 4 torch Linear layers,
initialised by sf.init.torch_(..., act), act between them, 4 inputs x ~ N(0, I). For each seed a new
network and new inputs; each of the 12 statistics (q, c, gamma at 4 layers) is scored as
z = (measured - band mean)/band sd. A correct 2-sd band covers ~95.4% of networks per statistic.

usage: PYTHONPATH=. python3 docs/scripts/diagnose_coverage.py [n_seeds] [width] [act] [sigma_b2] [depth] [sigma_w2]
(sigma_w2 default: the edge of chaos, sf.init.gain(act, sigma_b2)^2; float64 networks when sigma_w2 is given)
"""
import sys
import time
from statistics import NormalDist

import numpy as np
import torch

import symfield as sf

N = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
WIDTH = int(sys.argv[2]) if len(sys.argv) > 2 else 256
ACT = sys.argv[3] if len(sys.argv) > 3 else "relu"
SB = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
DEPTH = int(sys.argv[5]) if len(sys.argv) > 5 else 4
P = 4
FN = {"relu": torch.nn.ReLU, "tanh": torch.nn.Tanh}[ACT]
SW = float(sys.argv[6]) if len(sys.argv) > 6 else sf.init.gain(ACT, SB) ** 2
DT = torch.float64 if len(sys.argv) > 6 else torch.float32

t0 = time.time()
zs, oks, z4 = [], [], []
for seed in range(N):
    torch.manual_seed(seed)
    layers = []
    for _ in range(DEPTH):
        lin = torch.nn.Linear(WIDTH, WIDTH).to(DT)
        if len(sys.argv) > 6:
            with torch.no_grad():
                lin.weight.normal_(0, (SW / WIDTH) ** 0.5)
                lin.bias.normal_(0, SB ** 0.5)
        else:
            sf.init.torch_(lin, ACT, sigma_b2=SB)
        layers += [lin, FN()]
    model = torch.nn.Sequential(*layers[:-1])
    x = torch.randn(P, WIDTH, dtype=DT)
    with torch.no_grad(), sf.init.record_torch(model) as acts:
        model(x)
    d = sf.init.diagnose(acts, ACT, SW, SB)
    zs.append([(getattr(d, n) - getattr(d, n + "_mean")) / getattr(d, n + "_sd") for n in ("q", "c", "gamma")])
    oks.append(bool(d.ok))
zs = np.array(zs)                                   # (N, 3, DEPTH)
zb = NormalDist().inv_cdf(1 - 0.05 / (2 * zs[0].size))
print(f"{ACT} sigma_w2={SW:.6g} sigma_b2={SB:g} width={WIDTH} depth={DEPTH} P={P}: {N} seeded networks "
      f"({time.time() - t0:.0f} s)")
print("coverage of the 2-sd band per statistic and layer (binomial se ~ 0.7% at 95%):")
for k, n in enumerate(("q", "c", "gamma")):
    cov = (np.abs(zs[:, k]) <= 2).mean(axis=0)
    sdz = zs[:, k].std(axis=0)
    mz = zs[:, k].mean(axis=0)
    print(f"  {n:5s} coverage " + " ".join(f"{c:6.3f}" for c in cov) +
          " | sd of z " + " ".join(f"{s:5.2f}" for s in sdz) + " | mean z " + " ".join(f"{m:+5.2f}" for m in mz))
    print("        coverage of the family-wise band: " + " ".join(f"{c:6.3f}" for c in (np.abs(zs[:, k]) <= zb).mean(axis=0)))
print(f"networks with all {zs[0].size} statistics inside the 2-sd band: {np.mean((np.abs(zs) <= 2).all(axis=(1, 2))):.3f}")
print(f"networks diagnose calls ok (default z: family-wise, statuses 4 excluded): {np.mean(oks):.3f}")
print(f"networks with all {zs[0].size} inside the family-wise (Bonferroni) band z = {zb:.3f}: "
      f"{np.mean((np.abs(zs) <= zb).all(axis=(1, 2))):.3f}")
print(f"networks with all {zs[0].size} inside the 4-sd band: {np.mean((np.abs(zs) <= 4).all(axis=(1, 2))):.3f}")
print(f"seed 0: max |z| = {np.nanmax(np.abs(zs[0])):.2f}; rank of seed 0's max |z| among seeds: "
      f"{(np.nanmax(np.abs(zs), axis=(1, 2)) >= np.nanmax(np.abs(zs[0]))).mean():.3f} (fraction >=)")
