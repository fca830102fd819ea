"""An equation's named parameters in a ``kind: pde-inverse`` spec: the true models, the unknown
(which parameters are inverted, each with its own keys) and the parameters kept fixed.

Why a module of its own: acoustic2d and heat2d have one coefficient field, elastic2d three
(``vp``, ``vs``, ``rho``), and the spec must read naturally for both. A one-parameter equation
keeps the single-model form (``true_model: MODEL``, ``unknown: {type: grid, initial: MODEL,
bounds: ...}``); an equation with several parameters names them:

    true_model: {vp: MODEL, vs: MODEL, rho: MODEL}
    unknown:
      type: grid                       # shared by every inverted parameter (and one MLP for all)
      parameters:                      # which are inverted (default: all); a list of names works too
        vp: {initial: MODEL, bounds: [1500, 3200]}
        vs: {initial: MODEL, bounds: [0, 1800]}
      fixed: {rho: MODEL}              # the others; default: their true_model

A key under ``parameters.NAME`` overrides the unknown's own key of that name (``bounds``,
``initial``, ``base``, ``scale``, ``model``, ``trainable``, ``transform``). The normalised
unknown keeps the first inverted parameter's keys at its top level (so a one-parameter spec
normalises as it always has) and adds ``parameters`` (name -> that parameter's keys) and
``fixed`` (name -> model). The parameter names come from the equation module's
``PARAMETERS`` (:func:`parameters`); an equation module without one has a single coefficient.
"""

from __future__ import annotations

from typing import Any

import msgspec

from odecli.pde.propagator import EQUATIONS
from odecli.specs import pde_inputs as inputs
from odecli.specs.declare import read, read_value

# the names of single-coefficient equations whose modules predate PARAMETERS
_SINGLE = {"acoustic2d": ("c",), "heat2d": ("kappa",), "poisson2d": ("kappa",)}
MAX_PARAMETERS_SHOWN = 8


def parameters(equation: str) -> tuple[str, ...]:
    """The equation's parameter fields in the order its propagator stacks them."""
    return tuple(getattr(EQUATIONS[equation], "PARAMETERS", None) or _SINGLE.get(equation, ("coefficient",)))


def steady(equation: str) -> bool:
    """Whether the equation has no time axis (its data is ``(experiments, sensors)``)."""
    return bool(getattr(EQUATIONS[equation], "STEADY", False))


def _names(names: tuple[str, ...]) -> str:
    return ", ".join(names)


def _is_per_parameter(raw: Any, names: tuple[str, ...]) -> bool:
    """A mapping of parameter names to models (a model mapping has a ``type``)."""
    return isinstance(raw, dict) and "type" not in raw and (len(names) > 1 or set(raw) <= set(names)) and bool(raw)


def true_models(V: Any, raw: Any, equation: str) -> dict[str, dict | None]:
    """``true_model`` as one model per parameter (None: not given)."""
    names = parameters(equation)
    if raw is None:
        return {n: None for n in names}
    if not _is_per_parameter(raw, names):
        if len(names) > 1:
            raise V.err("true_model", f"{equation} has parameters {_names(names)}: give one model each, "
                                      f"as {{{', '.join(n + ': MODEL' for n in names)}}}")
        return {names[0]: model(V, read_value(raw, inputs.Model, "true_model", V.problems), "true_model")}
    for key in raw:
        if key not in names:
            raise V.err(f"true_model.{key}", f"{equation} has no parameter {key!r} (its parameters: {_names(names)})")
    out = {}
    for n in names:
        if raw.get(n) is None:
            out[n] = None
            continue
        out[n] = model(V, read_value(raw[n], inputs.Model, f"true_model.{n}", V.problems), f"true_model.{n}")
    return out


def unknown(V: Any, raw: Any, equation: str, truths: dict[str, dict | None]) -> dict:
    """The unknown normalised (module docstring): each inverted parameter's keys and the fixed models."""
    names = parameters(equation)
    raw = dict(raw) if isinstance(raw, dict) else raw
    given = raw.get("parameters") if isinstance(raw, dict) else None
    if isinstance(given, list):  # names only: each takes the unknown's keys
        for i, n in enumerate(given):
            if not isinstance(n, str):
                raise V.err(f"unknown.parameters[{i}]", f"expected a parameter name, got {n!r}")
        raw["parameters"] = {n: None for n in given}
    d = read(raw, inputs.Unknown, "unknown", V.problems)
    inverted = list(names) if d.parameters is None else list(d.parameters)
    for n in inverted:
        if n not in names:
            raise V.err(f"unknown.parameters.{n}", f"{equation} has no parameter {n!r} (its parameters: "
                                                   f"{_names(names)})")
    if not inverted:
        raise V.err("unknown.parameters", f"name at least one of {_names(names)}")
    inverted = [n for n in names if n in inverted]  # the equation's order
    per = {}
    for n in inverted:
        own = (d.parameters or {}).get(n)
        where = {k: (f"unknown.parameters.{n}.{k}" if own is not None and getattr(own, k) is not None
                     else f"unknown.{k}") for k in inputs.PER_PARAMETER}
        merged = msgspec.structs.replace(d, **{k: getattr(own, k) for k in inputs.PER_PARAMETER
                                               if own is not None and getattr(own, k) is not None})
        per[n] = _one_unknown(V, merged, where)
    fixed_given = d.fixed or {}
    fixed = {}
    for n, m in fixed_given.items():
        if n not in names:
            raise V.err(f"unknown.fixed.{n}", f"{equation} has no parameter {n!r} (its parameters: {_names(names)})")
        if n in inverted:
            raise V.err(f"unknown.fixed.{n}", f"{n} is inverted (unknown.parameters); it cannot also be fixed")
        fixed[n] = model(V, inputs.model(m), f"unknown.fixed.{n}")
    for n in names:
        if n not in inverted and n not in fixed:
            if truths.get(n) is None:
                raise V.err(f"unknown.fixed.{n}", f"{n} is not inverted and has no true_model.{n}: give its model")
            fixed[n] = truths[n]
    out = dict(per[inverted[0]])
    out["parameters"] = per
    out["fixed"] = fixed
    return out


