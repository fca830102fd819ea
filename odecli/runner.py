"""Turn a validated spec into tensors, call the engine, and hand back the result.

This is the layer between files and numerics: the CLI calls it, and so can a library user who
wants spec-driven runs without the command line. The engines never see a spec.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Callable

import torch

from odecli.errors import InputError
from odecli.ode.controllers import make_controller
from odecli.ode.native import NativeRhs, NativeUnavailable, solve_native, unsupported_reason
from odecli.ode.stepper import available_methods
from odecli.ode.solver import Progress, Solution, solve
from odecli.spec import OdeSpec, build_c_equations, build_rhs, param_tensors


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA when present; asking for CUDA without it is a user error, not a crash."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"device {name!r} requested but CUDA is not available; use cpu or auto")
    try:
        return torch.device(name)
    except RuntimeError:
        raise InputError(f"unknown device {name!r}; expected cpu, cuda or auto") from None


def with_overrides(
    spec: OdeSpec, *, method: str | None = None, rtol: float | None = None,
    atol: float | None = None, device: str | None = None,
) -> OdeSpec:
    """Apply command-line overrides, checked like the spec fields they replace."""
    changes: dict[str, object] = {}
    if method is not None:
        methods = available_methods()
        if method not in methods:
            raise InputError(f"--method: unknown method {method!r}; expected one of {', '.join(methods)}")
        if not methods[method].adaptive and spec.solver.dt0 is None:
            raise InputError(f"--method: fixed-step method {method!r} needs solver.dt0 in {spec.file}")
        changes["method"] = method
    for flag, value in (("rtol", rtol), ("atol", atol)):
        if value is not None:
            if not (math.isfinite(value) and value > 0):
                raise InputError(f"--{flag}: must be > 0, got {value:g}")
            changes[flag] = value
    if device is not None:
        if device not in ("cpu", "cuda", "auto") and not device.startswith("cuda:"):
            raise InputError(f"--device: expected cpu, cuda or auto, got {device!r}")
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


def available_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):  # not available on this platform: do not block the run
        return 1 << 62


def check_memory(spec: OdeSpec, device: torch.device) -> None:
    """Refuse a run that cannot fit, before allocating anything, instead of crashing out of memory."""
    need, have = estimated_bytes(spec), available_bytes(device)
    if need > have:
        raise InputError(
            f"{spec.file}: batch: {spec.batch} samples x {len(spec.t_eval[0])} eval times x {len(spec.states)} states "
            f"needs about {need / 2**30:.1f} GiB, more than the {have / 2**30:.1f} GiB available on {device}; "
            f"solve in smaller batches or with fewer eval times"
        )


def solve_spec(spec: OdeSpec, progress: Callable[[Progress], None] | None = None) -> Solution:
    """Solve every sample of ``spec`` and return the batched :class:`Solution`.

    ``solver.engine: auto`` runs the generated C solver when it can (equations, an explicit
    Runge-Kutta method, CPU, float64, a C compiler) and the batched PyTorch loop otherwise;
    ``native`` insists on C (a clear error when it cannot run), ``torch`` never uses it.
    ``solution.extra["engine"]`` says which one ran.
    """
    s = spec.solver
    device = resolve_device(s.device)
    check_memory(spec, device)
    dtype = getattr(torch, s.dtype)
    controller = make_controller(
        s.controller, pcoeff=s.pcoeff, icoeff=s.icoeff, dcoeff=s.dcoeff, safety=s.safety,
        factor_min=s.factor_min, factor_max=s.factor_max, dt_min=s.dt_min, dt_max=s.dt_max,
    )
    y0 = torch.tensor(spec.initial, dtype=dtype, device=device)
    t0 = torch.tensor(spec.t_start, dtype=dtype, device=device)
    t1 = torch.tensor(spec.t_end, dtype=dtype, device=device)
    t_eval = torch.tensor(spec.t_eval, dtype=dtype, device=device)
    params = param_tensors(spec, dtype, device)
    common = dict(params=params, method=s.method, rtol=s.rtol, atol=s.atol, controller=controller,
                  dt0=s.dt0, max_steps=s.max_steps, progress=progress)
    solution = None
    if s.engine != "torch":
        equations = build_c_equations(spec)
        why = "the right-hand side is Python code" if equations is None else unsupported_reason(s.method, dtype, device)
        if not why:
            try:
                solution = solve_native(NativeRhs(*equations), y0, t0, t1, t_eval, **common)
            except NativeUnavailable as exc:
                why = str(exc)
        if why and s.engine == "native":
            raise InputError(f"{spec.file}: solver.engine: native cannot run this spec: {why}")
    if solution is None:
        solution = solve(build_rhs(spec), y0, t0, t1, t_eval, compile=s.compile, **common)
        solution.extra["engine"] = "torch-compiled" if s.compile else "torch"
    solution.extra["device"] = str(device)
    return solution


