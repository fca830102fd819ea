"""Validation of ``kind: ode`` specs into frozen dataclasses.

Everything a run needs is checked here, before any compute, and every problem becomes a
one-line message naming the file and the dotted field path (``initial.v[2]``). One
validator serves two callers: ``parse_ode_spec`` stops at the first problem, while
``validate_ode_spec_all`` (for ``odecli validate``) collects them all. The difference is
only the ``Problems`` collector: strict mode raises on the first report.

The keys and value types are declared once (SolverSpec, OdeDocument, System, Time), and both
the unknown-key checks and the JSON Schema (odecli.specs.schema) come from the declarations.

Output names (odecli.specs.outputs, the same rule for every kind): ``name`` defaults to the
file's stem; a solve writes ``output`` or ``<name>.h5``, a fit ``<name>-fit.h5``.
"""

from __future__ import annotations

import ast
import difflib
import keyword
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Optional, Sequence, Union

import msgspec
from msgspec import Meta

from odecli.errors import SpecError
from odecli.specs.declare import INFINITE, Problems, Section, check_keys, expected, read
from odecli.specs.events import EventDecl, EventSpec, read_events
from odecli.specs.expr import CONSTANTS, FUNCTIONS, compile_expression
from odecli.specs.loader import describe, load_yaml
from odecli.specs.outputs import default_output
from odecli.specs.ode_values import (MAX_BATCH, PerSample, _batch, _check_spans, _eval, _expand, _number,
                                     _per_sample, _required_per_sample)

# The solver registry's built-in methods (name -> adaptive?), so that checking a spec needs no
# torch; tests/test_spec.py keeps it equal to odecli.ode.stepper.available_methods().
BUILTIN_METHODS = {
    "euler": False, "midpoint": False, "heun": False, "rk4": False, "bosh3": True, "dopri5": True,
    "tsit5": True, "dop853": True, "rodas5": True, "rodas5p": True, "rodas4": True, "kvaerno5": True,
    "kvaerno3": True, "auto": True,
}


@dataclass(frozen=True)
class SolverSpec:
    """Solver settings; the optional ones carry their defaults. Declared once: read by
    odecli.specs.declare.read and described by its schema (an empty key takes its default).
    ``method`` is checked against the solver registry, which the schema lists too."""

    method: Annotated[str, Meta(description="an ODE method (fixed-step ones need dt0)")] = "dopri5"
    rtol: Annotated[float, Meta(gt=0, description="relative tolerance")] = 1e-6
    atol: Annotated[float, Meta(gt=0, description="absolute tolerance")] = 1e-6
    controller: Literal["integral", "pi", "pid"] = "integral"
    dt0: Optional[Annotated[float, Meta(gt=0, description="initial (or fixed) step")]] = None
    max_steps: Annotated[int, Meta(ge=1)] = 100_000
    dtype: Literal["float32", "float64"] = "float64"
    device: Annotated[str, expected("one of cpu, cuda, auto (or cuda:N)", pattern="^(cpu|cuda|auto|cuda:[0-9]+)$")] = "auto"
    dt_min: Annotated[float, Meta(ge=0)] = 0.0
    dt_max: Annotated[float, Meta(gt=0, extra=INFINITE, description="largest step")] = math.inf
    safety: Annotated[float, Meta(gt=0, le=1)] = 0.9
    factor_min: Annotated[float, Meta(gt=0, le=1, description="smallest step-size factor")] = 0.2
    factor_max: Annotated[float, Meta(ge=1, description="largest step-size factor")] = 10.0
    pcoeff: Optional[float] = None
    icoeff: Optional[float] = None
    dcoeff: Optional[float] = None
    adjoint: Literal["direct", "backsolve", "checkpoint"] = "direct"
    # torch.compile each explicit step: true (once eager time pays for it) or "wait"
    compile: Annotated[Union[bool, Literal["wait"]], expected("true, false or wait", description=(
        "fuse each explicit step with torch.compile: true once the eager steps have cost about a compile, "
        "wait before the first step"))] = False
    # native: generated C solver (equations, explicit RK, CPU float64); torch; auto
    engine: Annotated[Literal["auto", "native", "torch"], Meta(
        description="native: generated C solver for equations (explicit RK, CPU, float64)")] = "auto"


