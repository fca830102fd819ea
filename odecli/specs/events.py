"""The ``events:`` section of a ``kind: ode`` spec: sign changes of expressions, recorded or terminal.

::

    events:
      - name: ground              # optional; default event0, event1, ... by position
        expression: h             # an expression of t, the states and params (as the equations)
        direction: falling        # rising (- to +), falling (+ to -) or both (default)
        terminal: true            # false (default): recorded only; true: the sample ends at the
                                  # first occurrence; N >= 1: at the N-th

Each event is declared once (:class:`EventDecl`, read by :func:`odecli.specs.declare.read` and
described by the JSON Schema) and its expression compiled now, so that an unknown name or a
refused construct is a one-line error before any run. :func:`build_events` turns the validated
events into the numerics' :class:`odecli.ode.events.Event` objects (importing torch only then),
:func:`c_events` into C text for the generated solver.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, Mapping, Optional, Union

from msgspec import Meta

from odecli.errors import SpecError
from odecli.specs.declare import Problems, Section, expected, read
from odecli.specs.expr import compile_expression, expression_to_c
from odecli.specs.loader import describe

if TYPE_CHECKING:
    from odecli.ode.events import Event

DIRECTIONS = {"rising": 1, "falling": -1, "both": 0}


class EventDecl(Section, frozen=True):
    """an event: a sign change of an expression of t, the states and params, located per sample"""

    expression: Annotated[Union[str, float], expected(
        "an expression string or a number", description="g(t, states, params); the event is where it changes sign")]
    name: Optional[Annotated[str, Meta(pattern="^[A-Za-z_][A-Za-z0-9_]*$",
                                       description="the event's name in the run file (default eventN)")]] = None
    direction: Annotated[Literal["rising", "falling", "both"], Meta(
        description="rising: - to +; falling: + to -; both")] = "both"
    terminal: Annotated[Union[bool, Annotated[int, Meta(ge=1)]], expected(
        "true, false or an integer >= 1",
        description="true: the sample ends at the first occurrence; N: at the N-th; false: recorded only")] = False


@dataclass(frozen=True)
class EventSpec:
    """A validated event: its name, expression text, direction (+1, -1, 0) and terminal count (0: none)."""

    name: str
    expression: str
    direction: int
    terminal: int


def read_events(value: Any, names: set[str] | None, file: str, report: Problems) -> tuple[EventSpec, ...]:
    """The ``events:`` list, every problem reported; ``names`` are the expressions' allowed names
    (None when the states are invalid: the expressions are then not checked)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        report("events", f"expected a list of events such as [{{expression: x, direction: falling}}], got {describe(value)}")
        return ()
    events: list[EventSpec] = []
    taken: dict[str, int] = {}
    for i, raw in enumerate(value):
        field = f"events[{i}]"
        declared = read(raw, EventDecl, field, report)
        if declared is None:
            continue
        if isinstance(declared.terminal, int) and not isinstance(declared.terminal, bool) and declared.terminal < 1:
            report(f"{field}.terminal", f"expected true, false or an integer >= 1, got {declared.terminal}")
            continue
        name = declared.name or f"event{i}"
        if name in taken:
            report(f"{field}.name", f"'{name}' is already the name of events[{taken[name]}]")
            continue
        taken[name] = i
        text = declared.expression if isinstance(declared.expression, str) else repr(float(declared.expression))
        if names is not None:
            try:
                compile_expression(text, names, file, f"{field}.expression")
            except SpecError as exc:
                report(exc.field, exc.message)
                continue
        events.append(EventSpec(name, text, DIRECTIONS[declared.direction], int(declared.terminal)))
    return tuple(events)


def build_events(events: tuple[EventSpec, ...], states: tuple[str, ...], params: Mapping[str, Any],
                 file: str) -> list[Event]:
    """The events as :class:`odecli.ode.events.Event` objects, each ``g(t, y, p) -> (A,)`` a compiled expression."""
    from odecli.ode.events import Event

    names = set(states) | set(params) | {"t"}
    out = []
    for i, event in enumerate(events):
        expression = compile_expression(event.expression, names, file, f"events[{i}].expression")

        def g(t, y, p, expression=expression):
            env = dict(p)
            env["t"] = t
            for j, state in enumerate(states):
                env[state] = y[..., j]
            return expression(env).to(y).expand(y.shape[:-1])

        out.append(Event(g, event.direction, event.terminal, event.name))
    return out


def c_events(events: tuple[EventSpec, ...], states: tuple[str, ...], params: tuple[str, ...],
             file: str) -> tuple[tuple[str, int, int, str], ...]:
    """Each event as (C expression over ``t``, ``y[i]``, ``p[j]``, direction, terminal, name), the
    fields of :class:`odecli.ode.native.rhs.NativeEvent`; ``params`` in the C solver's column order."""
    symbols = {"t": "t", **{s: f"y[{i}]" for i, s in enumerate(states)},
               **{name: f"p[{j}]" for j, name in enumerate(params)}}
    return tuple((expression_to_c(event.expression, symbols, file, f"events[{i}].expression"), event.direction,
                  event.terminal, event.name) for i, event in enumerate(events))
