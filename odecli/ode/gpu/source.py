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

The gradient (:func:`cuda_gradient_source`): the CPU gradient's own text too
(:func:`odecli.ode.native.reverse.taped_solver_source`: the solver with the tapes' recorder, the
right-hand side's pullback and the reverse ``sweep``), with a GPU thread's tape memory and one
more ``__global__`` entry, ``gradient_samples_cuda``: each thread solves its sample again into a
slab of tape sized by the forward pass's accepted steps, then sweeps it backwards.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from odecli.ode.methods import METHODS
from odecli.ode.native.codegen import generate
from odecli.ode.native.reverse import taped_solver_source
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
    return _in_precision(source, rhs, single)


def _in_precision(source: str, rhs: "NativeRhs | NativeMLP", single: bool) -> str:
    if not single:
        return source
    if not single_precision_ok(rhs):
        raise ValueError("this right-hand side has no float32 build")
    return "#define ODECLI_FLOAT 1\n" + _FLOATING_LITERAL.sub(r"\1f", source)


GRADIENT_ENTRY = "gradient_samples_cuda"
"""The ``__global__`` function of :func:`cuda_gradient_source`."""

_TAPE_MEMORY = """\
/* A GPU thread's tape: one sample's, a slab of the tape arrays that the launch sized from the
 * forward pass's accepted steps (odecli.ode.gpu.gradient), so it never grows; freeing it only
 * empties it. */
#define TAPE_OF(rec, i) ((rec)->of)
static void tape_free(Recorder *restrict rec, Tape *restrict tape)
{
    (void)rec;
    tape->n = tape->written_at_start = tape->status = tape->state = tape->bytes = 0;
}
static int tape_grow(Recorder *restrict rec, Tape *restrict tape) { (void)rec; (void)tape; return 0; }
"""

_GRADIENT_ENTRY = """
/* The gradient of samples [i0, i1), one thread each: solve_samples_cuda's arguments (its outputs
 * are scratch: the forward pass wrote the results), the cotangents of the outputs gy
 * (B x n_eval x N) and gfinal (B x N), and the tape arrays: sample i's steps start at
 * tape_start[i] - base and it has tape_start[i + 1] - tape_start[i] of them, its accepted steps
 * in the forward pass. The thread solves its sample again into that slab (the same steps: the
 * same arithmetic), sweeps it into gy0 (B x N), gp (B x n_params) and its own row of wbar
 * ((i1 - i0) x wbar_size, zeroed: the shared weights' cotangent, an MLP's, as the CPU sweep's
 * per-block array), and writes into taped[i] whether the slab held exactly the steps (0: the
 * solve took other steps; nothing swept). */
extern "C" __global__ void gradient_samples_cuda(int64_t i0, int64_t i1, int64_t n_eval, int64_t n_params,
                                                 const double *y0, const double *t0, const double *t1,
                                                 const double *grid, const double *params, const double *dt0,
                                                 int64_t auto_dt0, const double *cfg, int64_t max_steps,
                                                 double *yout, int64_t *istat, double *fstat, double *yfinal,
                                                 const double *shared, const double *gy, const double *gfinal,
                                                 double *gy0, double *gp, const int64_t *tape_start, int64_t base,
                                                 Step *steps, double *tape_y, double *tape_k, double *tape_keep,
                                                 int64_t *taped, double *wbar, int64_t wbar_size)
{
    const int64_t i = i0 + (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= i1) return;
    const Job job = make_job(n_eval, n_params, y0, t0, t1, grid, params, dt0, auto_dt0, cfg, max_steps, yout,
                             istat, fstat, yfinal, shared);
    const int64_t at = tape_start[i] - base;
    Tape tape;
    memset(&tape, 0, sizeof tape);
    tape.cap = tape_start[i + 1] - tape_start[i];
    tape.steps = steps + at;
    tape.y = tape_y + at * N;
    tape.k = tape_k + at * (S + 1) * N;
    tape.keep = tape_keep + at * (S + 1) * TAPE_KEEP;
    Recorder rec;
    rec.of = &tape; rec.budget = rec.used = 0;
    solve_range(&job, i, 1, NULL, &rec);
    taped[i] = tape.state == TAPE_COMPLETE && tape.n == tape.cap;
    if (!taped[i]) return;
    double *own_wbar = wbar + (i - i0) * wbar_size;  /* this thread's row: rows are summed in order afterwards */
    sweep(&job, i, &tape, gy + i * n_eval * N, gfinal + i * N, gy0 + i * N, gp + i * n_params, own_wbar);
    rhs_pullback_flush(own_wbar);
}
"""


def cuda_gradient_source(rhs: "NativeRhs | NativeMLP", method: str, single: bool = False) -> str:
    """The taped solver, ``sweep`` and ``gradient_samples_cuda`` of ``method`` and ``rhs``, one
    sample per GPU thread, in float64 or (``single``, expressions only) float32."""
    why = gradient_unsupported(rhs)
    if why:
        raise ValueError(why)
    source = taped_solver_source(METHODS[method], rhs, 1, _TAPE_MEMORY, "#ifdef __CUDACC_RTC__\n" + _GRADIENT_ENTRY
                                 + "#endif\n")
    return _in_precision(source, rhs, single)


def gradient_unsupported(rhs: "NativeRhs | NativeMLP") -> str:
    """Why the GPU gradient cannot take ``rhs`` ("" when it can): events (the generated gradient
    does not differentiate event times, on the CPU either)."""
    if getattr(rhs, "events", ()):
        return "the generated gradient does not differentiate event times"
    return ""
