"""Solve a batch with a generated C solver: each sample on its own steps, samples spread over threads.

For right-hand sides written as expressions (every ``equations:`` spec) there is no Python or
PyTorch work per step at all: the method, the controller and the equations are compiled into
one C function (:mod:`odecli.ode.native.codegen`) that runs samples from start to end, a few
at a time in vector lanes. Samples are independent, so blocks of them run on a thread pool
(ctypes releases the GIL), and a block boundary is where progress is reported. The result is
a :class:`~odecli.ode.solver.Solution` equal to the batched PyTorch loop's to round-off, with
the same per-sample steps (see codegen).
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import math
import time
from dataclasses import dataclass
from typing import Callable, Mapping

import torch
from torch import Tensor

from odecli import native
from odecli.ode.controllers import PIDController, make_controller
from odecli.ode.methods import METHODS, ExplicitRK
from odecli.ode.native.codegen import CONFIG_FIELDS, FLOAT_STATS, INT_STATS, LANES, generate
from odecli.ode.solver import STAT_NAMES, Progress, Solution, _as_batch_vector, _eval_grid

BLOCKS_PER_THREAD = 8  # enough blocks that threads stay busy when samples differ in cost
MAX_BLOCK = 4096
HOLD_GIL_BELOW = 8  # samples: so few finish in milliseconds, faster than handing Python's lock back


class NativeUnavailable(RuntimeError):
    """The generated solver cannot run here (no compiler, turned off, unsupported input)."""


@dataclass(frozen=True)
class NativeRhs:
    """``dy/dt`` as one C expression per state over ``t``, ``y[i]`` and ``p[j]``.

    ``params`` names the columns of ``p`` in order; the values come from ``solve_native``'s
    ``params`` mapping (per-sample (B,) tensors or scalars).
    """

    equations: tuple[str, ...]
    params: tuple[str, ...] = ()


def unsupported_reason(method: str, dtype: torch.dtype, device: torch.device) -> str:
    """Why the generated solver cannot take this solve ("" when it can)."""
    if method not in METHODS:
        return f"method {method!r} is not an explicit Runge-Kutta method"
    if device.type != "cpu":
        return f"the generated solver runs on the CPU (asked for {device})"
    if dtype != torch.float64:
        return f"the generated solver computes in float64 (asked for {dtype})"
    if not native.enabled():
        return "turned off by ODECLI_NATIVE=0"
    return ""


def solve_native(
    rhs: NativeRhs,
    y0: Tensor,
    t_start: Tensor | float,
    t_end: Tensor | float,
    t_eval: Tensor | None = None,
    *,
    params: Mapping[str, Tensor | float] | None = None,
    method: str = "dopri5",
    rtol: float = 1e-6,
    atol: float = 1e-6,
    controller: str | PIDController = "integral",
    dt0: float | Tensor | None = None,
    max_steps: int = 100_000,
    threads: int | None = None,
    progress: Callable[[Progress], None] | None = None,
) -> Solution:
    """:func:`odecli.ode.solver.solve` for an expression right-hand side, as compiled C.

    Same arguments and result as ``solve`` (no gradients: the output does not require grad).
    ``threads`` defaults to ``torch.get_num_threads()``. Raises :class:`NativeUnavailable`
    when the solver cannot be generated or built here; callers fall back to ``solve``.
    """
    started = time.perf_counter()
    why = unsupported_reason(method, y0.dtype, y0.device)
    if why:
        raise NativeUnavailable(why)
    tableau = METHODS[method]
    ctrl = make_controller(controller) if isinstance(controller, str) else controller
    if y0.dim() != 2 or y0.shape[1] != len(rhs.equations):
        raise ValueError(f"y0 must have shape (batch, {len(rhs.equations)}), got {tuple(y0.shape)}")
    if not tableau.adaptive and dt0 is None:
        raise ValueError(f"method {method!r} has a fixed step: pass dt0")
    if max_steps < 1:
        raise ValueError("max_steps must be >= 1")
    solver, solver_holding_gil = _load(tableau, rhs)
    batch, n_states = y0.shape
    f64 = dict(dtype=torch.float64, device="cpu")
    y0 = y0.detach().contiguous()
    t0 = _as_batch_vector(t_start, batch, torch.float64, y0.device)
    t1 = _as_batch_vector(t_end, batch, torch.float64, y0.device)
    grid = _eval_grid(t_eval, t0, t1).contiguous()
    n_eval = grid.shape[1]
    p = _param_matrix(rhs.params, params or {}, batch)
    dt = _as_batch_vector(dt0 if dt0 is not None else 0.0, batch, torch.float64, y0.device)
    cfg = torch.tensor([float(rtol), float(atol), *(float(getattr(ctrl, name)) for name in CONFIG_FIELDS[2:])], **f64)
    y_out = torch.full((batch, n_eval, n_states), math.nan, **f64)
    istat = torch.zeros(batch, len(INT_STATS), dtype=torch.int64)
    fstat = torch.zeros(batch, len(FLOAT_STATS), **f64)
    y_final = torch.empty(batch, n_states, **f64)
    fixed = [ctypes.c_int64(n_eval), ctypes.c_int64(p.shape[1])] + [
        ctypes.c_void_p(x.data_ptr()) for x in (y0, t0, t1, grid, p, dt)
    ] + [ctypes.c_int64(int(dt0 is None)), ctypes.c_void_p(cfg.data_ptr()), ctypes.c_int64(max_steps)] + [
        ctypes.c_void_p(x.data_ptr()) for x in (y_out, istat, fstat, y_final)
    ]

    def run(block: tuple[int, int], entry=solver) -> tuple[int, int]:
        if entry(ctypes.c_int64(block[0]), ctypes.c_int64(block[1]), *fixed) != 0:
            raise MemoryError("the generated ODE solver could not allocate its lanes")
        return block

    workers = max(1, min(threads or torch.get_num_threads(), batch))
    if batch < HOLD_GIL_BELOW and progress is None:
        # Releasing the lock for a sub-millisecond call costs more when another Python thread
        # runs (e.g. torch.compile's workers): taking it back waits for the 5 ms switch interval.
        run((0, batch), solver_holding_gil)
    elif workers == 1 and progress is None:
        run((0, batch))
    else:
        finished = steps = 0
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            for lo, hi in pool.map(run, _blocks(batch, workers)):
                finished += hi - lo
                steps += int(istat[lo:hi, 1].sum())
                if progress is not None:
                    progress(Progress(finished, batch, 1.0 if finished == batch else 0.0, steps))
    stats = {name: istat[:, i].clone() for i, name in enumerate(INT_STATS) if name in STAT_NAMES}
    stats["dt0"], stats["dt_final"] = fstat[:, 0].clone(), fstat[:, 1].clone()
    return Solution(
        t=grid, y=y_out, status=istat[:, 0].clone(), stats=stats, t_final=fstat[:, 2].clone(), y_final=y_final,
        wall_time_s=time.perf_counter() - started, method=method, extra={"engine": "native"},
    )


_ARGTYPES = [ctypes.c_int64] * 4 + [ctypes.c_void_p] * 6 + [ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64] \
    + [ctypes.c_void_p] * 4


def _load(tableau: ExplicitRK, rhs: NativeRhs):
    """``solve_samples`` twice: releasing Python's lock (for threads) and holding it (tiny batches)."""
    source = generate(tableau, rhs.equations, len(rhs.params), LANES).encode()
    lib, why = native.load_source(f"ode-{tableau.name}", source)
    if lib is None:
        raise NativeUnavailable(why)
    return _entry(lib), _entry(_holding_gil(lib._name))


