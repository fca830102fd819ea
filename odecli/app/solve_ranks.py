"""``mpirun -n N odecli solve SPEC``: one ODE batch split over MPI ranks, balanced by cost.

Design
------
* **Work queue on rank 0, guided chunks.** Samples are handed out as chunks of consecutive sample
  indices from a queue on rank 0 (:class:`GuidedSchedule`). A chunk holds
  ``ceil(remaining / (2 * ranks))`` samples, bounded below by ``min_chunk`` (so the batched solver
  keeps some vector width) and above by ``max_chunk`` (memory, see :func:`chunk_bounds`). A rank
  asks for the next chunk when it returns a result, so a rank that drew cheap samples simply takes
  more chunks; chunks shrink towards the end, so the run does not wait long for a last big chunk.
  Stiff samples cost many solver steps; whoever draws them keeps busy while the others take the rest.
* **Rank 0 coordinates, writes and works.** Its main thread is the coordinator and the only thread
  that calls MPI or HDF5: it polls for messages (``Iprobe`` and a short sleep, so waiting burns no
  CPU that an oversubscribed rank needs), answers requests, and writes results. A helper thread on
  rank 0 takes chunks from the same queue and solves them (no MPI calls). Replies therefore
  never wait for a chunk rank 0 is solving, and rank 0 contributes like any other rank; if the
  coordination slows its own solving, it simply takes fewer chunks. Other ranks also wait by
  polling with a sleep.
* **Same file as one process.** Every rank solves its chunks with the ordinary
  :func:`odecli.app.solve.solve_spec_arrays` on the spec cut to those samples (:func:`slice_spec`). Samples
  of a batch are solved independently (own steps, controller, counters), so every integer
  counter and status is identical to a one-process run, and values agree to round-off: torch's
  vectorised kernels may round the last bit differently with another batch composition, about
  1e-13 relative (``dt_final``, ``y``), which the tests bound at 1e-12. Rank 0 streams each chunk
  into its rows of the output (:class:`odecli.io.ode_run.OdeRunStream`, the layout of
  ``write_ode_run``) inside the atomic temporary file, so rank 0 holds at most a few chunks,
  never the batch. The file is renamed into place once, after the last sample. The only
  additions are the root attribute ``ranks`` and the group ``ranks/`` (per-rank ``busy_s``,
  ``idle_s``, ``samples`` and the chunk list); ``wall_time_s`` is the distributed solve's.
* **Devices.** With ``device: auto`` or ``cuda`` and GPUs present, rank ``r`` uses GPU
  ``local_rank % n_gpus`` (one rank per GPU); otherwise each rank uses the CPU. The file's
  ``device`` attribute is what a single process would have used.
* **Failures.** Problems that every rank sees alike (bad device, RHS that does not load) are
  checked together before any work and raised as the usual one-line error on rank 0, exit 2.
  An exception on any rank while solving (including out of memory) is sent to rank 0, which removes
  the temporary file, prints one ``error: rank R: ...`` line and calls ``MPI_Abort``, which ends
  every rank within seconds. Should rank 0 not answer within ``ABORT_GRACE_S`` the failing rank
  prints and aborts by itself. A sample's own failure (status != 0) is just its status, as in one
  process. Not covered: a rank killed outright (SIGKILL by the OOM killer) is ended by the
  launcher, and if that rank is 0 its hidden temporary file stays behind (never the output).

Test hook: ``ODECLI_TEST_FAIL_RANK=r`` makes rank ``r`` raise when it starts its first chunk.
Tuning: ``ODECLI_MPI_MIN_CHUNK``, ``ODECLI_MPI_MAX_CHUNK`` (samples) and ``ODECLI_MPI_CHUNK_BYTES``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import queue
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from odecli.errors import EXIT_INTERNAL, InputError, OdecliError
from odecli.parallel.comm import OUTPUT_FORWARD_S
from odecli.specs import OdeSpec

SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE")
CHUNK_BYTES = 256 * 2**20  # solver memory of one chunk (odecli.app.solve.estimated_bytes)
ABORT_GRACE_S = 10.0  # a failing rank waits this long for rank 0 to end the job
POLL_MIN_S, POLL_MAX_S = 5e-5, 2e-3
TAG_REQUEST, TAG_RESULT, TAG_ERROR, TAG_ASSIGN, TAG_FINAL = 811, 812, 813, 814, 815


def launched_ranks() -> int:
    """Number of ranks the MPI launcher started (from its environment; imports no MPI)."""
    for var in SIZE_VARS:
        value = os.environ.get(var)
        if value and value.isdigit():
            return int(value)
    return 1


# ---------------------------------------------------------------------------- scheduling


class GuidedSchedule:
    """Hands out consecutive chunks ``[start, stop)``: ``ceil(remaining / (2 * workers))`` samples,
    clamped to ``[min_chunk, max_chunk]``. Thread-safe (rank 0's coordinator and helper share it)."""

    def __init__(self, batch: int, workers: int, min_chunk: int = 1, max_chunk: int | None = None) -> None:
        self.batch = batch
        self.workers = max(1, workers)
        self.min_chunk = max(1, min_chunk)
        self.max_chunk = max(self.min_chunk, max_chunk or batch)
        self.position = 0
        self._lock = threading.Lock()

    def take(self) -> tuple[int, int] | None:
        with self._lock:
            remaining = self.batch - self.position
            if remaining <= 0:
                return None
            size = math.ceil(remaining / (2 * self.workers))
            size = min(remaining, max(self.min_chunk, min(self.max_chunk, size)))
            start = self.position
            self.position += size
            return start, start + size

    def sizes(self) -> list[int]:
        """The chunk sizes this schedule hands out (for docs and tests; consumes a copy)."""
        copy = GuidedSchedule(self.batch, self.workers, self.min_chunk, self.max_chunk)
        out = []
        while (chunk := copy.take()) is not None:
            out.append(chunk[1] - chunk[0])
        return out


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
    from odecli.io.ode_run import solution_part
    from odecli.app.solve import solve_spec_arrays

    if first and os.environ.get("ODECLI_TEST_FAIL_RANK") == str(rank):
        raise RuntimeError(f"injected failure on rank {rank} (ODECLI_TEST_FAIL_RANK)")
    began = time.perf_counter()
    solution = solve_spec_arrays(slice_spec(spec, start, stop))
    return solution_part(solution), time.perf_counter() - began


def _describe(exc: BaseException) -> tuple[str, int]:
    if isinstance(exc, OdecliError):
        return str(exc), exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted; no output was written", 130
    return f"{type(exc).__name__}: {exc}", EXIT_INTERNAL


# ---------------------------------------------------------------------------- results


@dataclass
class DistributedResult:
    """What every rank learns at the end of a distributed solve (rank 0 computed it)."""

    samples: int
    failed: int
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


# ---------------------------------------------------------------------------- MPI plumbing


class _Link:
    """Point-to-point messages on a private communicator; every wait polls with a short sleep."""

    def __init__(self, mpi_comm: Any) -> None:
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = mpi_comm
        self.rank = mpi_comm.Get_rank()
        self.size = mpi_comm.Get_size()

    def send(self, obj: Any, dest: int, tag: int) -> None:
        request = self.comm.isend(obj, dest=dest, tag=tag)
        delay = POLL_MIN_S
        while not request.Test():
            time.sleep(delay)
            delay = min(POLL_MAX_S, delay * 2)

    def isend(self, obj: Any, dest: int, tag: int) -> Any:
        return self.comm.isend(obj, dest=dest, tag=tag)

    def recv(self, source: int, tag: int, timeout: float | None = None) -> Any:
        delay, began = POLL_MIN_S, time.monotonic()
        while not self.comm.Iprobe(source=source, tag=tag):
            if timeout is not None and time.monotonic() - began > timeout:
                raise TimeoutError
            time.sleep(delay)
            delay = min(POLL_MAX_S, delay * 2)
        return self.comm.recv(source=source, tag=tag)

    def poll(self) -> tuple[int, int, Any] | None:
        """One pending message from any rank as (source, tag, payload), or None."""
        status = self.MPI.Status()
        if not self.comm.Iprobe(source=self.MPI.ANY_SOURCE, tag=self.MPI.ANY_TAG, status=status):
            return None
        source, tag = status.Get_source(), status.Get_tag()
        return source, tag, self.comm.recv(source=source, tag=tag)

    def abort(self, code: int) -> None:
        sys.stderr.flush()
        sys.stdout.flush()
        # The launcher forwards a rank's output through a pipe and kills every rank on Abort:
        # without a pause the one-line error can be lost (seen under load in CI).
        time.sleep(OUTPUT_FORWARD_S)
        self.MPI.COMM_WORLD.Abort(code or 1)
        # MPICH's Abort can return before the launcher kills us; leave now so nothing else
        # (e.g. the CLI's internal-error handler) prints a second message.
        os._exit(code or 1)


class _RankFailed(Exception):
    def __init__(self, rank: int, message: str, code: int) -> None:
        super().__init__(message)
        self.rank, self.message, self.code = rank, message, code


class _HelperWorker(threading.Thread):
    """Rank 0's solving thread: takes chunks from the shared schedule, queues results (no MPI)."""

    def __init__(self, spec: OdeSpec, schedule: GuidedSchedule) -> None:
        super().__init__(name="odecli-rank0-solver", daemon=True)
        self.spec = spec
        self.schedule = schedule
        self.results: queue.Queue = queue.Queue(maxsize=2)  # back-pressure if writing falls behind
        self.error: tuple[str, int] | None = None
        self.stop_requested = threading.Event()

    def run(self) -> None:
        first = True
        try:
            while not self.stop_requested.is_set() and (chunk := self.schedule.take()) is not None:
                part, busy = _solve_chunk(self.spec, chunk[0], chunk[1], 0, first)
                first = False
                while not self.stop_requested.is_set():
                    try:
                        self.results.put((chunk, part, busy), timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as exc:  # noqa: BLE001 - reported by the coordinator
            self.error = _describe(exc)


# ---------------------------------------------------------------------------- the solve


def solve_distributed(
    spec: OdeSpec, target: Path, *, on_progress: Callable[[int, int], None] | None = None,
    replace: bool = True,
) -> DistributedResult:
    """Solve ``spec`` over all MPI ranks and write ``target`` (rank 0); collective on COMM_WORLD.

    Returns the same :class:`DistributedResult` on every rank. A failure on any rank during the
    solve ends the whole job (see the module docstring); problems every rank sees alike raise the
    the same exception on rank 0 and ``SystemExit`` with its exit code on the others.
    ``replace=False`` keeps a file that appears at ``target`` during the run (see atomic_path).
    """
    from odecli.parallel.comm import import_mpi

    MPI = import_mpi()
    link = _Link(MPI.COMM_WORLD.Dup())
    node = link.comm.Split_type(MPI.COMM_TYPE_SHARED)
    local_rank = node.Get_rank()
    _share_cores(node.Get_size())
    node.Free()
    solve_spec_local, file_device, bounds = _prepare(link, spec, local_rank)
    if link.rank == 0:
        result = _coordinate(link, solve_spec_local, target, file_device, bounds, on_progress, replace)
    else:
        result = _work(link, solve_spec_local)
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


def _prepare(link: _Link, spec: OdeSpec, local_rank: int) -> tuple[OdeSpec, str, tuple[int, int]]:
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
            import odecli.ode.solver  # noqa: F401

            build_rhs(spec, device_name(device))  # the user's function loads and passes its probe on every rank
        else:
            build_c_equations(spec)
        bounds = chunk_bounds(spec, link.size)
    except Exception as exc:  # noqa: BLE001 - re-raised below on every rank
        message, code = _describe(exc)
        problem = (f"[rank {link.rank}] {message}" if link.rank else message, code, isinstance(exc, InputError))
    problems = link.comm.allgather(problem)
    first = next((p for p in problems if p is not None), None)
    if first is not None:
        message, code, is_input = first
        if link.rank != 0:
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


def _work(link: _Link, spec: OdeSpec) -> DistributedResult:
    """A rank other than 0: request chunks, solve them, send results, until told to stop."""
    first = True
    try:
        link.send(None, 0, TAG_REQUEST)
        while (chunk := link.recv(0, TAG_ASSIGN)) is not None:
            part, busy = _solve_chunk(spec, chunk[0], chunk[1], link.rank, first)
            first = False
            link.send((chunk, part, busy), 0, TAG_RESULT)
        final = link.recv(0, TAG_FINAL)
    except BaseException as exc:  # noqa: BLE001 - every failure ends the job through rank 0
        message, code = _describe(exc)
        try:
            link.isend((message, code), 0, TAG_ERROR)
            time.sleep(ABORT_GRACE_S)  # rank 0 aborts the job well before this ends
        finally:
            print(f"error: rank {link.rank}: {message} (rank 0 did not respond)", file=sys.stderr, flush=True)
            link.abort(code)
        raise  # not reached
    link.comm.Free()
    return final


def _coordinate(
    link: _Link, spec: OdeSpec, target: Path, file_device: str, bounds: tuple[int, int],
    on_progress: Callable[[int, int], None] | None, replace: bool,
) -> DistributedResult:
    """Rank 0: hand out chunks, write results as they come, account per-rank time; abort on failure."""
    import h5py

    from odecli.io.atomic import atomic_path
    from odecli.io.ode_run import OdeRunStream, write_ranks

    size, batch = link.size, spec.batch
    schedule = GuidedSchedule(batch, size, *bounds)
    busy = np.zeros(size)
    samples = np.zeros(size, dtype=np.int64)
    chunks: list[tuple[int, int, int]] = []
    failed = steps_total = steps_max = 0
    helper = _HelperWorker(spec, schedule)
    previous_interval = sys.getswitchinterval()
    sys.setswitchinterval(0.001)  # the coordinator gets the GIL back quickly from the helper
    try:
        with atomic_path(target, replace) as tmp, h5py.File(tmp, "w") as h5:
            writer = OdeRunStream(h5, spec)
            waiting = set(range(1, size))  # ranks that have not been told to stop
            sends: list[Any] = []
            began = time.perf_counter()
            helper.start()

            def store(rank: int, chunk: tuple[int, int], part: dict, seconds: float) -> None:
                nonlocal failed, steps_total, steps_max
                writer.write(chunk[0], part)
                busy[rank] += seconds
                samples[rank] += chunk[1] - chunk[0]
                chunks.append((chunk[0], chunk[1], rank))
                failed += int(np.count_nonzero(part["status"]))
                steps = part["stats"]["n_steps"]
                steps_total += int(steps.sum())
                steps_max = max(steps_max, int(steps.max()))
                if on_progress is not None:
                    on_progress(writer.written, batch)

            delay = POLL_MIN_S
            while writer.written < batch or waiting:
                handled = False
                while (message := link.poll()) is not None:
                    handled = True
                    source, tag, payload = message
                    if tag == TAG_ERROR:
                        raise _RankFailed(source, *payload)
                    nxt = schedule.take()
                    sends.append(link.isend(nxt, source, TAG_ASSIGN))  # reply first, then write
                    if nxt is None:
                        waiting.discard(source)
                    if tag == TAG_RESULT:
                        store(source, *payload)
                try:
                    while True:
                        store(0, *helper.results.get_nowait())
                        handled = True
                except queue.Empty:
                    pass
                if helper.error is not None:
                    raise _RankFailed(0, *helper.error)
                if not handled:
                    time.sleep(delay)
                    delay = min(POLL_MAX_S, delay * 2)
                else:
                    delay = POLL_MIN_S
            wall = time.perf_counter() - began
            helper.join()
            link.MPI.Request.Waitall(sends)
            idle = np.maximum(wall - busy, 0.0)
            writer.finish(device=file_device, wall_time_s=wall)
            write_ranks(h5, busy_s=busy, idle_s=idle, samples=samples, chunks=np.array(chunks, dtype=np.int64).reshape(-1, 3),
                        info={"schedule": "guided", "min_chunk": schedule.min_chunk, "max_chunk": schedule.max_chunk,
                              "description": "per-rank accounting of the distributed solve (odecli.app.solve_ranks)"})
        result = DistributedResult(
            samples=batch, failed=failed, steps_mean=steps_total / batch, steps_max=steps_max, wall_time_s=wall,
            ranks=size, busy_s=busy.tolist(), idle_s=idle.tolist(), samples_per_rank=samples.tolist(),
        )
    except BaseException as exc:  # noqa: BLE001 - the temporary file is gone by now; end every rank
        helper.stop_requested.set()
        if isinstance(exc, _RankFailed):
            message, code = f"rank {exc.rank}: {exc.message}", exc.code
        else:
            message, code = _describe(exc)
            message = f"rank 0: {message}"
        print(f"error: {message}", file=sys.stderr, flush=True)
        link.abort(code)
        raise  # not reached
    finally:
        sys.setswitchinterval(previous_interval)
    for rank in range(1, size):
        link.send(result, rank, TAG_FINAL)
    link.comm.Free()
    return result


# ---------------------------------------------------------------------------- CLI glue


def solve_cli(spec: OdeSpec, target: Path, *, force: bool, quiet: bool, stdout: Any, stderr: Any,
              logger: Callable[[str], None]) -> int:
    """``odecli solve`` under mpirun: solve, print the summary line on rank 0, return the exit code."""
    from odecli.errors import EXIT_FAILED_SAMPLES, EXIT_OK
    from odecli.parallel.comm import get_comm

    comm = get_comm()
    if comm.size == 1:
        raise InputError(f"launched as {launched_ranks()} MPI ranks, but mpi4py is not installed (or MPI "
                         f"did not start); install the mpi extra, or run without mpirun")
    if comm.rank == 0:
        logger(f"solve {spec.file} -> {target}: {spec.batch} samples, method {spec.solver.method}, {comm.size} ranks")
    with _progress_bar(stderr, enabled=comm.rank == 0 and not quiet) as on_progress:
        result = solve_distributed(spec, target, on_progress=on_progress, replace=force)
    if comm.rank == 0:
        line = (f"{spec.name}: {result.samples} samples, {result.samples - result.failed} succeeded, "
                f"{result.failed} failed; steps mean {result.steps_mean:.1f} max {result.steps_max}; "
                f"{result.wall_time_s:.3f} s on {result.ranks} ranks (idle {result.idle_fraction:.0%}); wrote {target}")
        logger(line)
        if not quiet:
            stdout.print(line, markup=False, soft_wrap=True)
    return EXIT_FAILED_SAMPLES if result.failed else EXIT_OK


class _progress_bar:
    """A rich bar of samples written, on a terminal only (rank 0)."""

    def __init__(self, console: Any, enabled: bool) -> None:
        self.console = console
        self.enabled = enabled and getattr(console, "is_terminal", False)
        self.bar = None

    def __enter__(self) -> Callable[[int, int], None] | None:
        if not self.enabled:
            return None
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.bar = Progress(TextColumn("[bold]solving"), BarColumn(), TextColumn("{task.completed}/{task.total} samples"),
                            TimeElapsedColumn(), TimeRemainingColumn(), console=self.console, transient=True)
        self.bar.__enter__()
        task = self.bar.add_task("solve", total=None)

        def update(done: int, total: int) -> None:
            self.bar.update(task, completed=done, total=total)

        return update

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)
