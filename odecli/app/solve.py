"""Turn a validated spec into arrays or tensors, call the engine, and hand back the result.

This is the layer between files and numerics: the CLI calls it, and so can a library user who
wants spec-driven runs without the command line. The engines never see a spec.

A spec the generated C solver can take (equations, an explicit Runge-Kutta method, float64,
on a CPU) is solved on numpy arrays without importing torch, which alone takes seconds; on a
CUDA device the same generated solver runs as a GPU kernel (float32 or float64,
:mod:`odecli.ode.gpu`); any other spec imports torch and runs the batched PyTorch loop.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import TYPE_CHECKING, Callable

import numpy as np

from odecli.errors import InputError, SpecError
from odecli.ode.controllers import make_controller
from odecli.ode.native import NativeEvent, NativeRhs, NativeUnavailable, solve_native_arrays, unsupported_reason
from odecli.ode.options import SolverOptions
from odecli.ode.solution import ArraySolution
from odecli.ode.status import Progress
from odecli.specs import OdeSpec, build_c_equations
from odecli.specs.events import c_events
from odecli.specs.ode import method_table

if TYPE_CHECKING:
    import torch

    from odecli.ode.solution import Solution

# Device files of the GPUs torch can use as "cuda" (NVIDIA, AMD ROCm, WSL). Where none exists,
# ``device: auto`` means the CPU, and finding that out needs no ``import torch``.
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg")


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA when present; asking for CUDA without it is a user error, not a crash."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"device {name!r} requested but CUDA is not available; use cpu or auto")
    try:
        return torch.device(name)
    except RuntimeError:
        raise InputError(f"unknown device {name!r}; expected cpu, cuda or auto") from None


def device_name(name: str) -> str:
    """:func:`resolve_device` as a name, asking torch only when the answer may be a GPU."""
    if name == "cpu" or (name == "auto" and not any(os.path.exists(f) for f in GPU_DEVICE_FILES)):
        return "cpu"
    return str(resolve_device(name))


def spec_device(spec: OdeSpec) -> str:
    """:func:`device_name` of the spec's ``solver.device``; a GPU that is not there is named as that field."""
    try:
        return device_name(spec.solver.device)
    except InputError as exc:
        raise SpecError(spec.file, "solver.device", str(exc)) from None


def with_overrides(
    spec: OdeSpec, *, method: str | None = None, rtol: float | None = None,
    atol: float | None = None, device: str | None = None,
) -> OdeSpec:
    """Apply command-line overrides, checked like the spec fields they replace."""
    changes: dict[str, object] = {}
    if method is not None:
        methods = method_table(None, method)
        if method not in methods:
            raise InputError(f"--method: unknown method {method!r}; expected one of {', '.join(methods)}")
        if not methods[method] and spec.solver.dt0 is None:
            raise InputError(f"--method: fixed-step method {method!r} needs solver.dt0 in {spec.file}")
        changes["method"] = method
    for flag, value in (("rtol", rtol), ("atol", atol)):
        if value is not None:
            if not (math.isfinite(value) and value > 0):
                raise InputError(f"--{flag}: must be a finite number > 0, got {value:g}")
            changes[flag] = value
    if device is not None:
        if device not in ("cpu", "cuda", "auto") and not device.startswith("cuda:"):
            raise InputError(f"--device: expected cpu, cuda or auto, got {device!r}")
        try:
            device_name(device)
        except InputError as exc:
            raise InputError(f"--device: {exc}") from None
        changes["device"] = device
    if not changes:
        return spec
    return dataclasses.replace(spec, solver=dataclasses.replace(spec.solver, **changes))


def estimated_bytes(spec: OdeSpec) -> int:
    """Memory a solve needs: the dense-output buffer plus about 40 state-sized work tensors."""
    itemsize = 4 if spec.solver.dtype == "float32" else 8
    n_eval = len(spec.t_eval[0]) if spec.t_eval else 2
    n_states = len(spec.states)
    return spec.batch * itemsize * (3 * (n_eval + 1) * n_states + 40 * n_states + 40)


def available_bytes(device: str) -> int:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.mem_get_info(torch.device(device))[0]
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):  # not available on this platform: do not block the run
        return 1 << 62


def check_memory(spec: OdeSpec, device: str) -> None:
    """Refuse a run that cannot fit, before allocating anything, instead of crashing out of memory."""
    need, have = estimated_bytes(spec), available_bytes(device)
    if need > have:
        raise InputError(
            f"{spec.file}: batch: {spec.batch} samples x {len(spec.t_eval[0])} eval times x {len(spec.states)} states "
            f"needs about {need / 2**30:.1f} GiB, more than the {have / 2**30:.1f} GiB available on {device}; "
            f"solve in smaller batches or with fewer eval times"
        )


def solve_spec(spec: OdeSpec, progress: Callable[[Progress], None] | None = None) -> Solution:
    """Solve every sample of ``spec`` and return the batched :class:`~odecli.ode.solver.Solution`.

    ``solver.engine: auto`` runs the generated C solver when it can (equations, an explicit
    Runge-Kutta method, CPU, float64, a C compiler; or CUDA, float32/float64, NVRTC)
    and the batched PyTorch loop otherwise;
    ``native`` insists on C (a clear error when it cannot run), ``torch`` never uses it.
    ``solution.extra["engine"]`` says which one ran.
    """
    solution = _solve(spec, progress)
    return solution.to_tensors() if isinstance(solution, ArraySolution) else solution


