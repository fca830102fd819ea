"""The batched solver loop: every sample steps independently, the arithmetic stays batched.

Each sample has its own time, step size, accept/reject decision, controller history, evaluation
pointer, status and counters. One loop iteration attempts one step for every *active* sample.
Finished and failed samples are dropped from the working set (compaction) once they make up half
of it, so they stop costing RHS evaluations. Explicit methods run up to ``chunk`` attempts per
host read (:func:`~odecli.ode.attempt.explicit_chunk`, one pure function, eagerly or under ``torch.compile``): a sample
whose next attempt would pass an evaluation time strictly inside its span waits, unchanged, for a
host-driven attempt (:func:`~odecli.ode.attempt.explicit_attempt`) that records dense output, so every sample takes
exactly the attempts it takes alone. That attempt, and every attempt of implicit methods, reads
the host once per step (evaluation times in the step, samples still running, samples waiting)
and once more per evaluation column it holds. Evaluation times at t_end take the final state.
All other decisions are per-sample ``torch.where`` masks, in :mod:`odecli.ode.attempt`; this module
runs the loop around them: set-up, host reads, dense output, compaction and the result.

Dense output is recorded as (row, column, value) triples and scattered into the result once at
the end, which keeps the loop free of in-place writes so autograd can differentiate through it.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import Tensor

from odecli.ode.attempt import (
    RHS, SUCCESS, Limits, LoopState, Outcome, Span, Trial, explicit_attempt, explicit_chunk, graph_safe_step,
    next_attempt_crosses, outcome, step_size,
)
from odecli.ode.compiled import COMPILE_MODES, FusedStep, fused_step
from odecli.ode.controllers import ControllerState
from odecli.ode.events import Event, EventFunction, EventLog, Found, as_events, explicit_chunk_events
from odecli.ode.initial_step import select_initial_step
from odecli.ode.methods import ExplicitRK
from odecli.ode.options import SolverOptions
from odecli.ode.solution import Solution
from odecli.ode.status import STAT_NAMES, Progress, Status
from odecli.ode.stepper import ExplicitStepper, StepResult

__all__ = ["Attempt", "CHUNK_STEPS", "COMPACT_MIN_ROWS", "RHS", "STAT_NAMES", "Solution", "SolverOptions", "solve"]

CHUNK_STEPS = 4  # explicit attempts per host read (solve's ``chunk``); compile time grows with it
COMPACT_BELOW = 0.5  # compact the working set when fewer than this fraction of it is active
COMPACT_MIN_ROWS = 32  # below this, gathering costs more than the rows it saves (and recompiles)
PROGRESS_INTERVAL_S = 0.2
EVENT = int(Status.EVENT)


@dataclass(frozen=True)
class Attempt:
    """One explicit RK attempt of the working rows, as ``solve``'s ``on_attempt`` hook sees it.

    Enough to integrate a quantity along the solution with the method's own weights over the
    accepted steps only, e.g. the parameter gradient of the backsolve adjoint.
    """

    method: ExplicitRK
    rows: Tensor  # (A,) sample index of each working row
    t: Tensor  # (A,) start of the attempt
    y: Tensor  # (A, n) state there
    h: Tensor  # (A,) attempted step (0 for inactive rows)
    K: list[Tensor]  # stage derivatives, then f at the step's end
    accept: Tensor  # (A,) bool: rows whose attempt is accepted
    params: dict[str, Tensor]  # per-sample parameters of the rows


def _as_batch_vector(value: Tensor | float, batch: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    vec = torch.as_tensor(value, dtype=dtype, device=device)
    # contiguous_format: a size-1 batch would otherwise keep stride 0, and the compiled step
    # guards on strides, so the first loop iteration would compile a second graph.
    vec = vec.expand(batch) if vec.dim() == 0 else vec.reshape(batch)
    return vec.clone(memory_format=torch.contiguous_format)


def _scalar_input(value: float, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A number the fused step reads as a tensor, so one compiled graph serves every value.

    Shape (1,), not (): torch 2.13's compile reads 0-d CPU tensors as Python floats, fails to
    turn them back into tensors and restarts the whole trace (twice the compile time).
    """
    return torch.as_tensor(value, dtype=dtype, device=device).reshape(1)