SOLVER_KEYS = tuple(SolverSpec.__dataclass_fields__)

# ---------------------------------------------------------------- the document, declared
# The keys and value types of the other sections. They give the unknown-key checks (with a
# did-you-mean) and the JSON Schema, and each value is read against them; the functions below
# check what spans keys: names that must be states, list lengths against the batch.

Identifier = Annotated[str, Meta(pattern="^[A-Za-z_][A-Za-z0-9_]*$")]


class System(Section, frozen=True):
    """the state names and their right-hand side: equations or python"""

    states: Annotated[list[Identifier], Meta(min_length=1, extra_json_schema={"uniqueItems": True})]
    params: Optional[dict[str, PerSample]] = None
    equations: Optional[dict[str, Union[str, float]]] = None
    python: Optional[Annotated[str, Meta(pattern="^.+\\.py:[A-Za-z_][A-Za-z0-9_]*$")]] = None


class Time(Section, frozen=True):
    """time span per sample; eval: output times (default: start and end)"""

    start: PerSample
    end: PerSample
    eval: Optional[Union[Annotated[int, Meta(ge=1)], Annotated[list[float], Meta(min_length=1)]]] = None


def _one_given(*keys: str) -> dict[str, Any]:
    """oneOf: exactly one of ``keys`` given and not empty."""
    return {"oneOf": [{"required": [key], "properties": {key: {"not": {"type": "null"}}}} for key in keys]}


class OdeDocument(Section, frozen=True, kw_only=True):
    """odecli ODE spec (kind: ode)"""

    kind: Literal["ode"]
    name: Optional[str] = None
    system: Annotated[System, Meta(extra_json_schema=_one_given("equations", "python"))]
    initial: dict[str, PerSample]
    batch: Optional[Annotated[int, Meta(ge=1, le=MAX_BATCH)]] = None
    time: Time
    solver: SolverSpec = msgspec.field(default_factory=SolverSpec)
    output: Optional[str] = None
    events: Optional[list[EventDecl]] = None


TOP_KEYS = tuple(OdeDocument.__struct_fields__)
SYSTEM_KEYS = tuple(System.__struct_fields__)
TIME_KEYS = tuple(Time.__struct_fields__)


@dataclass(frozen=True)
class OdeSpec:
    """A validated ODE spec with every per-sample value expanded to length ``batch``."""

    file: str
    text: str
    name: str
    states: tuple[str, ...]
    params: dict[str, list[float]]
    shared_params: tuple[str, ...]
    equations: dict[str, str] | None
    python: str | None
    initial: list[list[float]]
    batch: int
    t_start: list[float]
    t_end: list[float]
    t_eval: list[list[float]]
    solver: SolverSpec
    output: str | None
    events: tuple[EventSpec, ...] = ()  # odecli.specs.events

    @property
    def default_output(self) -> str:
        """The solve's output file when no override is given: ``output`` or ``<name>.h5``."""
        return default_output(self.name, fit=False, output=self.output)

    @property
    def fit_output(self) -> str:
        """The fit's output file when no override is given: ``<name>-fit.h5``."""
        return default_output(self.name, fit=True)


def load_ode_spec(path: str | Path, methods: Mapping[str, object] | None = None) -> OdeSpec:
    """Read and validate an ODE spec file; raises SpecError/InputError on the first problem."""
    data, text = load_yaml(path)
    return parse_ode_spec(data, text, str(path), methods)


def parse_ode_spec(
    data: dict[str, Any], text: str, file: str, methods: Mapping[str, object] | None = None
) -> OdeSpec:
    """Validate a loaded spec; raises a one-line SpecError on the first problem.

    ``methods`` maps method names to objects with a boolean ``adaptive`` attribute; by
    default every registered method (``odecli.ode.stepper.available_methods``).
    """
    spec = _validate(data, text, file, methods, Problems(file, strict=True))
    assert spec is not None  # strict mode raises instead of returning None
    return spec


