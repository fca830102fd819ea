"""``mpirun -n N odecli solve SPEC``: one ODE batch split over MPI ranks, balanced by cost.

The ranks share the batch through the MPI work queue of :mod:`odecli.parallel.work_queue`
(guided chunks of consecutive samples handed out by rank 0, which also solves some); this
module is what the queue knows nothing of: solving a spec's chunk, writing the file, the CLI.

* **Same file as one process.** Every rank solves its chunks with the ordinary
  :func:`odecli.app.solve.solve_spec_arrays` on the spec cut to those samples (:func:`slice_spec`).
  Samples of a batch are solved independently (own steps, controller, counters), so every integer
  counter and status is identical to a one-process run, and values agree to round-off: torch's
  vectorised kernels may round the last bit differently with another batch composition, about
  1e-13 relative (``dt_final``, ``y``), which the tests bound at 1e-12. Rank 0 streams each chunk
  into its rows of the output (:class:`odecli.io.ode_run.OdeRunStream`, the writer of
  ``write_ode_run``) inside the atomic temporary file, so rank 0 holds at most a few chunks,
  never the batch. The file is renamed into place once, after the last sample. The only
  additions are the root attribute ``ranks`` and the group ``ranks/`` (per-rank ``busy_s``,
  ``idle_s``, ``samples`` and the chunk list); ``wall_time_s`` is the distributed solve's.
* **Chunk sizes.** Bounded below so the batched solver keeps some vector width and above by
  memory (:func:`chunk_bounds`).
* **Devices.** With ``device: auto`` or ``cuda`` and GPUs present, rank ``r`` uses GPU
  ``local_rank % n_gpus`` (one rank per GPU); otherwise each rank uses the CPU. The file's
  ``device`` attribute is what a single process would have used.
* **Failures.** Problems that every rank sees alike (bad device, RHS that does not load) are
  checked together before any work and raised as the usual one-line error on rank 0, exit 2.
  An exception on any rank while solving (including out of memory) ends the job through rank 0,
  which removes the temporary file first (see the work queue). A sample's own failure
  (status != 0) is just its status, as in one process. Not covered: a rank killed outright
  (SIGKILL by the OOM killer) is ended by the launcher, and if that rank is 0 its hidden
  temporary file stays behind (never the output).

Test hook: ``ODECLI_TEST_FAIL_RANK=r`` makes rank ``r`` raise when it starts its first chunk.
Tuning: ``ODECLI_MPI_MIN_CHUNK``, ``ODECLI_MPI_MAX_CHUNK`` (samples) and ``ODECLI_MPI_CHUNK_BYTES``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from odecli.errors import EXIT_INTERNAL, InputError, OdecliError
from odecli.parallel.comm import Comm
from odecli.parallel.work_queue import (
    GuidedSchedule,
    coordinate,
    end_job,
    finish,
    launched_ranks,
    work,
)
from odecli.specs import OdeSpec

__all__ = ["CHUNK_BYTES", "DistributedResult", "GuidedSchedule", "chunk_bounds", "launched_ranks",
           "slice_spec", "solve_cli", "solve_distributed"]

CHUNK_BYTES = 256 * 2**20  # solver memory of one chunk (odecli.app.solve.estimated_bytes)


# ---------------------------------------------------------------------------- a spec's chunks


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None:
        return None
    if not value.isdigit() or int(value) < 1:
        raise InputError(f"{name}: expected a positive integer, got {value!r}")
    return int(value)


def chunk_bounds(spec: OdeSpec, ranks: int) -> tuple[int, int]:
    """(min_chunk, max_chunk) in samples.

    The largest chunk needs at most CHUNK_BYTES of solver memory (``estimated_bytes``), so a chunk
    fits where a rank's share would not, and rank 0 buffers at most a few chunks.

    The smallest is 1/8 of a rank's share, at most 4096 samples. Why not smaller: the batched solver
    runs one loop iteration per step of the chunk's slowest sample, and each iteration has a fixed
    cost (a few ms of Python and kernel launches on CPU) besides the per-sample arithmetic. A rank
    pays that fixed cost once per step of each of its chunks, so many small chunks of stiff samples
    cost far more than the same samples in one batch (measured: 4000-sample VdP sweep in 17 chunks
    down to 31 samples, 2 ranks took 4.3x the one-process time at 2 % idle). Both bounds can be set with
    ODECLI_MPI_MIN_CHUNK / ODECLI_MPI_MAX_CHUNK; a few very expensive samples balance best with
    ODECLI_MPI_MIN_CHUNK=1.
    """
    from odecli.app.solve import estimated_bytes

    per_sample = max(1, estimated_bytes(spec) // max(1, spec.batch))
    budget = _env_int("ODECLI_MPI_CHUNK_BYTES") or CHUNK_BYTES
    max_chunk = _env_int("ODECLI_MPI_MAX_CHUNK") or max(1, budget // per_sample)
    min_chunk = _env_int("ODECLI_MPI_MIN_CHUNK") or max(1, min(4096, spec.batch // (8 * ranks)))
    return min(min_chunk, max_chunk), max_chunk


def slice_spec(spec: OdeSpec, start: int, stop: int) -> OdeSpec:
    """The spec restricted to samples ``start .. stop - 1`` (every per-sample list is cut)."""
    return dataclasses.replace(
        spec, batch=stop - start, initial=spec.initial[start:stop], t_start=spec.t_start[start:stop],
        t_end=spec.t_end[start:stop], t_eval=spec.t_eval[start:stop],
        params={name: values[start:stop] for name, values in spec.params.items()},
    )


def _with_device(spec: OdeSpec, device: str) -> OdeSpec:
    if device == spec.solver.device:
        return spec
    return dataclasses.replace(spec, solver=dataclasses.replace(spec.solver, device=device))


def _solve_chunk(spec: OdeSpec, start: int, stop: int, rank: int, first: bool) -> tuple[dict, float]:
    """Samples ``start .. stop - 1`` of ``spec`` as a picklable :func:`~odecli.io.ode_run.solution_part`."""
    from odecli.app.solve import solve_spec_arrays
    from odecli.io.ode_run import solution_part

    if first and os.environ.get("ODECLI_TEST_FAIL_RANK") == str(rank):
        raise RuntimeError(f"injected failure on rank {rank} (ODECLI_TEST_FAIL_RANK)")
    began = time.perf_counter()
    solution = solve_spec_arrays(slice_spec(spec, start, stop))
    return solution_part(solution), time.perf_counter() - began


def _describe(exc: BaseException) -> tuple[str, int]:
    if isinstance(exc, OdecliError):
        return str(exc), exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        signum = getattr(exc, "signum", 2)  # SIGTERM too: 128 + signum, as on one rank (issue 42)
        return ("interrupted" if signum == 2 else f"stopped by {exc}") + "; no output was written", 128 + signum
    return f"{type(exc).__name__}: {exc}", EXIT_INTERNAL


# ---------------------------------------------------------------------------- results


@dataclass
class DistributedResult:
    """What every rank learns at the end of a distributed solve (rank 0 computed it)."""

    samples: int
    failed: int
    why: str  # the failures' clause of the summary line (odecli.report.failures), "" when none failed
    steps_mean: float
    steps_max: int
    wall_time_s: float
    ranks: int
    busy_s: list[float]
    idle_s: list[float]
    samples_per_rank: list[int]

    @property
    def idle_fraction(self) -> float:
        total = self.wall_time_s * self.ranks
        return float(sum(self.idle_s) / total) if total > 0 else 0.0


# ---------------------------------------------------------------------------- the solve


def solve_distributed(
    spec: OdeSpec, target: Path, *, on_progress: Callable[[int, int], None] | None = None,
    replace: bool = True,
) -> DistributedResult:
    """Solve ``spec`` over all MPI ranks and write ``target`` (rank 0); collective on COMM_WORLD.

    Returns the same :class:`DistributedResult` on every rank. A failure on any rank during the
    solve ends the whole job (see the module docstring); problems every rank sees alike raise
    the same exception on rank 0 and ``SystemExit`` with its exit code on the others.
    ``replace=False`` keeps a file that appears at ``target`` during the run (see atomic_path).
    """
    from odecli.parallel.comm import get_comm

    comm = get_comm().dup()  # the queue's messages meet no other traffic
    local_rank, ranks_on_node = comm.node_rank_and_size()
    _share_cores(ranks_on_node)
    local_spec, file_device, bounds = _prepare(comm, spec, local_rank)

    def solve(start: int, stop: int, rank: int, first: bool) -> tuple[dict, float]:
        return _solve_chunk(local_spec, start, stop, rank, first)

    if comm.rank == 0:
        result = _solve_and_write(comm, local_spec, solve, target, file_device, bounds, on_progress, replace)
        finish(comm, result)
    else:
        result = work(comm, solve, _describe)
    comm.free()
    return result


def _share_cores(ranks_on_node: int) -> None:
    """Split the node's cores between its ranks, so their threads (torch's, the C solver's) do not
    oversubscribe them; an explicit OMP_NUM_THREADS wins. Setting the variable covers torch too
    when it is imported later (it reads it then), so a C-solver run never needs to import it."""
    from odecli.threads import default_threads

    if "OMP_NUM_THREADS" not in os.environ and ranks_on_node > 1:
        share = max(1, default_threads() // ranks_on_node)
        os.environ["OMP_NUM_THREADS"] = str(share)
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(share)


def _prepare(comm: Comm, spec: OdeSpec, local_rank: int) -> tuple[OdeSpec, str, tuple[int, int]]:
    """Checks every rank makes alike, agreed collectively so no rank is left waiting on another."""
    from odecli.app.solve import device_name, native_unsupported, spec_device
    from odecli.specs import build_c_equations, build_rhs

    problem: tuple[str, int, bool] | None = None
    try:
        file_device = spec_device(spec)
        device = _rank_device(spec.solver.device, local_rank)
        if native_unsupported(spec, device_name(device)):
            # Import the PyTorch engine now, not on the first chunk: a rank still importing
            # torch (seconds) while another takes chunks from the queue would skew the shares.
            import odecli.ode.solver

            build_rhs(spec, device_name(device))  # the user's function loads and passes its probe on every rank
        else:
            build_c_equations(spec)
        bounds = chunk_bounds(spec, comm.size)
    except Exception as exc:
        message, code = _describe(exc)
        problem = (f"[rank {comm.rank}] {message}" if comm.rank else message, code, isinstance(exc, InputError))
    problems = comm.allgather_object(problem)
    first = next((p for p in problems if p is not None), None)
    if first is not None:
        message, code, is_input = first
        if comm.rank != 0:
            raise SystemExit(code)  # rank 0 reports it, once
        raise InputError(message) if is_input else OdecliError(message)
    return _with_device(spec, device), file_device, bounds


def _rank_device(name: str, local_rank: int) -> str:
    """One GPU per rank on a node when CUDA is asked for (or ``auto`` finds it)."""
    from odecli.app.solve import device_name

    if name not in ("auto", "cuda") or device_name(name) == "cpu":  # no GPU: torch is not asked
        return name
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return f"cuda:{local_rank % torch.cuda.device_count()}"
    return name


def _solve_and_write(
    comm: Comm, spec: OdeSpec, solve: Callable[[int, int, int, bool], tuple[dict, float]], target: Path,
    file_device: str, bounds: tuple[int, int], on_progress: Callable[[int, int], None] | None, replace: bool,
) -> DistributedResult:
    """Rank 0: run the queue, streaming each chunk into the atomic temporary file; on any failure
    the temporary file is removed, then every rank is ended (:func:`~odecli.parallel.work_queue.end_job`)."""
    import h5py

    from odecli.io.atomic import LIBVER, atomic_path
    from odecli.io.ode_run import OdeRunStream, write_ranks
    from odecli.report.failures import FailureTally

    batch = spec.batch
    schedule = GuidedSchedule(batch, comm.size, *bounds)
    failures = FailureTally()
    steps_total = steps_max = 0
    try:
        with atomic_path(target, replace) as tmp, h5py.File(tmp, "w", libver=LIBVER) as h5:
            writer = OdeRunStream(h5, spec)

            def store(chunk: tuple[int, int], part: dict) -> None:
                nonlocal steps_total, steps_max
                writer.write(chunk[0], part)
                failures.add(chunk[0], part["status"], part["t_final"])
                steps = part["stats"]["n_steps"]
                steps_total += int(steps.sum())
                steps_max = max(steps_max, int(steps.max()))
                if on_progress is not None:
                    on_progress(writer.written, batch)

            done = coordinate(comm, schedule, solve, store, _describe)
            writer.finish(device=file_device, wall_time_s=done.wall_s)
            write_ranks(h5, busy_s=done.busy_s, idle_s=done.idle_s, samples=done.items,
                        chunks=np.array(done.chunks, dtype=np.int64).reshape(-1, 3),
                        info={"schedule": "guided", "min_chunk": schedule.min_chunk, "max_chunk": schedule.max_chunk,
                              "description": "per-rank accounting of the distributed solve (odecli.app.solve_ranks)"})
    except BaseException as exc:  # the temporary file is gone by now; end every rank
        end_job(comm, exc, _describe)
        raise  # not reached
    return DistributedResult(
        samples=batch, failed=failures.failed, why=failures.clause(), steps_mean=steps_total / batch, steps_max=steps_max, wall_time_s=done.wall_s,
        ranks=comm.size, busy_s=done.busy_s.tolist(), idle_s=done.idle_s.tolist(), samples_per_rank=done.items.tolist(),
    )


# ---------------------------------------------------------------------------- CLI glue


def solve_cli(spec: OdeSpec, target: Path, *, force: bool, quiet: bool, stdout: Any, stderr: Any,
              logger: Callable[[str], None]) -> int:
    """``odecli solve`` under mpirun: solve, print the summary line on rank 0, return the exit code."""
    from odecli.errors import EXIT_FAILED_SAMPLES, EXIT_OK
    from odecli.parallel.comm import get_comm
    from odecli.report.progress import samples_progress

    comm = get_comm()
    if comm.size == 1:
        raise InputError(f"launched as {launched_ranks()} MPI ranks, but mpi4py is not installed (or MPI "
                         f"did not start); install the mpi extra, or run without mpirun")
    if comm.rank == 0:
        logger(f"solve {spec.file} -> {target}: {spec.batch} samples, method {spec.solver.method}, {comm.size} ranks")
    with samples_progress(stderr, enabled=comm.rank == 0 and not quiet) as on_progress:
        result = solve_distributed(spec, target, on_progress=on_progress, replace=force)
    if comm.rank == 0:
        line = (f"{spec.name}: {result.samples} samples, {result.samples - result.failed} succeeded, "
                f"{result.failed} failed{result.why}; steps mean {result.steps_mean:.1f} max {result.steps_max}; "
                f"{result.wall_time_s:.3f} s on {result.ranks} ranks (idle {result.idle_fraction:.0%}); wrote {target}")
        logger(line)
        if not quiet:
            stdout.print(line, markup=False, soft_wrap=True)
    return EXIT_FAILED_SAMPLES if result.failed else EXIT_OK