def _eval_grid(t_eval, t_start: Tensor, t_end: Tensor) -> Tensor:
    batch = t_start.shape[0]
    if t_eval is None:
        return torch.stack([t_start, t_end], dim=1)
    grid = torch.as_tensor(t_eval, dtype=t_start.dtype, device=t_start.device)
    if grid.dim() == 1:
        grid = grid.expand(batch, -1)
    if grid.dim() != 2 or grid.shape[0] != batch:
        raise ValueError(f"t_eval must have shape (n_eval,) or (batch, n_eval), got {tuple(grid.shape)}")
    return grid.contiguous()


def _split_params(params: Mapping[str, Tensor] | None, batch: int) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Per-sample parameters (leading dimension == batch) are compacted with the samples; the rest are shared."""
    per_sample, shared = {}, {}
    for name, value in (params or {}).items():
        value = torch.as_tensor(value)
        (per_sample if value.dim() >= 1 and value.shape[0] == batch else shared)[name] = value
    return per_sample, shared


@dataclass
class WorkingSet:
    """The samples still in the loop: their rows of everything that is compacted with them."""

    idx: Tensor  # (A,) sample of each row
    state: LoopState
    span: Span
    t_start: Tensor  # (A,)
    ptr: Tensor  # (A,) next evaluation column to record
    p: dict[str, Tensor]  # per-sample parameters
    mstate: dict[str, Tensor]  # the method's per-sample memory (e.g. a Jacobian)
    counters: dict[str, Tensor]  # the method's own per-sample counters (Stepper.counter_names)

    def take(self, rows: Tensor) -> WorkingSet:
        span = self.span
        return WorkingSet(
            idx=self.idx[rows], state=LoopState(*(value[rows] for value in self.state)),
            span=Span(span.t_end[rows], span.direction[rows], span.grid[rows],
                      None if span.n_interior is None else span.n_interior[rows]),
            t_start=self.t_start[rows], ptr=self.ptr[rows], p={n: v[rows] for n, v in self.p.items()},
            mstate={n: v[rows] for n, v in self.mstate.items()},
            counters={n: v[rows] for n, v in self.counters.items()},
        )


@dataclass
class _FullBatch:
    """Every sample's latest t, y, h, status and counters, written back from the working rows."""

    t: Tensor
    y: Tensor
    h: Tensor
    status: Tensor
    stats: dict[str, Tensor]  # STAT_NAMES and the method's counters

    def store(self, w: WorkingSet) -> None:
        """Copy the working rows' current values into the full-batch results (out of place)."""
        s = w.state
        self.t = self.t.index_put((w.idx,), s.t.detach())
        self.y = self.y.index_put((w.idx,), s.y)
        self.h = self.h.index_put((w.idx,), s.h.detach())
        self.status = self.status.index_put((w.idx,), s.status)
        for name in STAT_NAMES:
            self.stats[name] = self.stats[name].index_put((w.idx,), getattr(s, name))
        for name, value in w.counters.items():
            self.stats[name] = self.stats[name].index_put((w.idx,), value)


