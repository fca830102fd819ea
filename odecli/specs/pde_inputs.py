"""The declared inputs of a ``kind: pde-inverse`` spec whose keys depend on a ``type``: models,
the unknown, sources, receivers and heat2d's boundary.

Declared once, as the fixed sections of odecli.specs.pde_sections are: odecli.specs.pde reads
them with :func:`odecli.specs.declare.read` and odecli.specs.pde_schema describes them with
:func:`odecli.specs.declare.schema`. A model is a number (a constant field) or one of the
tagged sections below, chosen by its ``type`` (msgspec's tagged unions). What spans several
keys (a layered model's value count, points inside the grid, an unknown's type needing its
keys) stays as code in odecli.specs.pde, after this declarative pass.

A model's keys left out stay out of the parsed dict (odecli.pde.models applies their
defaults), so the optional ones are declared ``None`` here and dropped by :func:`plain`.
"""

from __future__ import annotations

import typing
from typing import Annotated, Any, ClassVar, Literal, Optional, Union

import msgspec
from msgspec import Meta

from odecli.specs.declare import Section, expected

Positive = Annotated[float, Meta(gt=0)]
NonNegative = Annotated[float, Meta(ge=0)]
Count = Annotated[int, Meta(ge=1)]
Point = Annotated[tuple[float, float], expected("[y, x], two numbers")]
# a list, not a tuple: msgspec 0.23 crashes (segfault) converting to a union of a number and a tuple of them
PositivePair = Annotated[Union[Positive, Annotated[list[Positive], Meta(min_length=2, max_length=2)]],
                         expected("a number > 0 or [y, x], two numbers > 0")]
Numbers = Annotated[Union[float, list[float]], expected("a number or a list of numbers")]  # a number: a list of one
BOUNDARY_TYPES = ("dirichlet", "neumann")
SIDES = ("top", "bottom", "left", "right")


class ModelSection(Section, frozen=True, tag_field="type"):
    """A field by its ``type``."""


class ConstantModel(ModelSection, frozen=True, tag="constant"):
    """the same value everywhere"""

    value: float


class LayeredModel(ModelSection, frozen=True, tag="layered"):
    """horizontal layers: one more value than interface depths (m)"""

    interfaces: Numbers
    values: Numbers


class GaussianModel(ModelSection, frozen=True, tag="gaussian"):
    """a Gaussian bump on a background"""

    background: float
    amplitude: float
    center: Point
    sigma: PositivePair


class CheckerboardModel(ModelSection, frozen=True, tag="checkerboard"):
    """squares of background +- amplitude"""

    background: float
    amplitude: float
    size: PositivePair


class MarmousiModel(ModelSection, frozen=True, tag="marmousi"):
    """a synthetic layered and faulted section"""

    seed: Optional[int] = None
    vmin: Optional[Positive] = None
    vmax: Optional[Positive] = None
    layers: Optional[Annotated[int, Meta(ge=2)]] = None
    water_depth: Optional[Positive] = None


class FileModel(ModelSection, frozen=True, tag="file"):
    """a field read from an HDF5 or .npy file"""

    path: str
    dataset: Optional[str] = None


class SmoothedModel(ModelSection, frozen=True, tag="smoothed"):
    """another model under a Gaussian filter (sigma in cells)"""

    of: Model
    sigma: NonNegative


Model = Annotated[Union[float, ConstantModel, LayeredModel, GaussianModel, CheckerboardModel, MarmousiModel,
                        FileModel, SmoothedModel], expected("a number or a model mapping")]
# the model types odecli.pde.models builds, by their tags
MODEL_TYPES = tuple(m.__struct_config__.tag for m in typing.get_args(typing.get_args(Model)[0]) if isinstance(m, type)
                    and issubclass(m, ModelSection))


class ParameterUnknown(Section, frozen=True):
    """one inverted parameter's own keys (unknown.parameters.NAME); a key left out takes the unknown's"""

    initial: Optional[Model] = None
    bounds: Optional[Annotated[tuple[float, float], expected("[low, high], two numbers")]] = None
    transform: Optional[Literal["clamp", "sigmoid", "softplus", "none"]] = None
    base: Optional[float] = None
    scale: Optional[Positive] = None
    model: Optional[Model] = None
    trainable: Optional[Union[str, list[str]]] = None


# the keys a parameter may set for itself; the others (type, hidden, ...) are the unknown's, shared
PER_PARAMETER = tuple(ParameterUnknown.__struct_fields__)


