"""``odecli train-inverse`` for ``kind: ode`` specs: fit per-sample or shared unknowns to trajectories.

Data parallel under ``mpirun``: the samples are split into contiguous blocks, one per rank. Every
rank holds the full (small) vector of unknowns and runs the same optimiser on it; a loss/gradient
evaluation solves only the rank's block, then gathers the per-sample loss terms, the per-sample
gradients and the per-sample contributions to shared gradients to every rank *in global sample
order* and sums them there in that order. The result is therefore the same on every rank and equal
to the 1-rank run (to round-off, ~1e-12), rather than depending on an all-reduce's summation order.

A spec's ``events:`` take part in every solve of the fit, as in ``odecli solve``: a terminal event
ends a sample (status 5), its later output times are NaN and are left out of the trajectory
misfit (on either side). ``inverse.data.events`` makes event times observations: the loss adds,
per observed event, the weighted mean squared error of each sample's first ``occurrences``
times, differentiated by the implicit function theorem in the PyTorch loop's direct gradient
(:mod:`odecli.ode.events`); a sample whose fitted solve has fewer occurrences fails that
evaluation (inf loss: the line search steps back). The generated C gradient does not
differentiate event times, so a fit of a spec with events runs in the PyTorch loop.

Shared unknowns are handed to the solver as one copy per row (the spec's right-hand sides broadcast
per-sample parameters), so their per-sample contributions come out of the same backward pass.

The loop, the optimisers and the checkpoints are those of every fit (:mod:`odecli.app.fit`,
:mod:`odecli.optim`, :mod:`odecli.app.checkpoint`): this module builds the problem, evaluates it,
and writes the run file. ``--resume`` finishes a killed fit exactly as an uninterrupted one.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import h5py
import numpy as np
import torch

from odecli import __version__
from odecli.app import checkpoint as ckpt
from odecli.app.fit import LOSS_COLUMNS, FitSettings, Stop, end_every_rank, run_fit
from odecli.errors import EXIT_FAILED_SAMPLES, EXIT_OK, InputError, OdecliError, SpecError
from odecli.io.atomic import atomic_h5
from odecli.io.ode_observations import read_observations
from odecli.optim import Box, Optimizer, Space, make_optimizer
from odecli.ode.adjoint import odeint
from odecli.ode.controllers import make_controller
from odecli.ode.native import NativeRhs, NativeUnavailable, solve_native
from odecli.ode.gpu.gradient import gpu_gradient_unsupported
from odecli.ode.native.gradient import gradient_unsupported
from odecli.ode.solver import STAT_NAMES, solve
from odecli.ode.status import Status
from odecli.parallel.comm import Comm, get_comm
from odecli.app.checkpoint import check_start, note_on_interrupt
from odecli.app.checkpoint import checkpoint_path  # noqa: F401 - callers import it from here
from odecli.app.solve import native_unsupported, spec_device
from odecli.specs import OdeSpec, build_c_equations, build_rhs, param_tensors
from odecli.specs.events import build_events
from odecli.specs.inverse import InverseSpec, load_ode_inverse_spec
from odecli.specs.rhs import python_errors


@dataclass
class FitResult:
    fitted: dict[str, np.ndarray]  # name -> (batch,) per-sample or (1,) shared
    initial_guess: dict[str, np.ndarray]
    truth: dict[str, np.ndarray]  # known true values (synthetic data), same layout
    history: dict[str, list[float]]
    stop_reason: str
    iterations: int
    t: np.ndarray | None = None  # full (batch, n_eval) on rank 0, None elsewhere
    y: np.ndarray | None = None
    data: np.ndarray | None = None
    status: np.ndarray | None = None
    stats: dict[str, np.ndarray] = field(default_factory=dict)
    events: dict[str, np.ndarray] = field(default_factory=dict)  # observed event -> fitted times (batch, occurrences)
    event_data: dict[str, np.ndarray] = field(default_factory=dict)  # observed event -> observed times
    wall_time_s: float = 0.0
    ranks: int = 1
    engine: str = "torch"  # what computed the loss gradients: "native" (generated C) or "torch"


def block(batch: int, size: int, rank: int) -> tuple[int, int]:
    """Contiguous block of samples owned by ``rank`` (the first ``batch % size`` ranks get one more)."""
    base, extra = divmod(batch, size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def _allgather(comm: Comm, local: np.ndarray) -> np.ndarray:
    """Blocks of every rank concatenated in rank (= global sample) order, on every rank."""
    if comm.size == 1:
        return np.array(local, copy=True)
    parts = comm.gather_object(np.ascontiguousarray(local), root=0)
    full = np.concatenate(parts, axis=0) if comm.rank == 0 else None
    return comm.bcast_object(full, root=0)


class Problem:
    """The rank's block of the fit: data, base tensors, and the loss/gradient evaluation."""

    def __init__(self, ode: OdeSpec, inv: InverseSpec, comm: Comm):
        self.ode, self.inv, self.comm = ode, inv, comm
        s = ode.solver
        self.batch = ode.batch
        if comm.size > self.batch:
            raise InputError(f"{ode.file}: {comm.size} ranks but only {self.batch} samples; use at most {self.batch} ranks")
        self.lo, self.hi = block(self.batch, comm.size, comm.rank)
        self.n_local = self.hi - self.lo
        self.device = torch.device(spec_device(ode))
        self.dtype = getattr(torch, s.dtype)
        self.rhs = build_rhs(ode, self.device)
        self.events = build_events(ode.events, ode.states, ode.params, ode.file) if ode.events else None
        self.gpu_note = ""  # why a direct gradient on CUDA runs in the PyTorch loop ("" when it does not)
        self.native_rhs = self._native_rhs()
        self.solve_kwargs = dict(
            method=s.method, rtol=s.rtol, atol=s.atol, dt0=s.dt0, max_steps=s.max_steps,
            controller=make_controller(
                s.controller, pcoeff=s.pcoeff, icoeff=s.icoeff, dcoeff=s.dcoeff, safety=s.safety,
                factor_min=s.factor_min, factor_max=s.factor_max, dt_min=s.dt_min, dt_max=s.dt_max,
            ),
        )
        sl = slice(self.lo, self.hi)
        tensor = lambda v: torch.tensor(v, dtype=self.dtype, device=self.device)  # noqa: E731
        self.base_params = {k: v[sl] for k, v in param_tensors(ode, self.dtype, self.device).items()}
        self.base_y0 = tensor(ode.initial)[sl]
        self.t0 = tensor(ode.t_start)[sl]
        self.t1 = tensor(ode.t_end)[sl]
        self.obs_index = [ode.states.index(name) for name in inv.observed]
        self.weights = tensor(inv.weights)
        self.truth: dict[str, np.ndarray] = {}
        self.event_obs: dict[str, torch.Tensor] = {}  # observed event -> (n_local, occurrences) times
        self.grid, self.obs = self._load_data()
        self.n_eval = self.grid.shape[1]
        self.norm = float(max(1, self.batch * self.n_eval * len(self.obs_index)))
        self.sizes = [self.batch if u.per_sample else 1 for u in inv.unknowns]
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(int)
        self.lower = np.concatenate([np.full(n, u.lower) for n, u in zip(self.sizes, inv.unknowns)])
        self.upper = np.concatenate([np.full(n, u.upper) for n, u in zip(self.sizes, inv.unknowns)])
        self.x0 = np.concatenate([np.asarray(u.init, dtype=np.float64) for u in inv.unknowns])
        self.n_evals = 0
        self.last_backward: dict[str, np.ndarray] = {}

    # ---------------------------------------------------------------------------------- solves
    def _native_rhs(self) -> NativeRhs | None:
        """The C right-hand side when the generated solver runs this fit (its gradient, when the
        fit asks for ``direct`` ones, is generated C too); None for the PyTorch loop."""
        direct_on_gpu = self.inv.adjoint == "direct" and self.device.type == "cuda"  # the gradient as a GPU kernel
        why = native_unsupported(self.ode, str(self.device))  # equations, explicit RK; CPU float64 or CUDA
        if not why and self.events is not None:
            why = "the generated gradient does not differentiate event times"
        rhs = None if why else NativeRhs(*build_c_equations(self.ode))
        if rhs is not None and self.inv.adjoint == "direct":
            why = gradient_unsupported(rhs, self.ode.solver.method) or (gpu_gradient_unsupported(
                rhs, self.ode.solver.method, self.ode.solver.dtype, str(self.device)) if direct_on_gpu else "")
        self.gpu_note = why if direct_on_gpu else ""
        return None if why else rhs

    @property
    def gradient_engine(self) -> str:
        return "native" if self.native_rhs is not None and self.inv.adjoint == "direct" else "torch"

    def _solve(self, y0: torch.Tensor, params: dict, grid: torch.Tensor, need_grad: bool):
        """One solve of the rank's block, by the C solver where it can (else the PyTorch loop)."""
        if self.native_rhs is not None and (not need_grad or self.inv.adjoint == "direct"):
            try:
                return solve_native(self.native_rhs, y0, self.t0, self.t1, grid, params=params, **self.solve_kwargs)
            except NativeUnavailable:  # no working C compiler here: the PyTorch loop from now on
                self.native_rhs = None
        events = {"events": self.events} if self.events is not None else {}
        if need_grad:
            return odeint(self.rhs, y0, self.t0, self.t1, grid, params=params, adjoint=self.inv.adjoint,
                          **events, **self.solve_kwargs)
        return solve(self.rhs, y0, self.t0, self.t1, grid, params=params, **events, **self.solve_kwargs)

    # ------------------------------------------------------------------------------------ data
    def _load_data(self) -> tuple[torch.Tensor, torch.Tensor]:
        ode, inv, data = self.ode, self.inv, self.inv.data
        sl = slice(self.lo, self.hi)
        if data.file is not None:
            t_full, y_full, event_times = read_observations(data.file, ode, inv)
            grid = torch.tensor(t_full[sl], dtype=self.dtype, device=self.device)
            clean = torch.tensor(y_full[sl], dtype=self.dtype, device=self.device)
            self.event_obs = {name: torch.tensor(times[sl], dtype=self.dtype, device=self.device)
                              for name, times in event_times.items()}
        else:
            grid = torch.tensor(ode.t_eval, dtype=self.dtype, device=self.device)[sl]
            params = dict(self.base_params)
            y0 = self.base_y0.clone()
            for name, values in data.truth_params.items():
                params[name] = torch.tensor(values, dtype=self.dtype, device=self.device)[sl]
            for name, values in data.truth_initial.items():
                y0[:, ode.states.index(name)] = torch.tensor(values, dtype=self.dtype, device=self.device)[sl]
            with torch.no_grad():
                sol = self._solve(y0, params, grid, need_grad=False)
            failed = (sol.status != 0) & (sol.status != Status.EVENT)
            if bool(failed.any()):
                bad = int(torch.nonzero(failed)[0, 0]) + self.lo
                raise InputError(f"{ode.file}: inverse.data.truth: the true system fails to solve for sample {bad}")
            clean = sol.y[:, :, self.obs_index]
            for observation in inv.data.events:
                times = _first_occurrences(sol.events[observation.name].t, observation.occurrences)
                missing = torch.isnan(times).any(dim=1)
                if bool(missing.any()):
                    bad = int(torch.nonzero(missing)[0, 0]) + self.lo
                    raise InputError(f"{ode.file}: inverse.data.events.{observation.name}: the true system has fewer "
                                     f"than {observation.occurrences} occurrence(s) in sample {bad}")
                self.event_obs[observation.name] = times
            for u in inv.unknowns:
                source = data.truth_params if u.kind == "param" else data.truth_initial
                if u.name in source:
                    values = np.asarray(source[u.name], dtype=np.float64)
                    self.truth[u.name] = values if u.per_sample else values[:1]
        if data.noise > 0:
            gen = torch.Generator().manual_seed(data.seed)
            full_shape = (self.batch, clean.shape[1], clean.shape[2])
            noise = torch.randn(full_shape, generator=gen, dtype=torch.float64)[sl].to(self.dtype).to(self.device)
            scale = clean.abs() * data.noise if data.relative else data.noise
            clean = clean + scale * noise
            for observation in inv.data.events:  # in spec order, after the trajectories' draw
                times = self.event_obs[observation.name]
                draw = torch.randn((self.batch, times.shape[1]), generator=gen, dtype=torch.float64)[sl]
                draw = draw.to(self.dtype).to(self.device)
                scale = times.abs() * data.noise if data.relative else data.noise
                self.event_obs[observation.name] = times + scale * draw
        return grid, clean

    # ------------------------------------------------------------------------------ evaluation
    def _inputs(self, x: np.ndarray, requires_grad: bool):
        params = dict(self.base_params)
        columns = list(self.base_y0.unbind(1))
        leaves = []
        for u, off, n in zip(self.inv.unknowns, self.offsets, self.sizes):
            values = x[off + self.lo: off + self.hi] if u.per_sample else np.full(self.n_local, x[off])
            leaf = torch.tensor(values, dtype=self.dtype, device=self.device).requires_grad_(requires_grad)
            leaves.append(leaf)
            if u.kind == "param":
                params[u.name] = leaf
            else:
                columns[self.ode.states.index(u.name)] = leaf
        return params, torch.stack(columns, dim=1), leaves

    def evaluate(self, x: np.ndarray, need_grad: bool = True) -> tuple[float, np.ndarray | None]:
        """Global loss and gradient at ``x`` (identical on every rank); inf/None if a sample fails."""
        self.n_evals += 1
        params, y0, leaves = self._inputs(x, need_grad)
        with torch.set_grad_enabled(need_grad):
            sol = self._solve(y0, params, self.grid, need_grad)
            per_sample = self._misfit(sol)
        local_ok = bool(torch.isfinite(per_sample).all()) and bool(
            ((sol.status == 0) | (sol.status == Status.EVENT)).all())
        ok = self.comm.allreduce_scalar(0.0 if local_ok else 1.0, op="max") == 0.0
        losses = _allgather(self.comm, per_sample.detach().cpu().double().numpy())
        if not ok:
            return math.inf, None
        loss = float(np.sum(losses))
        if not need_grad:
            return loss, None
        grads = torch.autograd.grad(per_sample.sum(), leaves, allow_unused=True)
        full = []
        for u, g, leaf in zip(self.inv.unknowns, grads, leaves):
            g = torch.zeros_like(leaf) if g is None else g
            gathered = _allgather(self.comm, g.detach().cpu().double().numpy())
            full.append(gathered if u.per_sample else np.sum(gathered, keepdims=True))
        back = sol.extra.get("backward_stats") or {}
        self.last_backward = {k: v for k, v in back.items() if k in STAT_NAMES}
        return loss, np.concatenate(full)

    def _misfit(self, sol) -> torch.Tensor:
        """(n_local,) loss terms: the trajectories' weighted squared error over ``norm``, plus each
        observed event's weighted mean squared error of its first occurrences' times (NaN, hence a
        failed evaluation, where a sample has fewer occurrences than observed)."""
        resid = sol.y[:, :, self.obs_index] - self.obs
        if self.events is not None:  # past a terminal event (fitted or observed) there is nothing to compare
            resid = torch.where(torch.isnan(resid), torch.zeros_like(resid), resid)
        per_sample = (self.weights * resid**2).sum(dim=(1, 2)) / self.norm
        for observation in self.inv.data.events:
            observed = self.event_obs[observation.name]
            fitted = _first_occurrences(sol.events[observation.name].t, observation.occurrences)
            per_sample = per_sample + observation.weight * ((fitted - observed) ** 2).sum(dim=1) / (
                self.batch * observation.occurrences)
        return per_sample

    def event_times(self, sol) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Fitted and observed times of the observed events, gathered to full arrays on every rank."""
        g = lambda v: _allgather(self.comm, v.detach().cpu().numpy())  # noqa: E731
        fitted = {o.name: g(_first_occurrences(sol.events[o.name].t, o.occurrences)) for o in self.inv.data.events}
        observed = {name: g(times) for name, times in self.event_obs.items()}
        return fitted, observed

    def final_solution(self, x: np.ndarray):
        """Trajectories, status and counters at ``x``, gathered to full arrays on every rank."""
        params, y0, _ = self._inputs(x, False)
        with torch.no_grad():
            sol = self._solve(y0, params, self.grid, need_grad=False)
        g = lambda v: _allgather(self.comm, v.detach().cpu().numpy())  # noqa: E731
        stats = {name: g(sol.stats[name]) for name in STAT_NAMES}
        for name, values in self.last_backward.items():
            stats[f"backward_{name}"] = g(values)
        return g(sol.t), g(sol.y), g(self.obs), g(sol.status), stats, self.event_times(sol)


def _first_occurrences(times: torch.Tensor, occurrences: int) -> torch.Tensor:
    """(A, occurrences): each row's first event times, NaN where it had fewer."""
    if times.shape[1] >= occurrences:
        return times[:, :occurrences]
    pad = torch.full((times.shape[0], occurrences - times.shape[1]), math.nan, dtype=times.dtype, device=times.device)
    return torch.cat([times, pad], dim=1)


