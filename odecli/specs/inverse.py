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
        events:                       # event times as observations (names from events:)
          ground: {occurrences: 1, weight: 1.0}   # each sample's first N times of this event
      observed: [x]                   # default: every state (none when data.events is given)
      loss: {type: mse, weights: {x: 1.0}}
      optimizer: {type: lbfgs, learning_rate: 1.0, iterations: 50, tolerance: 1e-10, gtol: 0, history_size: 10}
      adjoint: direct                 # direct | backsolve | checkpoint (default: solver.adjoint)
      checkpoint: {every: 10}         # iterations between OUT.ckpt.h5 checkpoints (0: none)

The section is declared below as msgspec Structs (odecli.specs.declare): the same declarations
check it and give its JSON Schema. The optimizer keys are those of a pde-inverse spec
(``learning_rate``, ``tolerance``, ``history_size``); the former ``lr``, ``tol`` and ``history``
are refused with a did-you-mean naming the new key. The parsed optimizer is an
:class:`odecli.optim.settings.OptimizerSettings`, as a PDE fit's is.

Event times as observations (``data.events``): each named event of the spec's ``events:``
contributes its first ``occurrences`` times per sample, taken from the true solve (``truth``) or
from the file's ``events/NAME/t`` (``file``); the loss adds their weighted mean squared error to
the trajectories'. Event times are differentiated by the implicit function theorem in the direct
gradient only, so a spec with ``events:`` fits with ``adjoint: direct``.
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Union

import msgspec
from msgspec import UNSET, Meta, UnsetType

from odecli.errors import SpecError
from odecli.optim.settings import OptimizerSettings
from odecli.specs.declare import INFINITE, Problems, Section, expected, read
from odecli.specs.loader import describe, load_yaml
from odecli.specs.ode import OdeSpec, parse_ode_spec
from odecli.specs.ode_values import PerSample

Bounds = Annotated[tuple[float, float], expected("[lower, upper]", INFINITE,
                                                 description="[lower, upper] (.inf: unbounded); init must lie inside")]
Weight = Annotated[float, Meta(ge=0, description="weight of this state (default 1)")]


class UnknownSettings(Section, frozen=True):
    """how to fit this value"""

    null_is_default: ClassVar[bool] = False
    per_sample: Annotated[bool, Meta(description="one value per sample (default), or false: one shared")] = True
    init: Union[Annotated[PerSample, Meta(description="starting value, or one per sample; default: the spec's")],
                UnsetType] = UNSET
    bounds: Union[Bounds, UnsetType] = UNSET


class UnknownGroups(Section, frozen=True):
    """the values to fit (at least one)"""

    params: Annotated[dict[str, UnknownSettings], Meta(description="parameters to fit, names from system.params")] = {}
    initial: Annotated[dict[str, UnknownSettings],
                       Meta(description="initial values to fit, names from system.states")] = {}


class TruthValues(Section, frozen=True):
    """synthesise the observations by solving with these true values"""

    params: Annotated[dict[str, PerSample], Meta(description="true parameter values (one, or one per sample)")] = {}
    initial: Annotated[dict[str, PerSample], Meta(description="true initial values (one, or one per sample)")] = {}


class ObservedEvent(Section, frozen=True):
    """an event whose times are observed"""

    null_is_default: ClassVar[bool] = False
    occurrences: Annotated[int, Meta(ge=1, le=10_000, description=(
        "each sample's first N occurrences are observed (default 1)"))] = 1
    weight: Annotated[float, Meta(ge=0, description="weight of these times in the loss (default 1)")] = 1.0


class DataSource(Section, frozen=True):
    """the observations: exactly one of file or truth"""

    null_is_default: ClassVar[bool] = False
    file: Union[Annotated[str, expected("a file name", pattern=r"\S", description=(
        "an odecli solve output (t, y per sample), relative to the spec's folder"))], UnsetType] = UNSET
    truth: Union[TruthValues, UnsetType] = UNSET
    noise: Annotated[float, Meta(ge=0, description="Gaussian noise std added to the observations")] = 0.0
    relative: Annotated[bool, Meta(description="true: the noise std is relative to |y|")] = False
    seed: Annotated[int, Meta(ge=0, description="seed of the noise")] = 0
    events: Annotated[dict[str, ObservedEvent], Meta(description=(
        "event times as observations: names from events:, each with its occurrences and weight"))] = {}


