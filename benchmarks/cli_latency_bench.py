"""End-to-end latency of a small solve: a fresh process, from interpreter start to the HDF5 file.

Issue 6 asks for ``odecli solve`` of a small example in <= 3 s including interpreter start. This
times ``odecli solve examples/vdp-sweep.yaml`` (16 van der Pol samples, 101 output times, dopri5,
rtol = atol = 1e-6) against the same job done by fresh-process scripts with the peers
(torchode eager, scipy's solve_ivp per sample), each writing t, y and status to HDF5 too, and
against ``python -c "import torch"``, the floor of any tool that imports torch. Runs go
round-robin over the commands so that a slow moment of the machine hits all of them.

    python benchmarks/cli_latency_bench.py --repeats 7
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "vdp-sweep.yaml"

PROBLEM = """
import numpy as np, yaml
spec = yaml.safe_load(open({example!r}))
mu = np.array(spec["system"]["params"]["mu"])
t_eval = np.linspace(spec["time"]["start"], spec["time"]["end"], spec["time"]["eval"])
"""

TORCHODE = PROBLEM + """
import torch, torchode, h5py
m = torch.tensor(mu)
def f(t, y):
    return torch.stack([y[:, 1], m * (1 - y[:, 0] ** 2) * y[:, 1] - y[:, 0]], dim=1)
term = torchode.ODETerm(f)
method = torchode.Dopri5(term=term)
controller = torchode.IntegralController(atol=1e-6, rtol=1e-6, term=term)
solver = torchode.AutoDiffAdjoint(method, controller)
y0 = torch.tensor([[2.0, 0.0]] * len(mu), dtype=torch.float64)
te = torch.tensor(t_eval).expand(len(mu), -1)
sol = solver.solve(torchode.InitialValueProblem(y0=y0, t_eval=te))
with h5py.File({out!r}, "w") as h5:
    h5["t"], h5["y"], h5["status"] = sol.ts.numpy(), sol.ys.numpy(), sol.status.numpy()
"""

SCIPY = PROBLEM + """
from scipy.integrate import solve_ivp
import h5py
ys, status = [], []
for m in mu:
    r = solve_ivp(lambda t, y: [y[1], m * (1 - y[0] ** 2) * y[1] - y[0]], (t_eval[0], t_eval[-1]), [2.0, 0.0],
                  method="RK45", t_eval=t_eval, rtol=1e-6, atol=1e-6)
    ys.append(r.y.T); status.append(r.status)
with h5py.File({out!r}, "w") as h5:
    h5["t"], h5["y"], h5["status"] = np.tile(t_eval, (len(mu), 1)), np.stack(ys), np.array(status)
"""


def commands(folder: Path) -> dict[str, list[str]]:
    torch_spec = folder / "vdp-torch.yaml"
    torch_spec.write_text(EXAMPLE.read_text() + "  engine: torch\n  device: cpu\n")
    odecli = [sys.executable, "-m", "odecli", "solve", "--force", "--quiet"]
    script = {name: [sys.executable, "-c", code.format(example=str(EXAMPLE), out=str(folder / f"{name}.h5"))]
              for name, code in (("torchode eager", TORCHODE), ("scipy RK45 loop", SCIPY))}
    return {
        "odecli solve": [*odecli, str(EXAMPLE), "-o", str(folder / "native.h5")],
        "odecli solve (engine: torch)": [*odecli, str(torch_spec), "-o", str(folder / "torch.h5")],
        **script,
        "python -c 'import torch'": [sys.executable, "-c", "import torch"],
        "python -c 'pass'": [sys.executable, "-c", "pass"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        runs = commands(Path(tmp))
        times: dict[str, list[float]] = {name: [] for name in runs}
        for name, cmd in runs.items():  # warm-up: page cache, the C solver's build cache
            subprocess.run(cmd, env=env, check=True, capture_output=True)
        for _ in range(args.repeats):
            for name, cmd in runs.items():
                start = time.perf_counter()
                subprocess.run(cmd, env=env, check=True, capture_output=True)
                times[name].append(time.perf_counter() - start)
    ours = statistics.median(times["odecli solve"])
    print(f"# {args.repeats} round-robin repeats after one warm-up each; OMP_NUM_THREADS=1; load {os.getloadavg()[0]:.2f}")
    print("| command | median s | min s | max s | odecli solve / this |")
    print("|---|---|---|---|---|")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.2f} | {min(values):.2f} | {max(values):.2f} | {ours / median:.2f} |")


if __name__ == "__main__":
    main()
