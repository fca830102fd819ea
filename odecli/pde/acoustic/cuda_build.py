"""The acoustic step as CUDA kernels, and the same kernels built for the host.

Why CUDA C through NVRTC (and not Triton): the per-point update is written once, in
``cuda_point.h`` (one step a launch) and ``cuda_blocks.h`` (up to 4 steps a launch in shared
memory), and two builds include them.  NVRTC compiles them into ``__global__`` kernels
(:func:`cuda_source`; compiling needs no GPU, so CI compiles the real kernels in both
precisions), and the system C compiler into a host library whose ``acoustic_cu_launch`` and
``acoustic_blocks_cu_launch``, stand-ins for the driver's ``cuLaunchKernel``, run every thread
block of a launch in a loop (:func:`host_source`; the blocked kernel's threads also as POSIX
threads meeting at a barrier).  So the kernels' arithmetic, tiling, lane striding, barriers,
source and receiver tables and the time loop that drives them
(:mod:`odecli.pde.acoustic.cuda_loop`, ``cuda_steps.c``) run on CPU tensors here, against the
PyTorch reference and its autograd, with no GPU and no extra test dependency (Triton's
interpreter would add one, and runs a stencil far slower than a C loop).  NVRTC and the driver
calls are the ODE solver's (:mod:`odecli.ode.gpu.nvrtc`, :mod:`odecli.ode.gpu.driver`),
imported, not copied.

Both builds turn contraction into fused multiply-adds off (``--fmad=false``, ``-ffp-contract=off``)
and keep subnormals (no ``--ftz``), so a step equals the PyTorch reference's bit for bit on
either.  A launch adds the sources and reads the receivers itself; its arguments are built once
per propagation (:class:`StepCall`) and re-pointed between launches by a time loop in C
(``cuda_steps.c``), the same loop for the driver's launches and the host build's.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from pathlib import Path

import torch

from odecli import native
from odecli.pde.cuda_driver import LAUNCH, DriverLaunches

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


# The kernel of several steps a launch (cuda_blocks.h): its parameters after (block, thread,
# nthreads, shared arrays), and its output tile (columns, rows) per dtype, so its shared memory
# (two time levels of the tile and its halo, and the tile's gradient sum) stays under the 48 KB
# a block gets without opting in: 39 KB in float32, 29 KB in float64.
BLOCKS_ENTRY = "acoustic_blocks"
STEPS_PER_LAUNCH = 4  # KMAX: the halo is 2 cells a step
BLOCK_TILES = {torch.float32: (64, 32), torch.float64: (32, 16)}
BLOCK_PARAMS: tuple[tuple[str, str], ...] = (
    ("odecli_i64", "B"), ("odecli_i64", "ny"), ("odecli_i64", "nx"), ("odecli_i64", "tiles_x"),
    ("odecli_i64", "steps"), ("const REAL *", "u_prev_in"), ("const REAL *", "u_in"),
    ("REAL *", "p_out"), ("REAL *", "u_out"),
    ("const REAL *", "c2dt2"), ("const REAL *", "sponge"), ("const odecli_i64 *", "span"),
    ("double", "iy2"), ("double", "ix2"),
    ("REAL *", "lap"), ("odecli_i64", "lap_stride"), ("odecli_i64", "lap_mode"), ("REAL *", "grad"),
    ("const odecli_i64 *", "src_ptr"), ("const odecli_i64 *", "src_at"),
    ("const odecli_i64 *", "src_idx"), ("const REAL *", "src_val"), ("odecli_i64", "src_stride"),
    ("const odecli_i64 *", "rec_ptr"), ("const odecli_i64 *", "rec_at"),
    ("const odecli_i64 *", "rec_slot"), ("REAL *", "traces"), ("odecli_i64", "rec_stride"),
)


def _ctype(c_type: str):
    if c_type.endswith("*"):
        return ctypes.c_void_p
    return ctypes.c_double if c_type == "double" else ctypes.c_longlong


def _signature(params=PARAMS) -> str:
    return ", ".join(f"{t} {n}" for t, n in params)


def _arguments(params=PARAMS) -> str:
    return ", ".join(n for _, n in params)


def _point_text(dtype: torch.dtype, device_qualifier: str, sync: str) -> str:
    ox, oy = BLOCK_TILES[dtype]
    return (f"#define REAL {REALS[dtype]}\n#define DEVICE {device_qualifier}\n"
            f"#define OX {ox}\n#define OY {oy}\n#define KMAX {STEPS_PER_LAUNCH}\n"
            f"#define SYNC() {sync}\n"
            + (HERE / "cuda_point.h").read_text() + (HERE / "cuda_blocks.h").read_text())


_SHARED = "sa[RX * RY], sb[RX * RY], sg[OX * OY]"  # cuda_blocks.h's shared arrays


def cuda_source(dtype: torch.dtype) -> str:
    """The CUDA text NVRTC compiles: the point updates and ``__global__`` entries around them."""
    return (_point_text(dtype, "__device__ __forceinline__", "__syncthreads()")
            + f'\nextern "C" __global__ void {ENTRY}({_signature()})\n'
            + f"{{\n    acoustic_thread(blockIdx.x, threadIdx.x, {_arguments()});\n}}\n"
            + f'\nextern "C" __global__ void __launch_bounds__({THREADS}) '
            + f"{BLOCKS_ENTRY}({_signature(BLOCK_PARAMS)})\n{{\n"
            + f"    __shared__ REAL {_SHARED};\n"
            + "    acoustic_block(blockIdx.x, threadIdx.x % 32, threadIdx.x / 32, 32, blockDim.x / 32, sa, sb, sg, "
            + f"{_arguments(BLOCK_PARAMS)});\n}}\n")


def host_source(dtype: torch.dtype, lanes: tuple[int, int] | None = None) -> str:
    """The same point updates as C for the host, behind ``acoustic_cu_launch`` and
    ``acoustic_blocks_cu_launch``: cuLaunchKernel's signature, running every (block, thread) of
    a launch in order on arguments passed as the driver takes them (``params[i]`` points to
    argument i).  The blocked kernel runs each thread block as one thread (its phases then need
    no barrier), or with ``lanes`` (columns, rows) as that many POSIX threads meeting at a
    barrier where the GPU's meet at __syncthreads(): the tests' check of its lane striding and
    its barriers."""
    def unpacked(params, where: str = "params"):
        return ", ".join(f"*({t} *){where}[{i}]" for i, (t, _) in enumerate(params))

    head = ("(void *function, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,\n"
            "    unsigned bz, unsigned shared, void *stream, void **params, void **extra)\n{\n")
    prefix = ""
    if lanes is None:
        blocks = (f"    static REAL {_SHARED};\n"
                  "    for (odecli_i64 b = 0; b < (odecli_i64)gx; ++b)\n"
                  f"        acoustic_block(b, 0, 0, 1, 1, sa, sb, sg, {unpacked(BLOCK_PARAMS)});\n"
                  "    return 0;\n}\n")
    else:
        lx, ly = lanes
        prefix = "#include <pthread.h>\nstatic pthread_barrier_t odecli_barrier;\n"
        blocks = (f"    static REAL {_SHARED};\n"
                  f"    pthread_t threads[{lx * ly}];\n    struct odecli_lane lane[{lx * ly}];\n"
                  f"    pthread_barrier_init(&odecli_barrier, 0, {lx * ly});\n"
                  "    for (odecli_i64 b = 0; b < (odecli_i64)gx; ++b) {\n"
                  f"        for (int t = 0; t < {lx * ly}; ++t) {{\n"
                  "            lane[t].block = b; lane[t].lane = t; lane[t].params = params;\n"
                  "            lane[t].sa = sa; lane[t].sb = sb; lane[t].sg = sg;\n"
                  "            pthread_create(&threads[t], 0, odecli_lane_main, &lane[t]);\n        }\n"
                  f"        for (int t = 0; t < {lx * ly}; ++t)\n"
                  "            pthread_join(threads[t], 0);\n    }\n"
                  "    pthread_barrier_destroy(&odecli_barrier);\n    return 0;\n}\n")
        prefix_lane = ("struct odecli_lane { odecli_i64 block; int lane; void **params; REAL *sa, *sb, *sg; };\n"
                       "static void *odecli_lane_main(void *arg)\n{\n"
                       "    struct odecli_lane *l = (struct odecli_lane *)arg;\n"
                       "    void **params = l->params;\n"
                       f"    acoustic_block(l->block, l->lane % {lx}, l->lane / {lx}, {lx}, {ly}, "
                       f"l->sa, l->sb, l->sg, {unpacked(BLOCK_PARAMS)});\n    return 0;\n}}\n")
    sync = "" if lanes is None else "pthread_barrier_wait(&odecli_barrier)"
    text = prefix + _point_text(dtype, "static inline", sync)
    if lanes is not None:
        text += prefix_lane
    return (text
            + "\nint acoustic_cu_launch" + head
            + "    for (odecli_i64 b = 0; b < (odecli_i64)gx; ++b)\n"
            + "        for (odecli_i64 t = 0; t < (odecli_i64)bx; ++t)\n"
            + f"            acoustic_thread(b, t, {unpacked(PARAMS)});\n    return 0;\n}}\n"
            + "\nint acoustic_blocks_cu_launch" + head + blocks)


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
    covers the block ``ny x nx`` with tiles of ``tile`` (columns, rows)."""

    def __init__(self, entry: str = ENTRY, tile: tuple[int, int] = (TILE_X, TILE_Y),
                 **values) -> None:
        """``entry``: :data:`ENTRY` (a step a launch) or :data:`BLOCKS_ENTRY` (several)."""
        params = PARAMS if entry == ENTRY else BLOCK_PARAMS
        self.entry, self.tile = entry, tile
        self.args = [_ctype(t)() for t, _ in params]
        self._slot = {name: arg for (_, name), arg in zip(params, self.args)}
        self.index = {name: i for i, (_, name) in enumerate(params)}
        self.pointers = (ctypes.c_void_p * len(self.args))(*(ctypes.addressof(a) for a in self.args))
        self._tensors: dict = {}  # the tensors pointed to, kept alive while they are
        self.set(**values)
        tiles_y = -(-int(self._slot["ny"].value) // tile[1])
        self.blocks = tiles_y * int(self._slot["tiles_x"].value)

    def set(self, **values) -> None:
        """Set arguments by name: tensors by address (kept referenced until re-pointed),
        None as NULL, numbers (and raw addresses into kept tensors) as they are."""
        for name, value in values.items():
            if isinstance(value, torch.Tensor):
                self._tensors[name] = value
                value = value.data_ptr()
            self._slot[name].value = value


def tiles_x(nx: int, tile_x: int = TILE_X) -> int:
    return -(-nx // tile_x)


@functools.cache
def _steps_library() -> ctypes.CDLL:
    lib, why = native.load_source("acoustic_cuda_steps", (HERE / "cuda_steps.c").read_bytes())
    if lib is None:
        raise RuntimeError(f"the acoustic CUDA time loop (cuda_steps.c) did not build: {why}")
    lib.acoustic_run_steps.restype = ctypes.c_int
    return lib


class Launcher:
    """Launches of the kernels through functions with cuLaunchKernel's signature, one at a time
    (:meth:`launch`) or as runs of leapfrog steps in C (:meth:`run`, :meth:`run_blocks`).
    ``entries``: per entry name, the launch function's address and the kernel handle it takes."""

    device_type = "cpu"

    def __init__(self, entries: dict[str, tuple[int, ctypes.c_void_p]]) -> None:
        self._entries = {name: (ctypes.c_void_p(address), LAUNCH(address), function)
                         for name, (address, function) in entries.items()}
        lib = _steps_library()
        self._run, self._run_blocks = lib.acoustic_run_steps, lib.acoustic_run_blocks

    def stream(self) -> ctypes.c_void_p:
        return ctypes.c_void_p(None)

    def check(self, result: int, what: str) -> None:
        if result != 0:
            raise RuntimeError(f"{what} failed ({result})")

    def launch(self, call: StepCall) -> None:
        """One launch with the arguments as set."""
        _, launch, function = self._entries[call.entry]
        self.check(launch(function, call.blocks, 1, 1, THREADS, 1, 1, 0, self.stream(),
                          ctypes.cast(call.pointers, ctypes.c_void_p), None), "acoustic step launch")

    def run(self, call: StepCall, steps: int, first: torch.Tensor, second: torch.Tensor,
            moving: list[tuple[str, int, int]],
            between: Callable[[torch.Tensor, torch.Tensor], None] | None = None) -> None:
        """``steps`` leapfrog steps of the one-step kernel, ``second`` the first step's u and
        ``first`` its u_prev and output, the two swapping roles each step; each ``(name,
        address, stride)`` of ``moving`` points argument ``name`` at ``address + m * stride``
        bytes in step m (NULL for 0).  ``between(u, u_prev)``, if given, runs after each
        launch on the new time levels (the field it wrote, and the other): the halo exchange
        on several ranks."""
        address, _, function = self._entries[call.entry]
        hook = None if between is None else _Between(between, [(first, second), (second, first)])
        result = self._run(address, function, ctypes.c_uint(call.blocks), ctypes.c_uint(THREADS),
                           self.stream(), call.pointers, ctypes.c_longlong(steps),
                           ctypes.c_void_p(first.data_ptr()), ctypes.c_void_p(second.data_ptr()),
                           *(ctypes.c_longlong(call.index[k]) for k in ("u", "u_prev", "out")),
                           *_moving(call, moving), None if hook is None else hook.function,
                           None)
        if hook is not None and hook.error is not None:
            raise hook.error
        self.check(result, "acoustic time loop")

    def run_blocks(self, call: StepCall, steps: int, per_launch: int, fields: list[torch.Tensor],
                   moving: list[tuple[str, int, int]],
                   between: Callable[[torch.Tensor, torch.Tensor], None] | None = None) -> None:
        """``steps`` steps of the blocked kernel, ``per_launch`` a launch, from ``fields`` =
        ``[u_prev, u, spare, spare]`` (``cuda_steps.c``'s acoustic_run_blocks); ``moving`` as in
        :meth:`run`, strides per step; ``between(u, u_prev)`` as in :meth:`run`, after each
        launch."""
        address, _, function = self._entries[call.entry]
        names = ("u_prev_in", "u_in", "p_out", "u_out")
        hook = None if between is None else _Between(
            between, [(fields[1], fields[0]), (fields[3], fields[2])])
        result = self._run_blocks(address, function, ctypes.c_uint(call.blocks),
                                  ctypes.c_uint(THREADS), self.stream(), call.pointers,
                                  ctypes.c_longlong(steps), ctypes.c_longlong(per_launch),
                                  (ctypes.c_void_p * 4)(*(f.data_ptr() for f in fields)),
                                  ctypes.c_longlong(call.index["steps"]),
                                  (ctypes.c_longlong * 4)(*(call.index[k] for k in names)),
                                  *_moving(call, moving), None if hook is None else hook.function,
                                  None)
        if hook is not None and hook.error is not None:
            raise hook.error
        self.check(result, "acoustic blocked time loop")


_BETWEEN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)


class _Between:
    """``between(u, u_prev)`` as the C loop's ``between_fn``: the written field's address mapped
    back to its tensor and the other time level's (``pairs``: ``(written, other)``); an
    exception is kept (a C caller cannot take it) and ends the loop, and the launcher raises
    it."""

    def __init__(self, between: Callable[[torch.Tensor, torch.Tensor], None],
                 pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.error: BaseException | None = None
        by_address = {u.data_ptr(): (u, other) for u, other in pairs}

        def call(_context, written) -> int:
            try:
                between(*by_address[written])
                return 0
            except BaseException as exc:  # noqa: BLE001 - raised again after the C loop
                self.error = exc
                return 1

        self.function = _BETWEEN(call)


def _moving(call: StepCall, moving: list[tuple[str, int, int]]) -> tuple:
    n = len(moving)
    return (ctypes.c_longlong(n),
            (ctypes.c_longlong * n)(*(call.index[name] for name, _, _ in moving)),
            (ctypes.c_void_p * n)(*(address or None for _, address, _ in moving)),
            (ctypes.c_longlong * n)(*(stride for _, _, stride in moving)))


class HostLauncher(Launcher):
    """The kernels built for the host: launches run on the CPU, synchronously, on CPU tensors
    (``lanes``: the blocked kernel's thread blocks as that many threads, :func:`host_source`)."""

    def __init__(self, dtype: torch.dtype, lanes: tuple[int, int] | None = None) -> None:
        name = f"acoustic_cuda_host_{REALS[dtype]}" + (f"_{lanes[0]}x{lanes[1]}" if lanes else "")
        lib, why = native.load_source(name, host_source(dtype, lanes).encode())
        if lib is None:
            raise RuntimeError(f"the acoustic CUDA kernel's host build failed: {why}")
        self._lib = lib
        none = ctypes.c_void_p(None)
        super().__init__({
            ENTRY: (ctypes.cast(lib.acoustic_cu_launch, ctypes.c_void_p).value, none),
            BLOCKS_ENTRY: (ctypes.cast(lib.acoustic_blocks_cu_launch, ctypes.c_void_p).value, none),
        })


@functools.cache
def host_launcher(dtype: torch.dtype, lanes: tuple[int, int] | None = None) -> HostLauncher:
    return HostLauncher(dtype, lanes)


class CudaLauncher(DriverLaunches, Launcher):
    """The NVRTC-built kernels on one GPU, launched by the driver on torch's current stream."""

    def __init__(self, dtype: torch.dtype, device: torch.device) -> None:
        from odecli.ode.gpu import driver

        super().__init__(compile_cubin(dtype, driver.device_arch(device)), (ENTRY, BLOCKS_ENTRY), device)

    def run_blocks(self, *args) -> None:
        with torch.cuda.device(self.device):
            super().run_blocks(*args)


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
