"""Gradients through the generated C solver: :func:`solve_native` when its inputs require grad.

The forward pass is the lane solver keeping a tape of each sample's accepted steps (within
:data:`TAPE_BUDGET_BYTES`); the backward pass is generated C too (:mod:`odecli.ode.native.reverse`):
each tape is swept backwards, and samples whose tape did not fit are solved again first. The
gradient is the one ``adjoint="direct"`` gives in the PyTorch loop (backpropagation through the
steps taken, step sizes held fixed), for ``y0``, every parameter and an MLP's weights, at C
speed and in bounded memory instead of an autograd graph.
"""

from __future__ import annotations

import ctypes
import functools
import time
import weakref
from typing import Any, Callable, Mapping

import numpy as np
import torch
from torch import Tensor

from odecli import native
from odecli.ode.methods import METHODS, ExplicitRK
from odecli.ode.native.engine import (
    _ARGTYPES, Job, _holding_gil, as_float64, block_ranges, prepare_job, run_blocks, solve_job, solver_flags,
)
from odecli.ode.native.mlp import NativeMLP
from odecli.ode.native.reverse import generate_reverse
from odecli.ode.native.rhs import NativeRhs, NativeUnavailable
from odecli.ode.options import SolverOptions
from odecli.ode.solution import Solution
from odecli.ode.status import Progress
from odecli.threads import default_threads


TAPE_BUDGET_BYTES = 256 * 2**20
"""Memory the forward pass may keep in tapes of accepted steps (all threads together). Taped
samples are swept at once in the backward pass; the others are solved again there first, so
memory stays bounded for any batch, at the cost of one more solve for what does not fit."""


def gradient_unsupported(rhs: NativeRhs | NativeMLP, method: str) -> str:
    """Why the generated gradient cannot take this solve ("" when it can, compiler permitting)."""
    if method not in METHODS:
        return f"method {method!r} is not an explicit Runge-Kutta method"
    try:
        _source(METHODS[method], rhs)
    except ValueError as exc:
        return str(exc)
    return ""


