"""The generated solver's CUDA text built for the host, so that its GPU path runs without a GPU.

g++ compiles the exact text NVRTC compiles (``__CUDACC_RTC__`` defined), with a shim for the
few CUDA names it uses and a ``launch`` that calls the ``__global__`` entry once per (block,
thread). :class:`HostKernel` stands in for :class:`odecli.ode.gpu.driver.Kernel`:
``tests/test_ode_gpu.py`` runs ``solve_gpu`` through it (``tests/test_ode_gpu_grad.py`` the
gradient's ``gradient_samples_cuda``), and ``benchmarks/gpu_check.py
--host-dry-run`` runs the whole GPU check on it.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

# The CUDA names solver_template.c's NVRTC branch uses, for the host: the kernel runs as a loop.
_HOST_SHIM = r"""
#include <math.h>
#include <string.h>
#define __global__
struct odecli_dim3 { unsigned x, y, z; };
static odecli_dim3 blockIdx, blockDim, threadIdx;
static inline double __longlong_as_double(long long v) { double d; memcpy(&d, &v, sizeof d); return d; }
static inline float __int_as_float(int v) { float f; memcpy(&f, &v, sizeof f); return f; }
#define __CUDACC_RTC__ 1
"""
_HOST_LAUNCH = r"""
extern "C" void launch(int64_t blocks, int64_t threads, int64_t i0, int64_t i1, int64_t n_eval, int64_t n_params,
                       const double *y0, const double *t0, const double *t1, const double *grid, const double *params,
                       const double *dt0, int64_t auto_dt0, const double *cfg, int64_t max_steps, double *yout,
                       int64_t *istat, double *fstat, double *yfinal, const double *shared)
{
    blockDim.x = (unsigned)threads;
    for (int64_t b = 0; b < blocks; b++)
        for (int64_t t = 0; t < threads; t++) {
            blockIdx.x = (unsigned)b; threadIdx.x = (unsigned)t;
            solve_samples_cuda(i0, i1, n_eval, n_params, y0, t0, t1, grid, params, dt0, auto_dt0, cfg, max_steps,
                               yout, istat, fstat, yfinal, shared);
        }
}
#if NE > 0
extern "C" void launch_events(int64_t blocks, int64_t threads, int64_t i0, int64_t i1, int64_t n_eval,
                              int64_t n_params, const double *y0, const double *t0, const double *t1,
                              const double *grid, const double *params, const double *dt0, int64_t auto_dt0,
                              const double *cfg, int64_t max_steps, double *yout, int64_t *istat, double *fstat,
                              double *yfinal, const double *shared, int64_t ev_cap, double *ev_t, double *ev_y,
                              int64_t *ev_count)
{
    blockDim.x = (unsigned)threads;
    for (int64_t b = 0; b < blocks; b++)
        for (int64_t t = 0; t < threads; t++) {
            blockIdx.x = (unsigned)b; threadIdx.x = (unsigned)t;
            solve_samples_events_cuda(i0, i1, n_eval, n_params, y0, t0, t1, grid, params, dt0, auto_dt0, cfg,
                                      max_steps, yout, istat, fstat, yfinal, shared, ev_cap, ev_t, ev_y, ev_count);
        }
}
#endif
"""
_HOST_GRADIENT_LAUNCH = r"""
extern "C" void launch_gradient(int64_t blocks, int64_t threads, int64_t i0, int64_t i1, int64_t n_eval,
                                int64_t n_params, const double *y0, const double *t0, const double *t1,
                                const double *grid, const double *params, const double *dt0, int64_t auto_dt0,
                                const double *cfg, int64_t max_steps, double *yout, int64_t *istat, double *fstat,
                                double *yfinal, const double *shared, const double *gy, const double *gfinal,
                                double *gy0, double *gp, const int64_t *tape_start, int64_t base, Step *steps,
                                double *tape_y, double *tape_k, double *tape_keep, int64_t *taped, double *wbar,
                                int64_t wbar_size)
{
    blockDim.x = (unsigned)threads;
    for (int64_t b = 0; b < blocks; b++)
        for (int64_t t = 0; t < threads; t++) {
            blockIdx.x = (unsigned)b; threadIdx.x = (unsigned)t;
            gradient_samples_cuda(i0, i1, n_eval, n_params, y0, t0, t1, grid, params, dt0, auto_dt0, cfg, max_steps,
                                  yout, istat, fstat, yfinal, shared, gy, gfinal, gy0, gp, tape_start, base, steps,
                                  tape_y, tape_k, tape_keep, taped, wbar, wbar_size);
        }
}
extern "C" int64_t step_bytes(void) { return sizeof(Step); }
"""


def host_build(source: str, folder: Path) -> ctypes.CDLL:
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    path = folder / "kernel.cpp"
    gradient = _HOST_GRADIENT_LAUNCH if "gradient_samples_cuda" in source else ""
    path.write_text(_HOST_SHIM + source + _HOST_LAUNCH + gradient)
    lib = folder / "kernel.so"
    subprocess.run([cxx, "-std=c++20", "-O1", "-ffp-contract=off", "-fPIC", "-shared", "-w", str(path), "-o", str(lib)],
                   check=True, capture_output=True)
    return ctypes.CDLL(str(lib))


class HostKernel:
    """The kernel built for the host (host_build) behind odecli.ode.gpu.driver.Kernel's launch."""

    def __init__(self, lib: ctypes.CDLL, entry: str = "solve_samples_cuda") -> None:
        self.lib, self.launches = lib, []
        self.entry = {"solve_samples_events_cuda": lambda: lib.launch_events,
                      "gradient_samples_cuda": lambda: lib.launch_gradient}.get(entry, lambda: lib.launch)()

    def launch(self, blocks: int, threads: int, args: list) -> None:
        self.launches.append((blocks, threads, args[0].value, args[1].value))
        self.entry(ctypes.c_int64(blocks), ctypes.c_int64(threads), *args)

    def registers(self) -> int:
        """As Kernel.registers; -1: a host build has none to report."""
        return -1

    def max_threads(self) -> int:
        """As Kernel.max_threads: a host loop has no limit of its own."""
        return 1024
