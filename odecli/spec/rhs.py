"""Turning a validated OdeSpec into the batched right-hand side ``f(t, y, p) -> dy/dt``.

Kept apart from validation because this is the only place that imports user Python code,
and it does so at build time (right before a run), never while a spec is being validated.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from odecli.errors import InputError
from odecli.spec.expr import compile_expression, expression_to_c
from odecli.spec.ode import OdeSpec

if TYPE_CHECKING:  # torch is imported where tensors are made, so checking a spec stays fast
    import torch
    from torch import Tensor

Rhs = Callable[["Tensor", "Tensor", "dict[str, Tensor]"], "Tensor"]


def build_rhs(spec: OdeSpec) -> Rhs:
    """``f(t, y, p)`` with t (batch,), y (batch, n_states), p name -> (batch,); returns (batch, n_states).

    Equations are compiled into safe closures; the result always has y's batch shape,
    dtype and device, even for constant right-hand sides. For ``python:`` the user's
    function is returned as is.
    """
    import torch

    if spec.python is not None:
        return _load_function(spec.python)
    assert spec.equations is not None
    names = set(spec.states) | set(spec.params) | {"t"}
    expressions = [
        compile_expression(spec.equations[s], names, spec.file, f"system.equations.{s}") for s in spec.states
    ]
    states = spec.states

    def rhs(t: Tensor, y: Tensor, p: dict[str, Tensor]) -> Tensor:
        env: dict[str, Tensor] = dict(p)
        env["t"] = t
        for i, state in enumerate(states):
            env[state] = y[..., i]
        shape = y.shape[:-1]
        return torch.stack([expr(env).to(y).expand(shape) for expr in expressions], dim=-1)

    return rhs


def build_c_equations(spec: OdeSpec) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The equations as C expressions over ``t``, ``y[i]`` and ``p[j]``, and the names behind ``p``.

    None for a ``python:`` right-hand side, which only PyTorch can run.
    """
    if spec.equations is None:
        return None
    params = tuple(spec.params)
    symbols = {"t": "t", **{s: f"y[{i}]" for i, s in enumerate(spec.states)},
               **{name: f"p[{j}]" for j, name in enumerate(params)}}
    equations = tuple(
        expression_to_c(spec.equations[s], symbols, spec.file, f"system.equations.{s}") for s in spec.states
    )
    return equations, params


def param_tensors(spec: OdeSpec, dtype: torch.dtype | str, device: torch.device | str) -> dict[str, Tensor]:
    """The spec's parameters as (batch,) tensors; ``dtype`` may be a name such as "float64"."""
    import torch

    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    return {name: torch.tensor(values, dtype=dtype, device=device) for name, values in spec.params.items()}


def _load_function(target: str) -> Rhs:
    """Import ``/abs/path.py:function`` from its file; failures become one-line InputErrors."""
    file, _, name = target.rpartition(":")
    path = Path(file)
    # A stable, path-derived module name: re-building reuses nothing stale and never clashes.
    module_name = "odecli_user_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    try:
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        if module_spec is None or module_spec.loader is None:
            raise ImportError("not a loadable Python file")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_name] = module  # some features (dataclasses, pickling) look the module up here
        module_spec.loader.exec_module(module)
    except BaseException as exc:  # user code may raise anything, including SystemExit
        sys.modules.pop(module_name, None)
        if isinstance(exc, KeyboardInterrupt):
            raise
        detail = " ".join(str(exc).split())
        raise InputError(f"{path}: cannot load: {type(exc).__name__}: {detail}") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise InputError(f"{path}: '{name}' is not a function after loading the module")
    return function
