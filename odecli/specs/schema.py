"""JSON Schema of the spec kinds, for editors (the YAML language server) and other tools.

The validators in this package remain the authority (they check things a schema cannot, such
as list lengths against the batch size); the schema catches structure and types while typing.
"""

from __future__ import annotations

from typing import Any

from odecli.specs.declare import schema as declared_schema
from odecli.specs.inverse import InverseSection
from odecli.specs.ode import SYSTEM_KEYS, TIME_KEYS, SolverSpec

_NUMBER_OR_LIST: dict[str, Any] = {
    "oneOf": [{"type": "number"}, {"type": "array", "items": {"type": "number"}, "minItems": 1}]
}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` or null, for a key the validator reads as left out (its default) when empty,
    as it is when a user comments out every key under it."""
    if "enum" in schema:
        return {**schema, "enum": [*schema["enum"], None]}
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        return {**schema, "type": [*types, "null"]}
    if "oneOf" in schema:
        return {**schema, "oneOf": [{"type": "null"}, *schema["oneOf"]]}
    raise ValueError(f"cannot make {schema} nullable")


def _positive(description: str) -> dict[str, Any]:
    return {"type": "number", "exclusiveMinimum": 0, "description": description}


_nullable = nullable  # the name _object's keyword shadows


def _object(keys: tuple[str, ...], fields: dict[str, dict[str, Any]], description: str, *,
            nullable: bool = False) -> dict[str, Any]:
    """A mapping with exactly the validator's ``keys`` (a key without a field here fails loudly);
    ``nullable`` where the validator reads an empty value as an empty mapping."""
    section = {"type": "object", "description": description,
               "properties": {key: fields[key] for key in keys}, "additionalProperties": False}
    return _nullable(section) if nullable else section


def ode_inverse_schema() -> dict[str, Any]:
    """The ``inverse:`` section, from the declarations odecli.specs.inverse reads it with."""
    return declared_schema(InverseSection)


def ode_schema(methods: list[str], fixed_step: list[str] = ()) -> dict[str, Any]:
    """The ``kind: ode`` schema; ``fixed_step``: the methods that need ``solver.dt0`` as their step."""
    # every solver key is nullable: the validator reads an empty one as its default
    solver = nullable(declared_schema(SolverSpec))
    solver["description"] = "solver settings; an empty key takes its default"
    method = solver["properties"]["method"]
    solver["properties"]["method"] = nullable({"description": method["description"], "enum": methods})
    if fixed_step:  # a fixed-step method's dt0 is its step, so it cannot be left out
        solver["if"] = {"properties": {"method": {"enum": list(fixed_step)}}, "required": ["method"]}
        solver["then"] = {"required": ["dt0"], "properties": {"dt0": {"type": "number"}}}
    identifier = {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"}
    system = _object(SYSTEM_KEYS, {
        "states": {"type": "array", "items": identifier, "minItems": 1, "uniqueItems": True},
        "params": nullable({"type": "object", "additionalProperties": _NUMBER_OR_LIST}),
        "equations": nullable({"type": "object", "additionalProperties": {"type": ["string", "number"]}}),
        "python": nullable({"type": "string", "pattern": "^.+\\.py:[A-Za-z_][A-Za-z0-9_]*$"}),
    }, "the state names and their right-hand side: equations or python")
    # exactly one of equations and python, an empty one counting as left out
    system["oneOf"] = [{"required": [key], "properties": {key: {"not": {"type": "null"}}}}
                       for key in ("equations", "python")]
    time = _object(TIME_KEYS, {
        "start": _NUMBER_OR_LIST,
        "end": _NUMBER_OR_LIST,
        "eval": nullable({"oneOf": [{"type": "integer", "minimum": 1},
                                    {"type": "array", "items": {"type": "number"}, "minItems": 1}]}),
    }, "time span per sample; eval: output times (default: start and end)")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "odecli ODE spec (kind: ode)",
        "type": "object",
        "required": ["kind", "system", "initial", "time"],
        "additionalProperties": False,
        "properties": {
            "kind": {"const": "ode"},
            "name": nullable({"type": "string"}),
            "system": {**system, "required": ["states"]},
            "initial": {"type": "object", "additionalProperties": _NUMBER_OR_LIST},
            "batch": nullable({"type": "integer", "minimum": 1}),
            "time": {**time, "required": ["start", "end"]},
            "solver": solver,
            "inverse": ode_inverse_schema(),
            "output": nullable({"type": "string"}),
        },
    }


def all_schemas() -> dict[str, Any]:
    """One document with a schema per kind, selected by the ``kind`` field."""
    from odecli.ode.stepper import available_methods

    methods = available_methods()
    ode = ode_schema(sorted(methods), sorted(name for name, method in methods.items() if not method.adaptive))
    kinds = {"ode": ode}
    try:
        from odecli.specs.pde_schema import pde_inverse_schema
    except ImportError:
        pass
    else:
        kinds["pde-inverse"] = pde_inverse_schema()
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "odecli spec",
        # each kind once, referenced: the document stays small enough for editors to check quickly
        "oneOf": [{"$ref": f"#/$defs/{kind}"} for kind in kinds],
        "$defs": kinds,
    }
