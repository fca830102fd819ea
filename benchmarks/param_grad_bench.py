#!/usr/bin/env python
"""Forward + backward time of parameter gradients through the generated C solver: odecli vs torchode, torchdiffeq.

The problems are issue 6's (float64, dopri5, rtol = atol = 1e-6, t in [0, 10], 11 output times):

* ``vdp``: van der Pol, mu = linspace(0.5, 25, B) (mu = 25 alone at B = 1), y0 = (2, 0);
* ``lv``: Lotka-Volterra x' = a x - b x y, y' = c x y - d y with (a, b, c, d) = (1.5, 1, 1, 3) per sample and
  (x0, y0) uniform in [1, 3]^2 (seed 0);
* ``mlp``: the neural ODE of ode_bench.py, y' = W2 tanh(W1 y + b1) + b2 (32 states, 64 hidden,
  ``nn.Linear`` defaults, seed 0), y0 ~ N(0, 1) (seed 1).

Loss = mean of y^2 over every output; gradients for y0 and every per-sample parameter (the MLP: its
shared weights and biases). Rows, all in one process, round-robin over ``--repeats`` timed runs
after one untimed call each (median):

* odecli native: the generated C solver and its generated reverse sweep (``solver.engine: auto``,
  what ``odecli train-inverse`` runs for an ``equations:`` spec with ``adjoint: direct``; the MLP as
  ``NativeMLP.from_module``);
* odecli torch direct / backsolve: the batched PyTorch loop, backprop through it / continuous adjoint;
* torchode AutoDiffAdjoint (backprop), per-sample steps like odecli (its BacksolveAdjoint vmaps f over
  single samples with the Module's parameters shared, so it cannot take per-sample parameters);
* torchdiffeq odeint (backprop) and odeint_adjoint: the batch as one system with shared steps.

``grad err`` is the largest relative difference of a row's gradient from odecli torch direct's
(same steps as odecli native, so ~1e-10 there; the peers take other steps, so ~ the tolerance).

Usage::

    python benchmarks/param_grad_bench.py                          # vdp and lv at B = 1, 64, 1024
    python benchmarks/param_grad_bench.py --problems mlp --batches 1,256,1024
    python benchmarks/param_grad_bench.py --problems vdp --batches 1,1024 --repeats 5
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

from odecli.ode.adjoint import odeint
from odecli.ode.native import NativeMLP, NativeRhs, solve_native

F64 = torch.float64
RTOL = ATOL = 1e-6
T_END, N_EVAL = 10.0, 11

PROBLEMS = {
    "vdp": dict(equations=("y[1]", "((p[0] * (1.0 - odecli_sq(y[0]))) * y[1]) - y[0]"), params=("mu",)),
    "lv": dict(equations=("((p[0] * y[0]) - ((p[1] * y[0]) * y[1]))", "(((p[2] * y[0]) * y[1]) - (p[3] * y[1]))"),
               params=("a", "b", "c", "d")),
}


def _mlp() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 32)).double()


NET = _mlp()


class _NetRhs(torch.nn.Module):
    """NET as f(t, y, p): a Module, so that odecli's backsolve finds its weights."""

    def __init__(self):
        super().__init__()
        self.net = NET

    def forward(self, t, y, p):
        return self.net(y)


def torch_rhs(problem: str) -> Callable:
    """f(t, y, p) of the same equations in PyTorch (odecli's signature)."""
    if problem == "mlp":
        return _NetRhs()
    if problem == "vdp":
        return lambda t, y, p: torch.stack([y[:, 1], p["mu"] * (1 - y[:, 0] ** 2) * y[:, 1] - y[:, 0]], dim=-1)
    return lambda t, y, p: torch.stack([p["a"] * y[:, 0] - p["b"] * y[:, 0] * y[:, 1],
                                        p["c"] * y[:, 0] * y[:, 1] - p["d"] * y[:, 1]], dim=-1)


