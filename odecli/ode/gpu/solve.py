"""The generated solver on a CUDA GPU: each sample's whole integration in one thread of one launch.

Why: the batched PyTorch loop launches about 200 kernels per step, so on a GPU its time is
launch latency, nearly independent of the batch (issue 41). The generated solver already runs
each sample from start to end on its own steps (its controller, dense output, status and
counters); compiled for the GPU (:mod:`.source`, :mod:`.nvrtc`), one thread runs one sample
and a solve is one kernel launch (a few when progress is reported, so that a long solve shows
progress and a Ctrl-C waits at most one launch). Inputs are laid out as the CPU engine lays
them out (:func:`odecli.ode.native.engine.prepare_job`), but as float64 tensors on the device,
and the kernel writes statuses, counters and dense output straight into device tensors.

Results agree with the CPU generated solver to round-off, with the same steps per sample (the
build rounds every operation as written, as the CPU build does; only ``pow`` in the controller
may differ in the last bit). A sample that fails (an infinite norm, a step below ``dt_min``, the
step budget) ends with its status and leaves every other sample as it would be alone.

float32 inputs of expression right-hand sides run a float32 build of the same text
(:func:`odecli.ode.gpu.source.cuda_source`), computing as the PyTorch loop does in float32; an
MLP's float32 solve runs in float64 and is returned as float32. Events are located in the kernel as on the CPU
(:mod:`odecli.ode.gpu.events`). Solves that record a gradient are :mod:`odecli.ode.gpu.gradient`'s.
"""

from __future__ import annotations

import ctypes
import math
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping

from odecli import native
from odecli.ode.gpu import nvrtc
from odecli.ode.gpu.driver import DriverError, Kernel, device_arch
from odecli.ode.gpu.source import cuda_source, single_precision_ok
from odecli.ode.methods import METHODS
from odecli.ode.native.codegen import CONFIG_FIELDS, FLOAT_STATS, INT_STATS
from odecli.ode.native.rhs import NativeUnavailable
from odecli.ode.options import SolverOptions
from odecli.ode.status import STAT_NAMES, Progress

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from odecli.ode.native.mlp import NativeMLP
    from odecli.ode.native.rhs import NativeRhs
    from odecli.ode.solution import Solution

THREADS_PER_BLOCK = 128
"""Threads per block. The dopri5 VdP kernel holds its whole state in 128 registers (no local
memory), so 128-thread blocks fill an SM in 4 blocks; benchmarks/gpu_check.py compares 64-512."""
PROGRESS_LAUNCHES = 16
"""With a progress callback, the batch goes in this many launches (at least LAUNCH_MIN samples each)."""
LAUNCH_MIN = 1 << 16
DTYPES = ("float32", "float64")


def unsupported_reason(method: str, dtype: str = "float64", device: str = "cuda") -> str:
    """Why the GPU build of the generated solver cannot take this solve ("" when it can).

    ``dtype`` and ``device`` are names, so no torch is needed to ask; NVRTC must load.
    """
    dtype, device = str(dtype).removeprefix("torch."), str(device)
    if method not in METHODS:
        return f"method {method!r} is not an explicit Runge-Kutta method"
    if device.split(":")[0] != "cuda":
        return f"the GPU solver runs on CUDA devices (asked for {device})"
    if dtype not in DTYPES:
        return f"the GPU solver takes float32 or float64 (asked for {dtype})"
    if not native.enabled():
        return "turned off by ODECLI_NATIVE=0"
    return nvrtc.available()


