"""JSON Schema of ``kind: pde-inverse`` specs.

The sections with fixed keys come from their declarations (odecli.specs.pde_sections), the
same ones the validator reads them with. The parts whose keys depend on a ``type`` (models,
the unknown, sources and receivers) and the heat boundary are described here, next to the
validator's tables they use. A key the validator reads as left out (its default) when empty
is ``nullable``; one it reads with no default, or checks as given, is not.
"""

from __future__ import annotations

from typing import Any

from odecli.specs import pde_sections as sections
from odecli.specs.declare import nullable
from odecli.specs.declare import schema as declared
from odecli.specs.pde import BOUNDARY_TYPES, EQUATIONS, MODEL_KEYS, MODEL_REQUIRED, MODEL_TYPES, SIDES, TRANSFORMS, UNKNOWN_TYPES

_NUMBER = {"type": "number"}
_POSITIVE = {"type": "number", "exclusiveMinimum": 0}
_NONNEGATIVE = {"type": "number", "minimum": 0}
_POINT = {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2}
_POSITIVE_PAIR = {"oneOf": [_POSITIVE, {"type": "array", "items": _POSITIVE, "minItems": 2, "maxItems": 2}]}
_NUMBERS = {"type": "array", "items": {"type": "number"}}
_LINE = {
    "type": "object",
    "required": ["from", "to", "count"],
    "properties": {"from": _POINT, "to": _POINT, "count": {"type": "integer", "minimum": 1}},
    "additionalProperties": False,
}
_ACOUSTIC_BOUNDARY = tuple(sections.AcousticBoundary.__struct_fields__)
_HEAT_BOUNDARY = ("type", "value") + SIDES


def _object(properties: dict[str, Any], required: tuple[str, ...] = (), *,
            nullable: bool = False) -> dict[str, Any]:
    """A mapping of exactly ``properties``; ``nullable`` where the validator reads an empty one as {}."""
    section = {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}
    return _nullable(section) if nullable else section


_nullable = nullable  # the name _object's keyword shadows


def _integer(minimum: int) -> dict[str, Any]:
    return {"type": "integer", "minimum": minimum}


def _model(depth: int = 1) -> dict[str, Any]:
    """A number (a constant) or a model of a type, with the keys the validator takes for it
    (those it requires may not be empty); ``depth``: how deep smoothed models nest (one level
    keeps the schema small enough for editors; validate takes any depth)."""
    values = {"value": _NUMBER, "interfaces": _NUMBERS, "values": _NUMBERS, "background": _NUMBER,
              "amplitude": _NUMBER, "center": _POINT, "size": _POSITIVE_PAIR, "path": {"type": "string"},
              "dataset": {"type": "string"}, "vmin": _POSITIVE, "vmax": _POSITIVE,
              "water_depth": _POSITIVE, "layers": _integer(2), "seed": {"type": "integer"}}
    kinds = []
    for kind in MODEL_TYPES:
        if kind == "smoothed" and depth == 0:
            continue
        fields = {**values, "sigma": _NONNEGATIVE if kind == "smoothed" else _POSITIVE_PAIR}
        if kind == "smoothed":
            fields["of"] = _model(depth - 1)
        keys = {key: fields[key] if key in MODEL_REQUIRED[kind] else nullable(fields[key]) for key in MODEL_KEYS[kind]}
        kinds.append(_object({"type": {"const": kind}, **keys}, ("type",) + MODEL_REQUIRED[kind]))
    return {"oneOf": [_NUMBER, *kinds]}


def _points() -> dict[str, Any]:
    """positions and/or line(s); an empty one is read as none."""
    return {"positions": nullable({"type": "array", "items": _POINT}),
            "line": nullable({"oneOf": [_LINE, {"type": "array", "items": _LINE}]})}


def _any_given(*keys: str) -> list[dict[str, Any]]:
    """anyOf: at least one of ``keys`` given and not empty."""
    return [{"required": [key], "properties": {key: {"not": {"type": "null"}}}} for key in keys]


def _given_for(key: str, value: str, needed: tuple[str, ...], present: tuple[str, ...] = ()) -> dict[str, Any]:
    """Where ``key`` is ``value``, ``needed`` must be given and not empty, and ``present`` not empty
    if given (the validator reads the keys of the other types not at all)."""
    return {"if": {"properties": {key: {"const": value}}, "required": [key]},
            "then": {"required": list(needed),
                     "properties": {k: {"not": {"type": "null"}} for k in needed + present}}}