# ------------------------------------------------------------------------------------ the fit

HISTORY = (*LOSS_COLUMNS, "n_evals")  # one row per point: the initial guess, then each iteration
CHECKPOINT_KIND = "ode-inverse-checkpoint"
# The run file's ``stop_reason`` for each way the loop stops (the words ODE fits have always used).
STOP_REASONS = {Stop.ITERATIONS: "max iterations", Stop.LOSS_CHANGE: "converged: loss change",
                Stop.GRADIENT: "converged: gradient",
                Stop.LINE_SEARCH: "converged: no further decrease (line search)",
                Stop.NO_DECREASE: "converged: no further decrease (line search)",
                Stop.FAILED: "failed: a sample did not solve",
                Stop.RISING: "stopped: rising loss", Stop.NON_FINITE: "failed: non-finite gradient"}


class OdeObjective:
    """The ODE half of a fit (:class:`odecli.app.fit.Objective`) over one vector of unknowns that
    every rank holds whole (its evaluation gathers the samples in global order)."""

    def __init__(self, problem: Problem, ode: OdeSpec, x: torch.Tensor, opt: Optimizer,
                 checkpoint: Path | None) -> None:
        self.problem, self.ode, self.x, self.opt, self.checkpoint = problem, ode, x, opt, checkpoint
        self.layout = ckpt.Layout(problem.comm, [False])
        self.evaluated = False  # whether the starting point has been evaluated

    def evaluate(self, completed: int) -> tuple[float, list[torch.Tensor] | None]:
        f, g = self.problem.evaluate(self.x.numpy())
        initial, self.evaluated = not self.evaluated, True
        # only the starting point's failure is fatal: a failed trial point of the first line
        # search (completed is still 0 there) makes the line search step back, as later ones do
        if initial and completed == 0 and g is None:
            also = (" or misses an observed event (fewer occurrences than inverse.data.events asks)"
                    if self.problem.inv.data.events else "")
            # the user's starting point: an input to change (exit 2), not an internal error (issue 42)
            raise SpecError(self.ode.file, "inverse.unknowns",
                            f"the initial guess does not solve (non-finite loss){also}; change the init")
        return f, None if g is None else [torch.from_numpy(g)]

    def columns(self) -> dict[str, float]:
        return {"n_evals": self.problem.n_evals}

    def save(self, iteration: int, f: float, g: list[torch.Tensor], history: dict[str, list]) -> None:
        if self.checkpoint is not None:
            ckpt.save(self.checkpoint, self.layout, kind=CHECKPOINT_KIND, spec_text=self.ode.text,
                      iteration=iteration, f=f, g=g, opt=self.opt, history=history,
                      attrs={"n_evals": self.problem.n_evals})


