"""Turning a validated OdeSpec into the batched right-hand side ``f(t, y, p) -> dy/dt``.

Kept apart from validation because this is the only place that imports user Python code,
and it does so at build time (right before a run, with one probe call), never while a spec
is being validated.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from odecli.errors import SpecError
from odecli.specs.expr import compile_expression, expression_to_c
from odecli.specs.ode import OdeSpec

if TYPE_CHECKING:  # torch is imported where tensors are made, so checking a spec stays fast
    import torch
    from torch import Tensor

Rhs = Callable[["Tensor", "Tensor", "dict[str, Tensor]"], "Tensor"]
PYTHON_FIELD = "system.python"


def build_rhs(spec: OdeSpec, device: torch.device | str = "cpu") -> Rhs:
    """``f(t, y, p)`` with t (batch,), y (batch, n_states), p name -> (batch,); returns (batch, n_states).

    Equations are compiled into safe closures; the result always has y's batch shape,
    dtype and device, even for constant right-hand sides. For ``python:`` the user's
    function is probed once on ``device`` (:func:`_probe`: its result, and that it leaves its
    arguments alone) and then checked on every call (:func:`_checked`), since a function can
    behave on the probe and not later.
    """
    import torch

    if spec.python is not None:
        function = _load_function(spec)
        _probe(spec, function, device)
        return _checked(spec, function)
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


@contextmanager
def python_errors(spec: OdeSpec) -> Iterator[None]:
    """Turn an exception raised inside the spec's ``python:`` file into a one-line SpecError.

    Wraps a solve: an exception counts as the user's only when its traceback runs through that
    file, so odecli's own errors pass unchanged. It costs nothing until something is raised.
    """
    try:
        yield
    except BrokenContract as exc:  # a call of the function that returned the wrong thing (_checked)
        raise SpecError(spec.file, PYTHON_FIELD, f"{_where(spec)} {exc}") from None
    except (Exception, SystemExit) as exc:  # sys.exit() in the user's code too (issue 42)
        if spec.python is not None and _user_line(spec, exc) is not None:
            raise _raised(spec, exc) from exc
        raise


class BrokenContract(Exception):
    """A call of a ``python:`` function returned a wrong result or modified its input in place.

    Not an OdecliError: like an exception of the user's own code, it happens on one rank only,
    so the rank-failure path treats it as that rank's (abort), and :func:`python_errors` words it.
    """


def _checked(spec: OdeSpec, function: Rhs) -> Rhs:
    """``function`` with its contract checked on every call, at O(1) cost per call.

    The result must be a tensor of y's shape, dtype and device; y and the parameters must be
    left alone, which their version counters tell without a copy (torch bumps a tensor's
    ``_version`` on every in-place change). Measured on the shared 2-core VM (timeit, best of 5):
    8.7 us a call checked against 6.2 us unchecked for ``-k * y``, at B = 2 and at B = 1024 alike,
    so about 2.5 us a call whatever the batch; a copy-and-compare of y would grow with it. Inside
    ``torch.compile`` tracing the function runs unchecked (the eager calls are checked).
    """
    import torch

    def versions(y: Tensor, p: dict[str, Tensor]) -> tuple[int, ...]:
        try:
            return (y._version, *(v._version for v in p.values() if isinstance(v, torch.Tensor)))
        except RuntimeError:  # inference tensors keep no version counter
            return ()

    def rhs(t: Tensor, y: Tensor, p: dict[str, Tensor]) -> Tensor:
        if torch.compiler.is_compiling():
            return function(t, y, p)
        before = versions(y, p)
        out = function(t, y, p)
        problem = _result_problem(out, y)
        if problem is None and versions(y, p) != before:
            problem = ("modified y or a parameter in place; it must leave its arguments unchanged and "
                       "return dy/dt as a new tensor")
        if problem is not None:
            raise BrokenContract(problem)
        return out

    rhs.__wrapped__ = function  # type: ignore[attr-defined]
    return rhs


def _result_problem(out: object, y: Tensor) -> str | None:
    """What is wrong with a result ``out`` for the state ``y``; None when it is right."""
    import torch

    shape = tuple(y.shape)
    if not isinstance(out, torch.Tensor):
        return f"returned {type(out).__name__}, expected a torch.Tensor of shape {shape} (batch, states)"
    if tuple(out.shape) != shape:
        return f"returned shape {tuple(out.shape)}, expected {shape} (batch, states)"
    if out.dtype != y.dtype or out.device != y.device:
        return f"returned {_dtype(out)} on {out.device}, expected y's {_dtype(y)} on {y.device}"
    return None


def _probe(spec: OdeSpec, function: Rhs, device: torch.device | str) -> None:
    """Call the user's function once on the spec's initial state, at the solver's dtype.

    A result of the wrong shape would broadcast and an argument modified in place would corrupt
    the solver's state, both silently, so they fail here, once, before the solve. Any
    exception of this call is the function's own, a wrong number of arguments included.
    """
    import torch

    dtype = getattr(torch, spec.solver.dtype)
    t = torch.tensor(spec.t_start, dtype=dtype, device=device)
    y = torch.tensor(spec.initial, dtype=dtype, device=device)
    p = param_tensors(spec, dtype, device)
    arguments = {"t": t, "y": y, **{f"p[{name!r}]": value for name, value in p.items()}}
    copies = {name: value.clone() for name, value in arguments.items()}
    try:
        out = function(t, y, p)
    except (Exception, SystemExit) as exc:
        raise _raised(spec, exc) from exc
    where = _where(spec)
    problem = _result_problem(out, y)
    if problem is None:
        changed = [name for name, value in arguments.items() if not _same(value, copies[name])]
        if not changed:
            return
        problem = (f"modified {changed[0]} in place; it must leave its arguments unchanged "
                   "and return dy/dt as a new tensor")
    raise SpecError(spec.file, PYTHON_FIELD, f"{where} {problem}")


def _same(value: Tensor, copy: Tensor) -> bool:
    """Equal shapes and values, NaN equal to NaN."""
    import torch

    return value.shape == copy.shape and bool(torch.isclose(value, copy, rtol=0, atol=0, equal_nan=True).all())


def _dtype(tensor: Tensor) -> str:
    """``float64``, the name ``solver.dtype`` uses, not ``torch.float64``."""
    return str(tensor.dtype).removeprefix("torch.")


def _where(spec: OdeSpec) -> str:
    """``file.py:function``, the file relative to the spec's folder when it lies inside it."""
    assert spec.python is not None
    file, _, name = spec.python.rpartition(":")
    path, folder = Path(file), Path(spec.file).resolve().parent
    return f"{path.relative_to(folder) if path.is_relative_to(folder) else path}:{name}"


