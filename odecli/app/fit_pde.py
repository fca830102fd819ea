"""The inverse loop behind ``odecli train-inverse`` (with or without mpirun).

Every rank runs the same program on its block; the loss and every optimiser decision are global
(all-reduced) values, so all ranks take the same path.  Errors every rank hits at the same point
(bad spec, CFL, NaN loss) are raised normally (the CLI prints them once on rank 0); any other
exception on one rank prints its message and aborts the whole MPI job, so nothing hangs.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

from odecli.errors import InputError, OdecliError
from odecli.parallel.comm import get_comm
from odecli.parallel.ops import gather_global
from odecli.app import checkpoint as ckpt
from odecli.app import faults
from odecli.optim.optimizers import LBFGS, Adam, Space
from odecli.io.pde_run import write_result
from odecli.app.pde_problem import Problem, collective
from odecli.specs.outputs import fit_output_of
from odecli.specs.pde import load_spec
from odecli.pde.timing import CommTimer

HISTORY_KEYS = ("loss", "grad_norm", "wall_time_s", "misfit", "regularization", "model_error")


def default_output(spec_path: Path) -> Path:
    return Path.cwd() / fit_output_of(spec_path)  # <name>-fit.h5, as for every kind (odecli.specs.outputs)


def train_inverse(spec_path: Path, output: Path | None, iterations: int | None, resume: bool,
                  force: bool, quiet: bool) -> int:
    comm = get_comm()
    output = Path(output) if output is not None else default_output(spec_path)
    try:
        with ckpt.note_on_interrupt(ckpt.checkpoint_path(output)):
            return _train(comm, Path(spec_path), output, iterations, resume, force, quiet)
    except BaseException as exc:  # noqa: BLE001 - every failure must end every rank
        if comm.size > 1 and not getattr(exc, "collective", False):
            code = getattr(exc, "exit_code", 1)
            if isinstance(exc, SystemExit):
                code = exc.code if isinstance(exc.code, int) else 1
            msg = str(exc) or type(exc).__name__
            if not isinstance(exc, OdecliError):
                msg = f"{type(exc).__name__}: {msg}"
            sys.stderr.write(f"error: rank {comm.rank}: {msg}\n")
            sys.stderr.flush()
            comm.abort(code or 1)
        raise


def _gather_np(local: torch.Tensor, problem: Problem, comm):
    if comm.size == 1:
        return local.detach().cpu().numpy()
    g = gather_global(local.detach(), problem.decomp, comm, root=0)
    return None if g is None else g.cpu().numpy()


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
    n_iter = iterations if iterations is not None else spec["optimizer"].iterations
    if n_iter < 1:
        raise collective(InputError("--iterations must be >= 1"))

    timer = CommTimer()
    problem = Problem(spec, comm, timer)
    unk = problem.unknown
    space = Space(comm, unk.distributed)
    o = spec["optimizer"]
    if o.type == "adam":
        opt = Adam(unk.params, o.learning_rate, o.betas)
    else:
        opt = LBFGS(unk.params, space, o.learning_rate, o.history_size, o.max_line_search)

    with torch.no_grad():
        initial_field = _gather_np(unk.field(), problem, comm)
    history = {k: [] for k in HISTORY_KEYS}
    start = 0
    prior_total = np.zeros(comm.size)
    prior_comm = np.zeros(comm.size)
    console = None
    if comm.rank == 0 and not quiet:
        from rich.console import Console

        console = Console(stderr=True, highlight=False)
    if resume:
        if cpath.exists():
            try:  # every rank reads the same file
                start, history, timing = ckpt.load(
                    cpath, spec_text=spec["text"], params=unk.params, distributed=unk.distributed,
                    opt=opt, decomp=problem.decomp, comm=comm, history_keys=HISTORY_KEYS)
            except OdecliError as exc:
                raise collective(exc)
            if timing["ranks"] == comm.size:
                prior_total = np.asarray(timing["total_s"])
                prior_comm = np.asarray(timing["comm_s"])
            if console:
                console.print(f"resuming from {cpath} at iteration {start}")
                if start >= n_iter:  # nothing to do but write it out: say so, not a silent 10 for 5
                    console.print(f"note: the checkpoint already has {start} iterations (this run "
                                  f"asks for {n_iter}); writing the output from it as it is",
                                  soft_wrap=True)
        elif console:
            console.print(f"no checkpoint at {cpath}; starting from the beginning")

    every = spec["checkpoint"]["every"]
    tol = o.tolerance
    stop_reason = "iterations"
    timer.reset()
    loop_t0 = time.perf_counter()
    for k in range(start, n_iter):
        t0 = time.perf_counter()
        evaluate = lambda: problem.evaluate(k)  # noqa: E731
        if opt.kind == "adam":
            f, g = evaluate()
        else:
            f, g = opt.current(evaluate)
            if not problem.last and opt.parts:  # resumed: parts of the loss come from the checkpoint
                problem.last = dict(opt.parts)
        gn = space.norm(g)
        with torch.no_grad():
            merr = problem.model_error(unk.field())
        prev = history["loss"][-1] if history["loss"] else None
        history["loss"].append(f)
        history["grad_norm"].append(gn)
        history["misfit"].append(problem.last.get("misfit", f))
        history["regularization"].append(problem.last.get("regularization", 0.0))
        history["model_error"].append(merr)
        if tol > 0 and prev is not None and abs(prev - f) <= tol * max(abs(f), 1e-300):
            stop_reason = "tolerance"
            history["wall_time_s"].append(time.perf_counter() - t0)
            break
        if gn == 0.0:
            stop_reason = "zero gradient"
            history["wall_time_s"].append(time.perf_counter() - t0)
            break
        if opt.kind == "adam":
            opt.step(g)
        else:
            opt.step(evaluate)
            opt.parts = {k: problem.last[k] for k in ("misfit", "regularization") if k in problem.last}
        wall = time.perf_counter() - t0
        history["wall_time_s"].append(wall)
        if console:
            extra = f"  model err {merr:.4g}" if math.isfinite(merr) else ""
            console.print(f"iter {k + 1:>4}/{n_iter}  loss {f:.6e}  |grad| {gn:.4e}  "
                          f"{wall:6.2f} s{extra}")
        if opt.kind == "lbfgs" and opt.failed:
            stop_reason = "line search failed"
            break
        if every and (k + 1) % every == 0 and k + 1 < n_iter:
            elapsed = time.perf_counter() - loop_t0
            timing = _timing(comm, prior_total + 0, prior_comm + 0, elapsed, timer.comm_s)
            ckpt.save(cpath, spec_text=spec["text"], iteration=k + 1, params=unk.params,
                      distributed=unk.distributed, opt=opt, history=history, timing=timing,
                      decomp=problem.decomp, comm=comm)
            faults.maybe_exit_after_checkpoint(k + 1)

    elapsed = time.perf_counter() - loop_t0
    timing = _timing(comm, prior_total, prior_comm, elapsed, timer.comm_s)
    with torch.no_grad():
        final_local = unk.field()
        final_field = _gather_np(final_local, problem, comm)
        true_field = (_gather_np(problem.true_local, problem, comm)
                      if problem.true_local is not None else None)
    predicted = problem.predict_full().cpu().numpy()
    final_err = problem.model_error(final_local)
    unknown_out = {}
    if unk.distributed != [True]:
        for name, p in zip(unk.names, unk.params):
            unknown_out[name] = p.detach().cpu().numpy()
        if spec["unknown"]["type"] == "scalars":
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
            "spacing": [problem.grid.dy, problem.grid.dx], "dt": problem.dt,
            "history": history,
            "fields": {"true": true_field, "initial": initial_field, "final": final_field},
            "observed": problem.observed.cpu().numpy(), "predicted": predicted,
            "receivers": geom.receivers,
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
            console.print(msg + ")")
    if comm.size > 1:
        comm.barrier()
    return 0


def _timing(comm, prior_total, prior_comm, elapsed: float, comm_s: float) -> dict:
    rows = comm.gather_object((elapsed, comm_s), root=0) if comm.size > 1 else [(elapsed, comm_s)]
    if comm.rank != 0 or rows is None:
        return {}
    total = prior_total + np.array([r[0] for r in rows])
    cm = prior_comm + np.array([r[1] for r in rows])
    return {"total_s": total, "comm_s": cm, "compute_s": total - cm}


__all__ = ["train_inverse", "default_output"]