class Loss(Section, frozen=True):
    """misfit between solution and data"""

    null_is_default: ClassVar[bool] = False
    type: Annotated[Literal["mse"], Meta(description="mean squared error")] = "mse"
    weights: Annotated[dict[str, Weight], Meta(description="weights of observed states")] = {}


class Optimizer(Section, frozen=True):
    """learning_rate and iterations default by type: adam 0.05 and 200, lbfgs 1 and 50"""

    null_is_default: ClassVar[bool] = False
    renamed: ClassVar[dict[str, str]] = {"lr": "learning_rate", "tol": "tolerance", "history": "history_size"}
    type: Annotated[Literal["adam", "lbfgs"], Meta(description="Adam, or L-BFGS with a line search")] = "lbfgs"
    learning_rate: Union[Annotated[float, Meta(gt=0, description="Adam's step; L-BFGS's first step length")],
                         UnsetType] = UNSET
    iterations: Union[Annotated[int, Meta(ge=1, description="most iterations (--iterations overrides)")],
                      UnsetType] = UNSET
    tolerance: Annotated[float, Meta(ge=0, description="stop when the loss changes by at most this (relative)")] = 1e-10
    gtol: Annotated[float, Meta(ge=0, description="stop when |gradient| is at most this")] = 0.0
    history_size: Annotated[int, Meta(ge=1, description="L-BFGS history length")] = 10
    betas: Annotated[tuple[Annotated[float, Meta(ge=0)], Annotated[float, Meta(ge=0)]],
                     Meta(description="Adam's moment decay rates [beta1, beta2]")] = (0.9, 0.999)
    # ODE fits have always tried up to 30 steps per line search (PDE fits: 12)
    max_line_search: Annotated[int, Meta(ge=1, description="L-BFGS: trial steps per line search")] = 30


class Checkpoint(Section, frozen=True):
    """checkpoints of the fit"""

    null_is_default: ClassVar[bool] = False
    every: Annotated[int, Meta(ge=0, description="iterations between OUT.ckpt.h5 checkpoints (--resume); 0: none")] = 10


def _given(key: str) -> dict[str, Any]:
    return {"required": [key], "properties": {key: {"not": {"type": "null"}}}}


class InverseSection(Section, frozen=True):
    """parameter estimation (odecli train-inverse)"""

    null_is_default: ClassVar[bool] = False
    unknowns: Annotated[UnknownGroups, Meta(
        extra={"missing": "; name at least one of params or initial"},
        # at least one group that names a value: an empty group is read as none
        extra_json_schema={"anyOf": [{"required": [group], "properties": {group: {"type": "object", "minProperties": 1}}}
                                     for group in ("params", "initial")]})]
    data: Annotated[DataSource, Meta(extra={"missing": "; give data.file (an odecli solve output) or data.truth"},
                                     extra_json_schema={"oneOf": [_given("file"), _given("truth")]})]
    observed: Union[Annotated[list[str], expected("a non-empty list of state names", min_length=1, extra_json_schema={
        "uniqueItems": True, "description": (
            "states compared with the data; default: every state, or none when data.events is given")})],
        UnsetType] = UNSET
    loss: Loss = msgspec.field(default_factory=Loss)
    optimizer: Optimizer = msgspec.field(default_factory=Optimizer)
    adjoint: Union[Annotated[Literal["direct", "backsolve", "checkpoint"], Meta(
        description="how gradients are computed; default: solver.adjoint")], UnsetType] = UNSET
    checkpoint: Checkpoint = msgspec.field(default_factory=Checkpoint)


def _keys(section: type[Section]) -> tuple[str, ...]:
    return tuple(section.__struct_fields__)


def _choices(section: type[Section], name: str) -> tuple[str, ...]:
    annotation = typing.get_type_hints(section, include_extras=True)[name]
    while typing.get_origin(annotation) is not Literal:
        annotation = typing.get_args(annotation)[0]
    return typing.get_args(annotation)


# The keys, choices and limits of the declarations above, by name (tests check the schema against them).
INVERSE_KEYS = _keys(InverseSection)
VALUE_GROUPS = _keys(UnknownGroups)  # keys of unknowns and of data.truth
UNKNOWN_KEYS = _keys(UnknownSettings)
DATA_KEYS = _keys(DataSource)
OBSERVED_EVENT_KEYS = _keys(ObservedEvent)
LOSS_KEYS = _keys(Loss)
LOSS_TYPES = _choices(Loss, "type")
OPTIMIZER_KEYS = _keys(Optimizer)
CHECKPOINT_KEYS = _keys(Checkpoint)
OPTIMIZERS = _choices(Optimizer, "type")
ADJOINT_MODES = _choices(InverseSection, "adjoint")
OPTIMIZER_DEFAULTS = {"adam": {"learning_rate": 0.05, "iterations": 200},
                      "lbfgs": {"learning_rate": 1.0, "iterations": 50}}