def fit_ode(ode: OdeSpec, inv: InverseSpec, comm: Comm | None = None, iterations: int | None = None,
            log: Callable[[str], None] | None = None, checkpoint: Path | None = None,
            resume: bool = False) -> FitResult:
    """Run the fit described by ``inv`` on ``ode``; collective over ``comm`` (default: COMM_WORLD).

    With ``checkpoint``, the optimiser state is saved there every ``inv.checkpoint_every``
    iterations; with ``resume`` too, a fit continues from that file when it exists."""
    comm = comm if comm is not None else get_comm()
    started = time.perf_counter()
    problem = Problem(ode, inv, comm)
    if log is not None and problem.native_rhs is not None and inv.adjoint != "direct":
        log(f"note: gradients by {inv.adjoint} run in the PyTorch loop; adjoint: direct would run them in "
            "generated C (exact for the discrete solution, and usually far faster)")
    if log is not None and problem.gpu_note:
        log(f"note: gradients run in the PyTorch loop on {problem.device}: {problem.gpu_note}")
    settings = inv.optimizer
    n_iter = settings.iterations if iterations is None else iterations
    x0 = np.clip(problem.x0, problem.lower, problem.upper)
    x = torch.tensor(x0, dtype=torch.float64)
    space = Space(None, [False])  # every rank holds the whole vector: no reductions
    box = Box([torch.from_numpy(problem.lower)], [torch.from_numpy(problem.upper)])
    # max_first_step: a steepest-descent step of L-BFGS is never longer than the gradient itself
    opt = make_optimizer(settings, [x], space, bounds=box, max_first_step=1.0)
    objective = OdeObjective(problem, ode, x, opt, checkpoint)

    resumed = None
    if resume and checkpoint is not None and checkpoint.exists():
        resumed = ckpt.load(checkpoint, objective.layout, kind=CHECKPOINT_KIND, spec_text=ode.text, opt=opt,
                            history_keys=HISTORY, read_extra=lambda f: {"n_evals": int(ckpt.read_attr(f, "n_evals"))})
        problem.n_evals = resumed.extra["n_evals"]
        started -= sum(resumed.history["wall_time_s"])  # wall time goes on from the interrupted run's
        if log is not None:
            log(f"resuming from {checkpoint} at iteration {resumed.iteration}")
            if resumed.iteration >= n_iter:  # nothing to do but write it out: say so, not a silent 10 for 5
                log(f"note: the checkpoint already has {resumed.iteration} iterations (this run asks for "
                    f"{n_iter}); writing the output from it as it is")
    elif resume and log is not None:
        log(f"no checkpoint at {checkpoint}; starting from the beginning")
    outcome = run_fit(objective, opt, space,
                      FitSettings(n_iter, settings.tolerance, settings.gtol,
                                  inv.checkpoint_every if checkpoint is not None else 0),
                      history_columns=HISTORY[len(LOSS_COLUMNS):], resumed=resumed, may_fail=True, log=log)
    xf = x.numpy().copy()
    t, y, data, status, stats, (event_fit, event_data) = problem.final_solution(xf)
    split = lambda v: {u.name: v[o:o + n].copy() for u, o, n in zip(inv.unknowns, problem.offsets, problem.sizes)}  # noqa: E731
    return FitResult(
        fitted=split(xf), initial_guess=split(x0), truth=problem.truth, history=outcome.history,
        stop_reason=STOP_REASONS[outcome.stop], iterations=outcome.iterations, t=t, y=y, data=data,
        status=status, stats=stats, events=event_fit, event_data=event_data,
        wall_time_s=time.perf_counter() - started, ranks=comm.size,
        engine=problem.gradient_engine,
    )


