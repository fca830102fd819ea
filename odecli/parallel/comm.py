"""A thin communicator wrapper so that the rest of odecli never imports mpi4py directly.

Two reasons for the indirection: the package must run (serially) where mpi4py is not
installed, and the array-level helpers below are the only place that knows about MPI
buffers, so the differentiable ops in :mod:`odecli.parallel.ops` stay plain torch/numpy.

It is also the one point-to-point and abort path: collectives, buffer exchanges, the polled
object messages of the ODE work queue (:mod:`odecli.parallel.work_queue`), and :meth:`Comm.abort`,
which every failing rank of every command ends the job through.

**No rank left waiting.** A rank that fails calls :func:`end_together` with its one-line message
and exit code. The ranks that fail there agree on a private duplicate of COMM_WORLD (made as the
first collective of every rank, so it can never be matched against other traffic): if every rank
arrives within :data:`AGREE_S` seconds (a failure all ranks meet at the same point: a bad spec),
the message is printed once, by rank 0, and every rank exits with the code; otherwise the failing
rank prints its message with its rank and aborts the job (:meth:`Comm.abort`) with that code, so a
failure that one rank alone met never leaves the others in a collective. A rank that is stuck
inside a blocking MPI call when a termination signal arrives cannot run Python's handler; the
watchdog of :mod:`odecli.interrupts` then calls :func:`abort_now` from another thread.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

_OPS = ("sum", "max", "min")
AGREE_S = 2.0  # failing ranks wait this long for every rank to fail alike before aborting
OUTPUT_FORWARD_S = 0.5  # pause before MPI_Abort so the launcher forwards the error line
POLL_MIN_S, POLL_MAX_S = 5e-5, 2e-3  # waits poll with a sleep growing between these bounds

#: One point-to-point message: (peer rank, buffer, tag).
Message = tuple[int, np.ndarray, int]


class Comm:
    """Rank/size plus the few collectives odecli needs; serial when ``mpi_comm`` is None or size 1.

    All methods are collective: every rank must call them in the same order.
    """

    def __init__(self, mpi_comm: Any | None = None) -> None:
        self._mpi = mpi_comm if mpi_comm is not None and mpi_comm.Get_size() > 1 else None
        if self._mpi is not None:
            from mpi4py import MPI

            self._MPI = MPI
            self.rank: int = self._mpi.Get_rank()
            self.size: int = self._mpi.Get_size()
        else:
            self.rank = 0
            self.size = 1

    def __repr__(self) -> str:
        kind = "mpi" if self._mpi is not None else "serial"
        return f"Comm({kind}, rank={self.rank}, size={self.size})"

    # -- object-level helpers (pickled, non-differentiable) -----------------------------------
    def barrier(self) -> None:
        if self._mpi is not None:
            self._mpi.Barrier()

    def abort(self, code: int = 1) -> None:
        """Stop every rank; a lone ``sys.exit`` on one rank would leave the others hanging.

        The launcher forwards a rank's output through a pipe and kills every rank on Abort,
        unread output too: without a pause the one-line error can be lost (seen under load in CI).
        """
        if self._mpi is not None:
            sys.stdout.flush()
            sys.stderr.flush()
            time.sleep(OUTPUT_FORWARD_S)
            self._MPI.COMM_WORLD.Abort(code or 1)  # an abort never reads as success
            # MPICH's Abort can return before the launcher kills this process; leave now so
            # nothing else (e.g. the CLI's internal-error handler) prints a second message.
            os._exit(code or 1)
        sys.exit(code)

    def dup(self) -> Comm:
        """A private communicator over the same ranks, so one component's tags meet no other's."""
        return Comm(self._mpi.Dup()) if self._mpi is not None else Comm()

    def free(self) -> None:
        """Release a communicator made by :meth:`dup` (collective)."""
        if self._mpi is not None:
            self._mpi.Free()

    def node_rank_and_size(self) -> tuple[int, int]:
        """This rank's index among the ranks on its node, and how many there are."""
        if self._mpi is None:
            return 0, 1
        node = self._mpi.Split_type(self._MPI.COMM_TYPE_SHARED)
        try:
            return node.Get_rank(), node.Get_size()
        finally:
            node.Free()

    def allreduce_scalar(self, value: float, op: str = "sum") -> float:
        if op not in _OPS:
            raise ValueError(f"allreduce_scalar: op must be one of {_OPS}, got {op!r}")
        if self._mpi is None:
            return float(value)
        mpi_op = {"sum": self._MPI.SUM, "max": self._MPI.MAX, "min": self._MPI.MIN}[op]
        return float(self._mpi.allreduce(float(value), op=mpi_op))

    def bcast_object(self, obj: Any, root: int = 0) -> Any:
        self._check_root(root)
        return obj if self._mpi is None else self._mpi.bcast(obj, root=root)

    def gather_object(self, obj: Any, root: int = 0) -> list[Any] | None:
        self._check_root(root)
        return [obj] if self._mpi is None else self._mpi.gather(obj, root=root)

    def allgather_object(self, obj: Any) -> list[Any]:
        return [obj] if self._mpi is None else self._mpi.allgather(obj)

    # -- polled point-to-point objects (a waiting rank sleeps, leaving an oversubscribed core free) --
    def send_object(self, obj: Any, dest: int, tag: int) -> None:
        """Send ``obj`` and wait, polling, until the message has left."""
        request = self._mpi.isend(obj, dest=dest, tag=tag)
        _poll(request.Test)

    def isend_object(self, obj: Any, dest: int, tag: int) -> Any:
        """Start sending ``obj``; the request must be waited on (:meth:`wait_all`) before the end."""
        return self._mpi.isend(obj, dest=dest, tag=tag)

    def recv_object(self, source: int, tag: int, timeout: float | None = None) -> Any:
        """The next object from ``source`` with ``tag``, polling; TimeoutError after ``timeout`` s."""
        _poll(lambda: self._mpi.Iprobe(source=source, tag=tag), timeout)
        return self._mpi.recv(source=source, tag=tag)

    def poll_object(self) -> tuple[int, int, Any] | None:
        """One pending message from any rank as (source, tag, payload), or None."""
        if self._mpi is None:
            return None
        status = self._MPI.Status()
        if not self._mpi.Iprobe(source=self._MPI.ANY_SOURCE, tag=self._MPI.ANY_TAG, status=status):
            return None
        source, tag = status.Get_source(), status.Get_tag()
        return source, tag, self._mpi.recv(source=source, tag=tag)

    def wait_all(self, requests: Sequence[Any]) -> None:
        if requests:
            self._MPI.Request.Waitall(list(requests))

    # -- array-level helpers (contiguous numpy buffers, used by the differentiable ops) --------
    def exchange(self, sends: Sequence[Message], recvs: Sequence[Message]) -> None:
        """Post all receives and sends non-blocking, then wait for all (ADCME's deadlock-free order).

        Receive buffers are filled in place; send buffers must stay untouched until return.
        """
        if not sends and not recvs:
            return
        if self._mpi is None:
            raise RuntimeError("Comm.exchange: a serial communicator has no peers to talk to")
        reqs = [self._mpi.Irecv(buf, source=src, tag=tag) for src, buf, tag in recvs]
        reqs += [self._mpi.Isend(buf, dest=dst, tag=tag) for dst, buf, tag in sends]
        self._MPI.Request.Waitall(reqs)

    def allreduce_array(self, a: np.ndarray) -> np.ndarray:
        """Element-wise sum over ranks, returned as a new array on every rank."""
        if self._mpi is None:
            return a.copy()
        out = np.empty_like(a)
        self._mpi.Allreduce(np.ascontiguousarray(a), out, op=self._MPI.SUM)
        return out

    def bcast_array(self, a: np.ndarray, root: int = 0) -> np.ndarray:
        """Root's values on every rank (``a`` must have the same shape/dtype everywhere)."""
        self._check_root(root)
        out = np.array(a, copy=True, order="C")
        if self._mpi is not None:
            self._mpi.Bcast(out, root=root)
        return out

    def reduce_array(self, a: np.ndarray, root: int = 0) -> np.ndarray:
        """Element-wise sum over ranks on root; zeros elsewhere (the adjoint of a broadcast)."""
        self._check_root(root)
        if self._mpi is None:
            return a.copy()
        out = np.zeros_like(a)
        self._mpi.Reduce(np.ascontiguousarray(a), out, op=self._MPI.SUM, root=root)
        return out

    def _check_root(self, root: int) -> None:
        if not 0 <= root < self.size:
            raise ValueError(f"root rank {root} is outside 0..{self.size - 1}")


