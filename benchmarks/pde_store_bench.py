"""The forward pass that writes the gradient's store, against one that does not, per point and step.

    python benchmarks/pde_store_bench.py 2000 float64 [OTHER_acoustic.c]
    python benchmarks/pde_store_bench.py 270 float64      # rows that end mid cache line

Passes of 8 steps (one rank, one thread, a sponge 20 cells wide) over a 48-step store, alternated
in one process over 5 rounds: into the store as the time loop allocates it (rows padded to whole
64-byte lines, ``new_lap_store``), into a packed one (rows ``size`` elements apart, as before the
padding), and without a store.  With OTHER_acoustic.c (e.g. an older commit's kernels from a git
worktree, of the same signature) its library is alternated too, so two versions are compared
under the same load.
"""
import sys
import time

import torch
from odecli import native
from odecli.pde.acoustic.kernels import Kernels, new_lap_store
from odecli.pde.native import source_path

torch.set_num_threads(1)
size, dt = int(sys.argv[1]), getattr(torch, sys.argv[2])
libs = {"this": native.load_source("acoustic", source_path("acoustic").read_bytes())[0]}
if len(sys.argv) > 3:
    libs["other"] = native.load_source("acoustic", open(sys.argv[3], "rb").read())[0]
sfx = "f64" if dt == torch.float64 else "f32"
B, n, passes = 1, 8, 6
u = torch.randn(B, size + 4, size + 4, dtype=dt)
p = torch.randn_like(u)
c2 = torch.full((size, size), 0.1, dtype=dt)
sponge = torch.full((size, size), 0.9, dtype=dt)
sponge[20:-20, 20:-20] = 1.0
k = Kernels(u, c2, sponge, 10.0, 10.0)
stores = {"padded": new_lap_store(c2, passes * n, B), "packed": torch.empty(passes * n, B, size, size, dtype=dt)}
for st in stores.values():  # touched once, as the Workspace reuses it
    st.zero_()
cases = [(f"{name} {kind} store", lib, st) for name, lib in libs.items() for kind, st in stores.items()]
cases.append(("no store", libs["this"], None))
res = {name: [] for name, _, _ in cases}
for r in range(5):
    for name, lib, store in cases:
        k._forward_run = getattr(lib, f"leapfrog_forward_run_{sfx}")
        t = time.perf_counter()
        for q in range(passes):
            outs = [(p, u)[j % 2] for j in range(n)]
            laps = None if store is None else store[q * n:(q + 1) * n]
            k.forward_run([p, u, *outs], None, 0, None, 0, laps)
        res[name].append((time.perf_counter() - t) / (passes * n * B * size * size) * 1e9)
for name, v in res.items():
    print(f"{size}^2 {sys.argv[2]} {name:20s} ns per point and step: "
          + " ".join(f"{x:.2f}" for x in v) + f"  best {min(v):.2f}")
base = min(res["no store"])
print("RATIO best / best without the store: "
      + ", ".join(f"{name} {min(v) / base:.2f}" for name, v in res.items() if name != "no store"))
