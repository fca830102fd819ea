"""Events of the batched PyTorch loop: per-sample sign changes of ``g(t, y, p)``, located on the dense output.

An event is a function ``g(t, y, p) -> (A,)`` of the working rows with a ``direction``
(+1 rising: g goes from < 0 to >= 0; -1 falling: from > 0 to <= 0; 0 both) and ``terminal``
(0: recorded only; N >= 1: the sample ends at its N-th occurrence). After every accepted step
each row compares g at the step's end with g at its start; a row with a sign change locates the
root on the step's own interpolant (:func:`locate`: Illinois regula falsi on theta in [0, 1],
to a time resolution of 4 ulp of t, as scipy's ``brentq`` with ``xtol = 4 eps``), so the event
time's error is that of the dense output, which the solver's rtol/atol bound. A start exactly
on g = 0 is not an event (the sign must change), so a solve restarted at an event does not
find it again. Several events in one step are taken in time order; a terminal one ends the
row there (later ones in the step are dropped). Rows without a sign change are untouched:
every sample takes the steps it takes without events.

Where autograd records (the direct gradient), event times and states carry derivatives by the
implicit function theorem (:meth:`EventLog._occurrence`).

:class:`EventLog` holds the per-row memory the loop compacts with its rows (g at the last
accepted point, occurrences so far) and the recorded (sample, time, state) triples, and turns
them into NaN-padded per-event arrays at the end (:class:`~odecli.ode.solution.EventRecord`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, NamedTuple, Sequence

import torch
from torch import Tensor

from odecli.ode.attempt import Limits, LoopState, Span, chunk_attempt, next_attempt_crosses
from odecli.ode.methods import ExplicitRK
from odecli.ode.solution import EventRecord

EventFunction = Callable[[Tensor, Tensor, Mapping[str, Tensor]], Tensor]
"""``g(t, y, p) -> (A,)`` with t (A,), y (A, n) and p the rows' parameters, as the right-hand side."""

DIRECTIONS = {"rising": 1, "falling": -1, "both": 0}
MAX_ITERATIONS = 200  # Illinois converges superlinearly; this only bounds a pathological g
RESOLUTION_ULPS = 4.0  # the root's bracket in t, in units of t's spacing (scipy's brentq xtol = 4 eps)


@dataclass(frozen=True)
class Event:
    """One event: ``g``, which way its sign must change, when it ends the sample, and its name.

    ``direction``: ``"rising"``/+1, ``"falling"``/-1 or ``"both"``/0. ``terminal``: ``False``/0
    records only, ``True``/1 ends the sample at the first occurrence, N at the N-th.
    """

    g: EventFunction
    direction: int | str = 0
    terminal: int | bool = 0
    name: str = ""

    def __post_init__(self) -> None:
        direction = DIRECTIONS.get(self.direction, self.direction) if isinstance(self.direction, str) else self.direction
        if direction not in (-1, 0, 1):
            raise ValueError(f"event direction must be rising, falling, both (or +1, -1, 0), got {self.direction!r}")
        terminal = int(self.terminal)
        if terminal < 0 or terminal != self.terminal:
            raise ValueError(f"event terminal must be true, false or an integer >= 1, got {self.terminal!r}")
        object.__setattr__(self, "direction", int(direction))
        object.__setattr__(self, "terminal", terminal)


def as_events(events: Sequence[Event | EventFunction] | None) -> list[Event]:
    """Events from :class:`Event` objects or bare callables; a callable's ``direction`` and
    ``terminal`` attributes are read as scipy's ``solve_ivp`` reads them. Unnamed ones are
    called ``event0``, ``event1``, ... by position; names must be distinct."""
    out: list[Event] = []
    for i, event in enumerate(events or ()):
        if not isinstance(event, Event):
            if not callable(event):
                raise TypeError(f"events[{i}] must be an Event or a callable g(t, y, p), got {type(event).__name__}")
            event = Event(event, getattr(event, "direction", 0), getattr(event, "terminal", 0))
        if not event.name:
            event = Event(event.g, event.direction, event.terminal, f"event{i}")
        out.append(event)
    names = [e.name for e in out]
    if len(set(names)) != len(names):
        raise ValueError(f"event names must be distinct, got {names}")
    return out


