"""``odecli train-inverse`` for ``kind: pde-inverse`` specs: the PDE half of the one fit loop.

The loop itself is :func:`odecli.app.fit.run_fit`; this module builds the problem
(:class:`odecli.app.pde_problem.Problem`), hands the loop its evaluation and history columns,
checkpoints with the ranks' timings, and writes the run file. With
``optimizer.frequency_continuation`` it runs the loop once per stage (data low-passed at rising
cutoffs, then the full band), each stage with a fresh optimiser, into one history whose
``max_frequency`` column names each row's stage; a checkpoint records the stage it was taken in.

Every rank runs the same program on its block; the loss and every optimiser decision are global
(all-reduced) values, so all ranks take the same path.  Errors every rank hits at the same point
(bad spec, CFL, NaN loss) are raised normally (the CLI prints them once on rank 0); any other
exception on one rank prints its message and aborts the whole MPI job, so nothing hangs.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import torch

from odecli.app import checkpoint as ckpt
from odecli.app.fit import LOSS_COLUMNS, FitSettings, Stop, end_every_rank, run_fit
from odecli.app.fit_smoothing import grid_smoother, smoothing_cells
from odecli.app.pde_problem import Problem, collective
from odecli.errors import InputError, OdecliError
from odecli.io.pde_run import write_result
from odecli.optim import Space, make_optimizer
from odecli.parallel.comm import get_comm
from odecli.io.model_files import with_model_arrays
from odecli.parallel.ops import broadcast, gather_global
from odecli.pde.timing import CommTimer
from odecli.specs.outputs import fit_output_of
from odecli.specs.pde import load_spec

HISTORY_KEYS = (*LOSS_COLUMNS, "misfit", "regularization", "model_error")
CHECKPOINT_KIND = "pde-inverse-checkpoint"
# The run file's ``stop_reason`` for each way the loop stops (the words PDE runs have always used).
STOP_REASONS = {Stop.ITERATIONS: "iterations", Stop.LOSS_CHANGE: "tolerance", Stop.GRADIENT: "zero gradient",
                Stop.LINE_SEARCH: "line search failed", Stop.NO_DECREASE: "converged: no further decrease",
                Stop.FAILED: "failed",
                Stop.RISING: "rising loss", Stop.NON_FINITE: "non-finite gradient"}


def default_output(spec_path: Path) -> Path:
    """``<name>-fit.h5`` in the working directory, as for every kind (odecli.specs.outputs)."""
    return Path.cwd() / fit_output_of(spec_path)


def train_inverse(spec_path: Path, output: Path | None, iterations: int | None, resume: bool,
                  force: bool, quiet: bool) -> int:
    comm = get_comm()
    output = Path(output) if output is not None else default_output(spec_path)
    try:
        with ckpt.note_on_interrupt(ckpt.checkpoint_path(output)):
            return _train(comm, Path(spec_path), output, iterations, resume, force, quiet)
    except BaseException as exc:  # every failure must end every rank
        end_every_rank(comm, exc, collective=getattr(exc, "collective", False))
        raise


def history_keys(problem: Problem) -> tuple[str, ...]:
    """The run's history columns: the loss columns, misfit, regularisation and model error; with
    several parameters each inverted one's model error; with linear solves their iterations (the
    mean and the largest count of a solve in each evaluation)."""
    keys = list(HISTORY_KEYS)
    if problem.multi:
        keys += [f"model_error_{name}" for name in problem.inverted]
    if problem.limit == math.inf:  # a steady equation or an implicit scheme: linear solves
        keys += list(SOLVER_KEYS)
    if problem.spec["continuation"]:
        keys.append(BAND_KEY)
    return tuple(keys)


# With frequency continuation, each row's stage: the low-pass's cutoff in Hz (inf: the full band).
BAND_KEY = "max_frequency"


SOLVER_KEYS = ("solver_iterations_mean", "solver_iterations_max")


def _fields(local: torch.Tensor | None, problem: Problem, comm, kind: str, names: list[str]) -> dict:
    """``{kind: array}``, or with several parameters ``{kind_NAME: array}`` for each (rank 0's;
    None elsewhere)."""
    if local is None:
        return {}
    if not problem.multi:
        return {kind: _gather_np(local, problem, comm)}
    return {f"{kind}_{name}": _gather_np(f, problem, comm) for name, f in zip(names, local.unbind(0))}


def _gather_np(local: torch.Tensor, problem: Problem, comm):
    if comm.size == 1:
        return local.detach().cpu().numpy()
    g = gather_global(local.detach(), problem.decomp, comm, root=0)
    return None if g is None else g.cpu().numpy()


class PdeObjective:
    """The PDE half of a fit (:class:`odecli.app.fit.Objective`): the problem's loss and gradient,
    the misfit/regularisation/model-error columns, and checkpoints with the ranks' timings."""

    def __init__(self, problem: Problem, spec: dict, layout: ckpt.Layout, opt, cpath: Path,
                 timer: CommTimer, prior_total: np.ndarray, prior_comm: np.ndarray) -> None:
        self.problem, self.spec, self.layout, self.opt, self.cpath = problem, spec, layout, opt, cpath
        self.timer, self.prior_total, self.prior_comm = timer, prior_total, prior_comm
        self.loop_t0 = time.perf_counter()
        self.model_error = float("nan")
        self.keys = history_keys(problem)
        # frequency continuation: this stage's index, the iterations and history rows before it
        self.stage, self.offset = 0, 0
        self.earlier: dict[str, list] = {k: [] for k in self.keys}

    def begin_stage(self, stage: int, opt, earlier: dict[str, list]) -> None:
        """The next stage runs ``opt`` after the rows of ``earlier`` (one per iteration)."""
        self.stage, self.opt, self.earlier = stage, opt, earlier
        self.offset = len(earlier["loss"])

    def evaluate(self, completed: int):
        return self.problem.evaluate(self.offset + completed)

    def columns(self) -> dict[str, float]:
        problem = self.problem
        with torch.no_grad():
            field = problem.unknown.field()
            self.model_error = problem.model_error(field)
            each = problem.model_errors(field) if problem.multi else {}
        last = problem.last
        out = {"misfit": last["misfit"], "regularization": last["regularization"],
               "model_error": self.model_error, **{f"model_error_{n}": v for n, v in each.items()}}
        if SOLVER_KEYS[0] in self.keys:
            its = problem.iterations or [0]
            out.update({SOLVER_KEYS[0]: float(np.mean(its)), SOLVER_KEYS[1]: float(max(its))})
        if BAND_KEY in self.keys:
            out[BAND_KEY] = math.inf if problem.max_frequency is None else float(problem.max_frequency)
        return out

    def progress(self) -> str:
        text = f"  model err {self.model_error:.4g}" if math.isfinite(self.model_error) else ""
        if SOLVER_KEYS[0] in self.keys and self.problem.iterations:
            text += f"  cg its {max(self.problem.iterations)}"
        return text

    def timing(self) -> dict:
        """Collective: the ranks' total and communication seconds, this run's and the resumed ones'."""
        elapsed = time.perf_counter() - self.loop_t0
        return _timing(self.layout.comm, self.prior_total, self.prior_comm, elapsed, self.timer.comm_s)

    def save(self, iteration: int, f: float, g, history: dict) -> None:
        """The stage's ``iteration`` and rows after the earlier stages': one history, iterations
        counted over the whole run, and the stage (attrs ``stage``, ``stage_start``) to resume in."""
        timing = self.timing()
        ckpt.save(self.cpath, self.layout, kind=CHECKPOINT_KIND, spec_text=self.spec["text"],
                  iteration=self.offset + iteration, f=f, g=g, opt=self.opt,
                  history={k: [*self.earlier[k], *v] for k, v in history.items()},
                  attrs={"stage": self.stage, "stage_start": self.offset},
                  arrays={f"timing/{k}": np.asarray(v, dtype=np.float64) for k, v in timing.items()})


