"""JSON Schema of the spec kinds, for editors (the YAML language server) and other tools.

The validators in this package remain the authority (they check things a schema cannot, such
as list lengths against the batch size); the schema catches structure and types while typing.
"""

from __future__ import annotations

from typing import Any

from odecli.specs import inverse as inv
from odecli.specs.ode import SOLVER_KEYS, SYSTEM_KEYS, TIME_KEYS

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


def _limited(path: str, description: str) -> dict[str, Any]:
    """A number with the lower limit the inverse validator enforces at ``path``."""
    limit = inv.NUMBER_MINIMUMS[path]
    return {"type": "number", "exclusiveMinimum" if limit.exclusive else "minimum": limit.value,
            "description": description}


def _count(path: str, description: str) -> dict[str, Any]:
    """An integer with the lower limit the inverse validator enforces at ``path``."""
    return {"type": "integer", "minimum": inv.INTEGER_MINIMUMS[path], "description": description}


def _named(values: dict[str, Any], description: str) -> dict[str, Any]:
    """A mapping of parameter or state names (checked against system: by the validator) to ``values``."""
    return nullable({"type": "object", "additionalProperties": values, "description": description})


def _unknowns() -> dict[str, Any]:
    """unknowns: at least one group, as the validator wants at least one value to fit."""
    settings = _object(inv.UNKNOWN_KEYS, {
        "per_sample": {"type": "boolean", "description": "one value per sample (default), or false: one shared"},
        "init": {**_NUMBER_OR_LIST, "description": "starting value, or one per sample; default: the spec's value"},
        "bounds": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2,
                   "description": "[lower, upper] (.inf: unbounded); init must lie inside"},
    }, "how to fit this value", nullable=True)
    section = _object(inv.VALUE_GROUPS, {
        "params": _named(settings, "parameters to fit, names from system.params"),
        "initial": _named(settings, "initial values to fit, names from system.states"),
    }, "the values to fit (at least one)")
    # at least one group that names a value: an empty group is read as none
    return {**section, "anyOf": [{"required": [group], "properties": {group: {"type": "object", "minProperties": 1}}}
                                 for group in inv.VALUE_GROUPS]}


def _data() -> dict[str, Any]:
    """data: oneOf, since the validator takes exactly one source (file or truth), never both."""
    truth = _object(inv.VALUE_GROUPS, {
        "params": _named(_NUMBER_OR_LIST, "true parameter values (one, or one per sample)"),
        "initial": _named(_NUMBER_OR_LIST, "true initial values (one, or one per sample)"),
    }, "synthesise the observations by solving with these true values", nullable=True)
    section = _object(inv.DATA_KEYS, {
        "file": {"type": "string", "pattern": "\\S",
                 "description": "an odecli solve output (t, y per sample), relative to the spec's folder"},
        "truth": truth,
        "noise": _limited("data.noise", "Gaussian noise std added to the observations (default 0)"),
        "relative": {"type": "boolean", "description": "true: the noise std is relative to |y|"},
        "seed": _count("data.seed", "seed of the noise"),
    }, "the observations: exactly one of file or truth")
    return {**section, "oneOf": [{"required": ["file"]}, {"required": ["truth"]}]}


def _optimizer() -> dict[str, Any]:
    """optimizer: lr and iterations default by type, so their defaults go in the description."""
    defaults = "; ".join(f"{name}: lr {d['lr']:g}, {d['iterations']} iterations"
                         for name, d in inv.OPTIMIZER_DEFAULTS.items())
    return _object(inv.OPTIMIZER_KEYS, {
        "type": {"enum": list(inv.OPTIMIZERS), "description": "Adam, or L-BFGS with a line search"},
        "lr": _limited("optimizer.lr", "learning rate (a pde-inverse spec says learning_rate)"),
        "iterations": _count("optimizer.iterations", "most iterations (--iterations overrides)"),
        "tol": _limited("optimizer.tol", "stop when the loss changes by at most this (relative)"),
        "gtol": _limited("optimizer.gtol", "stop when |gradient| is at most this"),
        "history": _count("optimizer.history", "L-BFGS history length"),
    }, f"defaults by type: {defaults}", nullable=True)


def ode_inverse_schema() -> dict[str, Any]:
    """The ``inverse:`` section, from the tables odecli.specs.inverse validates it with."""
    section = _object(inv.INVERSE_KEYS, {
        "unknowns": _unknowns(),
        "data": _data(),
        # null: the validator reads an empty `observed:` as left out (every state)
        "observed": {"type": ["array", "null"], "items": {"type": "string"}, "minItems": 1, "uniqueItems": True,
                     "description": "states compared with the data; default (or empty): every state"},
        "loss": _object(inv.LOSS_KEYS, {
            "type": {"enum": list(inv.LOSS_TYPES), "description": "mean squared error"},
            "weights": _named(_limited("loss.weights", "weight of this state (default 1)"),
                              "weights of observed states"),
        }, "misfit between solution and data", nullable=True),
        "optimizer": _optimizer(),
        "adjoint": {"enum": list(inv.ADJOINT_MODES),
                    "description": "how gradients are computed; default: solver.adjoint"},
        "checkpoint": _object(inv.CHECKPOINT_KEYS, {
            "every": {**_count("checkpoint.every", "iterations between OUT.ckpt.h5 checkpoints (--resume); 0: none"),
                      "default": inv.CHECKPOINT_EVERY},
        }, "checkpoints of the fit", nullable=True),
    }, "parameter estimation (odecli train-inverse)")
    return {**section, "required": ["unknowns", "data"]}


def ode_schema(methods: list[str], fixed_step: list[str] = ()) -> dict[str, Any]:
    """The ``kind: ode`` schema; ``fixed_step``: the methods that need ``solver.dt0`` as their step."""
    # every solver key is nullable: the validator reads an empty one as its default
    solver = _object(SOLVER_KEYS, {key: nullable(value) for key, value in {
        "method": {"enum": methods, "default": "dopri5"},
        "rtol": _positive("relative tolerance"),
        "atol": _positive("absolute tolerance"),
        "controller": {"enum": ["integral", "pi", "pid"], "default": "integral"},
        "dt0": _positive("initial (or fixed) step"),
        "max_steps": {"type": "integer", "minimum": 1},
        "dtype": {"enum": ["float32", "float64"]},
        "device": {"type": "string", "pattern": "^(cpu|cuda|auto|cuda:[0-9]+)$"},
        "dt_min": {"type": "number", "minimum": 0},
        "dt_max": _positive("largest step"),
        "safety": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "factor_min": _positive("smallest step-size factor"),
        "factor_max": _positive("largest step-size factor"),
        "pcoeff": {"type": "number"},
        "icoeff": {"type": "number"},
        "dcoeff": {"type": "number"},
        "adjoint": {"enum": ["direct", "backsolve", "checkpoint"]},
        "compile": {"enum": [True, False, "wait"],
                    "description": "fuse each explicit step with torch.compile: true once the eager "
                                   "steps have cost about a compile, wait before the first step"},
        "engine": {"enum": ["auto", "native", "torch"],
                   "description": "native: generated C solver for equations (explicit RK, CPU, float64)"},
    }.items()}, "solver settings; an empty key takes its default", nullable=True)
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
