"""A work queue over MPI ranks: rank 0 hands out chunks of consecutive item indices, every rank
(rank 0 too) solves them, rank 0 stores the results as they come.  Knows nothing of what an item is.

* **Guided chunks.** A chunk holds ``ceil(remaining / (2 * ranks))`` items, clamped to
  ``[min_chunk, max_chunk]`` (:class:`GuidedSchedule`). A rank asks for the next chunk when it
  returns a result, so a rank that drew cheap items simply takes more chunks; chunks shrink
  towards the end, so the run does not wait long for a last big chunk.
* **Rank 0 coordinates, stores and works.** Its main thread is the coordinator and the only thread
  that calls MPI or stores results: it polls for messages (``Iprobe`` and a short sleep, so waiting
  burns no CPU that an oversubscribed rank needs), answers requests before storing, and stores.
  A helper thread on rank 0 takes chunks from the same schedule and solves them (no MPI calls), so
  replies never wait for a chunk rank 0 is solving; if coordinating slows its own solving, it
  simply takes fewer chunks. Other ranks also wait by polling with a sleep.
* **Failures end the job.** An exception on a worker rank is sent to rank 0 and raised there as
  :class:`RankFailed`; the caller cleans up and calls :func:`end_job`, which prints one
  ``[rank R] error: ...`` line and aborts every rank (:meth:`odecli.parallel.comm.Comm.abort`).
  Should rank 0 not answer within :data:`ABORT_GRACE_S`, the failing rank prints and aborts itself.
"""

from __future__ import annotations

import math
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .comm import POLL_MAX_S, POLL_MIN_S, Comm

SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE")
ABORT_GRACE_S = 10.0  # a failing rank waits this long for rank 0 to end the job
TAG_REQUEST, TAG_RESULT, TAG_ERROR, TAG_ASSIGN, TAG_FINAL = 811, 812, 813, 814, 815

Chunk = tuple[int, int]
#: Solve items ``[start, stop)`` on ``rank``: ``(result, busy seconds)``; ``first`` marks a rank's first chunk.
SolveChunk = Callable[[int, int, int, bool], tuple[Any, float]]
#: An exception as (one-line message, exit code).
Describe = Callable[[BaseException], tuple[str, int]]


def launched_ranks() -> int:
    """Number of ranks the MPI launcher started (from its environment; imports no MPI)."""
    for var in SIZE_VARS:
        value = os.environ.get(var)
        if value and value.isdigit():
            return int(value)
    return 1


class GuidedSchedule:
    """Hands out consecutive chunks ``[start, stop)``: ``ceil(remaining / (2 * workers))`` items,
    clamped to ``[min_chunk, max_chunk]``. Thread-safe (rank 0's coordinator and helper share it)."""

    def __init__(self, batch: int, workers: int, min_chunk: int = 1, max_chunk: int | None = None) -> None:
        self.batch = batch
        self.workers = max(1, workers)
        self.min_chunk = max(1, min_chunk)
        self.max_chunk = max(self.min_chunk, max_chunk or batch)
        self.position = 0
        self._lock = threading.Lock()

    def take(self) -> Chunk | None:
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


@dataclass
class Accounting:
    """Rank 0's record of a finished queue: who solved what, and for how long."""

    wall_s: float
    busy_s: np.ndarray
    items: np.ndarray  # per rank
    chunks: list[tuple[int, int, int]] = field(default_factory=list)  # (start, stop, rank), as stored

    @property
    def idle_s(self) -> np.ndarray:
        return np.maximum(self.wall_s - self.busy_s, 0.0)


class RankFailed(Exception):
    """A rank's solve raised; ``message`` and ``code`` are its :data:`Describe` output."""

    def __init__(self, rank: int, message: str, code: int) -> None:
        super().__init__(message)
        self.rank, self.message, self.code = rank, message, code


