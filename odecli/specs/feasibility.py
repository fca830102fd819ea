"""Failures a valid spec is certain to meet, found before anything is allocated or solved.

A spec can pass every field check and still be doomed: a GPU that is not there, a right-hand side
that is not finite at the initial state (every such sample fails at its first step), a PDE grid
whose fields alone exceed the machine's memory. ``odecli validate`` reports these like any other
field error, and ``solve``/``train-inverse`` refuse them the same way before starting, so that
validate predicts what a run will do.
"""

from __future__ import annotations

import ast
import math
import os
from typing import Any

import numpy as np

from odecli.errors import SpecError
from odecli.specs.expr import CONSTANTS, _parse

# numpy spellings of the expression language's functions (odecli.specs.expr.FUNCTIONS)
_NUMPY = {"sin": np.sin, "cos": np.cos, "tan": np.tan, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
          "tanh": np.tanh, "abs": np.abs, "min": np.minimum, "max": np.maximum}
_BINARY = {ast.Add: np.add, ast.Sub: np.subtract, ast.Mult: np.multiply, ast.Div: np.divide, ast.Pow: np.power}


def check_ode(spec: Any) -> None:
    """Raise the one-line :class:`SpecError` of the first certain failure of an ``OdeSpec``."""
    check_device(spec.file, "solver.device", spec.solver.device)
    if spec.equations is not None:
        check_initial_rhs(spec)


def check_pde(spec: dict, ranks: int = 1, ranks_here: int = 1) -> None:
    """The same for a validated ``kind: pde-inverse`` spec run on ``ranks`` ranks, ``ranks_here`` of
    them on this machine."""
    check_device(spec["file"], "compute.device", spec["compute"]["device"])
    check_threads(spec["file"], "compute.threads", spec["compute"]["threads"])
    check_pde_memory(spec, ranks, ranks_here)


def check_threads(file: str, field: str, threads: int) -> None:
    """More threads per rank than this machine has cores (``compute.threads: 100000`` passed
    validation, then crashed allocating per-thread buffers): refused with the count there is."""
    import os

    cores = os.cpu_count() or 1
    if threads > cores:
        raise SpecError(file, field, f"must be at most the {cores} CPU cores of this machine (0: share them), got {threads}")


def check_device(file: str, field: str, device: str) -> None:
    """A CUDA device that this machine does not have (``auto`` falls back to the CPU instead)."""
    if not str(device).startswith("cuda"):
        return
    import torch  # only for a spec that asks for a GPU

    if not torch.cuda.is_available():  # worded as odecli.app.solve.resolve_device words it at run time
        raise SpecError(file, field, f"device {device!r} requested but CUDA is not available; use cpu or auto")


def check_initial_rhs(spec: Any) -> None:
    """Every equation evaluated at every sample's initial state, in float64 as the solver would
    start: a NaN or infinity there fails the sample at its first step, with no step taken."""
    env: dict[str, np.ndarray] = {"t": np.asarray(spec.t_start, dtype=np.float64)}
    initial = np.asarray(spec.initial, dtype=np.float64)
    for i, state in enumerate(spec.states):
        env[state] = initial[:, i]
    for name, values in spec.params.items():
        env[name] = np.asarray(values, dtype=np.float64)
    for state, text in spec.equations.items():
        field = f"system.equations.{state}"
        tree, _ = _parse(text, spec.file, field)
        with np.errstate(all="ignore"):
            value = np.broadcast_to(_evaluate(tree.body, env), (spec.batch,))
        bad = np.flatnonzero(~np.isfinite(value))
        if bad.size:
            k = int(bad[0])
            raise SpecError(spec.file, field, f"{text!s} is {value[k]} at the initial state of sample {k} "
                                              f"(t = {env['t'][k]:g}){_more(bad.size)}: "
                                              f"{'those samples' if bad.size > 1 else 'that sample'} would fail at "
                                              f"{'their' if bad.size > 1 else 'its'} first step")


def _more(count: int) -> str:
    return f" and {count - 1} other sample{'s' if count > 2 else ''}" if count > 1 else ""


def _evaluate(node: ast.AST, env: dict[str, np.ndarray]) -> np.ndarray:
    """An expression tree the compiler in odecli.specs.expr has accepted, on float64 arrays (every
    number a float, so ``9**9**9**9`` overflows to inf instead of computing a huge integer)."""
    if isinstance(node, ast.Constant):
        return np.float64(node.value)
    if isinstance(node, ast.Name):
        return env[node.id] if node.id in env else np.float64(CONSTANTS[node.id])
    if isinstance(node, ast.UnaryOp):
        operand = _evaluate(node.operand, env)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp):
        return _BINARY[type(node.op)](_evaluate(node.left, env), _evaluate(node.right, env))
    if isinstance(node, ast.Call):
        return _NUMPY[node.func.id](*(_evaluate(arg, env) for arg in node.args))
    raise AssertionError(f"unexpected node {type(node).__name__} in a validated expression")


def check_pde_memory(spec: dict, ranks: int = 1, ranks_here: int = 1) -> None:
    """Refuse a problem that certainly does not fit in memory, from lower bounds of what any run
    needs: on the grid, two wave fields per shot (every scheme keeps at least the present and
    the past, or CG's solution and residual) and three more fields (the coefficient, its
    gradient, the absorbing profile); the observed and predicted traces; an MLP unknown's weights
    three times over (the weights, their gradient, the optimiser's state)."""
    file = spec["file"]
    ny, nx = spec["grid"]["shape"]
    itemsize = 4 if spec["compute"]["dtype"] == "float32" else 8
    shots = len(spec["sources"]["shots"])
    receivers = len(spec["receivers"]["points"])
    steps = spec["time"]["steps"]
    have = _physical_memory()
    fields = 2 * shots + 3
    need = fields * ny * nx * itemsize * ranks_here / ranks + 2 * shots * receivers * steps * itemsize * ranks_here
    if need > have:
        raise SpecError(file, "grid.shape",
                        f"a {ny} x {nx} grid with {shots} shots x {receivers} receivers x {steps} steps needs "
                        f"at least {need / 2**30:.3g} GiB{' on this machine' if ranks_here > 1 else ''}, "
                        f"more than this machine's {have / 2**30:.3g} GiB of memory")
    unknown = spec.get("unknown") or {}
    if unknown.get("type") == "mlp":
        hidden = unknown.get("hidden") or []
        hidden = [hidden] if isinstance(hidden, int) else list(hidden)
        weights = sum(a * b for a, b in zip(hidden, hidden[1:])) + 2 * hidden[0]  # and more: biases, features
        need = 3 * weights * itemsize * ranks_here  # replicated on every rank
        if need > have:
            raise SpecError(file, "unknown.hidden",
                            f"an MLP of {' x '.join(map(str, hidden))} hidden units has {weights:.3g} weights and "
                            f"needs at least {need / 2**30:.3g} GiB, more than this machine's "
                            f"{have / 2**30:.3g} GiB of memory")


def _physical_memory() -> float:
    try:
        return float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # not known on this platform: do not block the run
        return math.inf