def _user_line(spec: OdeSpec, exc: BaseException) -> int | None:
    """The innermost line of the user's file in the exception's traceback; None if it has none."""
    assert spec.python is not None
    file, line, tb = spec.python.rpartition(":")[0], None, exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == file:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _raised(spec: OdeSpec, exc: BaseException) -> SpecError:
    """The one-line error for an exception of the user's function."""
    return SpecError(spec.file, PYTHON_FIELD, f"{_where(spec)} raised {_exception(spec, exc)}")


def _exception(spec: OdeSpec, exc: BaseException) -> str:
    """``Type: message`` on one line, with the line of the user's file it came from when known."""
    detail = " ".join(str(exc).split())
    line = _user_line(spec, exc)
    return type(exc).__name__ + (f": {detail}" if detail else "") + (f" (line {line})" if line is not None else "")


def _load_function(spec: OdeSpec) -> Rhs:
    """Import the ``python:`` function from its file; failures become one-line SpecErrors."""
    assert spec.python is not None
    file, _, name = spec.python.rpartition(":")
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
        raise SpecError(spec.file, PYTHON_FIELD, f"cannot load {_where(spec)}: {_exception(spec, exc)}") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise SpecError(spec.file, PYTHON_FIELD, f"{_where(spec)} is not a function after loading the module")
    return function
