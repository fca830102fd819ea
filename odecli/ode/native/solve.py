"""The generated C solver's entry points: numpy arrays in and out, or tensors in and out.

:func:`solve_native_arrays` is the path ``odecli solve`` of an equations spec takes, without
importing torch; :func:`solve_native` takes and returns tensors, equal to the batched PyTorch
loop's result to round-off with the same per-sample steps, and hands solves whose inputs require
grad to :mod:`odecli.ode.native.gradient`. The machinery both use (laying out a batch, building
and running the library over threads) is :mod:`odecli.ode.native.engine`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

from odecli.ode.native.engine import as_float64, prepare_job, solve_job, unsupported_reason
from odecli.ode.native.rhs import NativeRhs, NativeUnavailable
from odecli.ode.options import SolverOptions
from odecli.ode.solution import ArraySolution
from odecli.ode.status import Progress

if TYPE_CHECKING:
    from torch import Tensor

    from odecli.ode.native.mlp import NativeMLP
    from odecli.ode.solution import Solution


def solve_native_arrays(
    rhs: NativeRhs | NativeMLP,
    y0: np.ndarray,
    t_start: np.ndarray | float,
    t_end: np.ndarray | float,
    t_eval: np.ndarray | None = None,
    *,
    params: Mapping[str, np.ndarray | float] | None = None,
    options: SolverOptions | None = None,
    threads: int | None = None,
    progress: Callable[[Progress], None] | None = None,
    **settings: Any,
) -> ArraySolution:
    """:func:`odecli.ode.solver.solve` for an expression right-hand side, as compiled C on numpy arrays.

    Same arguments as ``solve`` (arrays in float64 where it takes tensors; ``settings`` are
    :class:`SolverOptions` fields laid over ``options``); ``threads`` defaults to
    :func:`~odecli.threads.default_threads`. Raises :class:`NativeUnavailable` when the solver
    cannot be generated or built here; callers fall back to ``solve``.
    """
    started = time.perf_counter()
    options = SolverOptions.of(options, settings)
    job = prepare_job(rhs, y0, t_start, t_end, t_eval, params=params, options=options)
    if getattr(rhs, "events", ()):
        from odecli.ode.native.events import solve_job_with_events

        return solve_job_with_events(rhs, options.method, job, threads, progress, started)
    return solve_job(rhs, options.method, job, threads, progress, started)


def solve_native(
    rhs: NativeRhs | NativeMLP,
    y0: Tensor,
    t_start: Tensor | float,
    t_end: Tensor | float,
    t_eval: Tensor | None = None,
    *,
    params: Mapping[str, Tensor | float] | None = None,
    options: SolverOptions | None = None,
    threads: int | None = None,
    progress: Callable[[Progress], None] | None = None,
    **settings: Any,
) -> Solution:
    """:func:`solve_native_arrays` with tensors in and a :class:`~odecli.ode.solution.Solution` out.

    Same arguments and result as :func:`odecli.ode.solver.solve`. CUDA tensors are solved by the
    same solver built for the GPU (:func:`odecli.ode.gpu.solve_gpu`, and
    :func:`~odecli.ode.gpu.solve_gpu_with_grad` when a gradient is recorded).
    When autograd records and
    ``y0``, a tensor in ``params`` or an MLP weight requires grad, ``y`` and ``y_final`` are
    differentiable (:mod:`odecli.ode.native.gradient`: the gradient of ``adjoint="direct"``, in
    generated C).
    """
    options = SolverOptions.of(options, settings)
    if y0.device.type == "cuda":  # the same solver (and gradient) as GPU kernels
        from odecli.ode.gpu import solve_gpu, solve_gpu_with_grad

        solver = solve_gpu_with_grad if _records_gradient(rhs, y0, params) else solve_gpu
        return solver(rhs, y0, t_start, t_end, t_eval, params=params, options=options, progress=progress)
    why = unsupported_reason(options.method, y0.dtype, y0.device)
    if why:
        raise NativeUnavailable(why)
    if _records_gradient(rhs, y0, params):
        from odecli.ode.native.gradient import solve_native_with_grad

        return solve_native_with_grad(rhs, y0, t_start, t_end, t_eval, params=params, options=options,
                                      threads=threads, progress=progress)
    started = time.perf_counter()
    result = solve_native_arrays(
        rhs, as_float64(y0), as_float64(t_start), as_float64(t_end), as_float64(t_eval),
        params={name: as_float64(value) for name, value in (params or {}).items()},
        options=options.replace(dt0=as_float64(options.dt0)), threads=threads, progress=progress,
    )
    result.wall_time_s = time.perf_counter() - started
    return result.to_tensors()


def _records_gradient(rhs: NativeRhs | NativeMLP, y0: Tensor, params: Mapping[str, Any] | None) -> bool:
    import torch

    tensors = [y0, *(v for v in (params or {}).values() if isinstance(v, torch.Tensor)),
               *(tensor for _, tensor in rhs.tensors())]
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
