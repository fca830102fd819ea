"""JSON Schema of ``kind: pde-inverse`` specs, generated from the declarations the validator reads.

Every key, type, limit and default comes from :class:`odecli.specs.pde_sections.PdeDocument`
and the sections it names (odecli.specs.pde_sections, odecli.specs.pde_inputs), through
:func:`odecli.specs.declare.schema`. Added here are the few rules that span keys, stated from
those same declarations: which boundary keys each equation takes, which keys an unknown's
type needs, that sources and receivers give some points, and that true_model may be left out
only where observed.file gives the data.
"""

from __future__ import annotations

from typing import Any

from odecli.pde.propagator import EQUATIONS
from odecli.specs import pde_inputs as inputs
from odecli.specs import pde_params as params
from odecli.specs import pde_sections as sections
from odecli.specs.declare import nullable
from odecli.specs.declare import schema as declared


def _any_given(*keys: str) -> list[dict[str, Any]]:
    """anyOf: at least one of ``keys`` given and not empty."""
    return [{"required": [key], "properties": {key: {"not": {"type": "null"}}}} for key in keys]


def _given_for(key: str, value: str, needed: tuple[str, ...], default: bool = False) -> dict[str, Any]:
    """Where ``key`` is ``value`` (or, for its ``default``, left out), ``needed`` must be given and not empty."""
    condition = {"properties": {key: {"enum": [value, None]}}} if default else {
        "properties": {key: {"const": value}}, "required": [key]}
    return {"if": condition,
            "then": {"required": list(needed), "properties": {k: {"not": {"type": "null"}} for k in needed}}}


def _per_equation(equation: str, boundary: type[inputs.Section], initial_condition: bool) -> dict[str, Any]:
    """The boundary keys (and whether initial_condition may be given) of one equation."""
    then: dict[str, Any] = {"properties": {"boundary": {"propertyNames": {"enum": list(boundary.__struct_fields__)}}}}
    if not initial_condition:
        then["not"] = {"required": ["initial_condition"]}
    return {"if": {"properties": {"equation": {"const": equation}}, "required": ["equation"]}, "then": then}


def _per_parameter(node: dict[str, Any]) -> dict[str, Any]:
    """A model, or a mapping of parameter names to models (no ``type`` key: odecli.specs.pde_params)."""
    models = dict(node)
    branch = {"description": "one model per parameter, e.g. {vp: MODEL, vs: MODEL, rho: MODEL}",
              "not": {"required": ["type"]}, "minProperties": 1,
              "additionalProperties": {key: [b for b in v if b != {"type": "null"}]
                                       for key, v in node.items() if key in ("oneOf", "anyOf")}}
    key = "oneOf" if "oneOf" in models else "anyOf"
    models[key] = [*models.get(key, []), branch]
    return models


def _time_by_equation() -> list[dict[str, Any]]:
    """Steady equations refuse ``time`` and a wavelet; the others require them."""
    steady = [eq for eq in EQUATIONS if params.steady(eq)]
    timed = [eq for eq in EQUATIONS if not params.steady(eq)]
    out = [{"if": {"properties": {"equation": {"enum": timed}}, "required": ["equation"]},
            "then": {"required": ["time"], "properties": {
                "time": {"not": {"type": "null"}},
                "sources": {"required": ["wavelet"], "properties": {"wavelet": {"not": {"type": "null"}}}}}}}]
    no_solves = [eq for eq in timed if "implicit" not in getattr(EQUATIONS[eq], "SCHEMES", ())]
    null_solver = {"properties": {"solver": {"type": "null"}}}
    out.append({"if": {"properties": {"equation": {"enum": no_solves}}, "required": ["equation"]},
                "then": null_solver})
    implicit = {"properties": {"time": {"type": "object", "required": ["scheme"],
                                        "properties": {"scheme": {"const": "implicit"}}}}, "required": ["time"]}
    out.append({"if": {"properties": {"equation": {"enum": [eq for eq in timed if eq not in no_solves]}},
                       "required": ["equation"]},
                "then": {"if": implicit, "else": null_solver}})
    if steady:
        out.append({"if": {"properties": {"equation": {"enum": steady}}, "required": ["equation"]},
                    "then": {"not": {"required": ["initial_condition"]},
                             "properties": {"time": {"type": "null"},
                                            "sources": {"properties": {"wavelet": {"type": "null"}}}}}})
    return out


def pde_inverse_schema() -> dict[str, Any]:
    document = declared(sections.PdeDocument)
    properties = document["properties"]
    acoustic, heat = declared(sections.AcousticBoundary), declared(inputs.HeatBoundary)
    properties["boundary"] = nullable({**acoustic, "properties": {**acoustic["properties"], **heat["properties"]},
                                       "description": f"{acoustic['description']}; {heat['description']}"})
    properties["true_model"] = _per_parameter(properties["true_model"])
    unknown = properties["unknown"]
    parameters = unknown["properties"]["parameters"]
    unknown["properties"]["parameters"] = {"anyOf": [parameters, {"type": "array", "items": {"type": "string"},
                                                                  "minItems": 1}],
                                           "description": "which parameters are inverted (default: all), "
                                                          "each with its own keys, or a list of names"}
    # a type's keys at the unknown's top level, unless parameters give them each (not followed here)
    per_parameter = {"required": ["parameters"], "properties": {"parameters": {"type": "object"}}}
    unknown["allOf"] = [{**rule, "if": {**rule["if"], "not": per_parameter}}
                        for rule in (_given_for("type", kind, needed) for kind, needed in inputs.Unknown.needs.items())]
    properties["sources"]["anyOf"] = _any_given("positions", "line", "shots")
    wavelet = properties["sources"]["properties"]["wavelet"]
    wavelet["allOf"] = [_given_for("type", kind, needed, default=kind == inputs.Wavelet().type)
                        for kind, needed in inputs.Wavelet.needs.items()]
    properties["receivers"]["anyOf"] = _any_given("positions", "line")
    observed_file = {"properties": {"observed": {"type": "object", "required": ["file"],
                                                 "properties": {"file": {"type": "string"}}}},
                     "required": ["observed"]}
    needs_true_model = {"if": observed_file,
                        "else": {"required": ["true_model"], "properties": {"true_model": {"not": {"type": "null"}}}}}
    document["allOf"] = [_per_equation("acoustic2d", sections.AcousticBoundary, initial_condition=False),
                         _per_equation("heat2d", inputs.HeatBoundary, initial_condition=True), needs_true_model,
                         *_time_by_equation()]
    for equation in EQUATIONS:
        if equation not in ("acoustic2d", "heat2d"):
            boundary = sections.AcousticBoundary if equation == "elastic2d" else inputs.HeatBoundary
            document["allOf"].append(_per_equation(equation, boundary, initial_condition=False))
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": document.pop("description"),
            **document}