def _poll(done: Any, timeout: float | None = None) -> None:
    """Wait until ``done()`` is true, sleeping from POLL_MIN_S doubling up to POLL_MAX_S."""
    delay, began = POLL_MIN_S, time.monotonic()
    while not done():
        if timeout is not None and time.monotonic() - began > timeout:
            raise TimeoutError
        time.sleep(delay)
        delay = min(POLL_MAX_S, delay * 2)


_world: Comm | None = None
_watch: Any = None  # the failures' private duplicate of COMM_WORLD (None when serial)
_together = False  # set by the CLI: its failures reach end_together


def end_failures_together() -> None:
    """Declare that every failure reaches :func:`end_together` (the CLI's commands do): library
    code then raises a failure of one rank instead of aborting the job itself."""
    global _together
    _together = True


def failures_end_together() -> bool:
    """Whether :func:`end_failures_together` was called in this process."""
    return _together


def get_comm() -> Comm:
    """COMM_WORLD if mpi4py is importable, else a serial communicator.

    mpi4py is imported here, not at module import, because importing it initialises MPI. The
    first call on several ranks also duplicates COMM_WORLD for :func:`end_together`: every rank's
    first collective, whenever each makes it (a rank that fails before it does so on its way out).
    """
    global _world, _watch
    if _world is not None:
        return _world
    try:
        MPI = import_mpi()
    except ImportError:
        _world = Comm()
        return _world
    if MPI.COMM_WORLD.Get_size() > 1:
        _watch = MPI.COMM_WORLD.Dup()
    _world = Comm(MPI.COMM_WORLD)
    return _world