CHECKPOINT_EVERY = Checkpoint().every


@dataclass(frozen=True)
class Minimum:
    """A number's lower limit; exclusive when the limit itself is rejected (a learning rate of 0)."""

    value: float
    exclusive: bool = False


def _minimums(section: type[Section], prefix: str = "") -> tuple[dict[str, Minimum], dict[str, int]]:
    """The lower limits declared in ``section`` by dotted path (a mapping's values under its own path)."""
    numbers: dict[str, Minimum] = {}
    integers: dict[str, int] = {}
    for name, annotation in typing.get_type_hints(section, include_extras=True).items():
        if name in ("null_is_default", "renamed"):
            continue
        path = f"{prefix}{name}"
        stack = [annotation]
        while stack:
            tp = stack.pop()
            origin = typing.get_origin(tp)
            if isinstance(tp, type) and issubclass(tp, Section):
                sub_numbers, sub_integers = _minimums(tp, path + ".")
                numbers.update(sub_numbers)
                integers.update(sub_integers)
            elif origin is Annotated:
                base = typing.get_args(tp)[0]
                for meta in tp.__metadata__:
                    if base in (float, int) and isinstance(meta, Meta) and (meta.ge, meta.gt) != (None, None):
                        if base is int:
                            integers[path] = meta.ge if meta.ge is not None else meta.gt + 1
                        else:
                            numbers[path] = Minimum(meta.gt, True) if meta.gt is not None else Minimum(meta.ge)
                stack.append(base)
            elif origin is dict:
                stack.append(typing.get_args(tp)[1])
            elif origin is Union:
                stack += list(typing.get_args(tp))
    return numbers, integers


NUMBER_MINIMUMS, INTEGER_MINIMUMS = _minimums(InverseSection)


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
class EventObservation:
    """An event of the spec whose first ``occurrences`` times per sample are observations."""

    name: str
    occurrences: int
    weight: float


@dataclass(frozen=True)
class DataSpec:
    file: str | None  # resolved path of an `odecli solve` output, or None for synthetic data
    truth_params: dict[str, tuple[float, ...]]  # per-sample true values (synthetic), expanded to batch
    truth_initial: dict[str, tuple[float, ...]]
    noise: float
    relative: bool
    seed: int
    events: tuple[EventObservation, ...] = ()


@dataclass(frozen=True)
class InverseSpec:
    unknowns: tuple[UnknownSpec, ...]
    data: DataSpec
    observed: tuple[str, ...]
    weights: tuple[float, ...]  # one per observed state
    optimizer: OptimizerSettings
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
    """The declared pass (keys, types, limits), then the checks against the ODE spec."""
    report = Problems(file)

    def fail(field: str, message: str) -> typing.NoReturn:
        raise SpecError(file, f"inverse.{field}" if field else "inverse", message)

    declared: InverseSection = read(section, InverseSection, "inverse", report)
    unknowns = _unknowns(declared.unknowns, ode, fail)
    data = _data(declared.data, ode, file, fail)
    observed = _observed(declared.observed, ode, fail, bool(data.events))
    weights = _weights(declared.loss.weights, observed, fail, data.events)
    opt = declared.optimizer
    defaults = OPTIMIZER_DEFAULTS[opt.type]
    optimizer = OptimizerSettings(
        type=opt.type,
        learning_rate=float(defaults["learning_rate"] if opt.learning_rate is UNSET else opt.learning_rate),
        iterations=int(defaults["iterations"] if opt.iterations is UNSET else opt.iterations),
        tolerance=float(opt.tolerance), gtol=float(opt.gtol), history_size=opt.history_size,
        betas=tuple(float(b) for b in opt.betas), max_line_search=opt.max_line_search,
    )
    adjoint = ode.solver.adjoint if declared.adjoint is UNSET else declared.adjoint
    if ode.events and adjoint != "direct":
        field = "adjoint" if declared.adjoint is not UNSET else ""
        fail(field, f"a spec with events: fits with adjoint: direct (event times are differentiated in the direct "
                    f"gradient only), got {adjoint}")
    return InverseSpec(unknowns=unknowns, data=data, observed=observed, weights=weights, optimizer=optimizer,
                       adjoint=adjoint, checkpoint_every=declared.checkpoint.every)


