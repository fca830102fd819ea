"""Device check (run by hand on a GPU machine): CUDA results equal CPU results; GPU throughput.

    python tests/mpi_scripts/pde_gpu_check.py
"""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "mpi_scripts"), str(ROOT / "benchmarks")]

from odecli.parallel.comm import get_comm  # noqa: E402
from odecli.app.pde_problem import Problem  # noqa: E402
from odecli.specs.pde import validate  # noqa: E402


def build(raw, dev):
    raw = copy.deepcopy(raw)
    raw.setdefault("compute", {})["device"] = dev
    spec = validate(raw, "gpu.yaml")
    spec["text"] = ""
    return Problem(spec, get_comm())


def main():
    print("torch", torch.__version__, "cuda", torch.cuda.is_available(), flush=True)
    if not torch.cuda.is_available():
        return
    print(torch.cuda.get_device_name(0), flush=True)
    from pde_equivalence import variants

    for name, raw in variants().items():
        out = {}
        for dev in ("cpu", "cuda"):
            P = build(raw, dev)
            loss, grads = P.evaluate(0)
            out[dev] = (loss, [g.detach().cpu() for g in grads], P.observed.cpu())
        (lc, gc, oc), (lg, gg, og) = out["cpu"], out["cuda"]
        gerr = max(float((a - b).abs().max() / max(float(a.abs().max()), 1e-300)) for a, b in zip(gc, gg))
        oerr = float((oc - og).abs().max() / oc.abs().max())
        print(f"{name:18s} observed rel {oerr:.2e}  loss rel {abs(lc - lg) / abs(lc):.2e}  grad rel {gerr:.2e}",
              flush=True)
    from pde_bench import spec_dict

    for n in (1000, 2000):
        for dtype in ("float32", "float64"):
            raw = spec_dict(n, 200, dtype, "auto")
            P = build(raw, "cuda")
            c = P.unknown.field().detach()

            def fwd():
                with torch.no_grad():
                    P.prop.forward(c)

            def fb():
                P.evaluate(None)

            for label, fn in (("forward", fwd), ("forward+gradient", fb)):
                fn()
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                t0 = time.perf_counter()
                fn()
                torch.cuda.synchronize()
                t = time.perf_counter() - t0
                mem = torch.cuda.max_memory_allocated() / 1e9
                print(f"cuda {n}x{n} {dtype} 200 steps {label:17s} {t:7.3f} s "
                      f"{n * n * 200 / t / 1e9:7.3f} GPts/s  peak {mem:.2f} GB", flush=True)


if __name__ == "__main__":
    main()
