"""The elastic half steps and their adjoint as CUDA kernels, and the same kernels built for the
host.

As the acoustic kernels (:mod:`odecli.pde.acoustic.cuda_build`, whose reasons hold here): the
per-point code is written once, in ``cuda_point.h``, and two builds include it.  NVRTC compiles
it into ``__global__`` kernels (:func:`cuda_source`; compiling needs no GPU, so CI compiles the
real kernels in both precisions), the system C compiler into a host library whose
``<entry>_launch`` functions, stand-ins for the driver's ``cuLaunchKernel``, run every
(block, thread) of a launch in a loop (:func:`host_source`).  So the kernels' arithmetic and
tiling run on CPU tensors in the tests, against the PyTorch reference and its autograd.  Both
builds keep every operation rounded on its own (``--fmad=false``, ``-ffp-contract=off``).

One kernel per half step (and per adjoint pass): the free-surface image runs as small kernels
between them, and on several ranks the halo exchange as a host step (:class:`Between`) in the
same list of launches (:mod:`odecli.pde.elastic.cuda_loop`).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from odecli import native
from odecli.pde.cuda_driver import LAUNCH, DriverLaunches

HERE = Path(__file__).resolve().parent
TILE_X, TILE_Y = 32, 8  # as cuda_point.h: a thread block is a tile of 32 x 8 points
THREADS = TILE_X * TILE_Y
REALS = {torch.float32: "float", torch.float64: "double"}

_GRID = (("odecli_i64", "B"), ("odecli_i64", "ny"), ("odecli_i64", "nx"), ("odecli_i64", "tiles_x"))
_PML = tuple(("const REAL *", n) for n in ("ayi", "byi", "ayh", "byh", "axi", "bxi", "axh", "bxh"))
_STEP = (("REAL", "dt"), ("REAL", "idy"), ("REAL", "idx"))
# the free-surface image's rows (r<channel><ghost row>) and signs per channel
_IMAGE = (*(("odecli_i64", f"r{c}{g}") for c in range(3) for g in range(2)),
          *(("REAL", f"s{c}") for c in range(3)))


def _ptrs(text: str, const: bool = False) -> tuple[tuple[str, str], ...]:
    return tuple(("const REAL *" if const else "REAL *", n) for n in text.split())


# Each kernel's parameters after (block, thread), in order: (C type, name); one table for the
# CUDA entries, the host launchers and the ctypes arguments.  The key is the entry's name, and
# cuda_point.h's device function is the name + "_thread".
KERNELS: dict[str, tuple[tuple[str, str], ...]] = {
    "elastic_velocity": (*_GRID, ("REAL *", "v"), ("const REAL *", "s"), ("REAL *", "psi"),
                         *_ptrs("buy bux", True), ("REAL *", "store"), *_PML, *_STEP),
    "elastic_stress": (*_GRID, ("const REAL *", "v"), ("REAL *", "s"), ("REAL *", "psi"),
                       *_ptrs("lam2mu lam muxy", True), ("REAL *", "store"),
                       ("const REAL *", "surface"), *_PML, *_STEP),
    "elastic_stress_adjoint": (*_GRID, *_ptrs("ls lp"), *_ptrs("lam2mu lam muxy surface store", True),
                               *_ptrs("g_lam2mu g_lam g_muxy g_surface w"), *_PML, *_STEP),
    "elastic_velocity_adjoint": (*_GRID, *_ptrs("lv lp"), *_ptrs("buy bux store", True),
                                 *_ptrs("g_by g_bx w"), *_PML, *_STEP),
    "elastic_stress_gather": (*_GRID, ("REAL *", "lv"), ("const REAL *", "w")),
    "elastic_velocity_gather": (*_GRID, ("REAL *", "ls"), ("const REAL *", "w")),
    # between the half steps (not over the grid: Call's ``threads`` says how many)
    "elastic_image": (("odecli_i64", "B"), ("odecli_i64", "C"), ("odecli_i64", "ny"),
                      ("odecli_i64", "nx"), ("REAL *", "f"), *_IMAGE),
    "elastic_fold": (("odecli_i64", "B"), ("odecli_i64", "C"), ("odecli_i64", "ny"),
                     ("odecli_i64", "nx"), ("REAL *", "f"), ("odecli_i64", "surface"), *_IMAGE),
    "elastic_source": (("odecli_i64", "B"), ("odecli_i64", "plane"), ("odecli_i64", "channels"),
                       ("REAL *", "f"), ("const odecli_i64 *", "ptr"), ("const odecli_i64 *", "at"),
                       ("const REAL *", "values")),
    "elastic_receiver": (("odecli_i64", "n"), ("odecli_i64", "plane"), *_ptrs("v s", True),
                         ("const odecli_i64 *", "at"), ("const odecli_i64 *", "kind"),
                         ("const odecli_i64 *", "slot"), ("REAL *", "traces"),
                         ("odecli_i64", "steps"), ("odecli_i64", "step")),
    "elastic_receiver_adjoint": (("odecli_i64", "n"), *_ptrs("lv ls"),
                                 *(("const odecli_i64 *", k) for k in ("at", "which", "ptr", "src")),
                                 *_ptrs("coef g", True), ("odecli_i64", "steps"),
                                 ("odecli_i64", "step")),
    "elastic_source_gradient": (("odecli_i64", "n"), ("REAL *", "grad"),
                                *(("const odecli_i64 *", k) for k in ("at", "ptr", "lam_at")),
                                *_ptrs("values lv", True)),
}
GATHERS = ("elastic_stress_gather", "elastic_velocity_gather")  # over the ringed grid


def _signature(params) -> str:
    return ", ".join(f"{t} {n}" for t, n in params)


def _arguments(params) -> str:
    return ", ".join(n for _, n in params)


def _point_text(dtype: torch.dtype, device_qualifier: str) -> str:
    return (f"#define REAL {REALS[dtype]}\n#define DEVICE {device_qualifier}\n"
            + (HERE / "cuda_point.h").read_text())


def cuda_source(dtype: torch.dtype) -> str:
    """The CUDA text NVRTC compiles: the point updates and a ``__global__`` entry per kernel."""
    text = _point_text(dtype, "__device__ __forceinline__")
    for name, params in KERNELS.items():
        text += (f'\nextern "C" __global__ void __launch_bounds__({THREADS}) {name}({_signature(params)})\n'
                 f"{{\n    {name}_thread(blockIdx.x, threadIdx.x, {_arguments(params)});\n}}\n")
    return text


def host_source(dtype: torch.dtype) -> str:
    """The same point updates as C for the host, behind ``<entry>_launch`` functions with
    cuLaunchKernel's signature that run every (block, thread) of a launch in order, on
    arguments passed as the driver takes them (``params[i]`` points to argument i)."""
    text = _point_text(dtype, "static inline")
    for name, params in KERNELS.items():
        unpacked = ", ".join(f"*({t} *)params[{i}]" for i, (t, _) in enumerate(params))
        text += (f"\nint {name}_launch(void *function, unsigned gx, unsigned gy, unsigned gz,\n"
                 "    unsigned bx, unsigned by, unsigned bz, unsigned shared, void *stream,\n"
                 "    void **params, void **extra)\n{\n"
                 "    for (odecli_i64 b = 0; b < (odecli_i64)gx; ++b)\n"
                 "        for (odecli_i64 t = 0; t < (odecli_i64)bx; ++t)\n"
                 f"            {name}_thread(b, t, {unpacked});\n    return 0;\n}}\n")
    return text


NVRTC_OPTIONS = ("--fmad=false",)  # every operation rounds as written, as the reference's


def compile_cubin(dtype: torch.dtype, arch: str) -> bytes:
    """The kernels' cubin for ``arch`` (``"sm_90"``), cached on disk by NVRTC's module; raises
    :class:`odecli.ode.gpu.nvrtc.NvrtcUnavailable` or ``CompileError``."""
    from odecli.ode.gpu import nvrtc

    return nvrtc.compile_cubin(cuda_source(dtype), arch, NVRTC_OPTIONS, "elastic_step.cu")


def _ctype(c_type: str, real):
    if c_type.endswith("*"):
        return ctypes.c_void_p
    return real if c_type == "REAL" else ctypes.c_longlong


class Call:
    """One kernel's launch arguments as ctypes objects made once, and the array of their
    addresses the launch reads; :meth:`set` re-points them between launches.  ``blocks``
    covers the grid (the ringed one for a gather) with tiles of 32 x 8, or ``threads``
    threads for the kernels that do not run over the grid."""

    def __init__(self, entry: str, dtype: torch.dtype, threads: int | None = None, **values) -> None:
        params = KERNELS[entry]
        real = ctypes.c_float if dtype == torch.float32 else ctypes.c_double
        self.entry = entry
        self.args = [_ctype(t, real)() for t, _ in params]
        self._slot = {name: arg for (_, name), arg in zip(params, self.args)}
        self.index = {name: i for i, (_, name) in enumerate(params)}
        self.pointers = (ctypes.c_void_p * len(self.args))(*(ctypes.addressof(a) for a in self.args))
        self._tensors: dict = {}  # the tensors pointed to, kept alive while they are
        if threads is not None:
            self.set(**values)
            self.blocks = max(1, -(-threads // THREADS))
            return
        ring = 4 if entry in GATHERS else 0
        ny, nx = values["ny"] + ring, values["nx"] + ring
        self.set(tiles_x=-(-nx // TILE_X), **values)
        self.blocks = -(-ny // TILE_Y) * int(self._slot["tiles_x"].value)

    def set(self, **values) -> None:
        """Set arguments by name: tensors by address (kept referenced until re-pointed), None
        as NULL, numbers as they are."""
        for name, value in values.items():
            if isinstance(value, torch.Tensor):
                self._tensors[name] = value
                value = value.data_ptr()
            self._slot[name].value = value


@functools.cache
def _steps_library() -> ctypes.CDLL:
    lib, why = native.load_source("elastic_cuda_steps", (HERE / "cuda_steps.c").read_bytes())
    if lib is None:
        raise RuntimeError(f"the elastic CUDA time loop (cuda_steps.c) did not build: {why}")
    lib.elastic_run_steps.restype = ctypes.c_int
    return lib


class Between:
    """A host step in a list of launches (:meth:`Launcher.run`): ``action()`` run by the C loop
    between two launches, in their order on their stream, through a function with
    cuLaunchKernel's signature, so ``cuda_steps.c`` runs it as it runs a launch.  On several
    ranks it is a halo exchange (cuda_loop.py).  An exception is kept (the C loop cannot take
    it), ends the loop, and :meth:`Launcher.run` raises it."""

    blocks = 1

    def __init__(self, entry: str, action) -> None:
        self.entry, self.error = entry, None
        self.index: dict = {}  # no arguments that move
        self.pointers = (ctypes.c_void_p * 1)()

        def call(*_args) -> int:
            try:
                action()
                return 0
            except BaseException as exc:  # noqa: BLE001 - raised again after the C loop
                self.error = exc
                return 1

        self._function = LAUNCH(call)  # kept alive while the loop may call it
        self.address = ctypes.cast(self._function, ctypes.c_void_p).value


class Launcher:
    """Launches through functions with cuLaunchKernel's signature, one at a time
    (:meth:`launch`) or as steps of a fixed list of launches in C (:meth:`run`); ``entries``:
    per kernel name, the launch function's address and the kernel handle it takes."""

    device_type = "cpu"

    def __init__(self, entries: dict[str, tuple[int, ctypes.c_void_p]]) -> None:
        self._entries = {name: (LAUNCH(address), function)
                         for name, (address, function) in entries.items()}
        self._addresses = {name: address for name, (address, _) in entries.items()}
        self._run = _steps_library().elastic_run_steps

    def stream(self) -> ctypes.c_void_p:
        return ctypes.c_void_p(None)

    def check(self, result: int, what: str) -> None:
        if result != 0:
            raise RuntimeError(f"{what} failed ({result})")

    def launch(self, call: Call) -> None:
        """One launch with the arguments as set."""
        launch, function = self._entries[call.entry]
        self.check(launch(function, call.blocks, 1, 1, THREADS, 1, 1, 0, self.stream(),
                          ctypes.cast(call.pointers, ctypes.c_void_p), None), call.entry)


    def run(self, calls: list[Call], steps: int, moving: list[tuple[int, str, int, int]]) -> None:
        """``steps`` steps of the launches ``calls`` in order (``cuda_steps.c``), each
        ``(l, name, base, stride)`` of ``moving`` setting argument ``name`` of ``calls[l]`` (a
        pointer or an integer) to ``base + m * stride`` before step m's launches."""
        n, k = len(calls), len(moving)
        host = lambda c: isinstance(c, Between)
        result = self._run(
            ctypes.c_longlong(steps), ctypes.c_longlong(n),
            (ctypes.c_void_p * n)(*(c.address if host(c) else self._addresses[c.entry] for c in calls)),
            (ctypes.c_void_p * n)(*(None if host(c) else self._entries[c.entry][1] for c in calls)),
            (ctypes.c_uint * n)(*(c.blocks for c in calls)), ctypes.c_uint(THREADS), self.stream(),
            (ctypes.c_void_p * n)(*(ctypes.addressof(c.pointers) for c in calls)),
            ctypes.c_longlong(k), (ctypes.c_longlong * k)(*(m[0] for m in moving)),
            (ctypes.c_longlong * k)(*(calls[m[0]].index[m[1]] for m in moving)),
            (ctypes.c_longlong * k)(*(m[2] for m in moving)),
            (ctypes.c_longlong * k)(*(m[3] for m in moving)))
        for c in calls:
            if host(c) and c.error is not None:
                error, c.error = c.error, None
                raise error
        self.check(result, "elastic time loop")


