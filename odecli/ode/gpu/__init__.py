"""The generated ODE solver on CUDA GPUs: the CPU solver's text compiled with NVRTC, one thread per sample.

:mod:`.source` generates the CUDA source (the CPU's ``solver_template.c`` with one lane),
:mod:`.nvrtc` compiles it (no GPU needed), :mod:`.driver` loads and launches it in torch's
context, :mod:`.solve` lays out a batch and returns a :class:`~odecli.ode.solution.Solution`.
Importing this package imports no torch.
"""

from odecli.ode.gpu.solve import solve_gpu, unsupported_reason

__all__ = ["solve_gpu", "unsupported_reason"]
