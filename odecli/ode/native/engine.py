"""The generated C solver's machinery: lay a batch out as arrays, build the library, run it over threads.

For right-hand sides written as expressions (every ``equations:`` spec,
:class:`~odecli.ode.native.rhs.NativeRhs`) and for MLPs with shared weights
(:class:`~odecli.ode.native.mlp.NativeMLP`, a neural ODE) there is no Python or PyTorch work per
step at all: the method, the controller and the right-hand side are compiled into one C
function (:mod:`odecli.ode.native.codegen`) that runs samples from start to end, a few at a time
in vector lanes. Samples are independent, so blocks of them run on the kernel thread pool
(ctypes releases the GIL), and a block boundary is where progress is reported.

Everything here works on numpy arrays and never imports torch. The entry points are
:mod:`odecli.ode.native.solve` (plain solves) and :mod:`odecli.ode.native.gradient` (solves that
record a gradient); both import this module, which imports neither.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import dataclasses
import functools
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from odecli import native
from odecli.threads import default_threads, kernel_pool
from odecli.ode.methods import METHODS, ExplicitRK
from odecli.ode.native.codegen import CONFIG_FIELDS, FLOAT_STATS, INT_STATS, LANES, SOLVER_FLAGS, generate
from odecli.ode.native.rhs import NativeRhs, NativeUnavailable
from odecli.ode.options import SolverOptions
from odecli.ode.solution import ArraySolution
from odecli.ode.status import STAT_NAMES, Progress

if TYPE_CHECKING:
    from odecli.ode.native.mlp import NativeMLP

__all__ = ["ArraySolution", "Job", "NativeRhs", "NativeUnavailable", "as_float64", "block_ranges", "prepare_job",
           "run_blocks", "solve_job", "solver_flags", "unsupported_reason", "use_pow_lanes"]

BLOCKS_PER_THREAD = 8  # enough blocks that threads stay busy when samples differ in cost
MAX_BLOCK = 4096
HOLD_GIL_BELOW = 8  # samples: so few finish in milliseconds, faster than handing Python's lock back


def unsupported_reason(method: str, dtype: str = "float64", device: str = "cpu") -> str:
    """Why the generated solver cannot take this solve ("" when it can).

    ``dtype`` and ``device`` are names ("float64", "cuda:0"), so no torch is needed to ask.
    """
    dtype, device = str(dtype).removeprefix("torch."), str(device)
    if method not in METHODS:
        return f"method {method!r} is not an explicit Runge-Kutta method"
    if device.split(":")[0] != "cpu":
        return f"the generated solver runs on the CPU (asked for {device})"
    if dtype != "float64":
        return f"the generated solver computes in float64 (asked for {dtype})"
    if not native.enabled():
        return "turned off by ODECLI_NATIVE=0"
    return ""


def solve_job(rhs: NativeRhs | NativeMLP, method: str, job: "Job", threads: int | None = None,
              progress: Callable[[Progress], None] | None = None, started: float | None = None,
              solvers: tuple[Callable, Callable] | None = None, extra_args: Sequence[Any] = ()) -> ArraySolution:
    """Run the generated solver on a prepared :class:`Job` (its output arrays become the result's).

    ``solvers`` replaces ``solve_samples`` (releasing Python's lock, holding it) with another
    entry point taking ``extra_args`` after the Job's (the gradient's taping forward pass).
    """
    started = time.perf_counter() if started is None else started
    solver, solver_holding_gil = _load(METHODS[method], rhs) if solvers is None else solvers
    args = job.args() + list(extra_args)
    batch = job.y0.shape[0]
    if batch < HOLD_GIL_BELOW and progress is None:
        # Releasing the lock for a sub-millisecond call costs more when another Python thread
        # runs (e.g. torch.compile's workers): taking it back waits for the 5 ms switch interval.
        run_blocks(solver_holding_gil, args, job, 1)
    else:
        run_blocks(solver, args, job, threads or default_threads(), progress)
    stats = {name: job.istat[:, i].copy() for i, name in enumerate(INT_STATS) if name in STAT_NAMES}
    stats["dt0"], stats["dt_final"] = job.fstat[:, 0].copy(), job.fstat[:, 1].copy()
    return ArraySolution(
        t=job.grid, y=job.y_out, status=job.istat[:, 0].copy(), stats=stats, t_final=job.fstat[:, 2].copy(),
        y_final=job.y_final, wall_time_s=time.perf_counter() - started, method=method,
        extra={"engine": "native"},
    )


@dataclass
class Job:
    """What ``solve_samples`` reads (the batch as float64 arrays, the controller's constants) and
    the output arrays it fills; the gradient's forward and backward passes read the same."""

    y0: np.ndarray  # (B, n_states)
    t0: np.ndarray  # (B,)
    t1: np.ndarray  # (B,)
    grid: np.ndarray  # (B, n_eval)
    p: np.ndarray  # (B, n_params), at least one column
    dt: np.ndarray  # (B,) first steps, used unless auto_dt0
    auto_dt0: bool
    cfg: np.ndarray  # CONFIG_FIELDS
    max_steps: int
    y_out: np.ndarray  # (B, n_eval, n_states), NaN until written
    istat: np.ndarray  # (B, len(INT_STATS)) int64
    fstat: np.ndarray  # (B, len(FLOAT_STATS))
    y_final: np.ndarray  # (B, n_states)
    shared: np.ndarray  # weights every sample reads (NativeMLP), at least one element

    def args(self) -> list:
        """solve_samples' arguments after the sample range."""
        return [ctypes.c_int64(self.grid.shape[1]), ctypes.c_int64(self.p.shape[1])] + [
            ctypes.c_void_p(x.ctypes.data) for x in (self.y0, self.t0, self.t1, self.grid, self.p, self.dt)
        ] + [ctypes.c_int64(int(self.auto_dt0)), ctypes.c_void_p(self.cfg.ctypes.data),
             ctypes.c_int64(self.max_steps)] + [
            ctypes.c_void_p(x.ctypes.data) for x in (self.y_out, self.istat, self.fstat, self.y_final, self.shared)
        ]

    def fresh_outputs(self) -> "Job":
        """The same inputs with new output arrays (solving samples again must not overwrite a returned result)."""
        return dataclasses.replace(self, y_out=np.full_like(self.y_out, math.nan), istat=np.zeros_like(self.istat),
                                   fstat=np.zeros_like(self.fstat), y_final=np.empty_like(self.y_final))


def prepare_job(
    rhs: NativeRhs | NativeMLP,
    y0: np.ndarray,
    t_start: np.ndarray | float,
    t_end: np.ndarray | float,
    t_eval: np.ndarray | None,
    *,
    params: Mapping[str, np.ndarray | float] | None,
    options: SolverOptions,
) -> Job:
    """Check the arguments of :func:`~odecli.ode.native.solve.solve_native_arrays` and lay them out for the C solver."""
    method, rtol, atol, dt0, max_steps = options.method, options.rtol, options.atol, options.dt0, options.max_steps
    why = unsupported_reason(method)
    if why:
        raise NativeUnavailable(why)
    tableau = METHODS[method]
    ctrl = options.pid()
    y0 = np.ascontiguousarray(y0, dtype=np.float64)
    if y0.ndim != 2 or y0.shape[1] != rhs.n_states:
        raise ValueError(f"y0 must have shape (batch, {rhs.n_states}), got {tuple(y0.shape)}")
    if not tableau.adaptive and dt0 is None:
        raise ValueError(f"method {method!r} has a fixed step: pass dt0")
    if max_steps < 1:
        raise ValueError("max_steps must be >= 1")
    batch, n_states = y0.shape
    t0 = _batch_vector(t_start, batch)
    t1 = _batch_vector(t_end, batch)
    grid = _eval_grid(t_eval, t0, t1)
    return Job(
        y0=y0, t0=t0, t1=t1, grid=grid, p=_param_matrix(rhs.params, params or {}, batch),
        dt=_batch_vector(dt0 if dt0 is not None else 0.0, batch), auto_dt0=dt0 is None,
        cfg=np.array([float(rtol), float(atol), *(float(getattr(ctrl, name)) for name in CONFIG_FIELDS[2:])]),
        max_steps=int(max_steps), y_out=np.full((batch, grid.shape[1], n_states), math.nan),
        istat=np.zeros((batch, len(INT_STATS)), dtype=np.int64), fstat=np.zeros((batch, len(FLOAT_STATS))),
        y_final=np.empty((batch, n_states)), shared=np.ascontiguousarray(rhs.shared_weights(), dtype=np.float64),
    )


def block_ranges(batch: int, threads: int, progress: Callable[[Progress], None] | None = None) -> list[tuple[int, int]]:
    """The sample ranges :func:`run_blocks` hands out, in order: one for a single thread without progress."""
    workers = max(1, min(threads, batch))
    if workers == 1 and progress is None:
        return [(0, batch)]
    return _blocks(batch, workers)


def run_blocks(entry: Callable, args: list, job: Job, threads: int,
               progress: Callable[[Progress], None] | None = None,
               block_args: Callable[[int], list] | None = None) -> None:
    """``entry(i0, i1, *args, *block_args(index))`` over :func:`block_ranges`, on ``threads`` threads.

    ``block_args`` gives each block arguments of its own (the gradient's per-block weight sums).
    """
    batch = job.y0.shape[0]
    ranges = block_ranges(batch, threads, progress)

    def run(index: int) -> tuple[int, int]:
        lo, hi = ranges[index]
        extra = block_args(index) if block_args is not None else []
        if entry(ctypes.c_int64(lo), ctypes.c_int64(hi), *args, *extra) != 0:
            raise MemoryError("the generated ODE solver could not allocate its working memory")
        return lo, hi

    if len(ranges) == 1 and progress is None:
        run(0)
        return
    pool = kernel_pool(max(1, min(threads, batch)))
    blocks = [pool.submit(run, index) for index in range(len(ranges))]
    finished = steps = 0
    try:
        for block in blocks:
            lo, hi = block.result()
            finished += hi - lo
            steps += int(job.istat[lo:hi, 1].sum())
            if progress is not None:
                progress(Progress(finished, batch, 1.0 if finished == batch else 0.0, steps))
    except BaseException:
        # Ctrl-C or SIGTERM (raised here, in the main thread) must not unwind and free the job's
        # arrays while other threads are still inside the C solver writing into them (a segfault
        # in about a third of SIGTERMs at 200k samples): blocks not started are cancelled, the
        # running ones (at most MAX_BLOCK samples each) finish first.
        for block in blocks:
            block.cancel()
        concurrent.futures.wait(blocks)
        raise


def as_float64(value: Any) -> Any:
    """A tensor as a float64 numpy array (no copy for CPU float64); anything else (None, floats) unchanged."""
    if hasattr(value, "detach"):
        return value.detach().cpu().double().numpy()
    return value


_ARGTYPES = [ctypes.c_int64] * 4 + [ctypes.c_void_p] * 6 + [ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64] \
    + [ctypes.c_void_p] * 5


def _library(tableau: ExplicitRK, rhs: NativeRhs | NativeMLP) -> ctypes.CDLL:
    return _built(tableau.name, rhs.c_source(), rhs.n_states, len(rhs.params), LANES, rhs.keep_size(),
                  solver_flags(rhs))


@functools.lru_cache(maxsize=64)
def _built(method: str, rhs_c: str, n_states: int, n_params: int, lanes: int, n_keep: int,
           flags: tuple[str, ...]) -> ctypes.CDLL:
    """Cached: generating and hashing the source took half of a one-sample solve's 0.9 ms."""
    source = generate(METHODS[method], rhs_c, n_states, n_params, lanes, n_keep=n_keep).encode()
    lib, why = native.load_source(f"ode-{method}", source, flags)
    if lib is None:
        raise NativeUnavailable(why)
    return lib


def solver_flags(rhs: NativeRhs | NativeMLP) -> tuple[str, ...]:
    """The flags a solver fused with ``rhs`` is built with, beyond :data:`odecli.native.FLAGS`."""
    return tuple(dict.fromkeys((*SOLVER_FLAGS, *rhs.c_flags)))


def _load(tableau: ExplicitRK, rhs: NativeRhs | NativeMLP):
    """``solve_samples`` twice: releasing Python's lock (for threads) and holding it (tiny batches)."""
    lib = _library(tableau, rhs)
    return _entry(lib), _entry(_holding_gil(lib._name))


def use_pow_lanes(rhs: NativeRhs | NativeMLP, method: str, on: bool) -> bool:
    """Let the solver of ``rhs`` and ``method`` take the controller's powers over vector lanes
    (``on``, the default) or from libm's ``pow`` one at a time; returns whether lanes are used
    now (not where the library's load check found this libm's ``pow`` to differ). Both give
    the same solutions bit for bit; benchmarks time the two, tests compare them."""
    switch = _library(METHODS[method], rhs).odecli_pow_lanes
    switch.restype, switch.argtypes = ctypes.c_int, [ctypes.c_int]
    return bool(switch(int(on)))


@functools.lru_cache(maxsize=64)
def _holding_gil(path: str) -> ctypes.PyDLL:
    return ctypes.PyDLL(path)


def _entry(lib: ctypes.CDLL):
    solver = lib.solve_samples
    solver.restype = ctypes.c_int
    solver.argtypes = _ARGTYPES
    return solver


def _batch_vector(value: np.ndarray | float, batch: int) -> np.ndarray:
    """A scalar or (batch,)-sized value as a contiguous (batch,) float64 array."""
    vec = np.asarray(value, dtype=np.float64)
    if vec.ndim == 0:
        return np.full(batch, float(vec))
    if vec.size != batch:
        raise ValueError(f"expected a scalar or {batch} values (one per sample), got shape {vec.shape}")
    return np.ascontiguousarray(vec.reshape(batch))


def _eval_grid(t_eval: np.ndarray | None, t_start: np.ndarray, t_end: np.ndarray) -> np.ndarray:
    """(batch, n_eval) output times: ``t_eval`` per sample or shared, or just the span's two ends."""
    batch = t_start.shape[0]
    if t_eval is None:
        return np.stack([t_start, t_end], axis=1)
    grid = np.asarray(t_eval, dtype=np.float64)
    if grid.ndim == 1:
        grid = np.tile(grid, (batch, 1))  # a copy: the solution's t is its own, writable array
    if grid.ndim != 2 or grid.shape[0] != batch:
        raise ValueError(f"t_eval must have shape (n_eval,) or (batch, n_eval), got {tuple(grid.shape)}")
    return np.ascontiguousarray(grid)


def _param_matrix(names: tuple[str, ...], values: Mapping[str, np.ndarray | float], batch: int) -> np.ndarray:
    """(batch, n_params) float64, one column per name in ``names`` (scalars broadcast)."""
    columns = []
    for name in names:
        if name not in values:
            raise ValueError(f"parameter {name!r} has no value")
        columns.append(_batch_vector(values[name], batch))
    if not columns:
        return np.zeros((batch, 1))  # never read; keeps a valid pointer
    return np.ascontiguousarray(np.stack(columns, axis=1))


def _blocks(batch: int, workers: int) -> list[tuple[int, int]]:
    """Contiguous sample ranges, several per thread (load balance), none larger than MAX_BLOCK."""
    size = max(1, min(MAX_BLOCK, math.ceil(batch / (workers * BLOCKS_PER_THREAD))))
    return [(lo, min(lo + size, batch)) for lo in range(0, batch, size)]
