"""JSON Schema of the spec kinds, for editors (the YAML language server) and other tools.

Each kind's schema is generated (odecli.specs.declare.schema) from the declarations its
validator reads: odecli.specs.ode (OdeDocument, SolverSpec), odecli.specs.inverse
(InverseSection) and odecli.specs.pde_sections. What only the registry knows (the method
names, which are fixed-step) is filled in here. The validators still check what a schema
cannot (list lengths against the batch size, names that must be states).
"""

from __future__ import annotations

from typing import Any

from odecli.specs.declare import nullable
from odecli.specs.declare import schema as declared_schema
from odecli.specs.inverse import InverseSection
from odecli.specs.ode import OdeDocument


def ode_inverse_schema() -> dict[str, Any]:
    """The ``inverse:`` section, from the declarations odecli.specs.inverse reads it with."""
    return declared_schema(InverseSection)


def ode_schema(methods: list[str], fixed_step: list[str] = ()) -> dict[str, Any]:
    """The ``kind: ode`` schema; ``fixed_step``: the methods that need ``solver.dt0`` as their step."""
    document = declared_schema(OdeDocument)
    solver = document["properties"]["solver"]  # every key nullable: an empty one takes its default
    solver["description"] = "solver settings; an empty key takes its default"
    method = solver["properties"]["method"]
    solver["properties"]["method"] = nullable({"description": method["description"], "enum": methods})
    if fixed_step:  # a fixed-step method's dt0 is its step, so it cannot be left out
        solver["if"] = {"properties": {"method": {"enum": list(fixed_step)}}, "required": ["method"]}
        solver["then"] = {"required": ["dt0"], "properties": {"dt0": {"type": "number"}}}
    document["properties"]["inverse"] = ode_inverse_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": document.pop("description"),
            **document}


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