def validate_ode_spec_all(
    data: Any, text: str, file: str, methods: Mapping[str, object] | None = None
) -> list[str]:
    """Every problem in a loaded spec as one-line messages ("file: field: message"); [] if valid."""
    problems = Problems(file, strict=False)
    _validate(data, text, file, methods, problems)
    return problems.messages


def _validate(
    data: Any, text: str, file: str, methods: Mapping[str, object] | None, report: Problems
) -> OdeSpec | None:
    """Check every section, reporting problems; return the spec only if none were found."""
    if not isinstance(data, dict):
        report("", f"top level must be a mapping of keys, got {describe(data)}")
        return None
    if "kind" in data and data["kind"] != "ode":  # another kind's keys would only add noise
        hint = "; run it with odecli train-inverse" if data["kind"] == "pde-inverse" else ""
        report("kind", f"expected 'ode', got {describe(data['kind'])}{hint}")
        return None
    check_keys(data, OdeDocument, "", report)
    if "kind" not in data:
        report("kind", "required key is missing; expected 'kind: ode'")
    name = _name(data.get("name"), file, report)

    system = _section(data, "system", System, report)
    states: tuple[str, ...] | None = None
    params: dict[str, list[float] | None] = {}
    shared: tuple[str, ...] = ()
    equations = python = None
    if system is not None:
        states = _states(system.get("states"), report)
        params = _params(system.get("params"), states, report)
        shared = tuple(k for k in params if not isinstance(system["params"][k], list))
        equations, python = _equations_or_python(system, states, params, file, report)
    initial = _initial(data.get("initial"), states, report)
    time = _section(data, "time", Time, report)
    start = _required_per_sample(time, "start", "time.start", report)
    end = _required_per_sample(time, "end", "time.end", report)

    lists = {f"system.params.{k}": v for k, v in params.items()}
    lists.update({f"initial.{k}": v for k, v in (initial or {}).items()})
    lists.update({"time.start": start, "time.end": end})
    batch = _batch(data.get("batch"), lists, report)
    expanded = {field: _expand(values, field, batch, report) for field, values in lists.items()}
    t_start, t_end = expanded["time.start"], expanded["time.end"]
    t_eval = None
    if t_start is not None and t_end is not None and batch is not None:
        _check_spans(t_start, t_end, isinstance(time.get("end"), list), report)
        t_eval = _eval(time.get("eval"), t_start, t_end, batch, report)
    solver = _solver(data.get("solver"), methods, report)
    output = _output(data.get("output"), report)
    event_names = None if states is None else set(states) | set(params) | {"t"}
    events = read_events(data.get("events"), event_names, file, report)

    if report.messages:
        return None
    assert states is not None and batch is not None and t_start is not None and t_end is not None
    assert t_eval is not None and solver is not None and name is not None
    return OdeSpec(
        file=file,
        text=text,
        name=name,
        states=states,
        params={k: expanded[f"system.params.{k}"] for k in params},  # type: ignore[misc]
        shared_params=shared,
        equations=equations,
        python=python,
        initial=[[expanded[f"initial.{s}"][i] for s in states] for i in range(batch)],  # type: ignore[index]
        batch=batch,
        t_start=t_start,
        t_end=t_end,
        t_eval=t_eval,
        solver=solver,
        output=output,
        events=events,
    )


# ---------------------------------------------------------------- generic value checks


def _join(field: str, key: Any) -> str:
    return f"{field}.{key}" if field else str(key)


def _section(data: dict[str, Any], key: str, declared: type[Section], report: Problems) -> dict[str, Any] | None:
    """A required nested mapping with known keys; ``None`` if missing or not a mapping."""
    value = data.get(key)
    if value is None:
        report(key, "required section is missing")
        return None
    if not isinstance(value, dict):
        report(key, f"expected a mapping, got {describe(value)}")
        return None
    check_keys(value, declared, key, report)
    return value