def solve(
    f: RHS,
    y0: Tensor,
    t_start: Tensor | float,
    t_end: Tensor | float,
    t_eval: Tensor | None = None,
    *,
    params: Mapping[str, Tensor] | None = None,
    options: SolverOptions | None = None,
    compact: bool = True,
    compile: bool | str = False,
    chunk: int = CHUNK_STEPS,
    progress: Callable[[Progress], None] | None = None,
    on_attempt: Callable[[Attempt], None] | None = None,
    events: Sequence[Event | EventFunction] | None = None,
    **settings: Any,
) -> Solution:
    """Solve ``dy/dt = f(t, y, p)`` for a batch of independent samples.

    ``y0`` is (B, n). ``t_start``/``t_end`` are scalars or (B,) tensors (either direction).
    ``t_eval`` is None (start and end), a shared (n_eval,) grid or a per-sample (B, n_eval) grid,
    monotone in the direction of integration and inside each span. Per-sample parameters go in
    ``params`` with a leading batch dimension so that ``f`` always sees the rows it is given;
    anything else in ``params`` is passed through unchanged (shared, e.g. for gradients).
    How to step is a :class:`SolverOptions` (``method``, ``rtol``, ``atol``, ``controller``,
    ``dt0``, ``max_steps``), given as ``options`` and/or as keywords (``settings``) that override
    its fields. ``dt0`` is the initial step (the fixed step for fixed-step methods); by default
    it is chosen per sample. ``compile=True`` runs each explicit step (stages, error norm,
    controller and bookkeeping) as one torch.compile'd function once the eager step has cost
    about what compiling it does (:mod:`odecli.ode.compiled`); ``compile="wait"`` compiles before
    the first step. Results equal the eager path to round-off; implicit methods ignore it.
    ``chunk`` is how many explicit attempts run at most between host reads (1: one read per
    attempt; eagerly the length starts at 1 and doubles while no sample waits for dense output);
    it changes no sample's steps, only the grouping, and is 1 while autograd records the solve.
    ``progress`` is called about every 0.2 s with a :class:`Progress` (it costs one extra
    reduction then, nothing otherwise). ``on_attempt`` (explicit methods only) is called with
    every :class:`Attempt` after its accept/reject decision; it makes every attempt read the
    host, as ``chunk=1`` does. ``events`` are :class:`~odecli.ode.events.Event` objects or
    callables ``g(t, y, p) -> (B,)`` (with scipy's ``direction``/``terminal`` attributes), located
    per sample on each accepted step's dense output (:mod:`odecli.ode.events`); a step that
    changes an event's sign is taken by the host-driven attempt, as one with output times. A
    terminal event ends its sample there with status 5 ``event`` (later output times NaN). Returns a :class:`Solution` with per-sample status and statistics,
    and ``events`` (name -> :class:`~odecli.ode.solution.EventRecord`).
    """
    started = time.perf_counter()
    options = SolverOptions.of(options, settings)
    method = options.stepper()
    ctrl = options.pid()
    dt0, max_steps = options.dt0, options.max_steps
    if y0.dim() != 2:
        raise ValueError(f"y0 must have shape (batch, n_states), got {tuple(y0.shape)}")
    if not method.adaptive and dt0 is None:
        raise ValueError(f"method {method.name!r} has a fixed step: pass dt0")
    if max_steps < 1:
        raise ValueError("max_steps must be >= 1")
    if chunk < 1:
        raise ValueError("chunk must be >= 1")
    if compile not in COMPILE_MODES:
        raise ValueError(f"compile must be one of {COMPILE_MODES}, got {compile!r}")
    if on_attempt is not None and not isinstance(method, ExplicitStepper):
        raise ValueError(f"on_attempt needs an explicit Runge-Kutta method, got {method.name!r}")
    batch, n_states = y0.shape
    dtype, device = y0.dtype, y0.device
    y0 = y0.contiguous()  # an expanded y0 (stride 0) would make the compiled step guard on it and recompile
    t0 = _as_batch_vector(t_start, batch, dtype, device)
    t1 = _as_batch_vector(t_end, batch, dtype, device)
    grid = _eval_grid(t_eval, t0, t1)
    n_eval = grid.shape[1]
    per_sample, shared = _split_params(params, batch)
    rtol_t, atol_t = _scalar_input(options.rtol, dtype, device), _scalar_input(options.atol, dtype, device)
    direction = torch.where(t1 >= t0, 1.0, -1.0).to(dtype)

    def bound(p_rows: dict[str, Tensor]) -> Callable[[Tensor, Tensor], Tensor]:
        merged = {**shared, **p_rows}
        return lambda t, y: f(t, y, merged)

    zeros_i = torch.zeros(batch, dtype=torch.int64, device=device)
    f_init = bound(per_sample)(t0, y0)
    n_f_evals = zeros_i + 1
    if dt0 is None:
        h_abs = select_initial_step(bound(per_sample), t0, y0, f_init, direction, method.error_order or method.order, rtol_t, atol_t)
        n_f_evals = n_f_evals + 1
    else:
        h_abs = _as_batch_vector(dt0, batch, dtype, device).abs()
    h_abs = torch.clamp(torch.minimum(h_abs, (t1 - t0).abs()), max=ctrl.dt_max).detach()

    grid_dir = grid * direction[:, None]
    n_interior = (grid_dir < (direction * t1)[:, None]).sum(1)
    interior = bool((n_interior > 0).any())
    ctrl0 = ControllerState.initial(batch, dtype, device)
    w = WorkingSet(
        idx=torch.arange(batch, device=device),
        state=LoopState(
            t=t0, y=y0, f0=f_init, h=direction * h_abs, active=t1 != t0, status=zeros_i.clone(),
            n_steps=zeros_i.clone(), n_accepted=zeros_i.clone(), n_rejected=zeros_i.clone(), n_f_evals=n_f_evals,
            err_prev=ctrl0.err_prev, err_prev2=ctrl0.err_prev2, rejected_last=ctrl0.rejected_last,
        ),
        span=Span(t_end=t1, direction=direction, grid=grid_dir, n_interior=n_interior if interior else None),
        t_start=t0, ptr=zeros_i.clone(), p=per_sample,
        mstate=method.init_state(bound(per_sample), t0, y0, f_init),
        counters={name: zeros_i.clone() for name in method.counter_names},
    )
    full = _FullBatch(t=t0.clone(), y=y0, h=w.state.h.detach().clone(), status=zeros_i.clone(),
                      stats={name: zeros_i.clone() for name in STAT_NAMES + method.counter_names})
    records: list[tuple[Tensor, Tensor, Tensor]] = []
    event_list = as_events(events)
    log = EventLog.start(event_list, t0, y0, {**shared, **per_sample}) if event_list else None

    def record(rows_valid: Tensor, cols: Tensor, values: Tensor) -> None:
        cols = torch.where(rows_valid, cols, n_eval)  # invalid entries go to a discarded column
        records.append((w.idx, cols, values))

    # Evaluation times equal to the start time take y0 directly; those at t_end take the final
    # state after the loop, so only interior times need dense output.
    at_start = torch.searchsorted(w.span.grid, (w.span.direction * w.state.t)[:, None], right=True).squeeze(1)
    for j in range(int(at_start.max())):
        record(j < at_start, torch.full_like(at_start, j), w.state.y)
    w.ptr = at_start.clone()  # not a view: the compiled step guards on an input's base

    explicit = isinstance(method, ExplicitStepper)
    fused = _Fused(compile, f, explicit_attempt) if explicit else None
    # A chunk's masked attempts would cost graph memory when autograd records the solve
    # (direct differentiation), so then every attempt reads the host, as chunk=1 does.
    chunked = explicit and chunk > 1 and not f_init.requires_grad and on_attempt is None
    # With events, a chunk leaves a row whose step changes an event's sign for the host (explicit_chunk_events).
    fused_chunk = _Fused(compile, f, explicit_chunk if log is None else explicit_chunk_events) if chunked else None
    attempts_compiled = 0
    limits = Limits(ctrl, rtol_t, atol_t, _scalar_input(ctrl.dt_min, dtype, device),
                    _scalar_input(ctrl.dt_max, dtype, device), max_steps)

    def attempt_with_dense_output() -> tuple[int, int]:
        """One attempt for every active row, recording the evaluation times it passes.

        Returns (rows still active, rows whose next attempt reaches an interior evaluation time).
        """
        nonlocal attempts_compiled
        s, span = w.state, w.span
        if fused is not None:
            # Explicit RK: one pure function from state to outcome (torch.compile-able).
            compiled = fused.compiled
            o, K = fused(method.method, limits, f, shared, w.p, s, w.ptr, span)
            attempts_compiled += compiled and fused.compiled  # not if the compile failed
            trial = o.trial
            result = StepResult(trial.y_new, trial.f_new, None, method.n_stages,
                                dense=functools.partial(method.interpolant, bound(w.p), s.t, s.y, s.f0, trial.h,
                                                        trial.y_new, trial.f_new, K))
            if on_attempt is not None:
                on_attempt(Attempt(method.method, w.idx, s.t, s.y, trial.h, K, o.accept, w.p))
        else:
            h, last = step_size(s, span)
            result = method.step(bound(w.p), s.t, s.y, s.f0, h, rtol_t, atol_t, w.mstate)
            # Implicit methods retry a non-finite trial step with a smaller one (see attempt.advance).
            flagged = result.nonfinite
            if torch.is_grad_enabled() and (result.y1.requires_grad or result.f1.requires_grad):
                result, flagged = graph_safe_step(method, bound(w.p), s.t, s.y, s.f0, h, rtol_t, atol_t, w.mstate,
                                                  result)
            o = outcome(limits, method.error_order, s, w.ptr, span,
                        Trial(h, last, result.y1, result.f1, result.err, result.n_evals),
                        retry_nonfinite=True, flagged=flagged)
        max_count, n_active, n_crossing = o.sync.tolist()
        found = None
        if log is not None:
            result.dense = functools.cache(result.dense)  # built once for the events and the output times
            found = log.step(w.idx, s.t, o.trial.h, o.t_new, o.trial.y_new, o.accept, {**shared, **w.p},
                             lambda: result.dense()[0], bound(w.p))
            if found is not None and found.t_event is not None:
                o = end_at_events(o, found)
                n_active = int(o.state.active.sum())
        new_state = o.state
        extra = torch.zeros_like(o.count)
        if max_count > 0:
            extra = record_dense_output(o, result, max_count)
        if found is not None:  # rows that located a root paid for the dense output, if it costs evaluations
            extra = torch.maximum(extra, result.dense()[1] * found.located)
        new_state = new_state._replace(n_f_evals=new_state.n_f_evals + extra)
        for name, increment in result.counters.items():
            w.counters[name] = w.counters[name] + s.active * increment
        accept = o.accept
        for key, value in result.state.items():
            mask = accept.reshape(accept.shape + (1,) * (value.dim() - 1))
            w.mstate[key] = torch.where(mask, value, w.mstate[key])
        if result.retry_state:
            rejected = s.active & ~accept
            for key, value in result.retry_state.items():
                mask = rejected.reshape(rejected.shape + (1,) * (value.dim() - 1))
                w.mstate[key] = torch.where(mask, value, w.mstate[key])
        w.ptr = w.ptr + o.count
        w.state = new_state
        return n_active, n_crossing

    def end_at_events(o: Outcome, found: Found) -> Outcome:
        """Rows a terminal event ended stop at its time and state, with only the output times up to it."""
        ended, t_event, y_event = found.ended, found.t_event, found.y_event
        s = o.state
        state = s._replace(t=torch.where(ended, t_event, s.t), y=torch.where(ended[:, None], y_event, s.y),
                           active=s.active & ~ended, status=torch.where(ended, EVENT, s.status))
        count, upto = o.count, o.upto
        if w.span.n_interior is not None:
            span = w.span
            upto_event = torch.searchsorted(span.grid, (span.direction * t_event)[:, None], right=True).squeeze(1)
            upto_event = torch.minimum(torch.minimum(upto_event, span.n_interior), upto)
            upto = torch.where(ended, upto_event, upto)
            count = torch.where(ended, upto - w.ptr, count)
        return o._replace(state=state, count=count, upto=upto)

    def record_dense_output(o: Outcome, result: StepResult, max_count: int) -> Tensor:
        """Record y at the interior evaluation times inside this step; returns the extra RHS evaluations."""
        h, t_new, count, upto, y_new = o.trial.h, o.t_new, o.count, o.upto, o.trial.y_new
        t, grid, direction = w.state.t, w.span.grid, w.span.direction
        interp, extra = None, torch.zeros_like(count)
        for j in range(max_count):
            valid = j < count
            col = torch.clamp(w.ptr + j, max=n_eval - 1)
            t_at = grid.gather(1, col[:, None]).squeeze(1) * direction
            inside = valid & (t_at != t_new)
            if interp is None and bool(inside.any()):
                # Built only when a time falls strictly inside a step: an eval time on the
                # step's end takes y_new as is, and DOP853's extension costs 3 evaluations.
                interp, extra_evals = result.dense()
                last_at = grid.gather(1, (upto - 1).clamp(min=0)[:, None]).squeeze(1) * direction
                extra = extra_evals * ((count > 1) | ((count == 1) & (last_at != t_new)))
            if interp is None:
                value = y_new
            else:
                theta = (t_at - t) / torch.where(h == 0, torch.ones_like(h), h)
                value = torch.where((t_at == t_new)[:, None], y_new, interp(theta))
            record(valid, col, value)
        return extra

    n_active = int(w.state.active.sum())
    n_crossing = 0  # rows whose next attempt reaches an interior evaluation time
    if fused_chunk is not None and interior:
        n_crossing = int(next_attempt_crosses(w.state, w.ptr, w.span).sum())
    reported = time.perf_counter()
    iterations = 0
    # Eagerly, chunks start at one attempt and double while they end with no row waiting for
    # dense output, halving when rows do: a row that starts waiting early in a chunk leaves its
    # remaining attempts as full-batch work for nothing (with evaluation times every step or
    # two, a fixed chunk of 4 made solves 1.8x slower). Compiled, each length is another
    # graph, so the length stays ``chunk``.
    run_length = 1
    while n_active > 0:
        if fused_chunk is not None and n_crossing == 0:
            compiled = fused_chunk.compiled
            length = chunk if compiled else run_length
            if log is None:
                w.state, sync = fused_chunk(length, method.method, limits, f, shared, w.p, w.state, w.ptr, w.span)
            else:
                w.state, sync, log.g_prev = fused_chunk(length, method.method, limits, f, shared, w.p, w.state,
                                                        w.ptr, w.span, tuple(log.events), log.direction, log.g_prev)
            n_active, n_crossing = sync.tolist()
            iterations += length
            attempts_compiled += length * (compiled and fused_chunk.compiled)  # not if the compile failed
            if not compiled:
                run_length = min(chunk, 2 * run_length) if n_crossing == 0 else max(1, run_length // 2)
        else:
            n_active, n_crossing = attempt_with_dense_output()
            iterations += 1
        if progress is not None and time.perf_counter() - reported > PROGRESS_INTERVAL_S:
            reported = time.perf_counter()
            progress(_progress(w, batch, n_active, iterations))
        if compact and w.idx.shape[0] > COMPACT_MIN_ROWS and 0 < n_active <= COMPACT_BELOW * w.idx.shape[0]:
            full.store(w)
            rows = w.state.active.nonzero().squeeze(1)
            w = w.take(rows)
            if log is not None:
                log.take(rows)
    full.store(w)
    if progress is not None:
        progress(Progress(batch, batch, 1.0, iterations))

    y_out = torch.full((batch, n_eval + 1, n_states), math.nan, dtype=dtype, device=device)
    if records:
        rows, cols, values = (torch.cat(parts) for parts in zip(*records))
        y_out = y_out.index_put((rows, cols), values)
    reached = (full.status == SUCCESS) | ((full.status == EVENT) & (full.t == t1))
    at_end = (grid == t1[:, None]) & reached[:, None]
    y_out = torch.where(at_end[:, :, None], full.y[:, None, :], y_out[:, :n_eval])
    stats = dict(full.stats)
    stats["dt0"] = h_abs
    stats["dt_final"] = full.h.abs()
    return Solution(
        t=grid, y=y_out, status=full.status, stats=stats,
        t_final=full.t, y_final=full.y, wall_time_s=time.perf_counter() - started, method=method.name,
        extra={"attempts": iterations, "attempts_compiled": attempts_compiled} if compile and explicit else {},
        events=log.records(batch, n_states) if log is not None else {},
    )


class _Fused:
    """How the loop calls one fused function: eagerly, compiled, or eagerly until compiling pays.

    ``compiled`` says whether the next call runs (or first builds) the compiled copy.
    """

    def __init__(self, mode: bool | str, f: RHS, fn: Callable):
        self.mode = mode
        self.eager = fn
        self.step: FusedStep | None = fused_step(f, fn) if mode else None

    @property
    def compiled(self) -> bool:
        return self.mode == "wait" or (self.step is not None and (self.step.ready or self.step.due()))

    def __call__(self, *args):
        if self.step is None:
            return self.eager(*args)
        return self.step.wait(*args) if self.mode == "wait" else self.step(*args)


def _progress(w: WorkingSet, batch: int, n_active: int, iterations: int) -> Progress:
    s, span = w.state, w.span
    span_done = ((s.t - w.t_start).abs() / (span.t_end - w.t_start).abs().clamp_min(1e-300))
    slowest = float(torch.where(s.active, span_done, torch.ones_like(span_done)).min())
    return Progress(batch - n_active, batch, slowest, iterations)
