"""Validation of ``kind: ode`` specs into frozen dataclasses.

Everything a run needs is checked here, before any compute, and every problem becomes a
one-line message naming the file and the dotted field path (``initial.v[2]``). One
validator serves two callers: ``parse_ode_spec`` stops at the first problem, while
``validate_ode_spec_all`` (for ``odecli validate``) collects them all. The difference is
only the ``Problems`` collector: strict mode raises on the first report.
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

from msgspec import Meta

from odecli.errors import SpecError
from odecli.specs.declare import INFINITE, Problems, expected, read
from odecli.specs.expr import CONSTANTS, FUNCTIONS, compile_expression
from odecli.specs.loader import describe, load_yaml

TOP_KEYS = ("kind", "name", "system", "initial", "batch", "time", "solver", "output")
SYSTEM_KEYS = ("states", "params", "equations", "python")
TIME_KEYS = ("start", "end", "eval")
# The solver registry's built-in methods (name -> adaptive?), so that checking a spec needs no
# torch; tests/test_spec.py keeps it equal to odecli.ode.stepper.available_methods().
BUILTIN_METHODS = {
    "euler": False, "midpoint": False, "heun": False, "rk4": False, "bosh3": True, "dopri5": True,
    "tsit5": True, "dop853": True, "rodas5": True, "rodas5p": True, "rodas4": True, "kvaerno5": True,
    "kvaerno3": True, "auto": True,
}
# Guards against typos such as `eval: 1000000000` that would exhaust memory while expanding.
MAX_BATCH = 10_000_000
MAX_EVAL_POINTS = 20_000_000
EVAL_SNAP_RTOL = 1e-12  # output times this close (relative to the span) to its ends are taken as the ends


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

    @property
    def default_output(self) -> str:
        """The output file when no override is given: ``output`` or ``<name>.h5``."""
        return self.output if self.output is not None else f"{self.name}.h5"


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
    _check_keys(data, "", TOP_KEYS, report)
    if "kind" not in data:
        report("kind", "required key is missing; expected 'kind: ode'")
    name = _name(data.get("name"), file, report)

    system = _section(data, "system", SYSTEM_KEYS, report)
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
    time = _section(data, "time", TIME_KEYS, report)
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
    )


# ---------------------------------------------------------------- generic value checks


def _join(field: str, key: Any) -> str:
    return f"{field}.{key}" if field else str(key)


def _check_keys(mapping: dict[Any, Any], field: str, allowed: Sequence[str], report: Problems) -> None:
    """Report keys outside ``allowed``, suggesting the closest allowed one."""
    for key in mapping:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"expected one of: {', '.join(allowed)}"
            report(_join(field, key), f"unknown key ({hint})")


def _section(data: dict[str, Any], key: str, allowed: Sequence[str], report: Problems) -> dict[str, Any] | None:
    """A required nested mapping with known keys; ``None`` if missing or not a mapping."""
    value = data.get(key)
    if value is None:
        report(key, "required section is missing")
        return None
    if not isinstance(value, dict):
        report(key, f"expected a mapping, got {describe(value)}")
        return None
    _check_keys(value, key, allowed, report)
    return value


def _number(value: Any, field: str, report: Problems, expected: str = "a number", finite: bool = True) -> float | None:
    """A float from an int or float (never a bool); NaN/inf refused when ``finite``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        report(field, f"expected {expected}, got {describe(value)}")
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer too large for a float
        number = math.inf
    if math.isnan(number) or (finite and math.isinf(number)):
        report(field, f"must be a finite number, got {describe(value)}")
        return None
    return number


