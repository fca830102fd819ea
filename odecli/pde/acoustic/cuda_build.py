"""The acoustic step as a CUDA kernel, and the same kernel built for the host.

Why CUDA C through NVRTC (and not Triton): the per-point update is written once, in
``cuda_point.h``, and two builds include it.  NVRTC compiles it into the ``__global__`` kernel
(:func:`cuda_source`; compiling needs no GPU, so CI compiles the real kernel in both precisions),
and the system C compiler into a host library whose ``acoustic_step_launch`` calls the same
function once per (thread block, thread) in a loop (:func:`host_source`).  So the CUDA kernel's
arithmetic, its tiling, its source and receiver tables and the time loop that drives it
(:mod:`odecli.pde.acoustic.cuda_loop`) run on CPU tensors here, against the PyTorch reference and
its autograd, with no GPU and no extra test dependency (Triton's interpreter would add one, and
runs a stencil far slower than a C loop).  NVRTC and the driver calls are the ODE solver's
(:mod:`odecli.ode.gpu.nvrtc`, :mod:`odecli.ode.gpu.driver`), imported, not copied.

Both builds turn contraction into fused multiply-adds off (``--fmad=false``, ``-ffp-contract=off``)
and keep subnormals (no ``--ftz``), so a step equals the PyTorch reference's bit for bit on
either.  A launch makes one step for every shot, with the sources added and the receivers read
in the same launch (``cuda_point.h``): one launch per time step, whose arguments are built once
per propagation and only re-pointed per step (:class:`StepCall`).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from odecli import native

HERE = Path(__file__).resolve().parent
TILE_X, TILE_Y = 32, 8  # as cuda_point.h: a thread block is a tile of 32 x 8 block points
THREADS = TILE_X * TILE_Y
ENTRY = "acoustic_step"
REALS = {torch.float32: "float", torch.float64: "double"}

# The kernel's parameters after (block, thread), in order: (C type, name); one list for the CUDA
# entry, the host launcher and the ctypes arguments.
PARAMS: tuple[tuple[str, str], ...] = (
    ("odecli_i64", "B"), ("odecli_i64", "ny"), ("odecli_i64", "nx"), ("odecli_i64", "tiles_x"),
    ("const REAL *", "u"), ("const REAL *", "u_prev"), ("REAL *", "out"),
    ("const REAL *", "c2dt2"), ("const REAL *", "sponge"), ("const odecli_i64 *", "span"),
    ("double", "iy2"), ("double", "ix2"),
    ("REAL *", "lap_out"), ("const REAL *", "lap_in"), ("REAL *", "grad"),
    ("const odecli_i64 *", "src_ptr"), ("const odecli_i64 *", "src_at"),
    ("const odecli_i64 *", "src_idx"), ("const REAL *", "src_val"),
    ("const odecli_i64 *", "rec_ptr"), ("const odecli_i64 *", "rec_at"),
    ("const odecli_i64 *", "rec_slot"), ("REAL *", "traces"),
)


def _ctype(c_type: str):
    if c_type.endswith("*"):
        return ctypes.c_void_p
    return ctypes.c_double if c_type == "double" else ctypes.c_longlong


def _signature() -> str:
    return ", ".join(f"{t} {n}" for t, n in PARAMS)


def _arguments() -> str:
    return ", ".join(n for _, n in PARAMS)


def _point_text(dtype: torch.dtype, device_qualifier: str) -> str:
    return (f"#define REAL {REALS[dtype]}\n#define DEVICE {device_qualifier}\n"
            + (HERE / "cuda_point.h").read_text())


def cuda_source(dtype: torch.dtype) -> str:
    """The CUDA text NVRTC compiles: the point update and a ``__global__`` entry around it."""
    return (_point_text(dtype, "__device__ __forceinline__")
            + f'\nextern "C" __global__ void {ENTRY}({_signature()})\n'
            + f"{{\n    acoustic_thread(blockIdx.x, threadIdx.x, {_arguments()});\n}}\n")


def host_source(dtype: torch.dtype) -> str:
    """The same point update as C for the host: ``acoustic_step_launch(blocks, threads, ...)``
    runs every (block, thread) of a launch in order."""
    return (_point_text(dtype, "static inline")
            + f"\nvoid {ENTRY}_launch(odecli_i64 blocks, odecli_i64 threads, {_signature()})\n"
            + "{\n    for (odecli_i64 b = 0; b < blocks; ++b)\n"
            + "        for (odecli_i64 t = 0; t < threads; ++t)\n"
            + f"            acoustic_thread(b, t, {_arguments()});\n}}\n")


NVRTC_OPTIONS = ("--fmad=false",)  # every operation rounds as written, as the reference's


def compile_cubin(dtype: torch.dtype, arch: str) -> bytes:
    """The kernel's cubin for ``arch`` (``"sm_90"``), cached on disk by NVRTC's module; raises
    :class:`odecli.ode.gpu.nvrtc.NvrtcUnavailable` or ``CompileError``."""
    from odecli.ode.gpu import nvrtc

    return nvrtc.compile_cubin(cuda_source(dtype), arch, NVRTC_OPTIONS, "acoustic_step.cu")


class StepCall:
    """The arguments of one launch as ctypes objects made once: per step the time loop
    re-points a few of them (``set``) and launches, so a step costs one driver call and no
    argument building.  ``blocks`` covers the block ``ny x nx`` with tiles."""

    def __init__(self, **values) -> None:
        self.args = [_ctype(t)() for t, _ in PARAMS]
        self._slot = {name: arg for (_, name), arg in zip(PARAMS, self.args)}
        self._tensors: dict = {}  # the tensors pointed to, kept alive while they are
        self.set(**values)
        tiles_y = -(-int(self._slot["ny"].value) // TILE_Y)
        self.blocks = tiles_y * int(self._slot["tiles_x"].value)

    def set(self, **values) -> None:
        """Set arguments by name: tensors by address (kept referenced until re-pointed),
        None as NULL, numbers (and raw addresses into kept tensors) as they are."""
        for name, value in values.items():
            if isinstance(value, torch.Tensor):
                self._tensors[name] = value
                value = value.data_ptr()
            self._slot[name].value = value


def tiles_x(nx: int) -> int:
    return -(-nx // TILE_X)


class HostLauncher:
    """The kernel built for the host: launches run on the CPU, synchronously, on CPU tensors."""

    device_type = "cpu"

    def __init__(self, dtype: torch.dtype) -> None:
        lib, why = native.load_source(f"acoustic_cuda_host_{REALS[dtype]}",
                                      host_source(dtype).encode())
        if lib is None:
            raise RuntimeError(f"the acoustic CUDA kernel's host build failed: {why}")
        self._launch = getattr(lib, f"{ENTRY}_launch")
        self._launch.restype = None

    def launch(self, call: StepCall) -> None:
        self._launch(ctypes.c_longlong(call.blocks), ctypes.c_longlong(THREADS), *call.args)


@functools.cache
def host_launcher(dtype: torch.dtype) -> HostLauncher:
    return HostLauncher(dtype)


class CudaLauncher:
    """The NVRTC-built kernel on one GPU, launched on torch's current stream of that device."""

    device_type = "cuda"

    def __init__(self, dtype: torch.dtype, device: torch.device) -> None:
        from odecli.ode.gpu import driver

        self.kernel = driver.Kernel(compile_cubin(dtype, driver.device_arch(device)), ENTRY, device)
        self.device = device
        self._cu_launch = driver._libcuda().cuLaunchKernel
        self._check = driver._check

    def launch(self, call: StepCall) -> None:
        pointers = getattr(call, "_pointers", None)
        if pointers is None:  # made once per StepCall: its arguments live as long as it does
            pointers = (ctypes.c_void_p * len(call.args))(*(ctypes.addressof(a) for a in call.args))
            call._pointers = pointers
            call._stream = ctypes.c_void_p(torch.cuda.current_stream(self.device).cuda_stream)
        self._check(self._cu_launch(self.kernel._function, ctypes.c_uint(call.blocks), 1, 1,
                                    ctypes.c_uint(THREADS), 1, 1, 0, call._stream, pointers, None),
                    "cuLaunchKernel")


_CUDA: dict = {}


def cuda_launcher(like: torch.Tensor) -> tuple[CudaLauncher | None, str]:
    """The compiled kernel for tensors like ``like`` on their GPU, or ``(None, why not)``: a CPU
    tensor, a dtype without a build, no NVRTC, or a compile or load failure (cached per
    device and dtype, failures included, so the reason is given once and not re-tried)."""
    if like.device.type != "cuda":
        return None, f"the acoustic CUDA kernels need CUDA tensors (got {like.device})"
    if like.dtype not in REALS:
        return None, f"no acoustic CUDA kernel for {like.dtype}"
    key = (like.device, like.dtype)
    if key not in _CUDA:
        try:
            _CUDA[key] = (CudaLauncher(like.dtype, like.device), "")
        except Exception as exc:  # noqa: BLE001 - any failure means: use the reference, say why
            _CUDA[key] = (None, f"the acoustic CUDA kernel could not be built or loaded: {exc}")
    return _CUDA[key]
