"""The CUDA source of one solve: the CPU solver's own text, generated for one thread per sample.

One source of truth: :func:`odecli.ode.native.codegen.generate` writes the same
``solver_template.c`` + generated header as for the CPU, with one lane (``W = 1``): every lane
loop of the CPU solver becomes one thread's own arithmetic, and the lane refill (a lane taking
the next sample) becomes the GPU's scheduling of threads. ``solver_template.c`` reads
``__CUDACC_RTC__`` (NVRTC defines it) for the few things C and CUDA spell differently, and adds
the ``__global__`` entry.

float32: the same text again, with ``ODECLI_FLOAT`` defined (the template then reads ``double``
as ``float``) and every floating literal suffixed with ``f``, so that no operation is promoted
to double: a float32 solve computes as the PyTorch loop does in float32, at the GPU's float32
rate. Expression right-hand sides only (:func:`single_precision_ok`): the MLP's activations
work on the bits of doubles.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from odecli.ode.methods import METHODS
from odecli.ode.native.codegen import generate
from odecli.ode.native.rhs import NativeRhs

if TYPE_CHECKING:
    from odecli.ode.native.mlp import NativeMLP

_FLOATING_LITERAL = re.compile(r"(?<![\w.])(\d+\.\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)(?![\w.])")


def single_precision_ok(rhs: "NativeRhs | NativeMLP") -> bool:
    """Whether ``rhs`` has a float32 build (expressions do; the MLP's C is double only)."""
    return isinstance(rhs, NativeRhs)


def cuda_source(rhs: "NativeRhs | NativeMLP", method: str, single: bool = False) -> str:
    """The generated solver of ``method`` fused with ``rhs``, one sample per GPU thread, in
    float64 or (``single``) float32."""
    source = generate(METHODS[method], rhs.c_source(), rhs.n_states, len(rhs.params), lanes=1,
                      n_keep=rhs.keep_size())
    if not single:
        return source
    if not single_precision_ok(rhs):
        raise ValueError("this right-hand side has no float32 build")
    return "#define ODECLI_FLOAT 1\n" + _FLOATING_LITERAL.sub(r"\1f", source)