def _read_timing(f) -> dict:
    ranks = int(ckpt.read_attr(f, "ranks"))
    return {"ranks": ranks, **{k: np.asarray(ckpt.read_array(f, f"timing/{k}", rows=ranks))
                               for k in ("total_s", "comm_s")}}


def _saved_stage(cpath: Path, spec: dict, stages: int) -> tuple[int, int]:
    """The stage a checkpoint was written in and the iterations before that stage ((0, 0) for a
    run without frequency continuation)."""
    with ckpt.open_checkpoint(cpath, CHECKPOINT_KIND, spec["text"]) as f:
        stage, start = int(f.attrs.get("stage", 0)), int(f.attrs.get("stage_start", 0))
        if not (0 <= stage < stages and 0 <= start <= int(ckpt.read_attr(f, "iteration"))):
            raise ckpt.unusable(cpath, f"stage {stage} from iteration {start} is not one of this spec's {stages}")
    return stage, start


def _stage_plan(spec: dict, n_iter: int) -> list[tuple[float | None, int]]:
    """(low-pass cutoff in Hz or None for the full band, iterations) of each stage, in order."""
    return [(s["max_frequency"], s["iterations"]) for s in spec["continuation"]] + [(None, n_iter)]


def _stage_rows(outcome, last: bool) -> dict[str, list]:
    """A stage's history rows, one per iteration: an earlier stage's point after its last
    iteration is the next stage's first row (evaluated there on the next band), not its own."""
    if last:
        return outcome.history
    return {k: v[:outcome.iterations] for k, v in outcome.history.items()}