class HostLauncher(Launcher):
    """The kernels built for the host: launches run on the CPU, synchronously, on CPU tensors."""

    def __init__(self, dtype: torch.dtype) -> None:
        lib, why = native.load_source(f"elastic_cuda_host_{REALS[dtype]}", host_source(dtype).encode())
        if lib is None:
            raise RuntimeError(f"the elastic CUDA kernels' host build failed: {why}")
        self._lib = lib
        none = ctypes.c_void_p(None)
        super().__init__({name: (ctypes.cast(getattr(lib, f"{name}_launch"), ctypes.c_void_p).value, none)
                          for name in KERNELS})


@functools.cache
def host_launcher(dtype: torch.dtype) -> HostLauncher:
    return HostLauncher(dtype)


class CudaLauncher(DriverLaunches, Launcher):
    """The NVRTC-built kernels on one GPU, launched by the driver on torch's current stream."""

    def __init__(self, dtype: torch.dtype, device: torch.device) -> None:
        from odecli.ode.gpu import driver

        super().__init__(compile_cubin(dtype, driver.device_arch(device)), KERNELS, device)


_CUDA: dict = {}


def cuda_launcher(like: torch.Tensor) -> tuple[CudaLauncher | None, str]:
    """The compiled kernels for tensors like ``like`` on their GPU, or ``(None, why not)``: a
    CPU tensor, a dtype without a build, no NVRTC, or a compile or load failure (cached per
    device and dtype, failures included, so the reason is given once and not re-tried)."""
    if like.device.type != "cuda":
        return None, f"the elastic CUDA kernels need CUDA tensors (got {like.device})"
    if like.dtype not in REALS:
        return None, f"no elastic CUDA kernel for {like.dtype}"
    key = (like.device, like.dtype)
    if key not in _CUDA:
        try:
            _CUDA[key] = (CudaLauncher(like.dtype, like.device), "")
        except Exception as exc:  # noqa: BLE001 - any failure means: use the reference, say why
            _CUDA[key] = (None, f"the elastic CUDA kernels could not be built or loaded: {exc}")
    return _CUDA[key]