def write_fit(path: Path, ode: OdeSpec, inv: InverseSpec, result: FitResult, replace: bool = True) -> None:
    """The ``kind: ode-inverse`` run file, written atomically (``replace``: see atomic_path).

    Readers check its datasets against :data:`odecli.io.ode_run.ODE_INVERSE_LAYOUT`: change that with this.
    """
    with atomic_h5(path, replace) as h5:
        a = h5.attrs
        a["kind"] = "ode-inverse"
        a["name"] = ode.name
        a["spec"] = ode.text
        a["spec_file"] = ode.file
        a["odecli_version"] = __version__
        a["states"] = np.array(ode.states, dtype=object)
        a["observed"] = np.array(inv.observed, dtype=h5py.string_dtype())  # may be empty: event times only
        a["method"] = ode.solver.method
        a["rtol"] = ode.solver.rtol
        a["atol"] = ode.solver.atol
        a["adjoint"] = inv.adjoint
        a["engine"] = result.engine
        a["optimizer"] = inv.optimizer.type
        a["iterations"] = result.iterations
        a["stop_reason"] = result.stop_reason
        a["ranks"] = result.ranks
        a["wall_time_s"] = result.wall_time_s
        a["noise"] = inv.data.noise
        a["data_source"] = inv.data.file or "synthetic"
        for group, values in (("fit", result.fitted), ("init", result.initial_guess), ("truth", result.truth)):
            grp = h5.create_group(group)
            for u in inv.unknowns:
                if u.name in values:
                    ds = grp.create_dataset(u.name, data=values[u.name])
                    ds.attrs["unknown"] = u.kind
                    ds.attrs["per_sample"] = u.per_sample
                    ds.attrs["bounds"] = np.array([u.lower, u.upper])
        hist = h5.create_group("history")
        for name, values in result.history.items():
            hist.create_dataset(name, data=np.asarray(values, dtype=np.float64 if name != "n_evals" else np.int64))
        h5.create_dataset("t", data=result.t)
        h5.create_dataset("y", data=result.y)
        h5.create_dataset("data", data=result.data)
        h5.create_dataset("status", data=np.asarray(result.status).astype(np.int8))
        stats = h5.create_group("stats")
        for name, values in result.stats.items():
            stats.create_dataset(name, data=values)
        for observation in inv.data.events:  # observed event times: fitted (t) and observed (data)
            group = h5.create_group(f"events/{observation.name}")
            group.create_dataset("t", data=result.events[observation.name])
            group.create_dataset("data", data=result.event_data[observation.name])
            group.attrs["weight"] = observation.weight


