"""The direct gradient on a CUDA GPU: the CPU generated solver's tapes and reverse sweep, one thread per sample.

The gradient is the one :mod:`odecli.ode.native.gradient` computes on the CPU (backpropagation
through the steps taken, step sizes held fixed, as ``adjoint="direct"`` in the PyTorch loop), from
the same generated text (:func:`odecli.ode.gpu.source.cuda_gradient_source`). What a GPU changes
is the tapes' memory: a CPU lane grows its sample's tape by ``realloc`` under a byte budget; a
GPU thread cannot, so the work goes in two passes:

1. the forward pass is the plain kernel (:func:`odecli.ode.gpu.solve.solve_gpu`): the results,
   and each sample's accepted steps, which size its tape (nothing is taped yet, so the forward
   pass holds no memory beyond its outputs while autograd waits for ``backward``);
2. the backward pass lays the tapes out back to back (``tape_start``: the accepted steps' running
   sum) and launches ``gradient_samples_cuda`` over as many samples at a time as
   :data:`TAPE_BUDGET_BYTES` of tape hold: each thread solves its sample again into its slab
   (the same arithmetic, so the same steps, checked: a slab that does not hold exactly the steps
   is an error) and sweeps it backwards into the sample's cotangents.

So a gradient costs two forward solves and one sweep, and tape memory only inside ``backward``.
Every thread writes its own rows: the per-sample parameters' and y0's cotangents, and a row of
the shared weights' cotangent (an MLP's; the CPU sweep's per-block array, one per thread here),
which torch then sums over the samples in order, as it sums a scalar parameter's per-sample rows.
No atomics: the same inputs give the same result, bit for bit, whatever the threads per block
(the chunks under the budget only regroup the sum, at round-off). The cost of a row per thread
is memory (an MLP 2-32-32-2 row is about 50 KiB, the CPU's staging of RANK pullbacks included),
which the budget counts, so a launch takes fewer samples.
"""

from __future__ import annotations

import ctypes
import math
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping

from odecli.ode.gpu import nvrtc
from odecli.ode.gpu.driver import DriverError, Kernel, device_arch
from odecli.ode.gpu.solve import THREADS_PER_BLOCK, _Layout, _layout, solve_gpu, unsupported_reason
from odecli.ode.gpu.source import GRADIENT_ENTRY, cuda_gradient_source, gradient_unsupported, single_precision_ok
from odecli.ode.methods import METHODS
from odecli.ode.native.rhs import NativeUnavailable
from odecli.ode.options import SolverOptions
from odecli.ode.status import Progress

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from odecli.ode.native.mlp import NativeMLP
    from odecli.ode.native.rhs import NativeRhs
    from odecli.ode.solution import Solution

TAPE_BUDGET_BYTES: int | None = None
"""Tape memory one backward launch may use on the device (None: :data:`TAPE_SHARE` of the memory
free at the forward pass): the samples go in as many launches as it takes. A single sample whose
tape alone passes it is refused in the forward pass (one line), so that the caller can run the
PyTorch loop instead before any gradient is asked for. Why not a fixed few GiB: a launch should
fill the GPU (an H100 holds about 270 000 threads at once), and a VdP dopri5 sample's tape is
about 180 bytes per accepted step, so 10^6 samples of a few hundred steps take tens of GiB."""
TAPE_SHARE = 0.5
FALLBACK_BUDGET = 2 * 2**30
"""The budget where the free memory cannot be asked (not a CUDA device: the tests' host build)."""


def gpu_gradient_unsupported(rhs: "NativeRhs | NativeMLP", method: str, dtype: str = "float64",
                             device: str = "cuda") -> str:
    """Why the GPU gradient cannot take this solve ("" when it can, NVRTC permitting)."""
    return unsupported_reason(method, dtype, device) or gradient_unsupported(rhs)