def solve_native_with_grad(
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
    """:func:`~odecli.ode.native.solve.solve_native` with ``y``/``y_final`` differentiable in
    ``y0`` and the tensors in ``params`` (per-sample ones get per-sample gradients, shared ones
    the batch sum). Times and ``dt0`` get no gradient, as in the PyTorch loop.
    ``solution.extra["tapes_kept"]`` counts the samples whose tape fit :data:`TAPE_BUDGET_BYTES`
    (the others are solved again in the backward pass). ``settings`` are :class:`SolverOptions`
    fields laid over ``options``."""
    options = SolverOptions.of(options, settings)
    method = options.method
    why = gradient_unsupported(rhs, method)
    if why:
        raise NativeUnavailable(why)
    started = time.perf_counter()
    lib = _load(METHODS[method], rhs)  # built now: a failure falls back before any work, not in backward()
    params = dict(params or {})
    job = prepare_job(rhs, as_float64(y0), as_float64(t_start), as_float64(t_end), as_float64(t_eval),
                      params={name: as_float64(value) for name, value in params.items()},
                      options=options.replace(dt0=as_float64(options.dt0)))
    threads = threads or default_threads()
    tapes = _Tapes(lib, job.y0.shape[0])
    budget = TAPE_BUDGET_BYTES // len(block_ranges(job.y0.shape[0], threads, progress))
    solvers = (lib.solve_taped, _holding_gil(lib._name).solve_taped)
    result = solve_job(rhs, method, job, threads, progress, started, solvers=solvers,
                       extra_args=[tapes.pointer, ctypes.c_int64(budget)])
    names = [name for name in rhs.params if isinstance(params.get(name), Tensor)]
    weights = rhs.tensors()
    backward = _Backward(lib.gradient_samples, job, tapes, threads, [rhs.params.index(n) for n in names],
                         [offset for offset, _ in weights], rhs.gradient_size())
    y, y_final = _NativeSolve.apply(backward, y0, *(params[name] for name in names),
                                    *(tensor for _, tensor in weights))
    solution = result.to_tensors()
    solution.y, solution.y_final = y, y_final
    solution.extra["tapes_kept"] = tapes.kept()  # the other samples are solved again in backward()
    solution.wall_time_s = time.perf_counter() - started
    return solution


class _Tapes:
    """One C ``Tape`` per sample: the forward pass's record of its accepted steps, which the
    backward pass sweeps (and frees) instead of solving the sample again. Whatever is still held
    is freed with this object."""

    _STATE = 4  # index of the int64 field ``state`` in the C struct (odecli.ode.native.reverse)
    _COMPLETE = 1

    def __init__(self, lib: ctypes.CDLL, batch: int):
        self.batch = batch
        self.buffer = np.zeros(batch * lib.tape_bytes(), dtype=np.uint8)
        self.pointer = ctypes.c_void_p(self.buffer.ctypes.data)
        weakref.finalize(self, _free_tapes, lib.free_tapes, self.buffer, batch)

    def kept(self) -> int:
        """Samples whose whole tape is held (after the forward pass: those that fit the budget)."""
        states = self.buffer.view(np.int64).reshape(self.batch, -1)[:, self._STATE]
        return int((states == self._COMPLETE).sum())


def _free_tapes(free: Callable, buffer: np.ndarray, batch: int) -> None:
    free(ctypes.c_void_p(buffer.ctypes.data), ctypes.c_int64(batch))


class _Backward:
    """What the backward pass needs: the generated sweep, the solve's inputs and tapes, which
    parameter columns are tensors, and where the shared weights that are tensors start."""

    def __init__(self, entry: Callable, job: Job, tapes: _Tapes, threads: int, columns: list[int],
                 offsets: list[int], gradient_size: int):
        self.entry, self.job, self.tapes, self.threads = entry, job, tapes, threads
        self.columns, self.offsets, self.gradient_size = columns, offsets, gradient_size

    def __call__(self, grad_y: np.ndarray, grad_final: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Cotangents of y0 (B, n_states), of the parameter matrix (B, n_params) and of the shared weights."""
        job = self.job.fresh_outputs()
        grad_y0, grad_p = np.zeros_like(job.y0), np.zeros_like(job.p)
        # one weight-cotangent row per block, summed in block order: the same result on every run
        grad_w = np.zeros((len(block_ranges(job.y0.shape[0], self.threads)), self.gradient_size))
        extra = [ctypes.c_void_p(x.ctypes.data) for x in (grad_y, grad_final, grad_y0, grad_p)] + [self.tapes.pointer]
        run_blocks(self.entry, job.args() + extra, job, self.threads,
                   block_args=lambda index: [ctypes.c_void_p(grad_w[index].ctypes.data)])
        return grad_y0, grad_p, grad_w.sum(axis=0)


class _NativeSolve(torch.autograd.Function):
    """Connects the C solve's outputs to ``y0`` and the parameter tensors in autograd's graph."""

    @staticmethod
    def forward(ctx: Any, backward: _Backward, y0: Tensor, *values: Tensor) -> tuple[Tensor, Tensor]:
        """``values``: the parameter tensors (backward.columns), then the weight tensors (backward.offsets)."""
        ctx.backward_pass = backward
        ctx.shapes = [(value.shape, value.dtype) for value in values]
        ctx.like = (y0.dtype, y0.device)
        dtype, device = ctx.like
        job = backward.job
        return (torch.from_numpy(job.y_out.copy()).to(dtype=dtype, device=device),
                torch.from_numpy(job.y_final.copy()).to(dtype=dtype, device=device))

    @staticmethod
    def backward(ctx: Any, grad_y: Tensor | None, grad_final: Tensor | None):
        job = ctx.backward_pass.job
        gy = np.zeros_like(job.y_out) if grad_y is None else _contiguous(grad_y)
        gf = np.zeros_like(job.y_final) if grad_final is None else _contiguous(grad_final)
        grad_y0, grad_p, grad_w = ctx.backward_pass(gy, gf)
        dtype, device = ctx.like
        grads = [torch.from_numpy(grad_y0).to(dtype=dtype, device=device)]
        columns, offsets = ctx.backward_pass.columns, ctx.backward_pass.offsets
        for column, (shape, value_dtype) in zip(columns, ctx.shapes):
            per_sample = torch.from_numpy(grad_p[:, column].copy()).to(dtype=value_dtype, device=device)
            grads.append(per_sample.reshape(shape) if per_sample.numel() == shape.numel()
                         else per_sample.sum().expand(shape))
        for offset, (shape, value_dtype) in zip(offsets, ctx.shapes[len(columns):]):
            weight = grad_w[offset:offset + shape.numel()].reshape(shape)
            grads.append(torch.from_numpy(weight.copy()).to(dtype=value_dtype, device=device))
        return (None, *grads)


def _contiguous(tensor: Tensor) -> np.ndarray:
    return np.ascontiguousarray(tensor.detach().cpu().double().numpy())


def _source(tableau: ExplicitRK, rhs: NativeRhs | NativeMLP) -> bytes:
    if isinstance(rhs, NativeRhs):
        return _equations_source(tableau, rhs)
    return generate_reverse(tableau, rhs).encode()  # string work only; no cache holding modules alive


@functools.lru_cache(maxsize=32)
def _equations_source(tableau: ExplicitRK, rhs: NativeRhs) -> bytes:
    """Cached: a fit differentiates the same equations hundreds of times."""
    return generate_reverse(tableau, rhs).encode()


def _load(tableau: ExplicitRK, rhs: NativeRhs | NativeMLP) -> ctypes.CDLL:
    """The gradient's library: ``solve_taped`` (the forward pass), ``gradient_samples`` and the tapes' helpers."""
    lib, why = native.load_source(f"ode-grad-{tableau.name}", _source(tableau, rhs), solver_flags(rhs))
    if lib is None:
        raise NativeUnavailable(why)
    for taped in (lib.solve_taped, _holding_gil(lib._name).solve_taped):
        taped.restype = ctypes.c_int
        taped.argtypes = _ARGTYPES + [ctypes.c_void_p, ctypes.c_int64]
    lib.gradient_samples.restype = ctypes.c_int
    lib.gradient_samples.argtypes = _ARGTYPES + [ctypes.c_void_p] * 6
    lib.tape_bytes.restype = ctypes.c_int64
    lib.tape_bytes.argtypes = []
    lib.free_tapes.restype = None
    lib.free_tapes.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    return lib
