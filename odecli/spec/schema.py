"""JSON Schema of the spec kinds, for editors (the YAML language server) and other tools.

The validators in this package remain the authority (they check things a schema cannot, such
as list lengths against the batch size); the schema catches structure and types while typing.
"""

from __future__ import annotations

from typing import Any

_NUMBER_OR_LIST: dict[str, Any] = {
    "oneOf": [{"type": "number"}, {"type": "array", "items": {"type": "number"}, "minItems": 1}]
}


def _positive(description: str) -> dict[str, Any]:
    return {"type": "number", "exclusiveMinimum": 0, "description": description}


def ode_schema(methods: list[str]) -> dict[str, Any]:
    solver = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "method": {"enum": methods, "default": "dopri5"},
            "rtol": _positive("relative tolerance"),
            "atol": _positive("absolute tolerance"),
            "controller": {"enum": ["integral", "pi", "pid"], "default": "integral"},
            "dt0": {"oneOf": [{"type": "null"}, _positive("initial (or fixed) step")]},
            "max_steps": {"type": "integer", "minimum": 1},
            "dtype": {"enum": ["float32", "float64"]},
            "device": {"type": "string", "pattern": "^(cpu|cuda|auto|cuda:[0-9]+)$"},
            "dt_min": {"type": "number", "minimum": 0},
            "dt_max": _positive("largest step"),
            "safety": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            "factor_min": _positive("smallest step-size factor"),
            "factor_max": _positive("largest step-size factor"),
            "pcoeff": {"type": ["number", "null"]},
            "icoeff": {"type": ["number", "null"]},
            "dcoeff": {"type": ["number", "null"]},
            "adjoint": {"enum": ["direct", "backsolve", "checkpoint"]},
            "compile": {"enum": [True, False, "wait"],
                        "description": "fuse each explicit step with torch.compile: true once the eager "
                                       "steps have cost about a compile, wait before the first step"},
            "engine": {"enum": ["auto", "native", "torch"],
                       "description": "native: generated C solver for equations (explicit RK, CPU, float64)"},
        },
    }
    identifier = {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "odecli ODE spec (kind: ode)",
        "type": "object",
        "required": ["kind", "system", "initial", "time"],
        "additionalProperties": False,
        "properties": {
            "kind": {"const": "ode"},
            "name": {"type": "string"},
            "system": {
                "type": "object",
                "required": ["states"],
                "additionalProperties": False,
                "properties": {
                    "states": {"type": "array", "items": identifier, "minItems": 1, "uniqueItems": True},
                    "params": {"type": "object", "additionalProperties": _NUMBER_OR_LIST},
                    "equations": {"type": "object", "additionalProperties": {"type": ["string", "number"]}},
                    "python": {"type": "string", "pattern": "^.+\\.py:[A-Za-z_][A-Za-z0-9_]*$"},
                },
                "oneOf": [{"required": ["equations"]}, {"required": ["python"]}],
            },
            "initial": {"type": "object", "additionalProperties": _NUMBER_OR_LIST},
            "batch": {"type": "integer", "minimum": 1},
            "time": {
                "type": "object",
                "required": ["start", "end"],
                "additionalProperties": False,
                "properties": {
                    "start": _NUMBER_OR_LIST,
                    "end": _NUMBER_OR_LIST,
                    "eval": {"oneOf": [{"type": "integer", "minimum": 1},
                                       {"type": "array", "items": {"type": "number"}, "minItems": 1}]},
                },
            },
            "solver": solver,
            "inverse": {"type": "object", "description": "parameter estimation (odecli train-inverse)"},
            "output": {"type": "string"},
        },
    }


def all_schemas() -> dict[str, Any]:
    """One document with a schema per kind, selected by the ``kind`` field."""
    from odecli.ode.stepper import available_methods

    ode = ode_schema(sorted(available_methods()))
    kinds = {"ode": ode}
    try:
        from odecli.pde.schema import pde_inverse_schema
    except ImportError:
        pass
    else:
        kinds["pde-inverse"] = pde_inverse_schema()
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "odecli spec",
        "oneOf": list(kinds.values()),
        "$defs": kinds,
    }