def _one_unknown(V: Any, d: inputs.Unknown, where: dict[str, str]) -> dict:
    """One parameter's unknown (the keys a one-coefficient spec has always had)."""
    f = "unknown"
    kind = d.type
    out: dict = {"type": kind}
    out["bounds"] = None if d.bounds is None else list(d.bounds)
    if out["bounds"] is not None and out["bounds"][0] >= out["bounds"][1]:
        raise V.err(where["bounds"], "lower bound must be below the upper bound")
    # an MLP's output is mapped into its bounds smoothly (clamp would stop the gradient at them)
    out["transform"] = d.transform or (("sigmoid" if kind == "mlp" else "clamp") if d.bounds is not None
                                       else "none")
    if out["transform"] in ("sigmoid", "clamp") and out["bounds"] is None:
        raise V.err(where["transform"], f"{out['transform']} needs bounds: [low, high]")
    if out["transform"] == "softplus" and out["bounds"] is None:
        raise V.err(where["transform"], "softplus needs bounds: [low, high] (only low is used)")
    out["fixed_border"] = d.fixed_border
    for key in inputs.Unknown.needs[kind]:
        if getattr(d, key) is None:
            raise V.err(where.get(key, f"{f}.{key}"), "required key is missing")
    if kind == "grid":
        out["initial"] = model(V, inputs.model(d.initial), where["initial"])
    elif kind == "mlp":
        hidden = [20, 20] if d.hidden is None else d.hidden
        out["hidden"] = list(hidden) if isinstance(hidden, list) else [hidden]
        out["activation"] = d.activation
        out["base"] = d.base
        out["scale"] = d.scale
        out["seed"] = d.seed
        out["features"] = d.features
        out["frequency"] = d.frequency
        out["fourier_features"] = d.fourier_features
        out["initial"] = model(V, inputs.model(d.initial), where["initial"]) if d.initial is not None else None
    else:
        out["model"] = model(V, inputs.model(d.model), where["model"])
        tr = d.trainable
        mk = out["model"]["type"]
        numeric = {"constant": ["value"], "layered": ["values"],
                   "gaussian": ["background", "amplitude"],
                   "checkerboard": ["background", "amplitude"]}.get(mk)
        if numeric is None:
            raise V.err(f"{where['model']}.type", f"scalars unknowns need a constant, layered, gaussian "
                                                  f"or checkerboard model, got {mk}")
        tr = numeric if tr is None else ([tr] if isinstance(tr, str) else tr)
        for k in tr:
            if k not in numeric:
                raise V.err(where["trainable"], f"{k!r} is not a numeric parameter of a {mk} model "
                                                f"(choose from {', '.join(numeric)})")
        out["trainable"] = list(tr)
    return out


def check_model(V: Any, m: dict | None, f: str) -> None:
    """What a model's declaration cannot state: a layered model's value count and order."""
    if m is None:
        return
    if m["type"] == "layered":
        for key in ("interfaces", "values"):
            m[key] = m[key] if isinstance(m[key], list) else [m[key]]
        if len(m["values"]) != len(m["interfaces"]) + 1:
            raise V.err(f"{f}.values", "need one more value than interfaces")
        if m["interfaces"] != sorted(m["interfaces"]):
            raise V.err(f"{f}.interfaces", "must be increasing depths")
    elif m["type"] in ("gaussian", "checkerboard"):
        key = "sigma" if m["type"] == "gaussian" else "size"
        if not isinstance(m[key], list):
            m[key] = [m[key]] * 2
    elif m["type"] == "smoothed":
        check_model(V, m["of"], f"{f}.of")


def model(V: Any, m: Any, f: str) -> dict | None:
    """A read model (or its plain dict) checked across its keys."""
    m = inputs.model(m) if not isinstance(m, dict) and m is not None else m
    check_model(V, m, f)
    return m