class Unknown(Section, frozen=True):
    """what the fit inverts for: a grid of values, an MLP of the coordinates, or a model's scalars"""

    needs: ClassVar[dict[str, tuple[str, ...]]] = {"grid": ("initial",), "mlp": ("base",), "scalars": ("model",)}

    type: Literal["grid", "mlp", "scalars"]
    initial: Optional[Model] = None
    bounds: Optional[Annotated[tuple[float, float], expected("[low, high], two numbers")]] = None
    transform: Optional[Literal["clamp", "sigmoid", "softplus", "none"]] = None  # default: clamp with bounds
    hidden: Optional[Annotated[Union[Count, list[Count]], expected("a whole number >= 1 or a list of them")]] = None
    # hidden's default: [20, 20]
    activation: Literal["tanh", "relu", "sin", "softplus"] = "tanh"
    # mlp: the inputs' encoding (odecli.pde.unknowns.MLPUnknown); frequency: cycles over the grid's half-width
    features: Literal["fourier", "siren", "plain"] = "fourier"
    frequency: Positive = 1.0
    fourier_features: Count = 32
    base: Optional[float] = None
    scale: Positive = 1.0
    seed: int = 0
    model: Optional[Model] = None
    trainable: Optional[Union[str, list[str]]] = None
    # default: an mlp's acoustic2d/elastic2d absorbing_width (the sponge continues the interior), else 0
    fixed_border: Optional[Annotated[int, Meta(ge=0)]] = None
    # which of the equation's parameters are inverted (default: all), each with its own keys;
    # a list of names is the same as names with no keys of their own (odecli.specs.pde_params)
    parameters: Optional[dict[str, ParameterUnknown]] = None
    # the parameters not inverted: their model (default: their true_model's)
    fixed: Optional[dict[str, Model]] = None


# ``from`` is a Python keyword: the field is declared by name, before ``to`` as specs write it
MAX_LINE_POINTS = 1_000_000  # a guard against typos (count: 1e12) that would exhaust memory while expanding
LineCount = Annotated[int, Meta(ge=1, le=MAX_LINE_POINTS)]
Line = msgspec.defstruct("Line", [("from", Point), ("to", Point), ("count", LineCount)], bases=(Section,),
                         frozen=True, module=__name__)
Line.__doc__ = "``count`` evenly spaced points from ``from`` to ``to`` (both included)"
Positions = Annotated[list[Point], Meta(min_length=1), expected("a non-empty list of [y, x] pairs")]
Lines = Union[Line, list[Line]]
Shots = Annotated[list[Positions], expected("a list of shots, each a non-empty list of [y, x] pairs")]


class Wavelet(Section, frozen=True):
    """the source time function: ricker (peak_frequency, delay), array (values), file (path), constant (value)"""

    needs: ClassVar[dict[str, tuple[str, ...]]] = {"ricker": ("peak_frequency",), "array": ("values",),
                                                   "file": ("path",)}

    type: Literal["ricker", "array", "file", "constant"] = "ricker"
    peak_frequency: Union[Positive, msgspec.UnsetType] = msgspec.UNSET
    delay: Optional[NonNegative] = None
    values: Union[Numbers, msgspec.UnsetType] = msgspec.UNSET
    path: Union[str, msgspec.UnsetType] = msgspec.UNSET
    value: float = 1.0


SourceType = Literal["pressure", "fy", "fx"]
Component = Literal["vy", "vx", "pressure"]


class Sources(Section, frozen=True, kw_only=True):
    """the shots: each point of positions or line is a shot of its own, each entry of shots one with several sources
    (a steady equation's shots are its experiments, each source of strength amplitude)"""

    wavelet: Optional[Wavelet] = None  # required by the time-dependent equations
    # elastic2d: an explosive source on the normal stresses (pressure) or a point force
    type: Optional[SourceType] = None
    amplitude: float = 1.0
    positions: Optional[Positions] = None
    line: Optional[Lines] = None
    shots: Optional[Shots] = None


ReceiverLine = msgspec.defstruct("ReceiverLine", [("from", Point), ("to", Point), ("count", LineCount),
                                                  ("component", Optional[Component], None)],
                                  bases=(Section,), frozen=True, module=__name__)
ReceiverLine.__doc__ = ("``count`` evenly spaced receivers from ``from`` to ``to`` (both included); elastic2d: "
                        "the component they record (default: the receivers')")


class Receivers(Section, frozen=True):
    """where the data is recorded; elastic2d: each receiver records a component (vy, vx or pressure)"""

    positions: Optional[Positions] = None
    line: Optional[Union[ReceiverLine, list[ReceiverLine]]] = None
    component: Optional[Component] = None  # elastic2d: positions' component, and lines' default (vy)


BoundaryType = Literal["dirichlet", "neumann"]


class HeatSide(Section, frozen=True):
    """one side's condition; a key left out takes the boundary's"""

    type: Optional[BoundaryType] = None
    value: Optional[float] = None


Side = Optional[Annotated[Union[BoundaryType, HeatSide], expected("dirichlet, neumann or a mapping of type and value")]]


class HeatBoundary(Section, frozen=True):
    """heat2d: a condition on every side (type, value), or per side"""

    type: BoundaryType = "dirichlet"
    value: float = 0.0
    top: Side = None
    bottom: Side = None
    left: Side = None
    right: Side = None


def plain(value: Any) -> Any:
    """A read declaration as the plain data the run consumes: dicts with their ``type`` tag,
    lists (not tuples), a model's keys left out (None) dropped, a bare number a constant model."""
    if isinstance(value, ModelSection):
        given = {name: getattr(value, name) for name in value.__struct_fields__}
        return {"type": value.__struct_config__.tag,
                **{name: model(v) if name == "of" else plain(v) for name, v in given.items() if v is not None}}
    if isinstance(value, Section):
        return {name: plain(getattr(value, name)) for name in value.__struct_fields__}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def model(value: Any) -> dict | None:
    """A read model (a number: a constant field) as the dict odecli.pde.models builds from."""
    if value is None:
        return None
    if isinstance(value, float):
        return {"type": "constant", "value": value}
    return plain(value)
