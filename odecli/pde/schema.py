"""JSON Schema of ``kind: pde-inverse`` specs (structure and types; odecli.pde.spec stays the authority)."""

from __future__ import annotations

from typing import Any

from odecli.pde.spec import EQUATIONS, MODEL_TYPES, OPTIMIZERS, TRANSFORMS, UNKNOWN_TYPES

_POINT = {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2}
_LINE = {
    "type": "object",
    "required": ["from", "to", "count"],
    "properties": {"from": _POINT, "to": _POINT, "count": {"type": "integer", "minimum": 1}},
    "additionalProperties": False,
}
_MODEL = {
    "oneOf": [
        {"type": "number"},
        {"type": "object", "required": ["type"], "properties": {"type": {"enum": list(MODEL_TYPES)}}},
    ]
}


def _object(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


def pde_inverse_schema() -> dict[str, Any]:
    placements = {
        "positions": {"type": "array", "items": _POINT},
        "line": {"oneOf": [_LINE, {"type": "array", "items": _LINE}]},
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "odecli PDE inverse spec (kind: pde-inverse)",
        "type": "object",
        "required": ["kind", "equation", "grid", "time", "sources", "receivers", "unknown"],
        "properties": {
            "kind": {"const": "pde-inverse"},
            "name": {"type": "string"},
            "equation": {"enum": list(EQUATIONS)},
            "grid": _object({
                "shape": {"type": "array", "items": {"type": "integer", "minimum": 4}, "minItems": 2, "maxItems": 2},
                "spacing": {"oneOf": [{"type": "number", "exclusiveMinimum": 0},
                                      {"type": "array", "items": {"type": "number", "exclusiveMinimum": 0}}]},
            }, ("shape", "spacing")),
            "time": _object({"dt": {"type": "number", "exclusiveMinimum": 0},
                             "steps": {"type": "integer", "minimum": 1}}, ("dt", "steps")),
            "boundary": {"type": "object"},
            "initial_condition": {"type": "number"},
            "sources": {"type": "object", "properties": {
                "wavelet": {"type": "object", "required": ["type"]},
                "amplitude": {"type": "number"},
                "shots": {"type": "array"},
                **placements,
            }},
            "receivers": {"type": "object", "properties": placements},
            "true_model": _MODEL,
            "observed": {"type": "object"},
            "unknown": {"type": "object", "required": ["type"],
                        "properties": {"type": {"enum": list(UNKNOWN_TYPES)},
                                       "transform": {"enum": list(TRANSFORMS)},
                                       "bounds": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2},
                                       "fixed_border": {"type": "integer", "minimum": 0}}},
            "regularization": {"type": "object"},
            "optimizer": {"type": "object", "properties": {"type": {"enum": list(OPTIMIZERS)},
                                                          "iterations": {"type": "integer", "minimum": 0}}},
            "loss": {"type": "object"},
            "parallel": {"type": "object"},
            "checkpoint": {"type": "object"},
            "compute": {"type": "object", "properties": {
                "device": {"type": "string", "pattern": "^(cpu|cuda|auto|cuda:[0-9]+)$"},
                "dtype": {"enum": ["float64", "float32"]}}},
            "output": {"type": "string"},
        },
        "additionalProperties": False,
    }
