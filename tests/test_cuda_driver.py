"""The CUDA launchers of both equations built on the shared driver mixin
(:mod:`odecli.pde.cuda_driver`), with a stand-in driver: which kernels each loads, and that the
launch tables their C loops call hold the driver's launch function and those kernels' handles.
Without a GPU this is the only check of that glue; the GPU tests run it for real."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import pytest
import torch

from odecli.ode.gpu import driver
from odecli.pde.acoustic import cuda_build as acoustic_build
from odecli.pde.elastic import cuda_build as elastic_build


@pytest.fixture
def fake_driver(monkeypatch):
    loaded = []

    class Kernel:
        def __init__(self, cubin, name, device):
            loaded.append((cubin, name, str(device)))
            self._function = ctypes.c_void_p(1000 + len(loaded))

    launch = ctypes.pythonapi.Py_IsInitialized  # any C function: only its address is kept
    monkeypatch.setattr(driver, "Kernel", Kernel)
    monkeypatch.setattr(driver, "device_arch", lambda device: "sm_90")
    monkeypatch.setattr(driver, "_libcuda", lambda: SimpleNamespace(cuLaunchKernel=launch))
    for module in (acoustic_build, elastic_build):
        monkeypatch.setattr(module, "compile_cubin", lambda dtype, arch: f"{dtype}:{arch}".encode())
    return loaded, ctypes.cast(launch, ctypes.c_void_p).value


@pytest.mark.parametrize("module, names", [
    (acoustic_build, (acoustic_build.ENTRY, acoustic_build.BLOCKS_ENTRY)),
    (elastic_build, tuple(elastic_build.KERNELS)),
])
def test_cuda_launcher_loads_its_kernels_and_launches_through_the_driver(fake_driver, module, names):
    loaded, launch_address = fake_driver
    launcher = module.CudaLauncher(torch.float32, torch.device("cuda:1"))
    assert launcher.device_type == "cuda" and launcher.device == torch.device("cuda:1")
    assert [name for _, name, _ in loaded] == list(names)
    assert {cubin for cubin, _, _ in loaded} == {b"torch.float32:sm_90"}
    assert {device for _, _, device in loaded} == {"cuda:1"}
    assert set(launcher._entries) == set(names)
    for name in names:
        entry = launcher._entries[name]
        assert ctypes.cast(entry[-2], ctypes.c_void_p).value == launch_address
        assert entry[-1].value == launcher.kernels[name]._function.value
