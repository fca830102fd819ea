"""Do the pde-inverse examples recover their models with the optimiser defaults, and how do the
MLP unknown's input encodings compare? (issue 40)

Runs each case as ``odecli train-inverse`` would (in this process, one torch thread unless
``--threads``), and prints the model error at the start and the end, their ratio, the stop reason
and the wall time. Cases: the three bundled examples as written, and ``examples/acoustic-mlp.yaml``
with ``unknown.features`` plain (the former tanh MLP), fourier and siren, plus the same MLP on the
heat-conductivity problem, each under L-BFGS (the default) and Adam.

    python benchmarks/inverse_defaults_bench.py              # everything, ~10 min on one core
    python benchmarks/inverse_defaults_bench.py --only examples
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import h5py
import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
HEAT_MLP = {"type": "mlp", "base": 0.0002, "scale": 0.0004, "bounds": [0.00005, 0.002]}


def cases(only: str) -> list[tuple[str, dict]]:
    def load(name: str) -> dict:
        return yaml.safe_load((EXAMPLES / name).read_text())

    out = []
    if only in ("all", "examples"):
        for name in ("acoustic-anomaly.yaml", "acoustic-mlp.yaml", "heat-conductivity.yaml"):
            out.append((name, load(name)))
    if only in ("all", "mlp"):
        for features in ("plain", "fourier", "siren"):
            for optimizer in ("lbfgs", "adam"):  # lbfgs is the default
                spec = load("acoustic-mlp.yaml")
                spec["unknown"]["features"] = features
                spec["optimizer"] = {"type": optimizer, "iterations": 120}
                out.append((f"acoustic-mlp features={features} {optimizer}", spec))
                heat = load("heat-conductivity.yaml")
                heat["unknown"] = {**HEAT_MLP, "features": features}
                heat["optimizer"] = {"type": optimizer, "iterations": 100}
                out.append((f"heat-conductivity mlp features={features} {optimizer}", heat))
    return out


def run(name: str, spec: dict, threads: int, work: Path) -> str:
    from odecli.app.fit_pde import train_inverse

    spec = {**spec, "compute": {**spec.get("compute", {}), "threads": threads}}
    spec.pop("checkpoint", None)
    path = work / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = work / "out.h5"
    t0 = time.perf_counter()
    train_inverse(path, out, None, False, True, True)
    wall = time.perf_counter() - t0
    with h5py.File(out, "r") as f:
        e0, e1 = float(f["history/model_error"][0]), float(f.attrs["model_error_final"])
        n, stop = int(f.attrs["iterations"]), str(f.attrs["stop_reason"])
    return f"| {name} | {n} | {e0:.4g} | {e1:.4g} | {e1 / e0:.3f} | {stop[:40]} | {wall:.1f} |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=("all", "examples", "mlp"), default="all")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    print("| case | iterations | model error start | end | end/start | stop | wall s |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        for name, spec in cases(args.only):
            print(run(name, spec, args.threads, Path(d)), flush=True)


if __name__ == "__main__":
    main()