def solve_gpu(
    rhs: "NativeRhs | NativeMLP",
    y0: Tensor,
    t_start: Tensor | float,
    t_end: Tensor | float,
    t_eval: Tensor | None = None,
    *,
    params: Mapping[str, Tensor | float] | None = None,
    options: SolverOptions | None = None,
    progress: Callable[[Progress], None] | None = None,
    threads_per_block: int = THREADS_PER_BLOCK,
    contract: bool = False,
    **settings: Any,
) -> Solution:
    """:func:`odecli.ode.solver.solve` for a generated right-hand side, on ``y0``'s CUDA device.

    Same arguments and result as ``solve`` (tensors on the device, in ``y0``'s dtype).
    ``contract`` lets the compiler fuse multiply-adds (faster, no longer the CPU's rounding).
    Raises :class:`~odecli.ode.native.NativeUnavailable` when this solve cannot run here.
    """
    import torch

    started = time.perf_counter()
    options = SolverOptions.of(options, settings)
    why = unsupported_reason(options.method if isinstance(options.method, str) else "?", y0.dtype, y0.device)
    if why:
        raise NativeUnavailable(why)
    if torch.is_grad_enabled() and any(getattr(v, "requires_grad", False)
                                       for v in (y0, *(params or {}).values(), *(t for _, t in rhs.tensors()))):
        raise NativeUnavailable("solve_gpu records no gradient: solve_gpu_with_grad does")
    single = y0.dtype == torch.float32 and single_precision_ok(rhs)
    layout = _layout(rhs, y0, t_start, t_end, t_eval, params or {}, options, torch.float32 if single else torch.float64)
    if getattr(rhs, "events", ()):
        from odecli.ode.gpu.events import solve_with_events

        def run(part: _Layout, extra: list, report: Callable[[Progress], None] | None) -> None:
            kernel = _kernel(rhs, options.method, y0.device, contract, single, nvrtc.ENTRY_EVENTS)
            launch(kernel, part, threads_per_block, report, extra)

        records = solve_with_events(rhs, layout, run, progress)
        solution = _solution(layout, y0.dtype, options.method, started)
        solution.events = records
        return solution
    launch(_kernel(rhs, options.method, y0.device, contract, single), layout, threads_per_block, progress)
    return _solution(layout, y0.dtype, options.method, started)


def launch(kernel: Kernel, layout: "_Layout", threads_per_block: int, progress: Callable[[Progress], None] | None,
           extra: list | None = None) -> None:
    """The batch of ``layout`` in one launch, or PROGRESS_LAUNCHES with ``progress`` told after each."""
    batch = layout.y0.shape[0]
    if batch == 0:
        return
    threads_per_block = min(threads_per_block, kernel.max_threads())
    per_launch = batch if progress is None else max(LAUNCH_MIN, math.ceil(batch / PROGRESS_LAUNCHES))
    args = layout.args() + list(extra or [])
    for lo in range(0, batch, per_launch):
        hi = min(batch, lo + per_launch)
        kernel.launch(math.ceil((hi - lo) / threads_per_block), threads_per_block,
                      [ctypes.c_int64(lo), ctypes.c_int64(hi), *args])
        if progress is not None:
            steps = int(layout.istat[:hi, 1].sum())  # synchronises: the launch is done
            progress(Progress(hi, batch, 1.0 if hi == batch else 0.0, steps))


class _Layout:
    """The batch as ``solve_samples_cuda`` reads it, on the device in the build's precision, and its outputs."""

    def __init__(self, **tensors: Any) -> None:
        self.__dict__.update(tensors)

    def args(self) -> list:
        pointer = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731
        return [ctypes.c_int64(self.grid.shape[1]), ctypes.c_int64(self.p.shape[1]),
                *(pointer(t) for t in (self.y0, self.t0, self.t1, self.grid, self.p, self.dt)),
                ctypes.c_int64(int(self.auto_dt0)), pointer(self.cfg), ctypes.c_int64(self.max_steps),
                *(pointer(t) for t in (self.y_out, self.istat, self.fstat, self.y_final, self.shared))]