def _per_equation(equation: str, boundary: tuple[str, ...], initial_condition: bool) -> dict[str, Any]:
    """The boundary keys (and whether initial_condition may be given) of one equation."""
    then: dict[str, Any] = {"properties": {"boundary": {"propertyNames": {"enum": list(boundary)}}}}
    if not initial_condition:
        then["not"] = {"required": ["initial_condition"]}
    return {"if": {"properties": {"equation": {"const": equation}}, "required": ["equation"]}, "then": then}


def pde_inverse_schema() -> dict[str, Any]:
    side = nullable({"oneOf": [{"enum": list(BOUNDARY_TYPES)},
                               _object({"type": nullable({"enum": list(BOUNDARY_TYPES)}),
                                        "value": nullable(_NUMBER)})]})
    boundary = _object({
        **declared(sections.AcousticBoundary)["properties"],
        "type": nullable({"enum": list(BOUNDARY_TYPES)}),
        "value": nullable(_NUMBER),
        **{s: side for s in SIDES},
    }, nullable=True)
    wavelet = _object({
        "type": nullable({"enum": ["ricker", "array", "file", "constant"]}),
        "peak_frequency": _POSITIVE, "delay": nullable(_NONNEGATIVE), "values": _NUMBERS,
        "path": {"not": {"type": "null"}}, "value": nullable(_NUMBER),
    })
    unknown = _object({
        "type": {"enum": list(UNKNOWN_TYPES)},
        "initial": nullable(_model()),
        "bounds": nullable({"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2}),
        "transform": nullable({"enum": list(TRANSFORMS)}),
        "hidden": nullable({"type": "array", "items": _integer(1)}),
        "activation": nullable({"enum": ["tanh", "relu", "sin", "softplus"]}),
        "base": nullable(_NUMBER),
        "scale": nullable(_POSITIVE),
        "seed": nullable({"type": "integer"}),
        "model": nullable(_model()),
        "trainable": nullable({"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}),
        "fixed_border": nullable(_integer(0)),
    }, ("type",))
    # an unknown's type decides which keys it needs
    unknown["allOf"] = [_given_for("type", "grid", ("initial",)), _given_for("type", "mlp", ("base",)),
                        _given_for("type", "scalars", ("model",))]
    sources = _object({"wavelet": wavelet, "amplitude": nullable(_NUMBER),
                       "shots": nullable({"type": "array"}), **_points()}, ("wavelet",))
    sources["anyOf"] = _any_given("positions", "line", "shots")
    receivers = {**_object(_points()), "anyOf": _any_given("positions", "line")}
    # true_model may be empty or left out only where observed.file gives the data
    observed_file = {"properties": {"observed": {"type": "object", "required": ["file"],
                                                 "properties": {"file": {"type": "string"}}}},
                     "required": ["observed"]}
    needs_true_model = {"if": observed_file,
                        "else": {"required": ["true_model"], "properties": {"true_model": {"not": {"type": "null"}}}}}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "odecli PDE inverse spec (kind: pde-inverse)",
        "type": "object",
        "required": ["kind", "equation", "grid", "time", "sources", "receivers", "unknown", "optimizer"],
        "properties": {
            "kind": {"const": "pde-inverse"},
            "name": nullable({"type": "string"}),
            "description": nullable({"type": "string"}),
            "equation": {"enum": list(EQUATIONS)},
            "grid": declared(sections.Grid),
            "time": declared(sections.Time),
            "boundary": boundary,
            "initial_condition": nullable(_NUMBER),
            "sources": sources,
            "receivers": receivers,
            "true_model": nullable(_model()),
            "observed": nullable(declared(sections.Observed)),
            "unknown": unknown,
            **{key: nullable(declared(section)) for key, section in (
                ("regularization", sections.Regularization), ("loss", sections.Loss),
                ("parallel", sections.Parallel), ("checkpoint", sections.Checkpoint),
                ("compute", sections.Compute))},
            "optimizer": declared(sections.Optimizer),
        },
        "additionalProperties": False,
        "allOf": [_per_equation("acoustic2d", _ACOUSTIC_BOUNDARY, initial_condition=False),
                  _per_equation("heat2d", _HEAT_BOUNDARY, initial_condition=True), needs_true_model],
    }