def solve_spec_arrays(spec: OdeSpec, progress: Callable[[Progress], None] | None = None) -> ArraySolution:
    """:func:`solve_spec` with numpy arrays out, what files and reports need.

    When the C solver runs, torch is never imported.
    """
    solution = _solve(spec, progress)
    return solution if isinstance(solution, ArraySolution) else ArraySolution.from_solution(solution)


def _solve(spec: OdeSpec, progress: Callable[[Progress], None] | None) -> Solution | ArraySolution:
    """Whichever engine runs, its own result type: arrays from C, tensors from the PyTorch loop."""
    s = spec.solver
    device = spec_device(spec)
    check_memory(spec, device)
    controller = make_controller(
        s.controller, pcoeff=s.pcoeff, icoeff=s.icoeff, dcoeff=s.dcoeff, safety=s.safety,
        factor_min=s.factor_min, factor_max=s.factor_max, dt_min=s.dt_min, dt_max=s.dt_max,
    )
    options = SolverOptions(method=s.method, rtol=s.rtol, atol=s.atol, controller=controller, dt0=s.dt0,
                            max_steps=s.max_steps)
    solution: Solution | ArraySolution | None = None
    why = ""
    if s.engine != "torch":
        solution, why = _solve_native(spec, device, options, progress)
        if why and s.engine == "native":
            raise InputError(f"{spec.file}: solver.engine: native cannot run this spec: {why}")
    if solution is None:
        solution = _solve_torch(spec, device, options, progress)
        if why:
            solution.extra["why_not_native"] = why  # for the run's summary line
    solution.extra["device"] = device
    return solution


def native_unsupported(spec: OdeSpec, device: str) -> str:
    """Why the C solver will not take ``spec`` on ``device`` ("" when it will, compiler permitting)."""
    if spec.solver.engine == "torch":
        return "solver.engine is torch"
    if spec.equations is None:
        return "the right-hand side is Python code"
    if device.startswith("cuda"):  # the same generated solver, built for the GPU
        from odecli.ode.gpu import unsupported_reason as gpu_unsupported_reason

        return gpu_unsupported_reason(spec.solver.method, spec.solver.dtype, device)
    return unsupported_reason(spec.solver.method, spec.solver.dtype, device)


def _solve_native(spec: OdeSpec, device: str, options: SolverOptions,
                  progress: Callable[[Progress], None] | None) -> tuple[ArraySolution | Solution | None, str]:
    """The C solver's result, or ``(None, why it cannot run this spec)``."""
    why = native_unsupported(spec, device)
    if why:
        return None, why
    equations, params = build_c_equations(spec)
    events = tuple(NativeEvent(*event) for event in c_events(spec.events, spec.states, params, spec.file))
    if device.startswith("cuda"):
        return _solve_gpu(spec, NativeRhs(equations, params, events), device, options, progress)
    try:
        solution = solve_native_arrays(
            NativeRhs(equations, params, events), np.array(spec.initial, dtype=np.float64), np.array(spec.t_start),
            np.array(spec.t_end), np.array(spec.t_eval, dtype=np.float64),
            params={name: np.array(values, dtype=np.float64) for name, values in spec.params.items()},
            options=options, progress=progress,
        )
    except NativeUnavailable as exc:
        return None, str(exc)
    return solution, ""


def _solve_gpu(spec: OdeSpec, rhs: NativeRhs, device: str, options: SolverOptions,
               progress: Callable[[Progress], None] | None) -> tuple[Solution | None, str]:
    """The generated solver on a CUDA device (tensors there), or ``(None, why it cannot run)``."""
    import torch

    from odecli.ode.gpu import solve_gpu

    dtype, where = getattr(torch, spec.solver.dtype), torch.device(device)
    try:
        def f64(values: object) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float64, device=where)

        solution = solve_gpu(
            rhs, torch.tensor(spec.initial, dtype=dtype, device=where), f64(spec.t_start), f64(spec.t_end),
            f64(spec.t_eval), params={name: f64(values) for name, values in spec.params.items()},
            options=options, progress=progress,
        )
    except NativeUnavailable as exc:
        return None, str(exc)
    return solution, ""


def _solve_torch(spec: OdeSpec, device: str, options: SolverOptions,
                 progress: Callable[[Progress], None] | None) -> Solution:
    import torch

    from odecli.ode.solver import solve
    from odecli.specs import build_rhs, param_tensors
    from odecli.specs.events import build_events
    from odecli.specs.rhs import python_errors

    s = spec.solver
    dtype, where = getattr(torch, s.dtype), torch.device(device)
    y0 = torch.tensor(spec.initial, dtype=dtype, device=where)
    t0 = torch.tensor(spec.t_start, dtype=dtype, device=where)
    t1 = torch.tensor(spec.t_end, dtype=dtype, device=where)
    t_eval = torch.tensor(spec.t_eval, dtype=dtype, device=where)
    with python_errors(spec):
        solution = solve(build_rhs(spec, where), y0, t0, t1, t_eval, params=param_tensors(spec, dtype, where),
                         options=options, compile=s.compile, progress=progress,
                         events=build_events(spec.events, spec.states, spec.params, spec.file))
    # compile: true may switch to the compiled step part way through this solve, or not in it at all.
    solution.extra["engine"] = "torch-compiled" if solution.extra.get("attempts_compiled") else "torch"
    return solution