def _choice(value: Any, field: str, choices: Sequence[str], report: Problems) -> str | None:
    if isinstance(value, str) and value in choices:
        return value
    close = difflib.get_close_matches(value, choices, n=1) if isinstance(value, str) else []
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    report(field, f"expected one of {', '.join(choices)}, got {describe(value)}{hint}")
    return None


def _identifier(value: Any, field: str, what: str, taken: Mapping[str, str], report: Problems) -> str | None:
    """A name usable in expressions: an identifier, no keyword, dunder or reserved word, not taken."""
    if not isinstance(value, str) or not value.isidentifier() or keyword.iskeyword(value) or value.startswith("__"):
        report(field, f"{what} must be an identifier such as 'x' or 'theta_1', got {describe(value)}")
        return None
    if value == "t" or value in CONSTANTS or value in FUNCTIONS:
        role = "time" if value == "t" else "a constant" if value in CONSTANTS else "a function"
        report(field, f"{what} '{value}' is reserved ({role})")
        return None
    if value in taken:
        report(field, f"{what} '{value}' is already used as {taken[value]}")
        return None
    return value


# ---------------------------------------------------------------- sections


def _name(value: Any, file: str, report: Problems) -> str | None:
    if value is None:
        return Path(file).stem
    if not isinstance(value, str) or not value.strip() or re.search(r"[/\\\x00]", value):
        report("name", f"expected a non-empty name without slashes, got {describe(value)}")
        return None
    return value


def _states(value: Any, report: Problems) -> tuple[str, ...] | None:
    """The state names; ``None`` if any is bad, so dependent checks are skipped, not cascaded."""
    if value is None:
        report("system.states", "required key is missing; expected a list of state names such as [x, v]")
        return None
    if not isinstance(value, list) or not value:
        report("system.states", f"expected a non-empty list of names such as [x, v], got {describe(value)}")
        return None
    taken: dict[str, str] = {}
    for i, item in enumerate(value):
        if _identifier(item, f"system.states[{i}]", "state", taken, report) is not None:
            taken[item] = "a state"
    return tuple(value) if len(taken) == len(value) else None