def crossings(g_old: Tensor, g_new: Tensor, direction: Tensor) -> Tensor:
    """(A, E) bool: a sign change of g from the step's start to its end, in the event's direction."""
    up = (g_old < 0) & (g_new >= 0)
    down = (g_old > 0) & (g_new <= 0)
    return (up & (direction >= 0)) | (down & (direction <= 0))


def locate(G: Callable[[Tensor], Tensor], g0: Tensor, g1: Tensor, tol: Tensor, todo: Tensor) -> Tensor:
    """theta in [0, 1] with G(theta) = 0 for the ``todo`` rows, given G(0) = g0 and G(1) = g1 of opposite signs.

    Illinois regula falsi (the end that stays gets its value halved), batched over the rows;
    a row stops when its bracket is narrower than ``tol`` (in theta) or G hits 0 exactly. The
    bracket always holds the root, so the answer is within ``tol`` of a root of G. Rows not
    in ``todo`` get NaN. G takes (A,) thetas and returns (A,) values.
    """
    a, b = torch.zeros_like(g0), torch.ones_like(g0)
    ga, gb = g0.clone(), g1.clone()
    active = todo.clone()
    for _ in range(MAX_ITERATIONS):
        if not bool(active.any()):
            break
        denominator = gb - ga
        c = b - gb * (b - a) / torch.where(denominator == 0, torch.ones_like(denominator), denominator)
        # Round-off can put the secant point on or outside the bracket: bisect then.
        low, high = torch.minimum(a, b), torch.maximum(a, b)
        c = torch.where((c > low) & (c < high) & (denominator != 0), c, 0.5 * (a + b))
        gc = G(c)
        same = torch.sign(gc) == torch.sign(gb)
        # Illinois: when b stays on the same side, halve the value at the end a that stays.
        new_a = torch.where(same, a, b)
        new_ga = torch.where(same, 0.5 * ga, gb)
        a, ga = torch.where(active, new_a, a), torch.where(active, new_ga, ga)
        b, gb = torch.where(active, c, b), torch.where(active, gc, gb)
        active = active & (gc != 0) & ((b - a).abs() > tol)
    # b is the latest iterate, within the final bracket; the end whose |G| is smaller is the better root.
    root = torch.where(gb.abs() <= ga.abs(), b, a)
    return torch.where(todo, root, torch.full_like(root, math.nan))


class Found(NamedTuple):
    """The events of one step: rows that located a root (and so built the dense output), rows a
    terminal event ended, and where (for the ended rows; None when no row ended)."""

    located: Tensor  # (A,) bool
    ended: Tensor  # (A,) bool
    t_event: Tensor | None  # (A,)
    y_event: Tensor | None  # (A, n)