def _integer(value: Any, field: str, report: Problems) -> int | None:
    """An int from an int or a whole float (``1e5``); bools refused."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        report(field, f"expected a whole number, got {describe(value)}")
        return None
    return value


def _bounded(
    value: Any, field: str, report: Problems, *, gt: float | None = None, ge: float | None = None,
    le: float | None = None, finite: bool = True,
) -> float | None:
    """A number with bounds; the message states the violated bound and the given value."""
    number = _number(value, field, report, finite=finite)
    if number is None:
        return None
    if gt is not None and not number > gt:
        bound = f"> {gt:g}"
    elif ge is not None and not number >= ge:
        bound = f">= {ge:g}"
    elif le is not None and not number <= le:
        bound = f"<= {le:g}"
    else:
        return number
    report(field, f"must be {bound}, got {describe(value)}")
    return None


def _choice(value: Any, field: str, choices: Sequence[str], report: Problems) -> str | None:
    if isinstance(value, str) and value in choices:
        return value
    close = difflib.get_close_matches(value, choices, n=1) if isinstance(value, str) else []
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    report(field, f"expected one of {', '.join(choices)}, got {describe(value)}{hint}")
    return None


def _per_sample(value: Any, field: str, report: Problems) -> list[float] | None:
    """A number (shared by all samples) or a non-empty list of numbers (one per sample)."""
    expected = "a number or a list of numbers (one per sample)"
    if not isinstance(value, list):
        number = _number(value, field, report, expected=expected)
        return None if number is None else [number]
    if not value:
        report(field, f"list is empty, expected {expected}")
        return None
    numbers = [_number(v, f"{field}[{i}]", report) for i, v in enumerate(value)]
    return None if any(n is None for n in numbers) else numbers  # type: ignore[return-value]


def _required_per_sample(section: dict[str, Any] | None, key: str, field: str, report: Problems) -> list[float] | None:
    if section is None:
        return None
    if section.get(key) is None:
        report(field, "required key is missing")
        return None
    return _per_sample(section[key], field, report)


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


def _batch(value: Any, lists: Mapping[str, list[float] | None], report: Problems) -> int | None:
    """The explicit batch size, else the longest per-sample list (1 if there is none)."""
    if value is None:
        return max((len(v) for v in lists.values() if v is not None), default=1)
    batch = _integer(value, "batch", report)
    if batch is not None and not 1 <= batch <= MAX_BATCH:
        report("batch", f"must be between 1 and {MAX_BATCH}, got {describe(value)}")
        return None
    return batch


def _expand(values: list[float] | None, field: str, batch: int | None, report: Problems) -> list[float] | None:
    """Broadcast a length-1 list to ``batch``; other lengths must equal ``batch``."""
    if values is None or batch is None:
        return None
    if len(values) == 1:
        return values * batch
    if len(values) != batch:
        report(field, f"list has {len(values)} entries, expected 1 or batch={batch}")
        return None
    return values


def _check_spans(start: list[float], end: list[float], end_is_list: bool, report: Problems) -> None:
    for i, (a, b) in enumerate(zip(start, end)):
        if a == b:
            field = f"time.end[{i}]" if end_is_list else "time.end"
            report(field, f"must differ from time.start, both are {a:g} (sample {i})")
            return


def _eval(value: Any, start: list[float], end: list[float], batch: int, report: Problems) -> list[list[float]] | None:
    """Output times per sample: ``n`` evenly spaced, a shared explicit list, or [start, end]."""
    if value is None:
        return [[a, b] for a, b in zip(start, end)]
    if isinstance(value, list):
        return _explicit_eval(value, start, end, batch, report)
    n = _integer(value, "time.eval", report)
    if n is None:
        return None
    if n < 1:
        report("time.eval", f"must be >= 1 (number of output times) or a list of times, got {describe(value)}")
        return None
    if n * batch > MAX_EVAL_POINTS:
        report("time.eval", f"{n} times x batch {batch} exceeds the limit of {MAX_EVAL_POINTS} output points")
        return None
    if n == 1:
        return [[b] for b in end]
    return [[a + (b - a) * (k / (n - 1)) for k in range(n - 1)] + [b] for a, b in zip(start, end)]


def _explicit_eval(
    value: list[Any], start: list[float], end: list[float], batch: int, report: Problems
) -> list[list[float]] | None:
    """A list shared by all samples: inside every span and strictly monotone in the integration direction."""
    if not value:
        report("time.eval", "list is empty, expected at least one output time")
        return None
    if len(value) * batch > MAX_EVAL_POINTS:
        report("time.eval", f"{len(value)} times x batch {batch} exceeds the limit of {MAX_EVAL_POINTS} output points")
        return None
    times = [_number(v, f"time.eval[{j}]", report) for j, v in enumerate(value)]
    if any(x is None for x in times):
        return None
    forward = end[0] > start[0]
    if any((b > a) != forward for a, b in zip(start, end)):
        report("time.eval", "an explicit list of times needs all samples to integrate in the same direction")
        return None
    for j in range(1, len(times)):
        previous, current = times[j - 1], times[j]
        if (current <= previous) if forward else (current >= previous):  # type: ignore[operator]
            word = "increase" if forward else "decrease"
            message = f"times must strictly {word} (direction of integration), got {current:g} after {previous:g}"
            report(f"time.eval[{j}]", message)
            return None
    per_sample = []
    for i, (a, b) in enumerate(zip(start, end)):
        snapped = [_snap_to_span(x, a, b) for x in times]  # type: ignore[arg-type]
        for j, x in enumerate(snapped):
            if not min(a, b) <= x <= max(a, b):
                report(f"time.eval[{j}]", f"{x!r} lies outside the time span [{a!r}, {b!r}] of sample {i}")
                return None
            if j and x == snapped[j - 1]:
                report(f"time.eval[{j}]", f"{times[j]!r} is {snapped[j - 1]!r} to round-off (sample {i})")
                return None
        per_sample.append(snapped)
    return per_sample


def _snap_to_span(x: float, a: float, b: float) -> float:
    """``x``, or the span's end it misses by round-off only: a list built by adding steps, as
    ``numpy.arange`` does, ends at 0.30000000000000004 for a span that ends at 0.3."""
    tolerance = EVAL_SNAP_RTOL * max(abs(a), abs(b), abs(b - a))
    for edge in (a, b):
        if abs(x - edge) <= tolerance:
            return edge
    return x


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
