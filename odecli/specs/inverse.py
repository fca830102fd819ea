"""Validation of the ``inverse:`` section of a ``kind: ode`` spec (``odecli train-inverse``).

The ODE validator rejects unknown top-level keys, so :func:`load_ode_inverse_spec` takes
``inverse`` out of the loaded mapping, validates the rest as an ordinary ODE spec and then the
inverse section against it. Every problem is a one-line :class:`SpecError` with a dotted path::

    inverse:
      unknowns:
        params:                       # names from system.params
          mu: {per_sample: true, init: 1.0, bounds: [0.1, 10]}
        initial:                      # names from system.states (initial values)
          x: {per_sample: false}      # init defaults to the spec's value
      data:
        file: truth.h5                # output of `odecli solve` (t, y per sample) ...
        truth: {params: {mu: [...]}, initial: {...}}   # ... or synthesise from true values
        noise: 0.01                   # Gaussian noise std (relative: true -> times |y|)
        relative: false
        seed: 0
      observed: [x]                   # default: every state
      loss: {type: mse, weights: {x: 1.0}}
      optimizer: {type: lbfgs, lr: 1.0, iterations: 50, tol: 1e-10, gtol: 0, history: 10}
      adjoint: direct                 # direct | backsolve | checkpoint (default: solver.adjoint)
      checkpoint: {every: 10}         # iterations between OUT.ckpt.h5 checkpoints (0: none)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from odecli.errors import SpecError
from odecli.specs.loader import describe, load_yaml
from odecli.specs.ode import OdeSpec, parse_ode_spec

# The section's keys, enums and lower limits. The JSON Schema (odecli.specs.schema) is built from
# these same tables, so an editor completes and checks exactly what this validator accepts.
INVERSE_KEYS = ("unknowns", "data", "observed", "loss", "optimizer", "adjoint", "checkpoint")
VALUE_GROUPS = ("params", "initial")  # keys of unknowns and of data.truth
UNKNOWN_KEYS = ("per_sample", "init", "bounds")
DATA_KEYS = ("file", "truth", "noise", "relative", "seed")
LOSS_KEYS = ("type", "weights")
LOSS_TYPES = ("mse",)
OPTIMIZER_KEYS = ("type", "lr", "iterations", "tol", "gtol", "history")
CHECKPOINT_KEYS = ("every",)
OPTIMIZERS = ("adam", "lbfgs")
ADJOINT_MODES = ("direct", "backsolve", "checkpoint")
OPTIMIZER_DEFAULTS = {"adam": {"lr": 0.05, "iterations": 200}, "lbfgs": {"lr": 1.0, "iterations": 50}}
CHECKPOINT_EVERY = 10


@dataclass(frozen=True)
class Minimum:
    """A number's lower limit; exclusive when the limit itself is rejected (a learning rate of 0)."""

    value: float
    exclusive: bool = False


# Lower limits by field path (loss.weights: each weight).
NUMBER_MINIMUMS = {
    "data.noise": Minimum(0.0),
    "loss.weights": Minimum(0.0),
    "optimizer.lr": Minimum(0.0, exclusive=True),
    "optimizer.tol": Minimum(0.0),
    "optimizer.gtol": Minimum(0.0),
}
INTEGER_MINIMUMS = {"data.seed": 0, "optimizer.iterations": 1, "optimizer.history": 1, "checkpoint.every": 0}


@dataclass(frozen=True)
class UnknownSpec:
    name: str
    kind: str  # "param" or "initial"
    per_sample: bool
    init: tuple[float, ...]  # length batch (per-sample) or 1 (shared)
    lower: float
    upper: float

    @property
    def label(self) -> str:
        return self.name if self.kind == "param" else f"initial.{self.name}"


@dataclass(frozen=True)
class DataSpec:
    file: str | None  # resolved path of an `odecli solve` output, or None for synthetic data
    truth_params: dict[str, tuple[float, ...]]  # per-sample true values (synthetic), expanded to batch
    truth_initial: dict[str, tuple[float, ...]]
    noise: float
    relative: bool
    seed: int


@dataclass(frozen=True)
class InverseSpec:
    unknowns: tuple[UnknownSpec, ...]
    data: DataSpec
    observed: tuple[str, ...]
    weights: tuple[float, ...]  # one per observed state
    optimizer: str
    lr: float
    iterations: int
    tol: float
    gtol: float
    history: int
    adjoint: str
    checkpoint_every: int  # iterations between checkpoints for --resume; 0: none


def load_ode_inverse_spec(path: str | Path) -> tuple[OdeSpec, InverseSpec]:
    data, text = load_yaml(path)
    return parse_ode_inverse_spec(data, text, str(path))


def parse_ode_inverse_spec(data: dict[str, Any], text: str, file: str) -> tuple[OdeSpec, InverseSpec]:
    if "inverse" not in data:
        raise SpecError(file, "inverse", "required section is missing for train-inverse on a kind: ode spec")
    ode = parse_ode_spec({k: v for k, v in data.items() if k != "inverse"}, text, file)
    return ode, parse_inverse(data["inverse"], ode, file)