def _layout(rhs: "NativeRhs | NativeMLP", y0: Tensor, t_start: Any, t_end: Any, t_eval: Any,
            params: Mapping[str, Any], options: SolverOptions, real: "torch.dtype") -> _Layout:
    """Check the arguments as :func:`odecli.ode.native.engine.prepare_job` does, laid out on the device."""
    import torch

    device = y0.device
    method, dt0, max_steps = options.method, options.dt0, options.max_steps
    if y0.ndim != 2 or y0.shape[1] != rhs.n_states:
        raise ValueError(f"y0 must have shape (batch, {rhs.n_states}), got {tuple(y0.shape)}")
    if not METHODS[method].adaptive and dt0 is None:
        raise ValueError(f"method {method!r} has a fixed step: pass dt0")
    if max_steps < 1:
        raise ValueError("max_steps must be >= 1")
    batch = y0.shape[0]

    def vector(value: Any) -> Tensor:
        vec = torch.as_tensor(value, dtype=real, device=device).detach()
        if vec.ndim == 0:
            return vec.expand(batch).contiguous()
        if vec.numel() != batch:
            raise ValueError(f"expected a scalar or {batch} values (one per sample), got shape {tuple(vec.shape)}")
        return vec.reshape(batch).contiguous()

    t0, t1 = vector(t_start), vector(t_end)
    if t_eval is None:
        grid = torch.stack([t0, t1], dim=1)
    else:
        grid = torch.as_tensor(t_eval, dtype=real, device=device).detach()
        grid = grid.expand(batch, grid.shape[0]) if grid.ndim == 1 else grid
        if grid.ndim != 2 or grid.shape[0] != batch:
            raise ValueError(f"t_eval must have shape (n_eval,) or (batch, n_eval), got {tuple(grid.shape)}")
        grid = grid.contiguous()
    for name in rhs.params:
        if name not in params:
            raise ValueError(f"parameter {name!r} has no value")
    p = (torch.stack([vector(params[name]) for name in rhs.params], dim=1) if rhs.params
         else torch.zeros(batch, 1, dtype=real, device=device))
    ctrl = options.pid()
    cfg = [float(options.rtol), float(options.atol), *(float(getattr(ctrl, name)) for name in CONFIG_FIELDS[2:])]
    n_eval, n_states = grid.shape[1], rhs.n_states
    return _Layout(
        y0=y0.detach().to(real).contiguous(), y0_dtype=y0.dtype, t0=t0, t1=t1, grid=grid, p=p.contiguous(),
        dt=vector(dt0 if dt0 is not None else 0.0), auto_dt0=dt0 is None,
        cfg=torch.tensor(cfg, dtype=real, device=device), max_steps=int(max_steps),
        y_out=torch.full((batch, n_eval, n_states), math.nan, dtype=real, device=device),
        istat=torch.zeros((batch, len(INT_STATS)), dtype=torch.int64, device=device),
        fstat=torch.zeros((batch, len(FLOAT_STATS)), dtype=real, device=device),
        y_final=torch.empty((batch, n_states), dtype=real, device=device),
        shared=torch.as_tensor(rhs.shared_weights(), dtype=real).to(device).contiguous(),
    )


def _solution(layout: _Layout, dtype: "torch.dtype", method: str, started: float) -> Solution:
    import torch

    from odecli.ode.solution import Solution

    stats = {name: layout.istat[:, i] for i, name in enumerate(INT_STATS) if name in STAT_NAMES}
    stats["dt0"], stats["dt_final"] = layout.fstat[:, 0].to(dtype), layout.fstat[:, 1].to(dtype)
    torch.cuda.synchronize(layout.y0.device)
    return Solution(
        t=layout.grid.to(dtype), y=layout.y_out.to(dtype), status=layout.istat[:, 0].clone(), stats=stats,
        t_final=layout.fstat[:, 2].to(dtype), y_final=layout.y_final.to(dtype),
        wall_time_s=time.perf_counter() - started, method=method, extra={"engine": "native-cuda"},
    )


_KERNELS: dict[tuple, Kernel] = {}
"""Loaded kernels by (method, right-hand side's C, sizes, device index, contract): built once per
process, and compiled by NVRTC once per machine (:func:`odecli.ode.gpu.nvrtc.compile_cubin`'s cache)."""


def _kernel(rhs: "NativeRhs | NativeMLP", method: str, device: "torch.device", contract: bool,
            single: bool = False, entry: str = nvrtc.ENTRY) -> Kernel:
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (method, rhs.c_source(), rhs.n_states, len(rhs.params), rhs.keep_size(), index, contract, single, entry)
    if key not in _KERNELS:
        where = torch.device("cuda", index)
        try:
            cubin = nvrtc.compile_cubin(cuda_source(rhs, method, single), device_arch(where),
                                        () if contract else nvrtc.CONTRACT_OFF)
            _KERNELS[key] = Kernel(cubin, entry, where)
        except (nvrtc.CompileError, nvrtc.NvrtcUnavailable, DriverError) as exc:
            raise NativeUnavailable(str(exc)) from None  # e.g. a driver older than NVRTC's cubins
    return _KERNELS[key]