def _train(comm, spec_path: Path, output: Path, iterations, resume, force, quiet) -> int:
    try:
        spec = load_spec(spec_path)
    except OdecliError as exc:
        raise collective(exc)  # every rank reads the same file
    try:
        cpath, replace = ckpt.check_start(output, resume, force)
    except OdecliError as exc:
        raise collective(exc)
    if spec["compute"]["threads"]:
        torch.set_num_threads(spec["compute"]["threads"])
    settings = spec["optimizer"]
    n_iter = iterations if iterations is not None else settings.iterations
    if n_iter < 1:
        raise collective(InputError("--iterations must be >= 1"))

    timer = CommTimer()
    problem = Problem(spec, comm, timer)
    unk = problem.unknown
    _pretrain(unk, problem, comm)
    space = Space(comm, unk.distributed)
    layout = ckpt.Layout(comm, unk.distributed, problem.decomp)
    smoother = grid_smoother(smoothing_cells(settings.smoothing, problem.grid.shape), problem.decomp,
                             comm, unk.distributed)
    # each stage's optimiser starts afresh (its misfit is another function); the scales are the
    # starting field's, for every stage and for a resumed run alike (bit-identical --resume)
    scales = unk.scales(problem.global_max)
    plan = _stage_plan(spec, n_iter)

    def optimizer_for(iterations: int):
        return make_optimizer(settings, unk.params, space, scales=scales, iterations=iterations,
                              precondition=smoother)

    names = problem.inverted if problem.multi else []
    with torch.no_grad():
        initial_fields = _fields(unk.field(), problem, comm, "initial", names)
    prior_total = np.zeros(comm.size)
    prior_comm = np.zeros(comm.size)
    console = None
    if comm.rank == 0 and not quiet:
        from rich.console import Console

        console = Console(stderr=True, highlight=False, soft_wrap=True)  # piped output: one line per event, never wrapped at 80 columns
    keys = history_keys(problem)
    resumed, first_stage = None, 0
    earlier: dict[str, list] = {k: [] for k in keys}
    if resume:
        if cpath.exists():
            try:  # every rank reads the same file
                first_stage, stage_start = _saved_stage(cpath, spec, len(plan))
                opt = optimizer_for(plan[first_stage][1])
                problem.set_band(plan[first_stage][0])
                saved = ckpt.load(cpath, layout, kind=CHECKPOINT_KIND, spec_text=spec["text"],
                                  opt=opt, history_keys=keys, read_extra=_read_timing)
            except OdecliError as exc:
                raise collective(exc)
            if saved.extra["ranks"] == comm.size:
                prior_total = np.asarray(saved.extra["total_s"])
                prior_comm = np.asarray(saved.extra["comm_s"])
            earlier = {k: v[:stage_start] for k, v in saved.history.items()}
            resumed = ckpt.Saved(saved.iteration - stage_start, saved.f, saved.g,
                                 {k: v[stage_start:] for k, v in saved.history.items()}, saved.extra)
            start = saved.iteration
            if console:
                console.print(f"resuming from {cpath} at iteration {start}")
                if first_stage == len(plan) - 1 and resumed.iteration >= n_iter:  # say so, not a silent 10 for 5
                    console.print(f"note: the checkpoint already has {start} iterations (this run "
                                  f"asks for {stage_start + n_iter}); writing the output from it as it is",
                                  soft_wrap=True)
        elif console:
            console.print(f"no checkpoint at {cpath}; starting from the beginning")

    timer.reset()
    objective = PdeObjective(problem, spec, layout, None, cpath, timer, prior_total, prior_comm)
    log = (lambda line: console.print(line, highlight=False)) if console else None
    for stage in range(first_stage, len(plan)):
        band, stage_iterations = plan[stage]
        if stage != first_stage or resumed is None:
            problem.set_band(band)
            opt = optimizer_for(stage_iterations)
        objective.begin_stage(stage, opt, earlier)
        if log is not None and len(plan) > 1:
            what = f"data low-passed at {band:g} Hz" if band is not None else "the full band"
            log(f"stage {stage + 1}/{len(plan)}: {what}, {stage_iterations} iterations")
        outcome = run_fit(
            objective, opt, space,
            FitSettings(stage_iterations, settings.tolerance, settings.gtol, spec["checkpoint"]["every"],
                        record_final=False),
            history_columns=keys[len(LOSS_COLUMNS):], resumed=resumed if stage == first_stage else None,
            log=log, extra_log=objective.progress)
        last = stage == len(plan) - 1
        if not last and outcome.stop is not Stop.ITERATIONS and log is not None:
            log(f"stage {stage + 1} stopped early ({STOP_REASONS[outcome.stop]}); going on to the next")
        earlier = {k: [*earlier[k], *v] for k, v in _stage_rows(outcome, last).items()}
    history, stop_reason = earlier, STOP_REASONS[outcome.stop]
    if outcome.message:  # a stop that is not convergence says what happened and what to try
        stop_reason = (outcome.message if outcome.message.startswith(stop_reason)
                       else f"{stop_reason}: {outcome.message}")

    timing = objective.timing()
    with torch.no_grad():
        final_local = unk.field()
        fields = {**_fields(final_local, problem, comm, "final", names), **initial_fields}
        if problem.multi:  # every parameter's true field that is known, inverted or not
            for name, truth in problem.true_fields.items():
                if truth is not None:
                    fields[f"true_{name}"] = _gather_np(truth, problem, comm)
        else:
            fields.update(_fields(problem.true_local, problem, comm, "true", names))
    predicted = problem.predict_full().cpu().numpy()
    final_err = problem.model_error(final_local)
    final_each = problem.model_errors(final_local) if problem.multi else {}
    observed = problem.observed.cpu().numpy()
    unknown_out = {}
    if not all(unk.distributed):  # the replicated parameters (a grid's blocks are fields/final)
        for name, p, dist in zip(unk.names, unk.params, unk.distributed):
            if not dist:
                unknown_out[name] = p.detach().cpu().numpy()
        if spec["unknown"]["type"] == "scalars" and unk.values():
            for name, v in unk.values().items():
                unknown_out[f"value_{name}"] = v.detach().cpu().numpy()
    if comm.rank == 0:
        d = problem.decomp
        blocks = comm.gather_object([d.y0, d.y1, d.x0, d.x1], root=0) if comm.size > 1 else [
            [d.y0, d.y1, d.x0, d.x1]]
    else:
        comm.gather_object([problem.decomp.y0, problem.decomp.y1, problem.decomp.x0,
                            problem.decomp.x1], root=0)
    if comm.rank == 0:
        geom = problem.geometry
        result = {
            "spec_text": spec["text"], "ranks": comm.size,
            "decomposition": {"proc_grid": list(problem.decomp.proc_grid),
                              "global_shape": list(problem.grid.shape), "blocks": blocks},
            "equation": spec["equation"], "name": spec["name"], "optimizer": opt.kind,
            "unknown_type": spec["unknown"]["type"], "stop_reason": stop_reason,
            "spacing": [problem.grid.dy, problem.grid.dx], "dt": 0.0 if problem.steady else problem.dt,
            "history": history,
            "fields": fields, "parameters": problem.parameters,
            "inverted": problem.inverted if problem.multi else problem.parameters,
            "final_model_errors": final_each, "steady": problem.steady,
            "observed": observed, "predicted": predicted,
            "receivers": geom.receivers, "receiver_components": spec["receivers"].get("components"),
            "sources": [(b, iy, ix) for b, shot in enumerate(geom.shots) for iy, ix, _ in shot],
            "timing": timing, "unknown": unknown_out, "final_model_error": final_err,
            "engine": problem.engine(),
        }
        write_result(output, result, replace)
        if cpath.exists():
            cpath.unlink()
        if console:
            msg = f"wrote {output} ({len(history['loss'])} iterations, stop: {stop_reason}"
            if math.isfinite(final_err) and history["model_error"]:
                msg += f", model error {history['model_error'][0]:.4g} -> {final_err:.4g}"
                for name, v in final_each.items():
                    first = history[f"model_error_{name}"][0]
                    msg += f"; {name} {first:.4g} -> {v:.4g}"
            console.print(msg + ")")
    if comm.size > 1:
        comm.barrier()
    return 0