def _per_sample(value: float | list[float], field: str, batch: int, fail) -> tuple[float, ...]:
    if isinstance(value, list):
        if len(value) not in (1, batch):
            fail(field, f"list has {len(value)} entries, expected 1 or batch={batch}")
        numbers = tuple(float(v) for v in value)
        return numbers * batch if len(numbers) == 1 else numbers
    return (float(value),) * batch


def _unknowns(groups: UnknownGroups, ode: OdeSpec, fail) -> tuple[UnknownSpec, ...]:
    unknowns: list[UnknownSpec] = []
    for kind, group, names in zip(("param", "initial"), VALUE_GROUPS, (tuple(ode.params), ode.states)):
        for name, settings in getattr(groups, group).items():
            field = f"unknowns.{group}.{name}"
            if name not in names:
                what = "system.params" if kind == "param" else "system.states"
                fail(field, f"not in {what} ({', '.join(names) or 'none'})")
            lower, upper = -math.inf, math.inf
            if settings.bounds is not UNSET:
                lower, upper = (float(b) for b in settings.bounds)
                if not lower < upper:
                    fail(f"{field}.bounds", f"lower must be < upper, got [{lower:g}, {upper:g}]")
            if settings.init is not UNSET:
                init = _per_sample(settings.init, f"{field}.init", ode.batch, fail)
            elif kind == "param":
                init = tuple(ode.params[name])
            else:
                init = tuple(row[ode.states.index(name)] for row in ode.initial)
            if not settings.per_sample:
                if len(set(init)) != 1:
                    fail(f"{field}.init", "a shared unknown needs one initial value (give init: a number)")
                init = init[:1]
            for i, v in enumerate(init):
                if not lower <= v <= upper:
                    fail(f"{field}.init", f"initial value {v:g} (sample {i}) lies outside bounds [{lower:g}, {upper:g}]")
            unknowns.append(UnknownSpec(name, kind, settings.per_sample, init, lower, upper))
    if not unknowns:
        fail("unknowns", "no unknowns given; name at least one under params or initial")
    return tuple(unknowns)


def _data(source: DataSource, ode: OdeSpec, file: str, fail) -> DataSpec:
    has_file, has_truth = source.file is not UNSET, source.truth is not UNSET
    if has_file == has_truth:
        fail("data", f"give exactly one of 'file' or 'truth', got {'both' if has_file else 'neither'}")
    path = None
    truth_params: dict[str, tuple[float, ...]] = {}
    truth_initial: dict[str, tuple[float, ...]] = {}
    if has_file:
        candidate = Path(source.file).expanduser()
        if not candidate.is_absolute():
            candidate = Path(file).resolve().parent / candidate
        path = str(candidate)
    else:
        for group, names, out in zip(VALUE_GROUPS, (tuple(ode.params), ode.states), (truth_params, truth_initial)):
            for name, raw in getattr(source.truth, group).items():
                if name not in names:
                    fail(f"data.truth.{group}.{name}", f"not a known {'parameter' if group == 'params' else 'state'}")
                out[name] = _per_sample(raw, f"data.truth.{group}.{name}", ode.batch, fail)
    events = []
    known = [event.name for event in ode.events]
    for name, settings in source.events.items():
        if name not in known:
            fail(f"data.events.{name}", f"not an event of events: ({', '.join(known) or 'none'})")
        events.append(EventObservation(name, settings.occurrences, float(settings.weight)))
    return DataSpec(path, truth_params, truth_initial, float(source.noise), source.relative, source.seed,
                    tuple(events))


def _observed(value: list[str] | UnsetType, ode: OdeSpec, fail, events_observed: bool) -> tuple[str, ...]:
    if value is UNSET:
        return () if events_observed else ode.states
    for i, name in enumerate(value):
        if name not in ode.states:
            fail(f"observed[{i}]", f"{describe(name)} is not a state ({', '.join(ode.states)})")
    if len(set(value)) != len(value):
        fail("observed", "a state is listed twice")
    return tuple(value)


def _weights(weights: dict[str, float], observed: tuple[str, ...], fail,
             events: tuple[EventObservation, ...]) -> tuple[float, ...]:
    for name in weights:
        if name not in observed:
            fail(f"loss.weights.{name}", f"not an observed state ({', '.join(observed) or 'none'})")
    out = tuple(float(weights.get(name, 1.0)) for name in observed)
    if not any(out) and not any(event.weight for event in events):
        fail("loss.weights", "every weight is zero")
    return out
