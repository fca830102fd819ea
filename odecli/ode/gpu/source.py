"""The CUDA source of one solve: the CPU solver's own text, generated for one thread per sample.

One source of truth: :func:`odecli.ode.native.codegen.generate` writes the same
``solver_template.c`` + generated header as for the CPU, with one lane (``W = 1``): every lane
loop of the CPU solver becomes one thread's own arithmetic, and the lane refill (a lane taking
the next sample) becomes the GPU's scheduling of threads. ``solver_template.c`` reads
``__CUDACC_RTC__`` (NVRTC defines it) for the few things C and CUDA spell differently, and adds
the ``__global__`` entry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from odecli.ode.methods import METHODS
from odecli.ode.native.codegen import generate

if TYPE_CHECKING:
    from odecli.ode.native.mlp import NativeMLP
    from odecli.ode.native.rhs import NativeRhs


def cuda_source(rhs: "NativeRhs | NativeMLP", method: str) -> str:
    """The generated solver of ``method`` fused with ``rhs``, one sample per GPU thread."""
    return generate(METHODS[method], rhs.c_source(), rhs.n_states, len(rhs.params), lanes=1,
                    n_keep=rhs.keep_size())