def _pretrain(unk, problem: Problem, comm) -> None:
    """An MLP unknown with an ``initial`` model is fitted to it first; rank 0's weights are then
    everyone's (the ranks' arithmetic may round differently on different thread counts)."""
    if not hasattr(unk, "pretrain") or all(unk.distributed):  # grid unknowns: nothing to fit or share
        return
    if problem.multi:  # one network, an output per parameter
        initial = [one.get("initial") for one in problem.spec["unknown"]["parameters"].values()]
        initial = [None if m is None else with_model_arrays(m, problem.spec["base_dir"]) for m in initial]
    else:
        initial = unk.spec.get("initial")
        if initial is not None:
            initial = with_model_arrays(initial, problem.spec["base_dir"])
    unk.pretrain(initial)
    if comm.size > 1:
        with torch.no_grad():  # only the replicated ones: a grid's blocks differ from rank to rank
            for p, distributed in zip(unk.params, unk.distributed):
                if not distributed:
                    p.copy_(broadcast(p.detach(), comm, root=0))


def _timing(comm, prior_total, prior_comm, elapsed: float, comm_s: float) -> dict:
    rows = comm.gather_object((elapsed, comm_s), root=0) if comm.size > 1 else [(elapsed, comm_s)]
    if comm.rank != 0 or rows is None:
        return {}
    total = prior_total + np.array([r[0] for r in rows])
    cm = prior_comm + np.array([r[1] for r in rows])
    return {"total_s": total, "comm_s": cm, "compute_s": total - cm}


__all__ = ["train_inverse", "default_output"]
