"""Compile the generated solver's source for a GPU with NVRTC, CUDA's run-time compiler.

Compiling needs no GPU: only the NVRTC library, which every CUDA build of torch already
depends on (the ``nvidia-cuda-nvrtc-cu12`` wheel, or a CUDA toolkit's ``libnvrtc``). So CI, with
no GPU, compiles every method's kernel (``tests/test_ode_gpu.py``) and a template change that
breaks the CUDA build fails there, not on a lent GPU.

Why ctypes and not ``cuda-python`` or ``cupy``: the solver needs six NVRTC functions (create,
compile, log, cubin size, cubin, destroy), the way torch itself calls NVRTC
(``torch.cuda._utils``); ``cuda-bindings`` follows the newest CUDA major (13) while torch's
wheels bring NVRTC 12, and cupy brings a second GPU array library we do not need. The cubins
are cached on disk under :func:`odecli.native.cache_dir`, keyed by the source, the options and
the NVRTC version, so a second process loads the kernel without compiling it (a dopri5 VdP
kernel takes about a second to compile).
"""

from __future__ import annotations

import ctypes
import functools
import glob
import hashlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Sequence

from odecli import native

ENTRY = "solve_samples_cuda"
"""The ``__global__`` function of ``solver_template.c`` (one thread per sample)."""
ENTRY_EVENTS = "solve_samples_events_cuda"
"""The same with the events recorded (right-hand sides with events)."""

BASE_OPTIONS = ("-default-device", "-std=c++20")
"""Every unannotated function a device function (the template's text stays plain C), and C++20
for the template's designated initialisers."""

CONTRACT_OFF = ("--fmad=false",)
"""As the CPU build's -ffp-contract=off: every operation rounds as written, so a sample takes the
CPU's steps (only ``pow``, 2 ulp on the GPU against glibc's correctly rounded one, may differ)."""


class NvrtcUnavailable(RuntimeError):
    """No NVRTC library could be loaded here."""


class CompileError(RuntimeError):
    """NVRTC rejected the source; the message holds its log."""


def _candidates() -> list[str]:
    """Where libnvrtc may be: $ODECLI_NVRTC, the NVIDIA wheels (``nvidia/cuda_nvrtc/lib`` for CUDA
    12, ``nvidia/cu13/lib`` for 13; torch's own CUDA major first), then the loader's path."""
    found = []
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        found += sorted(glob.glob(os.path.join(folder, "*", "lib", "libnvrtc.so.*")))
    found = [path for path in found if ".alt." not in path and "builtins" not in path]
    torch = sys.modules.get("torch")
    cuda = getattr(getattr(torch, "version", None), "cuda", None)
    if cuda:  # a cubin of another CUDA major may not load under torch's driver
        found.sort(key=lambda path: not path.endswith(f".so.{cuda.split('.')[0]}"))
    explicit = os.environ.get("ODECLI_NVRTC")
    return ([explicit] if explicit else []) + found + ["libnvrtc.so.12", "libnvrtc.so.13", "libnvrtc.so"]


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """The NVRTC library (loaded once); :class:`NvrtcUnavailable` when none is found."""
    errors = []
    for name in _candidates():
        try:
            lib = ctypes.CDLL(name)
        except OSError as exc:
            errors.append(str(exc))
            continue
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        return lib
    raise NvrtcUnavailable("no NVRTC library found (pip install nvidia-cuda-nvrtc-cu12, or set ODECLI_NVRTC): "
                           + "; ".join(errors[:2]))


def available() -> str:
    """"" when NVRTC loads here, else why not."""
    try:
        library()
    except NvrtcUnavailable as exc:
        return str(exc)
    return ""


def version() -> tuple[int, int]:
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(library().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)))
    return major.value, minor.value


def _check(result: int) -> None:
    if result != 0:
        raise CompileError(f"NVRTC error {result}: {library().nvrtcGetErrorString(result).decode()}")


def compile_cubin(source: str, arch: str, options: Sequence[str] = (), name: str = "odecli_solver.cu") -> bytes:
    """``source`` compiled for ``arch`` (``"sm_90"``): the cubin, from the disk cache when built before."""
    all_options = [f"--gpu-architecture={arch}", *BASE_OPTIONS, *options]
    key = hashlib.sha256("\0".join([source, *all_options, repr(version())]).encode()).hexdigest()[:32]
    cached = native.cache_dir() / "cuda" / f"{key}.cubin"
    try:
        return cached.read_bytes()
    except OSError:
        pass
    cubin = _compile(source, all_options, name)
    _store(cached, cubin)
    return cubin


def _compile(source: str, options: list[str], name: str) -> bytes:
    lib = library()
    prog = ctypes.c_void_p()
    _check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None))
    try:
        encoded = [option.encode() for option in options]
        result = lib.nvrtcCompileProgram(prog, len(encoded), (ctypes.c_char_p * len(encoded))(*encoded))
        if result != 0:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, log)
            raise CompileError(f"NVRTC could not compile the generated solver: {log.value.decode(errors='replace')}")
        size = ctypes.c_size_t()
        _check(lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)))
        cubin = ctypes.create_string_buffer(size.value)
        _check(lib.nvrtcGetCUBIN(prog, cubin))
        return cubin.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _store(path: Path, data: bytes) -> None:
    """Write atomically (ranks compiling at once); a cache that cannot be written is skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_bytes(data)
        os.replace(partial, path)
    except OSError:
        pass
