"""The value checks of a ``kind: ode`` spec that span keys: numbers given per sample (declared
here as :data:`PerSample`, read against that declaration), the batch size they imply and the
list lengths it fixes, and the output times.

Each reports through a :class:`odecli.specs.declare.Problems` and returns None for a bad
value, so that ``odecli validate`` lists every problem and dependent checks are skipped.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Mapping, Union

from msgspec import Meta

from odecli.specs.declare import INVALID, Problems, expected, read_value
from odecli.specs.loader import describe

# Guards against typos such as `eval: 1000000000` that would exhaust memory while expanding.
MAX_BATCH = 10_000_000
MAX_EVAL_POINTS = 20_000_000
EVAL_SNAP_RTOL = 1e-12  # output times this close (relative to the span) to its ends are taken as the ends


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


# A value given per sample: one number for every sample, or one per sample (the batch checks the length).
PerSample = Annotated[Union[float, Annotated[list[float], Meta(min_length=1)]], expected(
    "a number or a list of numbers (one per sample)",
    description="one number for every sample, or a list of one per sample (as long as the batch)")]


def _per_sample(value: Any, field: str, report: Problems) -> list[float] | None:
    """``value`` read against :data:`PerSample`, as a list (of one where a number is shared)."""
    result = read_value(value, PerSample, field, report)
    if result is INVALID:
        return None
    return result if isinstance(result, list) else [result]


def _required_per_sample(section: dict[str, Any] | None, key: str, field: str, report: Problems) -> list[float] | None:
    if section is None:
        return None
    if section.get(key) is None:
        report(field, "required key is missing")
        return None
    return _per_sample(section[key], field, report)


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