def _params(value: Any, states: tuple[str, ...] | None, report: Problems) -> dict[str, list[float] | None]:
    """Every well-named parameter (values ``None`` where invalid), so names stay known for equations."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        report("system.params", f"expected a mapping of name: value, got {describe(value)}")
        return {}
    taken = {s: "a state" for s in states or ()}
    params: dict[str, list[float] | None] = {}
    for key, raw in value.items():
        field = f"system.params.{key}"
        if _identifier(key, field, "parameter", taken, report) is not None:
            params[key] = _per_sample(raw, field, report)
    return params


def _equations_or_python(
    system: dict[str, Any], states: tuple[str, ...] | None, params: Mapping[str, Any], file: str, report: Problems
) -> tuple[dict[str, str] | None, str | None]:
    has_equations, has_python = system.get("equations") is not None, system.get("python") is not None
    if has_equations == has_python:
        which = "both" if has_equations else "neither"
        report("system", f"give exactly one of 'equations' or 'python', got {which}")
        return None, None
    if has_python:
        return None, _python(system["python"], file, report)
    return _equations(system["equations"], states, params, file, report), None


def _equations(
    value: Any, states: tuple[str, ...] | None, params: Mapping[str, Any], file: str, report: Problems
) -> dict[str, str] | None:
    """One expression per state, each compiled now so that errors surface before any run."""
    if not isinstance(value, dict):
        report("system.equations", f"expected a mapping of state: expression, got {describe(value)}")
        return None
    if states is None:
        return None
    equations: dict[str, str] = {}
    for key in value:
        if key not in states:
            report(f"system.equations.{key}", f"not a state (states: {', '.join(states)})")
    names = set(states) | set(params) | {"t"}
    for state in states:
        field = f"system.equations.{state}"
        if state not in value:
            report(field, "missing; every state needs an equation d(state)/dt = expression")
            continue
        raw = value[state]
        if not isinstance(raw, str):
            number = _number(raw, field, report, expected="an expression string or a number")
            if number is None:
                continue
            raw = repr(number)
        try:
            compile_expression(raw, names, file, field)
        except SpecError as exc:
            report(exc.field, exc.message)
            continue
        equations[state] = raw
    return equations


def _python(value: Any, file: str, report: Problems) -> str | None:
    """``path.py:function`` made absolute; the file is parsed (never imported) to find the def."""
    field = "system.python"
    match = re.fullmatch(r"(.+):([^:]+)", value) if isinstance(value, str) else None
    if match is None or not match.group(2).strip().isidentifier():
        report(field, f"expected 'path/to/file.py:function', got {describe(value)}")
        return None
    path = Path(match.group(1).strip()).expanduser()
    function = match.group(2).strip()
    if not path.is_absolute():
        path = Path(file).resolve().parent / path
    if not path.is_file():
        report(field, f"file not found: {path}")
        return None
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except SyntaxError as exc:
        report(field, f"cannot parse {path}: line {exc.lineno}: {exc.msg}")
        return None
    except (OSError, ValueError) as exc:
        report(field, f"cannot read {path}: {exc}")
        return None
    defined = [node.name for node in tree.body if isinstance(node, ast.FunctionDef)]
    if function not in defined:
        close = difflib.get_close_matches(function, defined, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        report(field, f"no top-level function '{function}' in {path}{hint}")
        return None
    return f"{path}:{function}"


def _initial(value: Any, states: tuple[str, ...] | None, report: Problems) -> dict[str, list[float] | None] | None:
    if value is None:
        report("initial", "required section is missing; give a value for every state")
        return None
    if not isinstance(value, dict):
        report("initial", f"expected a mapping of state: value, got {describe(value)}")
        return None
    if states is not None:
        for key in value:
            if key not in states:
                report(f"initial.{key}", f"not a state (states: {', '.join(states)})")
        for state in states:
            if state not in value:
                report(f"initial.{state}", "missing; every state needs an initial value")
    wanted = value.keys() if states is None else [key for key in value if key in states]
    return {key: _per_sample(value[key], f"initial.{key}", report) for key in wanted}


def _solver(value: Any, methods: Mapping[str, object] | None, report: Problems) -> SolverSpec | None:
    """Solver settings with defaults (the declared pass), then the method against the solver
    registry; a fixed-step method needs ``dt0`` as its step."""
    solver = read(value, SolverSpec, "solver", report)
    raw = value if isinstance(value, dict) else {}
    method = SolverSpec.method if raw.get("method") is None else raw["method"]
    if not isinstance(method, str):  # read() has reported it
        return None
    table = method_table(methods, method)
    if method not in table:
        _choice(method, "solver.method", sorted(table), report)
        return None
    if not table[method] and raw.get("dt0") is None:
        report("solver.dt0", f"required for fixed-step method '{method}' (it is the step size)")
        return None
    if solver is not None and solver.dt_min > solver.dt_max:
        report("solver.dt_min", f"must be <= solver.dt_max ({solver.dt_max:g}), got {solver.dt_min:g}")
        return None
    return solver


def method_table(methods: Mapping[str, object] | None, wanted: Any) -> dict[str, bool]:
    """Method name -> adaptive?, from ``methods``, else the built-in names or, for any other
    name, the solver registry (imported lazily: it imports torch, which takes seconds)."""
    if methods is None:
        if wanted is None or (isinstance(wanted, str) and wanted in BUILTIN_METHODS):
            return dict(BUILTIN_METHODS)
        from odecli.ode.stepper import available_methods

        methods = available_methods()
    return {name: bool(getattr(method, "adaptive")) for name, method in methods.items()}


def _output(value: Any, report: Problems) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or "\x00" in value:
        report("output", f"expected a file name such as run.h5, got {describe(value)}")
        return None
    return value
