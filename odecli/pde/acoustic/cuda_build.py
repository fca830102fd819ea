"""The acoustic step as a CUDA kernel, and the same kernel built for the host.

Why CUDA C through NVRTC (and not Triton): the per-point update is written once, in
``cuda_point.h``, and two builds include it.  NVRTC compiles it into the ``__global__`` kernel
(:func:`cuda_source`; compiling needs no GPU, so CI compiles the real kernel in both precisions),
and the system C compiler into a host library whose ``acoustic_cu_launch``, a stand-in for the
driver's ``cuLaunchKernel``, calls the same function once per (thread block, thread) in a loop
(:func:`host_source`).  So the CUDA kernel's
arithmetic, its tiling, its source and receiver tables and the time loop that drives it
(:mod:`odecli.pde.acoustic.cuda_loop`) run on CPU tensors here, against the PyTorch reference and
its autograd, with no GPU and no extra test dependency (Triton's interpreter would add one, and
runs a stencil far slower than a C loop).  NVRTC and the driver calls are the ODE solver's
(:mod:`odecli.ode.gpu.nvrtc`, :mod:`odecli.ode.gpu.driver`), imported, not copied.

Both builds turn contraction into fused multiply-adds off (``--fmad=false``, ``-ffp-contract=off``)
and keep subnormals (no ``--ftz``), so a step equals the PyTorch reference's bit for bit on
either.  A launch makes one step for every shot, with the sources added and the receivers read
in the same launch (``cuda_point.h``): one launch per time step, whose arguments are built once
per propagation and re-pointed per step by a time loop in C (``cuda_steps.c``), the same loop
for the driver's launches and the host build's.
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
    """The same point update as C for the host, behind ``acoustic_cu_launch``: cuLaunchKernel's
    signature, running every (block, thread) of a launch in order on arguments passed as the
    driver takes them (``params[i]`` points to argument i)."""
    unpacked = ", ".join(f"*({t} *)params[{i}]" for i, (t, _) in enumerate(PARAMS))
    return (_point_text(dtype, "static inline")
            + "\nint acoustic_cu_launch(void *function, unsigned gx, unsigned gy, unsigned gz,\n"
            + "                       unsigned bx, unsigned by, unsigned bz, unsigned shared,\n"
            + "                       void *stream, void **params, void **extra)\n{\n"
            + "    for (odecli_i64 b = 0; b < (odecli_i64)gx; ++b)\n"
            + "        for (odecli_i64 t = 0; t < (odecli_i64)bx; ++t)\n"
            + f"            acoustic_thread(b, t, {unpacked});\n    return 0;\n}}\n")


NVRTC_OPTIONS = ("--fmad=false",)  # every operation rounds as written, as the reference's


def compile_cubin(dtype: torch.dtype, arch: str) -> bytes:
    """The kernel's cubin for ``arch`` (``"sm_90"``), cached on disk by NVRTC's module; raises
    :class:`odecli.ode.gpu.nvrtc.NvrtcUnavailable` or ``CompileError``."""
    from odecli.ode.gpu import nvrtc

    return nvrtc.compile_cubin(cuda_source(dtype), arch, NVRTC_OPTIONS, "acoustic_step.cu")


class StepCall:
    """The arguments of one launch as ctypes objects made once, and the array of their
    addresses the launch reads: per step the time loop re-points a few of them (:meth:`set`, or
    in C, ``cuda_steps.c``) and launches, so a step costs no argument building.  ``blocks``
    covers the block ``ny x nx`` with tiles."""

    def __init__(self, **values) -> None:
        self.args = [_ctype(t)() for t, _ in PARAMS]
        self._slot = {name: arg for (_, name), arg in zip(PARAMS, self.args)}
        self.index = {name: i for i, (_, name) in enumerate(PARAMS)}
        self.pointers = (ctypes.c_void_p * len(self.args))(*(ctypes.addressof(a) for a in self.args))
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


_LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint,
                           ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                           ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


@functools.cache
def _steps_library() -> ctypes.CDLL:
    lib, why = native.load_source("acoustic_cuda_steps", (HERE / "cuda_steps.c").read_bytes())
    if lib is None:
        raise RuntimeError(f"the acoustic CUDA time loop (cuda_steps.c) did not build: {why}")
    lib.acoustic_run_steps.restype = ctypes.c_int
    return lib


class Launcher:
    """Launches of the kernel through a function with cuLaunchKernel's signature, one at a time
    (:meth:`launch`) or as a run of leapfrog steps in C (:meth:`run`)."""

    device_type = "cpu"

    def __init__(self, launch_address: int, function: ctypes.c_void_p) -> None:
        self._address = ctypes.c_void_p(launch_address)
        self._launch = _LAUNCH(launch_address)
        self._function = function
        self._run = _steps_library().acoustic_run_steps

    def stream(self) -> ctypes.c_void_p:
        return ctypes.c_void_p(None)

    def check(self, result: int, what: str) -> None:
        if result != 0:
            raise RuntimeError(f"{what} failed ({result})")

    def launch(self, call: StepCall) -> None:
        """One launch with the arguments as set."""
        self.check(self._launch(self._function, call.blocks, 1, 1, THREADS, 1, 1, 0, self.stream(),
                                ctypes.cast(call.pointers, ctypes.c_void_p), None), "acoustic step launch")

    def run(self, call: StepCall, steps: int, first: torch.Tensor, second: torch.Tensor,
            moving: list[tuple[str, int, int]]) -> None:
        """``steps`` leapfrog steps, ``second`` the first step's u and ``first`` its u_prev and
        output, the two swapping roles each step; each ``(name, address, stride)`` of ``moving``
        points argument ``name`` at ``address + m * stride`` bytes in step m (NULL for 0)."""
        n = len(moving)
        slots = (ctypes.c_longlong * n)(*(call.index[name] for name, _, _ in moving))
        bases = (ctypes.c_void_p * n)(*(address or None for _, address, _ in moving))
        strides = (ctypes.c_longlong * n)(*(stride for _, _, stride in moving))
        self.check(self._run(self._address, self._function, ctypes.c_uint(call.blocks),
                             ctypes.c_uint(THREADS), self.stream(), call.pointers,
                             ctypes.c_longlong(steps), ctypes.c_void_p(first.data_ptr()),
                             ctypes.c_void_p(second.data_ptr()),
                             *(ctypes.c_longlong(call.index[k]) for k in ("u", "u_prev", "out")),
                             ctypes.c_longlong(n), slots, bases, strides), "acoustic time loop")


class HostLauncher(Launcher):
    """The kernel built for the host: launches run on the CPU, synchronously, on CPU tensors."""

    def __init__(self, dtype: torch.dtype) -> None:
        lib, why = native.load_source(f"acoustic_cuda_host_{REALS[dtype]}",
                                      host_source(dtype).encode())
        if lib is None:
            raise RuntimeError(f"the acoustic CUDA kernel's host build failed: {why}")
        self._lib = lib
        super().__init__(ctypes.cast(lib.acoustic_cu_launch, ctypes.c_void_p).value,
                         ctypes.c_void_p(None))


@functools.cache
def host_launcher(dtype: torch.dtype) -> HostLauncher:
    return HostLauncher(dtype)


class CudaLauncher(Launcher):
    """The NVRTC-built kernel on one GPU, launched by the driver on torch's current stream."""

    device_type = "cuda"

    def __init__(self, dtype: torch.dtype, device: torch.device) -> None:
        from odecli.ode.gpu import driver

        self.kernel = driver.Kernel(compile_cubin(dtype, driver.device_arch(device)), ENTRY, device)
        self.device = device
        self._driver = driver
        super().__init__(ctypes.cast(driver._libcuda().cuLaunchKernel, ctypes.c_void_p).value,
                         self.kernel._function)

    def stream(self) -> ctypes.c_void_p:
        return ctypes.c_void_p(torch.cuda.current_stream(self.device).cuda_stream)

    def check(self, result: int, what: str) -> None:
        self._driver._check(result, what)


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