@functools.lru_cache(maxsize=64)
def _holding_gil(path: str) -> ctypes.PyDLL:
    return ctypes.PyDLL(path)


def _entry(lib: ctypes.CDLL):
    solver = lib.solve_samples
    solver.restype = ctypes.c_int
    solver.argtypes = _ARGTYPES
    return solver


def _param_matrix(names: tuple[str, ...], values: Mapping[str, Tensor | float], batch: int) -> Tensor:
    """(batch, n_params) float64, one column per name in ``names`` (scalars broadcast)."""
    columns = []
    for name in names:
        if name not in values:
            raise ValueError(f"parameter {name!r} has no value")
        columns.append(_as_batch_vector(torch.as_tensor(values[name]).detach(), batch, torch.float64,
                                        torch.device("cpu")))
    if not columns:
        return torch.zeros(batch, 1, dtype=torch.float64)  # never read; keeps a valid pointer
    return torch.stack(columns, dim=1).contiguous()


def _blocks(batch: int, workers: int) -> list[tuple[int, int]]:
    """Contiguous sample ranges, several per thread (load balance), none larger than MAX_BLOCK."""
    size = max(1, min(MAX_BLOCK, math.ceil(batch / (workers * BLOCKS_PER_THREAD))))
    return [(lo, min(lo + size, batch)) for lo in range(0, batch, size)]