@dataclass
class EventLog:
    """The events of one solve: per-row memory (compacted with the rows) and what was recorded.

    ``g_prev`` (A, E) is g at each row's last accepted point and ``count`` (A, E) its
    occurrences so far; ``found`` keeps (sample, event, time, state) of every occurrence.
    """

    events: list[Event]
    g_prev: Tensor
    count: Tensor
    direction: Tensor  # (E,) +1, -1, 0
    terminal: Tensor  # (E,) int64, 0: not terminal
    found: list[tuple[Tensor, Tensor, Tensor, Tensor]] = field(default_factory=list)

    @classmethod
    def start(cls, events: list[Event], t0: Tensor, y0: Tensor, p: Mapping[str, Tensor]) -> EventLog:
        """The log at the start of a solve: g at (t0, y0), no occurrences yet."""
        device = y0.device
        return cls(
            events=events, g_prev=evaluate(events, t0, y0, p),
            count=torch.zeros(y0.shape[0], len(events), dtype=torch.int64, device=device),
            direction=torch.tensor([e.direction for e in events], dtype=y0.dtype, device=device),
            terminal=torch.tensor([e.terminal for e in events], dtype=torch.int64, device=device),
        )

    def take(self, rows: Tensor) -> None:
        """Keep the memory of ``rows`` only (the loop's compaction)."""
        self.g_prev, self.count = self.g_prev[rows], self.count[rows]

    def step(
        self, idx: Tensor, t: Tensor, h: Tensor, t_new: Tensor, y_new: Tensor, accept: Tensor,
        p: Mapping[str, Tensor], dense: Callable[[], Callable[[Tensor], Tensor]],
        rhs: Callable[[Tensor, Tensor], Tensor] | None = None,
    ) -> Found | None:
        """Look for events in the accepted steps (t, t_new] of the working rows ``idx``.

        Records every occurrence up to and including a terminal one; returns None when no row
        had a sign change, else a :class:`Found`. ``dense()`` builds the step's interpolant
        y(theta), called only when some row has a sign change. ``rhs(t, y)`` (the rows' f) gives
        event times their derivatives where autograd records (:meth:`_occurrence`).
        """
        with torch.no_grad():
            g_old, g_new = self.g_prev, evaluate(self.events, t_new, y_new.detach(), p)
            hit = crossings(g_old, g_new, self.direction) & accept[:, None]
            self.g_prev = torch.where(accept[:, None], g_new, self.g_prev)
        if not bool(hit.any()):
            return None
        # Built with autograd as the caller has it: the output times share this interpolant (cached).
        interp = dense()
        with torch.no_grad():
            spacing = torch.maximum(t.abs(), t_new.abs()) * torch.finfo(t.dtype).eps + torch.finfo(t.dtype).tiny
            safe_h = torch.where(h == 0, torch.ones_like(h), h)
            tol = RESOLUTION_ULPS * spacing / safe_h.abs()
            theta = torch.full_like(g_new, math.inf)
            for k, event in enumerate(self.events):
                todo = hit[:, k]
                if not bool(todo.any()):
                    continue

                def G(th: Tensor, event: Event = event) -> Tensor:
                    return event.g(t + th * h, interp(th).detach(), p)

                theta[:, k] = torch.where(todo, locate(G, g_old[:, k], g_new[:, k], tol, todo),
                                          theta[:, k])
            # A terminal occurrence ends the row at the earliest one; later events in the step are dropped.
            ends = hit & (self.terminal > 0) & (self.count + 1 >= self.terminal)
            t_stop = torch.where(ends, theta, torch.full_like(theta, math.inf)).min(dim=1).values
            keep = hit & (theta <= t_stop[:, None])
            self.count = self.count + keep
            ended = ends.any(dim=1)
            stop_event = torch.where(ends, theta, torch.full_like(theta, math.inf)).argmin(dim=1)
        t_event = y_event = None
        for k, event in enumerate(self.events):
            rows = keep[:, k]
            if not bool(rows.any()):
                continue
            th = theta[:, k].where(rows, torch.zeros_like(theta[:, k]))
            t_at, y_at = self._occurrence(event, th, t, h, t_new, y_new, interp, p, rhs)
            self.found.append((idx[rows], torch.full_like(idx[rows], k), t_at[rows], y_at[rows]))
            stops_here = ended & (stop_event == k)
            if bool(stops_here.any()):
                t_event = t_at if t_event is None else torch.where(stops_here, t_at, t_event)
                y_event = y_at if y_event is None else torch.where(stops_here[:, None], y_at, y_event)
        return Found(hit.any(dim=1), ended, t_event, y_event)

    @staticmethod
    def _occurrence(
        event: Event, th: Tensor, t: Tensor, h: Tensor, t_new: Tensor, y_new: Tensor,
        interp: Callable[[Tensor], Tensor], p: Mapping[str, Tensor], rhs: Callable[[Tensor, Tensor], Tensor] | None,
    ) -> tuple[Tensor, Tensor]:
        """The event's time and state at ``th`` of the step, differentiable where autograd records.

        The root theta is found without a graph; the implicit function theorem on g(t*, y(t*)) = 0
        gives dt* = -(dg at fixed t) / (dg/dt along the solution), with dg/dt = g_t + g_y . f, and
        the state's total change dy* = (dy at fixed t) + f dt*. Written as t* + (g - g.detach()) *
        (-1 / gdot), the values stay the located ones and autograd carries the derivatives.
        """
        at_end = th >= 1
        t_at = torch.where(at_end, t_new, t + th * h).detach()
        y_at = torch.where(at_end[:, None], y_new, interp(th))
        records = torch.is_grad_enabled() and (y_at.requires_grad or any(
            isinstance(v, Tensor) and v.requires_grad for v in p.values()))
        if not records or rhs is None:
            return t_at, y_at.detach()
        with torch.no_grad():
            f_at = rhs(t_at, y_at.detach())
        with torch.enable_grad():
            tt, yy = t_at.detach().requires_grad_(), y_at.detach().requires_grad_()
            gg = event.g(tt, yy, {k: v.detach() if isinstance(v, Tensor) else v for k, v in p.items()})
            g_t, g_y = torch.autograd.grad(gg.sum(), (tt, yy), allow_unused=True)
        g_dot = (torch.zeros_like(t_at) if g_t is None else g_t) + (
            torch.zeros_like(t_at) if g_y is None else (g_y * f_at).sum(dim=1))
        g = event.g(t_at, y_at, p)
        # g_dot = 0 (a tangential root) has no derivative; 1 there keeps the values finite
        dt = -(g - g.detach()) / torch.where(g_dot == 0, torch.ones_like(g_dot), g_dot)
        return t_at + dt, y_at + f_at * dt[:, None]

    def records(self, batch: int, n_states: int) -> dict[str, EventRecord]:
        """Every event's occurrences, per sample in time order, NaN-padded to the most any sample had."""
        out: dict[str, EventRecord] = {}
        dtype, device = self.g_prev.dtype, self.g_prev.device
        for k, event in enumerate(self.events):
            parts = [(s, t, y) for s, which, t, y in self.found if which.numel() and int(which[0]) == k]
            if parts:
                samples = torch.cat([s for s, _, _ in parts])
                times = torch.cat([t for _, t, _ in parts])
                states = torch.cat([y for _, _, y in parts])
            else:
                samples = torch.zeros(0, dtype=torch.int64, device=device)
                times = torch.zeros(0, dtype=dtype, device=device)
                states = torch.zeros(0, n_states, dtype=dtype, device=device)
            counts = torch.bincount(samples, minlength=batch)
            width = int(counts.max()) if batch else 0
            # Occurrences were appended step by step, so within a sample they are in time order.
            order = torch.sort(samples, stable=True).indices
            samples, times, states = samples[order], times[order], states[order]
            starts = torch.cumsum(counts, 0) - counts
            slot = torch.arange(samples.shape[0], device=device) - starts[samples]
            t_out = torch.full((batch, width), math.nan, dtype=dtype, device=device)
            y_out = torch.full((batch, width, n_states), math.nan, dtype=dtype, device=device)
            t_out[samples, slot] = times
            y_out[samples, slot] = states
            out[event.name] = EventRecord(t=t_out, y=y_out, count=counts)
        return out


