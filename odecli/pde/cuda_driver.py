"""What the acoustic and elastic CUDA launchers share: their NVRTC-built kernels loaded on one
GPU and launched through the CUDA driver on torch's current stream.

Each equation's ``Launcher`` (``acoustic/cuda_build.py``, ``elastic/cuda_build.py``) takes, per
kernel, a launch function with ``cuLaunchKernel``'s signature and the kernel handle it takes,
and issues its launches from C; its host build passes stand-ins that run on the CPU.  This mixin,
put ahead of such a ``Launcher``, passes the driver's function and the loaded kernels instead.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable

import torch

# cuLaunchKernel's signature (function, grid x y z, block x y z, shared bytes, stream, kernel
# parameters, extra): the driver's function and the host builds' stand-ins are called through it
LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint,
                          ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                          ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


class DriverLaunches:
    """Mixin for a launcher whose ``__init__`` takes ``{name: (launch address, kernel handle)}``
    and whose ``launch`` and ``run`` issue the launches: the kernels of ``cubin`` named ``names``
    on ``device``, launched in that device's context on torch's current stream."""

    device_type = "cuda"

    def __init__(self, cubin: bytes, names: Iterable[str], device: torch.device) -> None:
        from odecli.ode.gpu import driver

        self.kernels = {name: driver.Kernel(cubin, name, device) for name in names}
        self.device = device
        self._driver = driver
        address = ctypes.cast(driver._libcuda().cuLaunchKernel, ctypes.c_void_p).value
        super().__init__({name: (address, kernel._function) for name, kernel in self.kernels.items()})

    def stream(self) -> ctypes.c_void_p:
        return ctypes.c_void_p(torch.cuda.current_stream(self.device).cuda_stream)

    def check(self, result: int, what: str) -> None:
        self._driver._check(result, what)

    # The driver launches in the calling thread's current context: the device's, made current
    # here (autograd runs the backward on a thread of its own, and tensors may be on cuda:1).
    def launch(self, call) -> None:
        with torch.cuda.device(self.device):
            super().launch(call)

    def run(self, *args) -> None:
        with torch.cuda.device(self.device):
            super().run(*args)
