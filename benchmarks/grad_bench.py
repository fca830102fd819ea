#!/usr/bin/env python
"""Forward+backward time of a neural-ODE batch: odecli (direct/backsolve/checkpoint) vs torchode and torchdiffeq.

The problem: an MLP right-hand side 2 -> 32 -> 32 -> 2 (tanh), float32, initial states uniform in
[-2, 2]^2, t in [0, 3] with 8 evaluation times, dopri5 with rtol = 1e-4, atol = 1e-5 everywhere,
loss = mean of y^2 over every output, gradient w.r.t. the MLP weights (and y0 for odecli).

Rows (all in the same process and run, round-robin over the rows for ``--repeats`` timed runs after
one untimed warm-up each, median reported):

* odecli direct / backsolve / checkpoint: per-sample steps (every sample its own step size);
* torchode AutoDiffAdjoint (backprop through its solver) and BacksolveAdjoint: per-sample steps too;
* torchdiffeq odeint (backprop) and odeint_adjoint: the batch is ONE system with shared steps, so
  its step count is that of the hardest sample; it is the common baseline, not the same semantics.

``steps`` is the mean number of forward steps per sample (torchdiffeq: of the joint system) and,
where the library reports it, the backward steps.

Usage::

    python benchmarks/grad_bench.py                       # batches 256 and 4096
    python benchmarks/grad_bench.py --batches 256 --repeats 3
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import platform
import statistics
import time
from typing import Callable

import torch
from torch import nn

from odecli.ode.adjoint import odeint

DTYPE = torch.float32
RTOL, ATOL = 1e-4, 1e-5
T_END, N_EVAL = 3.0, 8


class MLP(nn.Module):
    def __init__(self, hidden: int = 32):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(2, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                                 nn.Linear(hidden, 2)).to(DTYPE)

    def forward(self, t, y, p=None):  # odecli signature f(t, y, p); torchdiffeq/torchode call f(t, y)
        return self.net(y)


def odecli_row(mode: str, field: MLP, y0: torch.Tensor, t_eval: torch.Tensor) -> Callable[[], dict]:
    def run() -> dict:
        y = y0.clone().requires_grad_(True)
        sol = odeint(field, y, 0.0, T_END, t_eval, adjoint=mode, rtol=RTOL, atol=ATOL)
        (sol.y**2).mean().backward()
        back = sol.extra.get("backward_stats") or {}
        out = {"steps": float(sol.stats["n_steps"].float().mean())}
        if "n_steps" in back:
            out["back_steps"] = float(back["n_steps"].float().mean())
        return out

    return run


def torchdiffeq_row(adjoint: bool, field: MLP, y0: torch.Tensor, t_eval: torch.Tensor) -> Callable[[], dict]:
    import torchdiffeq

    counter = {"n": 0}

    class Counted(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = field

        def forward(self, t, y):
            counter["n"] += 1
            return self.inner(t, y)

    func = Counted()
    solver = torchdiffeq.odeint_adjoint if adjoint else torchdiffeq.odeint

    def run() -> dict:
        counter["n"] = 0
        y = y0.clone().requires_grad_(True)
        kwargs = {"adjoint_params": tuple(field.parameters()) + (y,)} if adjoint else {}
        ys = solver(func, y, t_eval, rtol=RTOL, atol=ATOL, method="dopri5", **kwargs)
        forward_evals = counter["n"]
        (ys**2).mean().backward()
        return {"steps": forward_evals / 6.0, "back_evals": counter["n"] - forward_evals}

    return run


def torchode_row(adjoint: str, field: MLP, y0: torch.Tensor, t_eval: torch.Tensor) -> Callable[[], dict]:
    import torchode as to

    term = to.ODETerm(field)  # a Module: BacksolveAdjoint reads its named_parameters
    step = to.Dopri5(term=term)
    controller = to.IntegralController(atol=ATOL, rtol=RTOL, term=term)
    solver = to.AutoDiffAdjoint(step, controller) if adjoint == "autodiff" else to.BacksolveAdjoint(term, step, controller)
    grid = t_eval.expand(y0.shape[0], -1)

    def run() -> dict:
        y = y0.clone().requires_grad_(True)
        sol = solver.solve(to.InitialValueProblem(y0=y, t_eval=grid))
        (sol.ys**2).mean().backward()
        return {"steps": float(sol.stats["n_steps"].float().mean())}

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="256,4096")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--skip", default="", help="comma-separated row names to leave out")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    skip = set(filter(None, args.skip.split(",")))
    print(f"# grad_bench {datetime.date.today()} torch {torch.__version__} {platform.processor() or platform.machine()} "
          f"threads={torch.get_num_threads()} rtol={RTOL} atol={ATOL} float32 MLP 2-32-32-2")
    for batch in (int(b) for b in args.batches.split(",")):
        torch.manual_seed(1)
        y0 = (torch.rand(batch, 2, dtype=DTYPE) * 4 - 2)
        t_eval = torch.linspace(0.0, T_END, N_EVAL, dtype=DTYPE)
        field = MLP()
        rows: dict[str, Callable[[], dict]] = {
            f"odecli {m}": odecli_row(m, field, y0, t_eval) for m in ("direct", "backsolve", "checkpoint")
        }
        if importlib.util.find_spec("torchode"):
            rows["torchode autodiff"] = torchode_row("autodiff", field, y0, t_eval)
            rows["torchode backsolve"] = torchode_row("backsolve", field, y0, t_eval)
        if importlib.util.find_spec("torchdiffeq"):
            rows["torchdiffeq odeint (joint)"] = torchdiffeq_row(False, field, y0, t_eval)
            rows["torchdiffeq adjoint (joint)"] = torchdiffeq_row(True, field, y0, t_eval)
        rows = {k: v for k, v in rows.items() if k not in skip}
        first, info, times = {}, {}, {k: [] for k in rows}
        for name, run in rows.items():
            started = time.perf_counter()
            try:
                info[name] = run()
            except Exception as exc:  # noqa: BLE001 - a peer failing must not hide the others
                info[name] = {"error": f"{type(exc).__name__}: {exc}"[:120]}
            first[name] = time.perf_counter() - started
        for _ in range(args.repeats):
            for name, run in rows.items():
                if "error" in info[name]:
                    continue
                started = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - started)
        print(f"\n## batch {batch}\n")
        print("| row | fwd+bwd median (s) | 1st call (s) | steps/sample (fwd) | backward |")
        print("|---|---:|---:|---:|---|")
        for name in rows:
            if "error" in info[name]:
                print(f"| {name} | failed: {info[name]['error']} | | | |")
                continue
            d = info[name]
            back = (f"{d['back_steps']:.1f} steps/sample" if "back_steps" in d else
                    f"{d['back_evals']} f-evals" if "back_evals" in d else "")
            print(f"| {name} | {statistics.median(times[name]):.3f} | {first[name]:.3f} | {d['steps']:.1f} | {back} |",
                  flush=True)


if __name__ == "__main__":
    main()