def inputs(problem: str, batch: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    if problem == "mlp":
        return torch.randn(batch, 32, generator=torch.Generator().manual_seed(1), dtype=F64), {}
    if problem == "vdp":
        mu = torch.tensor([25.0], dtype=F64) if batch == 1 else torch.linspace(0.5, 25.0, batch, dtype=F64)
        return torch.tensor([[2.0, 0.0]], dtype=F64).expand(batch, 2).clone(), {"mu": mu}
    gen = torch.Generator().manual_seed(0)
    y0 = 1 + 2 * torch.rand(batch, 2, generator=gen, dtype=F64)
    return y0, {name: torch.full((batch,), value, dtype=F64) for name, value in zip("abcd", (1.5, 1.0, 1.0, 3.0))}


def _leaves(y0, params):
    return y0.clone().requires_grad_(True), {k: v.clone().requires_grad_(True) for k, v in params.items()}


def odecli_row(problem: str, engine: str, y0, params, t_eval) -> Callable[[], tuple[dict, list]]:
    rhs = NativeMLP.from_module(NET) if problem == "mlp" else NativeRhs(**PROBLEMS[problem])
    f = torch_rhs(problem)
    weights = list(NET.parameters()) if problem == "mlp" else []

    def run():
        y, p = _leaves(y0, params)
        if engine == "native":
            sol = solve_native(rhs, y, 0.0, T_END, t_eval, params=p, rtol=RTOL, atol=ATOL)
        else:
            sol = odeint(f, y, 0.0, T_END, t_eval, params=p, adjoint=engine, rtol=RTOL, atol=ATOL)
        grads = torch.autograd.grad((sol.y**2).mean(), [y, *p.values(), *weights])
        return {"steps": float(sol.stats["n_steps"].double().mean())}, grads

    return run


class Field(torch.nn.Module):
    """The right-hand side f(t, y) with the (per-sample) parameters as Module parameters, as the
    peers' adjoints need them; counts its calls."""

    def __init__(self, problem: str, params: dict[str, torch.Tensor]):
        super().__init__()
        self.f = torch_rhs(problem)
        self.p = torch.nn.ParameterDict({k: torch.nn.Parameter(v.clone()) for k, v in params.items()})
        self.net = NET if problem == "mlp" else None  # a submodule: the adjoints see its weights
        self.evals = 0

    def forward(self, t, y):
        self.evals += 1
        return self.f(t, y, dict(self.p))

    def gradient_inputs(self) -> list[torch.Tensor]:
        """What odecli differentiates, in its order: the parameters, then the MLP's weights."""
        return [*self.p.values(), *(self.net.parameters() if self.net is not None else [])]


def torchode_row(problem: str, y0, params, t_eval) -> Callable[[], tuple[dict, list]]:
    import torchode as to

    grid = t_eval.expand(y0.shape[0], -1)

    def run():
        y, _ = _leaves(y0, params)
        field = Field(problem, params)
        term = to.ODETerm(field)
        step = to.Dopri5(term=term)
        controller = to.IntegralController(atol=ATOL, rtol=RTOL, term=term)
        solver = to.AutoDiffAdjoint(step, controller)
        sol = solver.solve(to.InitialValueProblem(y0=y, t_eval=grid))
        grads = torch.autograd.grad((sol.ys**2).mean(), [y, *field.gradient_inputs()], allow_unused=True)
        return {"steps": float(sol.stats["n_steps"].double().mean())}, grads

    return run


def torchdiffeq_row(problem: str, adjoint: bool, y0, params, t_eval) -> Callable[[], tuple[dict, list]]:
    import torchdiffeq

    def run():
        y, _ = _leaves(y0, params)
        field = Field(problem, params)
        solver = torchdiffeq.odeint_adjoint if adjoint else torchdiffeq.odeint
        ys = solver(field, y, t_eval, rtol=RTOL, atol=ATOL, method="dopri5")
        steps = field.evals / 6.0
        grads = torch.autograd.grad((ys**2).mean(), [y, *field.gradient_inputs()])
        return {"steps": steps}, grads

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", default="vdp,lv")
    parser.add_argument("--batches", default="1,64,1024")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip", default="", help="comma-separated row names to leave out")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    skip = set(filter(None, args.skip.split(",")))
    print(f"# param_grad_bench {datetime.datetime.now():%Y-%m-%d %H:%M} torch {torch.__version__} "
          f"{platform.processor() or platform.machine()} threads={torch.get_num_threads()} rtol=atol={RTOL} float64")
    t_eval = torch.linspace(0.0, T_END, N_EVAL, dtype=F64)
    for problem in args.problems.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            y0, params = inputs(problem, batch)
            rows = {f"odecli {e}": odecli_row(problem, e, y0, params, t_eval) for e in ("native", "direct", "backsolve")}
            if importlib.util.find_spec("torchode"):
                rows["torchode autodiff"] = torchode_row(problem, y0, params, t_eval)
            if importlib.util.find_spec("torchdiffeq"):
                rows["torchdiffeq odeint"] = torchdiffeq_row(problem, False, y0, params, t_eval)
                rows["torchdiffeq adjoint"] = torchdiffeq_row(problem, True, y0, params, t_eval)
            rows = {name: row for name, row in rows.items() if name not in skip}
            info, grads, failed = {}, {}, {}
            for name, row in rows.items():  # untimed first calls (C builds, caches)
                try:
                    info[name], grads[name] = row()
                except Exception as exc:  # a peer that cannot solve this problem is reported, not timed
                    failed[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:60]}"
            rows = {name: row for name, row in rows.items() if name not in failed}
            times: dict[str, list[float]] = {name: [] for name in rows}
            for _ in range(args.repeats):
                for name, row in rows.items():
                    started = time.perf_counter()
                    row()
                    times[name].append(time.perf_counter() - started)
            median = {name: statistics.median(values) for name, values in times.items()}
            reference = grads.get("odecli direct")
            print(f"\n## {problem}, B = {batch}\n")
            print("| row | fwd+bwd median (s) | steps/sample | grad err vs odecli direct | odecli native / row |")
            print("|---|---:|---:|---:|---:|")
            for name in rows:
                err = "" if reference is None else f"{_relative_error(grads[name], reference):.1e}"
                ratio = f"{median['odecli native'] / median[name]:.3f}" if "odecli native" in median else ""
                print(f"| {name} | {median[name]:.4f} | {info[name]['steps']:.1f} | {err} | {ratio} |")
            for name, why in failed.items():
                print(f"| {name} | failed ({why}) | | | |")


def _relative_error(got, want) -> float:
    worst = 0.0
    for g, w in zip(got, want):
        if g is None:
            return float("nan")
        worst = max(worst, float((g - w).abs().max() / w.abs().max().clamp_min(1e-300)))
    return worst


if __name__ == "__main__":
    main()
