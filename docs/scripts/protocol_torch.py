"""The initialisation protocol on a torch MLP (issue 33): width 512, 20 tanh layers, sigma_b2 = 0.05, 8 seeds, at
torch's default initialisation and at sf.init's edge-of-chaos gain. Prints each protocol's table and writes the
two figures. Run: python docs/scripts/protocol_torch.py OUTDIR"""
import math
import sys

import torch

import symfield as sf
from symfield.io import plots

WIDTH, DEPTH, BATCH, SEEDS, SB = 512, 20, 16, 8, 0.05


def record(seed, edge_of_chaos):
    torch.manual_seed(seed)
    layers = []
    for _ in range(DEPTH):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(WIDTH, 10)).double()
    if edge_of_chaos:
        for m in model:
            if isinstance(m, torch.nn.Linear):
                sf.init.torch_(m, "tanh", sigma_b2=SB)
    x = torch.randn(BATCH, WIDTH, dtype=torch.float64)
    y = torch.randint(0, 10, (BATCH,))
    with sf.init.record_torch_grads(model) as (acts, grads):
        torch.nn.functional.cross_entropy(model(x), y).backward()
    return acts, grads


def main(out):
    runs = {"torch default": (False, 1 / 3, 1 / (3 * WIDTH)),    # U(+-1/sqrt(fan_in)): variance 1/(3 fan_in)
            "sf.init edge of chaos": (True, sf.init.gain("tanh", SB) ** 2, SB)}
    for name, (eoc, sw, sb) in runs.items():
        rec = [record(s, eoc) for s in range(SEEDS)]
        p = sf.init.protocol([a for a, _ in rec], "tanh", sw, sb, grads=[g for _, g in rec])
        print(f"== {name}: sigma_w2 = {sw:.6g}, sigma_b2 = {sb:.6g}, ok = {p.ok}")
        print(p.table())
        slug = "default" if not eoc else "eoc"
        plots.protocol(p, path=f"{out}/protocol_{slug}.png",
                       title=f"tanh MLP {DEPTH}x{WIDTH}, {SEEDS} seeds: {name}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
