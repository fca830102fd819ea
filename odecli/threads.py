"""The one thread pool that every C kernel (ODE solver blocks, PDE stencil passes) runs on.

Why a pool of our own rather than OpenMP in the C: the kernels run inside a process that also
holds torch's OpenMP runtime, and a second runtime in the same process risks two sets of threads
on the same cores (not measured here: the two pools this replaced were already Python executors,
and their speed is unchanged). Python threads calling ctypes functions release the GIL, so a
plain executor gives the parallelism with one set of threads. Why kept for the process: a fit solves and differentiates
hundreds of times, and starting threads for each call cost more than the C work of a small batch.
"""

from __future__ import annotations

import concurrent.futures
import functools
import itertools
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def kernel_pool(workers: int) -> ThreadPoolExecutor:
    """A shared executor with at least ``workers`` threads (threads start lazily, on demand)."""
    global _pool
    with _lock:
        if _pool is None or _pool._max_workers < workers:
            old, _pool = _pool, ThreadPoolExecutor(max(workers, available_cpus()), thread_name_prefix="odecli-kernel")
            if old is not None:
                old.shutdown(wait=False)
        return _pool


def split_rows(rows: int, pieces: int) -> list[tuple[int, int]]:
    """``rows`` split into at most ``pieces`` contiguous, nearly equal, non-empty ranges [a, b)."""
    pieces = max(1, min(pieces, rows))
    cuts = [rows * k // pieces for k in range(pieces + 1)]
    return list(itertools.pairwise(cuts))


def run_on_pool(calls: list) -> None:
    """Run the kernel calls at once: all but one on the pool, the last on this thread. On an
    exception (a signal) it waits for the others, which are inside C writing into the caller's
    arrays, before unwinding."""
    if len(calls) == 1:
        calls[0]()
        return
    futures = [kernel_pool(len(calls) - 1).submit(c) for c in calls[:-1]]
    try:
        calls[-1]()
        for f in futures:
            f.result()
    except BaseException:
        concurrent.futures.wait(futures)
        raise


@functools.lru_cache(maxsize=1)
def available_cpus() -> int:
    """Logical CPUs this process may run on (its affinity mask), the CPU count off Linux."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_threads() -> int:
    """What ``torch.get_num_threads()`` gives: torch's own setting when torch is loaded (so
    ``torch.set_num_threads`` and MPI ranks' core shares apply), else as torch would start:
    the physical cores this process may use, fewer if ``OMP_NUM_THREADS`` asks for fewer."""
    if "torch" in sys.modules:
        return sys.modules["torch"].get_num_threads()
    cores = physical_cores()
    try:
        return max(1, min(cores, int(os.environ.get("OMP_NUM_THREADS", ""))))
    except ValueError:
        return cores


@functools.lru_cache(maxsize=1)
def physical_cores() -> int:
    """Cores (not hyperthreads) among the CPUs this process may run on; the CPU count off Linux."""
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
    cores = set()
    for cpu in cpus:
        try:
            cores.add(Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text().strip())
        except OSError:
            cores.add(str(cpu))
    return max(1, len(cores))
