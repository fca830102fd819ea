"""The generated ODE solver on CUDA GPUs: the CPU solver's text compiled with NVRTC, one thread per sample.

:mod:`.source` generates the CUDA source (the CPU's ``solver_template.c`` with one lane, in
float64 or float32), :mod:`.nvrtc` compiles it (no GPU needed), :mod:`.driver` loads and
launches it in torch's context, :mod:`.solve` lays out a batch and returns a
:class:`~odecli.ode.solution.Solution`, :mod:`.events` records events as the CPU engine does.

Not yet: the direct gradient (the CPU's tapes grow by realloc per sample under a byte budget;
a GPU needs a two-pass design, steps counted then tapes allocated, and block-wise weight
cotangent sums), so solves that record a gradient run on the PyTorch loop.
Importing this package imports no torch.
"""

from odecli.ode.gpu.solve import solve_gpu, unsupported_reason

__all__ = ["solve_gpu", "unsupported_reason"]