def evaluate(events: Sequence[Event], t: Tensor, y: Tensor, p: Mapping[str, Tensor]) -> Tensor:
    """(A, E): every event function at (t, y), each broadcast to the rows."""
    values = [torch.as_tensor(e.g(t, y, p)).to(y).expand(y.shape[0]) for e in events]
    return torch.stack(values, dim=1)


def explicit_chunk_events(
    steps: int, method: ExplicitRK, limits: Limits, f: Callable, shared: dict[str, Tensor], p: dict[str, Tensor],
    s: LoopState, ptr: Tensor, span: Span, events: tuple[Event, ...], direction: Tensor, g_prev: Tensor,
) -> tuple[LoopState, Tensor, Tensor]:
    """:func:`~odecli.ode.attempt.explicit_chunk` with events: ``steps`` attempts, one host read.

    A row whose accepted attempt changes the sign of an event's g is put back where it was
    (state, counters and controller history: the attempt is undone) and waits, like a row that
    would pass an output time, for the host-driven attempt, which takes the same step again and
    locates the root; so every row still takes exactly the steps it takes alone, and chunks keep
    running between events. Returns the state, ``sync`` = (rows still active, rows waiting for
    the host) and g at each row's last accepted point.
    """
    merged = {**shared, **p}
    pending = torch.zeros_like(s.active)
    for _ in range(steps):
        new = chunk_attempt(method, limits, f, merged, s, ptr, span)
        stepped = new.n_accepted > s.n_accepted
        g_new = evaluate(events, new.t, new.y.detach(), merged)
        hit = crossings(g_prev, g_new, direction).any(dim=1) & stepped
        s = LoopState(*(torch.where(hit.reshape(hit.shape + (1,) * (old.dim() - 1)), old, value)
                        for old, value in zip(s, new)))
        g_prev = torch.where((stepped & ~hit)[:, None], g_new, g_prev)
        pending = pending | hit
    waiting = next_attempt_crosses(s, ptr, span) | (pending & s.active)
    return s, torch.stack([s.active.sum(), waiting.sum()]), g_prev