def end_together(line: str | None, code: int, grace_s: float = AGREE_S) -> tuple[str | None, int]:
    """A failing rank's way out: ``(line to print here, exit code)`` when every rank failed alike
    (rank 0 prints the first failing rank's line; the others print nothing), else print ``line``
    with this rank's number and abort every rank with ``code`` (does not return). ``line`` None:
    this rank has nothing to say (another rank reports the failure). Serial: ``(line, code)``."""
    comm = get_comm()
    if comm.size == 1 or _watch is None:
        return line, code
    request = _watch.Ibarrier()
    try:
        _poll(request.Test, grace_s)
    except TimeoutError:
        abort_now(line, code)
    reports = _watch.allgather((line, code))
    rank, (first, first_code) = next(((r, p) for r, p in enumerate(reports) if p[0] is not None), (0, (None, code)))
    if comm.rank != 0 or first is None:
        return None, first_code
    return (first if rank == 0 else f"[rank {rank}] {first}"), first_code


def abort_now(line: str | None, code: int) -> None:
    """Print ``line`` with this rank's number and end every rank with ``code`` (does not return).
    Safe from any thread; initialises MPI first where this rank had not yet (its launcher would
    otherwise leave the other ranks waiting for it)."""
    try:
        world = import_mpi().COMM_WORLD
    except ImportError:
        world = None
    if line is not None:
        sys.stderr.write(f"[rank {world.Get_rank() if world is not None else 0}] {line}\n")
    if world is not None and world.Get_size() > 1:
        Comm(world).abort(code)  # does not return
    sys.stderr.flush()
    os._exit(code or 1)


def import_mpi() -> Any:
    """``mpi4py.MPI``, imported (which initialises MPI) with odecli's signal handlers kept: the MPI
    library may install its own, and then SIGHUP no longer stops a run (odecli.interrupts)."""
    from mpi4py import MPI

    from odecli.interrupts import reinstall

    reinstall()
    return MPI