def parse_inverse(section: Any, ode: OdeSpec, file: str) -> InverseSpec:
    def fail(field: str, message: str):
        raise SpecError(file, f"inverse.{field}" if field else "inverse", message)

    section = _mapping(section, "", INVERSE_KEYS, fail)
    unknowns = _unknowns(section.get("unknowns"), ode, fail)
    data = _data(section.get("data"), ode, file, fail)
    observed = _observed(section.get("observed"), ode, fail)
    weights = _loss(section.get("loss"), observed, fail)
    opt = _optimizer(section.get("optimizer"), fail)
    adjoint = section.get("adjoint", ode.solver.adjoint)
    if adjoint not in ADJOINT_MODES:
        fail("adjoint", f"expected one of {', '.join(ADJOINT_MODES)}, got {describe(adjoint)}")
    every = _mapping(section.get("checkpoint"), "checkpoint", CHECKPOINT_KEYS, fail).get("every", CHECKPOINT_EVERY)
    every = _count(every, "checkpoint.every", fail, " (0: no checkpoints)")
    return InverseSpec(unknowns=unknowns, data=data, observed=observed, weights=weights, adjoint=adjoint,
                       checkpoint_every=every, **opt)


def _mapping(value: Any, field: str, keys: tuple[str, ...], fail) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        fail(field, f"expected a mapping, got {describe(value)}")
    for key in value:
        if key not in keys:
            where = f"{field}.{key}" if field else str(key)
            fail(where, f"unknown key; expected one of {', '.join(keys)}")
    return value


