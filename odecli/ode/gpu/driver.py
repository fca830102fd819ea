"""Load a cubin into torch's CUDA context and launch its kernel on torch's current stream.

torch owns the device, the context, the streams and the memory; this module only adds what
torch does not expose: loading a module from a cubin and launching a function of it, through the
CUDA driver library (``libcuda``, installed with the GPU driver), with ctypes, as
``torch.cuda._utils`` does. Arguments are passed as ctypes values (tensors by ``data_ptr``).
"""

from __future__ import annotations

import ctypes
import functools
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    import torch


class DriverError(RuntimeError):
    """A CUDA driver call failed."""


@functools.lru_cache(maxsize=1)
def _libcuda() -> ctypes.CDLL:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise DriverError(f"the CUDA driver library could not be loaded: {exc}") from None


def _check(result: int, what: str) -> None:
    if result != 0:
        text = ctypes.c_char_p()
        _libcuda().cuGetErrorString(result, ctypes.byref(text))
        raise DriverError(f"{what} failed: {(text.value or b'unknown error').decode()} ({result})")


def device_arch(device: "torch.device") -> str:
    """``sm_XY`` of ``device``: the cubin NVRTC builds for it."""
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


class Kernel:
    """One ``__global__`` function of a cubin, loaded on one device."""

    def __init__(self, cubin: bytes, name: str, device: "torch.device") -> None:
        import torch

        self.device = device
        with torch.cuda.device(device):
            torch.cuda.init()
            torch.empty(1, device=device)  # makes torch's (primary) context current on this thread
            lib = _libcuda()
            self._cubin = ctypes.create_string_buffer(cubin, len(cubin))
            self._module = ctypes.c_void_p()
            _check(lib.cuModuleLoadData(ctypes.byref(self._module), self._cubin), "cuModuleLoadData")
            self._function = ctypes.c_void_p()
            _check(lib.cuModuleGetFunction(ctypes.byref(self._function), self._module, name.encode()),
                   f"cuModuleGetFunction({name})")

    def _attribute(self, which: int) -> int:
        value = ctypes.c_int()
        _check(_libcuda().cuFuncGetAttribute(ctypes.byref(value), which, self._function), "cuFuncGetAttribute")
        return value.value

    def registers(self) -> int:
        """Registers per thread (``CU_FUNC_ATTRIBUTE_NUM_REGS``), for the benchmark's report."""
        return self._attribute(4)

    def max_threads(self) -> int:
        """The most threads a block of this kernel can have (``CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK``:
        fewer than 1024 when its registers run out first)."""
        return self._attribute(0)

    def launch(self, blocks: int, threads: int, args: Sequence[ctypes._SimpleCData]) -> None:
        """``blocks`` x ``threads`` threads on the device's current torch stream (asynchronous)."""
        import torch

        pointers = (ctypes.c_void_p * len(args))(*(ctypes.addressof(arg) for arg in args))
        stream = torch.cuda.current_stream(self.device).cuda_stream
        with torch.cuda.device(self.device):
            _check(_libcuda().cuLaunchKernel(self._function, ctypes.c_uint(blocks), 1, 1, ctypes.c_uint(threads), 1, 1,
                                             0, ctypes.c_void_p(stream), pointers, None), "cuLaunchKernel")