class _Helper(threading.Thread):
    """Rank 0's solving thread: takes chunks from the shared schedule, queues results (no MPI)."""

    def __init__(self, solve: SolveChunk, schedule: GuidedSchedule, describe: Describe) -> None:
        super().__init__(name="odecli-rank0-solver", daemon=True)
        self.solve, self.schedule, self.describe = solve, schedule, describe
        self.results: queue.Queue = queue.Queue(maxsize=2)  # back-pressure if storing falls behind
        self.error: tuple[str, int] | None = None
        self.stop_requested = threading.Event()

    def run(self) -> None:
        first = True
        try:
            while not self.stop_requested.is_set() and (chunk := self.schedule.take()) is not None:
                result, busy = self.solve(chunk[0], chunk[1], 0, first)
                first = False
                while not self.stop_requested.is_set():
                    try:
                        self.results.put((chunk, result, busy), timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as exc:  # reported by the coordinator
            self.error = self.describe(exc)


def coordinate(comm: Comm, schedule: GuidedSchedule, solve: SolveChunk, store: Callable[[Chunk, Any], None],
               describe: Describe) -> Accounting:
    """Rank 0: hand out every chunk, solve some, ``store`` each result; raises :class:`RankFailed`
    (or whatever ``store`` raised) with the helper thread stopped. Workers run :func:`work`."""
    size = comm.size
    busy, items = np.zeros(size), np.zeros(size, dtype=np.int64)
    chunks: list[tuple[int, int, int]] = []
    stored = 0
    helper = _Helper(solve, schedule, describe)
    previous_interval = sys.getswitchinterval()
    sys.setswitchinterval(0.001)  # the coordinator gets the GIL back quickly from the helper

    def keep(rank: int, chunk: Chunk, result: Any, seconds: float) -> None:
        nonlocal stored
        store(chunk, result)
        busy[rank] += seconds
        items[rank] += chunk[1] - chunk[0]
        chunks.append((chunk[0], chunk[1], rank))
        stored += chunk[1] - chunk[0]

    try:
        waiting = set(range(1, size))  # ranks that have not been told to stop
        sends: list[Any] = []
        began = time.perf_counter()
        helper.start()
        delay = POLL_MIN_S
        while stored < schedule.batch or waiting:
            handled = False
            while (message := comm.poll_object()) is not None:
                handled = True
                source, tag, payload = message
                if tag == TAG_ERROR:
                    raise RankFailed(source, *payload)
                nxt = schedule.take()
                sends.append(comm.isend_object(nxt, source, TAG_ASSIGN))  # reply first, then store
                if nxt is None:
                    waiting.discard(source)
                if tag == TAG_RESULT:
                    keep(source, *payload)
            try:
                while True:
                    keep(0, *helper.results.get_nowait())
                    handled = True
            except queue.Empty:
                pass
            if helper.error is not None:
                raise RankFailed(0, *helper.error)
            if not handled:
                time.sleep(delay)
                delay = min(POLL_MAX_S, delay * 2)
            else:
                delay = POLL_MIN_S
        wall = time.perf_counter() - began
        helper.join()
        comm.wait_all(sends)
    except BaseException:
        helper.stop_requested.set()
        raise
    finally:
        sys.setswitchinterval(previous_interval)
    return Accounting(wall, busy, items, chunks)


def work(comm: Comm, solve: SolveChunk, describe: Describe) -> Any:
    """A rank other than 0: request chunks, solve them, send results until told to stop; returns
    what rank 0 sends with :func:`finish`. Any failure ends the job through rank 0."""
    first = True
    try:
        comm.send_object(None, 0, TAG_REQUEST)
        while (chunk := comm.recv_object(0, TAG_ASSIGN)) is not None:
            result, busy = solve(chunk[0], chunk[1], comm.rank, first)
            first = False
            comm.send_object((chunk, result, busy), 0, TAG_RESULT)
        return comm.recv_object(0, TAG_FINAL)
    except BaseException as exc:  # every failure ends the job through rank 0
        message, code = describe(exc)
        try:
            comm.isend_object((message, code), 0, TAG_ERROR)
            time.sleep(ABORT_GRACE_S)  # rank 0 aborts the job well before this ends
        finally:
            print(f"[rank {comm.rank}] error: {message} (rank 0 did not respond)", file=sys.stderr, flush=True)
            comm.abort(code)
        raise  # not reached


def finish(comm: Comm, final: Any) -> None:
    """Rank 0, after :func:`coordinate` and the caller's last writes: every worker gets ``final``."""
    for rank in range(1, comm.size):
        comm.send_object(final, rank, TAG_FINAL)


def end_job(comm: Comm, exc: BaseException, describe: Describe) -> None:
    """Rank 0 after a failure (its own or a :class:`RankFailed`): one ``[rank R] error: ...`` line,
    the form every command prints for a failure one rank met alone
    (:func:`odecli.parallel.comm.end_together`), then every rank ends with the failure's exit
    code. Does not return."""
    if isinstance(exc, RankFailed):
        rank, message, code = exc.rank, exc.message, exc.code
    else:
        rank, (message, code) = 0, describe(exc)
    print(f"[rank {rank}] error: {message}", file=sys.stderr, flush=True)
    comm.abort(code)