def _number(value: Any, field: str, fail, *, finite: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        fail(field, f"expected a number, got {describe(value)}")
    value = float(value)
    if math.isnan(value) or (finite and math.isinf(value)):
        fail(field, f"expected a finite number, got {value!r}")
    return value


def _limited(value: Any, path: str, fail, field: str | None = None) -> float:
    """A finite number held to its NUMBER_MINIMUMS[path] entry, the limit the schema states too;
    ``field`` names it in the error where that is finer than ``path`` (one of loss.weights)."""
    field = field or path
    number = _number(value, field, fail)
    limit = NUMBER_MINIMUMS[path]
    if number < limit.value or (limit.exclusive and number == limit.value):
        fail(field, f"must be {'>' if limit.exclusive else '>='} {limit.value:g}, got {number:g}")
    return number


def _count(value: Any, field: str, fail, note: str = "") -> int:
    """An integer (not a bool, not 2.0) held to its INTEGER_MINIMUMS[field] entry."""
    minimum = INTEGER_MINIMUMS[field]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        fail(field, f"expected an integer >= {minimum}{note}, got {describe(value)}")
    return value


def _per_sample(value: Any, field: str, batch: int, fail) -> tuple[float, ...]:
    if isinstance(value, list):
        if len(value) not in (1, batch):
            fail(field, f"list has {len(value)} entries, expected 1 or batch={batch}")
        numbers = tuple(_number(v, f"{field}[{i}]", fail) for i, v in enumerate(value))
        return numbers * batch if len(numbers) == 1 else numbers
    return (_number(value, field, fail),) * batch


def _unknowns(value: Any, ode: OdeSpec, fail) -> tuple[UnknownSpec, ...]:
    if value is None:
        fail("unknowns", "required key is missing; name at least one of params or initial")
    section = _mapping(value, "unknowns", VALUE_GROUPS, fail)
    unknowns: list[UnknownSpec] = []
    for kind, group, names in zip(("param", "initial"), VALUE_GROUPS, (tuple(ode.params), ode.states)):
        entries = section.get(group) or {}
        if not isinstance(entries, dict):
            fail(f"unknowns.{group}", f"expected a mapping of name: settings, got {describe(entries)}")
        for name, settings in entries.items():
            field = f"unknowns.{group}.{name}"
            if name not in names:
                what = "system.params" if kind == "param" else "system.states"
                fail(field, f"not in {what} ({', '.join(names) or 'none'})")
            settings = _mapping(settings, field, UNKNOWN_KEYS, fail)
            per_sample = settings.get("per_sample", True)
            if not isinstance(per_sample, bool):
                fail(f"{field}.per_sample", f"expected true or false, got {describe(per_sample)}")
            lower, upper = -math.inf, math.inf
            if "bounds" in settings:
                bounds = settings["bounds"]
                if not isinstance(bounds, list) or len(bounds) != 2:
                    fail(f"{field}.bounds", f"expected [lower, upper], got {describe(bounds)}")
                lower = _number(bounds[0], f"{field}.bounds[0]", fail, finite=False)
                upper = _number(bounds[1], f"{field}.bounds[1]", fail, finite=False)
                if not lower < upper:
                    fail(f"{field}.bounds", f"lower must be < upper, got [{lower:g}, {upper:g}]")
            if "init" in settings:
                init = _per_sample(settings["init"], f"{field}.init", ode.batch, fail)
            elif kind == "param":
                init = tuple(ode.params[name])
            else:
                init = tuple(row[ode.states.index(name)] for row in ode.initial)
            if not per_sample:
                if len(set(init)) != 1:
                    fail(f"{field}.init", "a shared unknown needs one initial value (give init: a number)")
                init = init[:1]
            for i, v in enumerate(init):
                if not lower <= v <= upper:
                    fail(f"{field}.init", f"initial value {v:g} (sample {i}) lies outside bounds [{lower:g}, {upper:g}]")
            unknowns.append(UnknownSpec(name, kind, per_sample, init, lower, upper))
    if not unknowns:
        fail("unknowns", "no unknowns given; name at least one under params or initial")
    return tuple(unknowns)


def _data(value: Any, ode: OdeSpec, file: str, fail) -> DataSpec:
    if value is None:
        fail("data", "required key is missing; give data.file (an odecli solve output) or data.truth")
    section = _mapping(value, "data", DATA_KEYS, fail)
    has_file, has_truth = "file" in section, "truth" in section
    if has_file == has_truth:
        fail("data", f"give exactly one of 'file' or 'truth', got {'both' if has_file else 'neither'}")
    path = None
    truth_params: dict[str, tuple[float, ...]] = {}
    truth_initial: dict[str, tuple[float, ...]] = {}
    if has_file:
        raw = section["file"]
        if not isinstance(raw, str) or not raw.strip():
            fail("data.file", f"expected a file name, got {describe(raw)}")
        candidate = Path(raw).expanduser()
        if not candidate.is_absolute():
            candidate = Path(file).resolve().parent / candidate
        path = str(candidate)
    else:
        truth = _mapping(section["truth"], "data.truth", VALUE_GROUPS, fail)
        for group, names, out in zip(VALUE_GROUPS, (tuple(ode.params), ode.states), (truth_params, truth_initial)):
            entries = truth.get(group) or {}
            if not isinstance(entries, dict):
                fail(f"data.truth.{group}", f"expected a mapping of name: value(s), got {describe(entries)}")
            for name, raw in entries.items():
                if name not in names:
                    fail(f"data.truth.{group}.{name}", f"not a known {'parameter' if group == 'params' else 'state'}")
                out[name] = _per_sample(raw, f"data.truth.{group}.{name}", ode.batch, fail)
    noise = _limited(section.get("noise", 0.0), "data.noise", fail)
    relative = section.get("relative", False)
    if not isinstance(relative, bool):
        fail("data.relative", f"expected true or false, got {describe(relative)}")
    seed = _count(section.get("seed", 0), "data.seed", fail)
    return DataSpec(path, truth_params, truth_initial, noise, relative, seed)


def _observed(value: Any, ode: OdeSpec, fail) -> tuple[str, ...]:
    if value is None:
        return ode.states
    if not isinstance(value, list) or not value:
        fail("observed", f"expected a non-empty list of state names, got {describe(value)}")
    for i, name in enumerate(value):
        if name not in ode.states:
            fail(f"observed[{i}]", f"{describe(name)} is not a state ({', '.join(ode.states)})")
    if len(set(value)) != len(value):
        fail("observed", "a state is listed twice")
    return tuple(value)


def _loss(value: Any, observed: tuple[str, ...], fail) -> tuple[float, ...]:
    section = _mapping(value, "loss", LOSS_KEYS, fail)
    kind = section.get("type", LOSS_TYPES[0])
    if kind not in LOSS_TYPES:
        fail("loss.type", f"expected one of {', '.join(LOSS_TYPES)}, got {describe(kind)}")
    weights = section.get("weights") or {}
    if not isinstance(weights, dict):
        fail("loss.weights", f"expected a mapping of state: weight, got {describe(weights)}")
    for name in weights:
        if name not in observed:
            fail(f"loss.weights.{name}", f"not an observed state ({', '.join(observed)})")
    out = []
    for name in observed:
        out.append(_limited(weights.get(name, 1.0), "loss.weights", fail, f"loss.weights.{name}"))
    if not any(out):
        fail("loss.weights", "every weight is zero")
    return tuple(out)


def _optimizer(value: Any, fail) -> dict[str, Any]:
    section = _mapping(value, "optimizer", OPTIMIZER_KEYS, fail)
    kind = section.get("type", "lbfgs")
    if kind not in OPTIMIZERS:
        fail("optimizer.type", f"expected one of {', '.join(OPTIMIZERS)}, got {describe(kind)}")
    defaults = OPTIMIZER_DEFAULTS[kind]
    out: dict[str, Any] = {"optimizer": kind, "lr": _limited(section.get("lr", defaults["lr"]), "optimizer.lr", fail)}
    for key, default in (("iterations", defaults["iterations"]), ("history", 10)):
        out[key] = _count(section.get(key, default), f"optimizer.{key}", fail)
    for key, default in (("tol", 1e-10), ("gtol", 0.0)):
        out[key] = _limited(section.get(key, default), f"optimizer.{key}", fail)
    return out