def train_inverse(spec_path: Path, output: Path | None, iterations: int | None, resume: bool,
                  force: bool, quiet: bool) -> int:
    """CLI entry: fit, write the result on rank 0, return the exit code (same on every rank)."""
    comm = get_comm()
    ode, inv = load_ode_inverse_spec(spec_path)  # every rank reads the same file: errors are collective
    if iterations is not None and iterations < 1:
        raise InputError("--iterations must be >= 1")
    output = Path(output) if output is not None else Path(ode.fit_output)
    cpath, replace = check_start(output, resume, force)
    # No rank runs the user's code (a python: right-hand side may write files) before every rank
    # has checked the output: else one rank's probe can create it under another's check_start.
    comm.barrier()
    log = None if quiet or comm.rank != 0 else (lambda line: print(line, flush=True))
    # Outside the try: on one of several ranks, an error of the user's python: function during
    # the fit is that rank's alone, so it must still abort every rank, not wait for them.
    with python_errors(ode):
        try:
            with note_on_interrupt(cpath):
                result = fit_ode(ode, inv, comm, iterations, log, checkpoint=cpath, resume=resume)
                if comm.rank == 0:
                    write_fit(output, ode, inv, result, replace)
                    cpath.unlink(missing_ok=True)  # the output holds everything the checkpoint did
            comm.barrier()
        except BaseException as exc:  # a failure on one rank must end every rank
            # an OdecliError here is every rank's: they all evaluate the same global values
            end_every_rank(comm, exc, collective=isinstance(exc, OdecliError))
            raise
    status = np.asarray(result.status)
    failed = int(((status != 0) & (status != Status.EVENT)).sum())  # a terminal event is no failure
    if comm.rank == 0 and not quiet:
        print(f"{ode.name}: {result.stop_reason} after {result.iterations} iterations; loss "
              f"{result.history['loss'][0]:.3e} -> {result.history['loss'][-1]:.3e}; "
              f"{result.wall_time_s:.2f} s on {comm.size} rank(s); wrote {output}", flush=True)
    return EXIT_FAILED_SAMPLES if failed else EXIT_OK
