"""The generated ODE solver on CUDA GPUs: the CPU solver's text compiled with NVRTC, one thread per sample.

:mod:`.source` generates the CUDA source (the CPU's ``solver_template.c`` with one lane, in
float64 or float32), :mod:`.nvrtc` compiles it (no GPU needed), :mod:`.driver` loads and
launches it in torch's context, :mod:`.solve` lays out a batch and returns a
:class:`~odecli.ode.solution.Solution`, :mod:`.events` records events as the CPU engine does.

The direct gradient (:mod:`.gradient`, ``solve_gpu_with_grad``): the CPU gradient's own text
(tapes of accepted steps, the right-hand side's pullback, the reverse sweep), in two passes since
a GPU thread cannot grow its tape as a CPU lane does: the forward kernel counts each sample's
accepted steps, then the backward kernel solves each sample again into a slab of tape of that
size and sweeps it, as many samples per launch as a byte budget holds. Every explicit method;
expression right-hand sides in float64 and float32, an MLP's (y0 and its weights: each thread's
row of the weights' cotangent, summed in sample order) in float64; not events (event times are
not differentiated on the CPU either): those gradients run on the PyTorch loop.

What has been measured on a GPU: see docs/performance.md (the gradient kernel has been compiled
by NVRTC and run on the host through tests/gpu_host.py, equal to the CPU's gradient bit for bit,
but not yet run on a GPU). Importing this package imports no torch.
"""

from odecli.ode.gpu.gradient import solve_gpu_with_grad
from odecli.ode.gpu.solve import solve_gpu, unsupported_reason

__all__ = ["solve_gpu", "solve_gpu_with_grad", "unsupported_reason"]