def solve_gpu_with_grad(
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
    """:func:`~odecli.ode.gpu.solve_gpu` with ``y``/``y_final`` differentiable in ``y0`` and the
    tensors in ``params`` (per-sample ones get per-sample gradients, scalar ones the batch sum), as
    :func:`odecli.ode.native.gradient.solve_native_with_grad` on the CPU. Times and ``dt0`` get no
    gradient. ``solution.extra`` tells what the backward pass will take: ``tape_bytes`` (the most
    tape memory of one launch) and ``tape_launches``. Raises
    :class:`~odecli.ode.native.NativeUnavailable` when this solve cannot run here.
    """
    import torch

    options = SolverOptions.of(options, settings)
    method = options.method if isinstance(options.method, str) else "?"
    why = gpu_gradient_unsupported(rhs, method, str(y0.dtype), str(y0.device))
    if why:
        raise NativeUnavailable(why)
    started = time.perf_counter()
    single = y0.dtype == torch.float32 and single_precision_ok(rhs)
    kernel = _gradient_kernel(rhs, method, y0.device, contract, single)  # built now: a failure falls back here
    params = dict(params or {})
    detached = {name: _detached(value) for name, value in params.items()}
    with torch.no_grad():  # pass 1: the results, and each sample's accepted steps (its tape's length)
        solution = solve_gpu(rhs, y0.detach(), t_start, t_end, t_eval, params=detached, options=options,
                             progress=progress, threads_per_block=threads_per_block, contract=contract)
    real = torch.float32 if single else torch.float64

    shared = torch.as_tensor(rhs.shared_weights(), dtype=real).to(y0.device)  # the weights this solve read

    def scratch() -> _Layout:  # the inputs laid out again, with outputs for the second solve to overwrite
        layout = _layout(rhs, y0.detach(), t_start, t_end, t_eval, detached, options, real)
        layout.shared = shared
        return layout

    plan = TapePlan(solution.stats["n_accepted"], rhs.n_states, METHODS[method].n_stages, rhs.keep_size(),
                    real.itemsize, _budget(y0.device), rhs.gradient_size() * real.itemsize)
    names = [name for name in rhs.params if isinstance(params.get(name), torch.Tensor)]
    weights = rhs.tensors()
    backward = _Backward(kernel, scratch, plan, threads_per_block, [rhs.params.index(n) for n in names],
                         [offset for offset, _ in weights], rhs.gradient_size(), (solution.y, solution.y_final))
    solution.y, solution.y_final = _GpuSolve.apply(backward, y0, *(params[name] for name in names),
                                                   *(tensor for _, tensor in weights))
    solution.extra["gradient"] = "native-cuda"
    # what backward() will hold and launch: tape bytes, and launches of gradient_samples_cuda
    solution.extra["tape_bytes"], solution.extra["tape_launches"] = plan.bytes(), len(plan.chunks)
    solution.wall_time_s = time.perf_counter() - started
    return solution


def _budget(device: "torch.device") -> int:
    import torch

    if TAPE_BUDGET_BYTES is not None:
        return TAPE_BUDGET_BYTES
    if device.type != "cuda":
        return FALLBACK_BUDGET
    free, _ = torch.cuda.mem_get_info(device)
    return int(free * TAPE_SHARE)


def _detached(value: Any) -> Any:
    return value.detach() if hasattr(value, "detach") else value


class TapePlan:
    """The tapes of a batch laid out back to back, and the launches that keep them within the budget.

    ``accepted`` (one count per sample, on the device) sizes each sample's tape; each sample also
    takes ``row_bytes`` for its row of the shared weights' cotangent. ``chunks`` are the (lo, hi)
    sample ranges of the backward launches, each needing at most ``budget`` bytes. Raises
    :class:`NativeUnavailable` when one sample alone passes the budget.
    """

    def __init__(self, accepted: Tensor, n_states: int, n_stages: int, n_keep: int, real_bytes: int,
                 budget: int = FALLBACK_BUDGET, row_bytes: int = 0) -> None:
        import torch

        self.step_bytes = step_bytes(real_bytes)
        self.per_step = self.step_bytes + ((n_stages + 2) * n_states + (n_stages + 1) * n_keep) * real_bytes
        self.row_bytes = row_bytes
        self.n_states, self.n_stages, self.n_keep, self.real_bytes = n_states, n_stages, n_keep, real_bytes
        counts = accepted.to(torch.int64)
        self.start = torch.zeros(counts.numel() + 1, dtype=torch.int64, device=counts.device)
        torch.cumsum(counts, 0, out=self.start[1:])
        batch = counts.numel()
        # bytes of samples [0, i): their steps and rows, non-decreasing in i
        total = self.start.cpu() * self.per_step + torch.arange(batch + 1, dtype=torch.int64) * row_bytes
        most = int(counts.max()) if batch else 0
        if most * self.per_step + row_bytes > budget:
            size = (most * self.per_step + row_bytes) / 2**20
            raise NativeUnavailable(f"one sample's tape ({most} accepted steps, {size:.0f} MiB) passes the GPU "
                                    f"gradient's budget of {budget / 2**20:.0f} MiB")
        self.chunks: list[tuple[int, int]] = []
        lo = 0
        while lo < batch:  # the most samples from lo that fit the budget
            hi = int(torch.searchsorted(total, int(total[lo]) + budget, right=True)) - 1
            hi = min(batch, max(hi, lo + 1))
            self.chunks.append((lo, hi))
            lo = hi

    def steps(self, lo: int, hi: int) -> int:
        return int(self.start[hi]) - int(self.start[lo])

    def bytes(self) -> int:
        """The most memory one launch takes: tapes and cotangent rows."""
        return max((self.steps(lo, hi) * self.per_step + (hi - lo) * self.row_bytes for lo, hi in self.chunks),
                   default=0)


def step_bytes(real_bytes: int) -> int:
    """``sizeof(Step)``: three reals (t, h, t_new) then two int64 (p0, p1), aligned to 8."""
    return -(-3 * real_bytes // 8) * 8 + 16


class _Backward:
    """The backward pass: the gradient kernel over the plan's chunks, each with its own tape arrays."""

    def __init__(self, kernel: Kernel, scratch: Callable[[], _Layout], plan: TapePlan, threads_per_block: int,
                 columns: list[int], offsets: list[int], gradient_size: int,
                 outputs: tuple[Tensor, Tensor] | None) -> None:
        self.kernel, self.scratch, self.plan = kernel, scratch, plan
        self.threads_per_block, self.columns, self.outputs = threads_per_block, columns, outputs
        self.offsets, self.gradient_size = offsets, gradient_size

    def __call__(self, grad_y: Tensor, grad_final: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Cotangents of y0 (B, n_states), of the parameter matrix (B, n_params) and of the shared
        weights (their layout, :meth:`~odecli.ode.native.NativeMLP.shared_weights`), in the build's precision.

        The weights' cotangent: each thread fills its own row, the rows are summed by torch in
        sample order, chunk after chunk: no atomics, so every run gives the same result."""
        import torch

        layout, plan = self.scratch(), self.plan
        real, device = layout.y0.dtype, layout.y0.device
        gy = grad_y.detach().to(real).contiguous()
        gfinal = grad_final.detach().to(real).contiguous()
        grad_y0, grad_p = torch.zeros_like(layout.y0), torch.zeros_like(layout.p)
        grad_w = torch.zeros(self.gradient_size, dtype=real, device=device)
        taped = torch.zeros(layout.y0.shape[0], dtype=torch.int64, device=device)
        threads = min(self.threads_per_block, self.kernel.max_threads())
        pointer = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731
        n, s, keep = plan.n_states, plan.n_stages, plan.n_keep
        for lo, hi in plan.chunks:
            count = plan.steps(lo, hi)
            steps = torch.empty(max(1, count * plan.step_bytes), dtype=torch.uint8, device=device)
            tape_y = torch.empty(max(1, count * n), dtype=real, device=device)
            tape_k = torch.empty(max(1, count * (s + 1) * n), dtype=real, device=device)
            tape_keep = torch.empty(max(1, count * (s + 1) * keep), dtype=real, device=device)
            args = [ctypes.c_int64(lo), ctypes.c_int64(hi), *layout.args(),
                    *(pointer(t) for t in (gy, gfinal, grad_y0, grad_p, plan.start)),
                    ctypes.c_int64(int(plan.start[lo])),
                    *(pointer(t) for t in (steps, tape_y, tape_k, tape_keep, taped))]
            rows = torch.zeros((hi - lo, self.gradient_size), dtype=real, device=device)
            self.kernel.launch(math.ceil((hi - lo) / threads), threads,
                               args + [pointer(rows), ctypes.c_int64(self.gradient_size)])
            grad_w += rows.sum(dim=0)
            del steps, tape_y, tape_k, tape_keep, rows  # torch's allocator frees them after the launch, in stream order
        missed = int((taped == 0).sum())
        if missed:
            raise RuntimeError(f"the GPU gradient's second solve took other steps than the forward pass in {missed} "
                               "sample(s): their tapes did not match")
        return grad_y0, grad_p, grad_w


class _GpuSolve:
    """Connects the kernel's outputs to ``y0`` and the parameter tensors in autograd's graph
    (a :class:`torch.autograd.Function`, made on first use so that importing this module imports no torch)."""

    _function: Any = None

    @classmethod
    def apply(cls, backward: _Backward, y0: Tensor, *values: Tensor) -> tuple[Tensor, Tensor]:
        if cls._function is None:
            cls._function = _make_function()
        return cls._function.apply(backward, y0, *values)


def _make_function() -> Any:
    import torch

    class GpuSolve(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, backward: _Backward, y0: Tensor, *values: Tensor) -> tuple[Tensor, Tensor]:
            """``values``: the parameter tensors (backward.columns), then the weight tensors (backward.offsets)."""
            ctx.backward_pass = backward
            ctx.shapes = [(value.shape, value.dtype) for value in values]
            ctx.like = y0.dtype
            y, y_final = backward.outputs
            ctx.output_shapes, ctx.device = (y.shape, y_final.shape), y0.device
            backward.outputs = None  # autograd holds them as this function's outputs from here on
            return y, y_final

        @staticmethod
        def backward(ctx: Any, grad_y: Tensor | None, grad_final: Tensor | None):
            zeros = lambda shape: torch.zeros(shape, dtype=ctx.like, device=ctx.device)  # noqa: E731
            gy = zeros(ctx.output_shapes[0]) if grad_y is None else grad_y
            gf = zeros(ctx.output_shapes[1]) if grad_final is None else grad_final
            grad_y0, grad_p, grad_w = ctx.backward_pass(gy, gf)
            grads = [grad_y0.to(ctx.like)]
            columns, offsets = ctx.backward_pass.columns, ctx.backward_pass.offsets
            for column, (shape, value_dtype) in zip(columns, ctx.shapes):
                per_sample = grad_p[:, column].to(value_dtype)
                grads.append(per_sample.reshape(shape) if per_sample.numel() == shape.numel()
                             else per_sample.sum().expand(shape))
            for offset, (shape, value_dtype) in zip(offsets, ctx.shapes[len(columns):]):
                grads.append(grad_w[offset:offset + shape.numel()].reshape(shape).to(value_dtype))
            return (None, *grads)

    return GpuSolve


_KERNELS: dict[tuple, Kernel] = {}
"""Loaded gradient kernels, as :data:`odecli.ode.gpu.solve._KERNELS`."""


def _gradient_kernel(rhs: "NativeRhs | NativeMLP", method: str, device: "torch.device", contract: bool,
                     single: bool) -> Kernel:
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (method, rhs.c_source(), rhs.n_states, len(rhs.params), index, contract, single)
    if key not in _KERNELS:
        where = torch.device("cuda", index)
        try:
            cubin = nvrtc.compile_cubin(cuda_gradient_source(rhs, method, single), device_arch(where),
                                        () if contract else nvrtc.CONTRACT_OFF, name="odecli_gradient.cu")
            _KERNELS[key] = Kernel(cubin, GRADIENT_ENTRY, where)
        except (nvrtc.CompileError, nvrtc.NvrtcUnavailable, DriverError, ValueError) as exc:
            raise NativeUnavailable(str(exc)) from None
    return _KERNELS[key]
