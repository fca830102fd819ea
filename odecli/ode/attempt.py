"""One attempted step of every working row, as pure tensor code: the part of the loop torch.compile fuses.

:class:`LoopState` holds the per-sample tensors an attempt reads and replaces; :class:`Span`
the working rows' fixed end, direction and evaluation grid; :class:`Limits` the solve's
tolerances and step limits; :class:`Trial` what the method's step produced. :func:`advance`
turns a trial into the next state (accept/reject, next step, statuses); :func:`outcome` adds
the dense-output bookkeeping the host needs; :func:`explicit_attempt` and :func:`explicit_chunk`
are the fused units the loop in :mod:`odecli.ode.solver` calls eagerly or compiled.

The records are NamedTuples rather than dataclasses: torch.compile (dynamo, AOTAutograd and
``nested_compile_region``) flattens them as pytrees, in and out of a compiled function, with no
registration.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, NamedTuple

import torch
from torch import Tensor

from odecli.ode.controllers import END_SNAP, ControllerState, PIDController
from odecli.ode.methods import ExplicitRK
from odecli.ode.stages import rk_step
from odecli.ode.status import Status
from odecli.ode.stepper import Stepper, StepResult

RHS = Callable[[Tensor, Tensor, Mapping[str, Tensor]], Tensor]
"""``f(t, y, p) -> dy/dt`` with t (A,), y (A, n) and p the per-sample parameters of those rows."""

# Plain ints, not the IntEnum: torch.compile (2.13) mis-evaluates ``tensor == IntEnum member``.
SUCCESS, INFINITE_NORM = int(Status.SUCCESS), int(Status.INFINITE_NORM)
REACHED_DT_MIN, REACHED_MAX_STEPS = int(Status.REACHED_DT_MIN), int(Status.REACHED_MAX_STEPS)


class LoopState(NamedTuple):
    """Per-sample tensors that one attempt reads and replaces (rows of the working set)."""

    t: Tensor  # (A,) current time
    y: Tensor  # (A, n) state there
    f0: Tensor  # (A, n) f(t, y): the next step's first stage
    h: Tensor  # (A,) signed step the controller proposes next
    active: Tensor  # (A,) bool: still integrating
    status: Tensor  # (A,) int64 Status
    n_steps: Tensor  # (A,) int64 counters, as Solution.stats
    n_accepted: Tensor
    n_rejected: Tensor
    n_f_evals: Tensor
    err_prev: Tensor  # (A,) controller history (ControllerState)
    err_prev2: Tensor
    rejected_last: Tensor

    def history(self) -> ControllerState:
        return ControllerState(self.err_prev, self.err_prev2, self.rejected_last)


class Span(NamedTuple):
    """Per-row constants of the working set: where each row ends, which way, and its output times."""

    t_end: Tensor  # (A,)
    direction: Tensor  # (A,) +1.0 or -1.0
    grid: Tensor  # (A, n_eval) evaluation times times direction (increasing)
    n_interior: Tensor | None  # (A,) evaluation times strictly before t_end; None when no row has one


class Limits(NamedTuple):
    """The solve's constants an attempt reads: the controller, tolerances and step limits.

    Tolerances and step limits are (1,) tensors so that one compiled graph serves every value.
    """

    ctrl: PIDController
    rtol: Tensor
    atol: Tensor
    dt_min: Tensor
    dt_max: Tensor
    max_steps: int


class Trial(NamedTuple):
    """One attempted step of the working rows, before the controller's decision."""

    h: Tensor  # (A,) attempted step (0 for inactive rows)
    last: Tensor  # (A,) bool: the step reaches t_end
    y_new: Tensor  # (A, n)
    f_new: Tensor  # (A, n) f at the step's end
    err: Tensor | None  # (A,) error norm; None for fixed-step methods
    n_evals: int | Tensor  # right-hand side evaluations per row


class Advanced(NamedTuple):
    """:func:`advance`'s result: the next state, which rows accepted, and the attempted step's end."""

    state: LoopState
    accept: Tensor
    t_new: Tensor


class Outcome(NamedTuple):
    """:func:`outcome`'s result: :class:`Advanced` plus what the host needs for dense output.

    ``count``: interior evaluation times inside (t, t_new] of each accepted row; ``upto``: the
    evaluation pointer after them; ``sync`` packs the three numbers the host reads after the
    step (most evaluation times in one row's step, rows still running, rows whose next attempt
    reaches an evaluation time).
    """

    state: LoopState
    accept: Tensor
    t_new: Tensor
    trial: Trial
    count: Tensor
    upto: Tensor
    sync: Tensor


def step_size(s: LoopState, span: Span) -> tuple[Tensor, Tensor]:
    """The step each row attempts (0 for inactive rows) and whether it reaches t_end."""
    remaining = (span.t_end - s.t).abs()
    # A step that would stop within a hair of the end takes it, so round-off in t does not
    # leave a sliver of a step (1001 rk4 steps of 0.01 on [0, 10]).
    last = s.h.abs() * (1 + END_SNAP) >= remaining
    h = torch.where(s.active, span.direction * torch.minimum(s.h.abs(), remaining), torch.zeros_like(s.h))
    return h, last


def reaches_eval_time(h: Tensor, last: Tensor, t: Tensor, span: Span, ptr: Tensor) -> Tensor:
    """Rows whose attempt (t, t + h] would reach their next evaluation time before t_end."""
    assert span.n_interior is not None
    t_new = torch.where(last, span.t_end, t + h)
    upcoming = span.grid.gather(1, ptr.clamp(max=span.grid.shape[1] - 1)[:, None]).squeeze(1)
    return (ptr < span.n_interior) & (span.direction * t_new >= upcoming)


def next_attempt_crosses(s: LoopState, ptr: Tensor, span: Span) -> Tensor:
    """Active rows whose next attempt needs dense output, which only the host-driven attempt records."""
    if span.n_interior is None:
        return torch.zeros_like(s.active)
    h, last = step_size(s, span)
    return s.active & reaches_eval_time(h, last, s.t, span, ptr)


def advance(
    limits: Limits, error_order: int | None, s: LoopState, active: Tensor, trial: Trial, span: Span,
    retry_nonfinite: bool = False, flagged: Tensor | None = None,
) -> Advanced:
    """The loop state after one attempt of the ``active`` rows, as pure tensor code (no host sync).

    Accept/reject and the next step come from the controller; failures set the status. Also
    returns ``accept`` and ``t_new`` (the attempted step's end).

    Non-finite trial steps. By default (the explicit methods, which the generated C solver
    reproduces step for step) a non-finite error norm ends the sample at once with
    ``INFINITE_NORM``. With ``retry_nonfinite`` (the implicit methods) a trial step whose error
    norm, result or end derivative is non-finite, or that the stepper ``flagged`` (e.g. a
    Newton iteration that produced non-finite values), is rejected and retried with the step
    shrunk by the controller's ``factor_min``, as scipy's solvers (a NaN norm there shrinks by
    their minimum factor), diffrax and the ESDIRK Newton failure handling do: an implicit step
    too large for a stiff problem commonly overflows, and a smaller one succeeds. The sample
    fails only when the shrinking cannot go on, i.e. when the retried step would fall below
    ``dt_min`` or below the resolution of t, the same test that otherwise gives
    ``REACHED_DT_MIN``; it then reports ``INFINITE_NORM``, the real cause. That bounds the
    retries in a row by log(h / max(dt_min, ulp(t))) / log(1 / factor_min) (about 23 from h = 1
    at t = 1 with the default 0.2). A sample that creeps up to a region where f is NaN alternates
    accepted steps and retries until it stands within an ulp or so of it (80-120 attempts
    measured for a region starting at t = 1); a dt_min ends that sooner. There is no separate
    cap on non-finite retries: stiff Van der Pol samples at rtol 1e-3..1e-1 met up to 4 in a row
    and up to 7 before getting past the step that first overflowed, then finished, so a small
    cap would fail samples that can be solved, and the resolution test needs no tuning. A sample
    whose derivative at its current point, or whose step, is non-finite can never succeed by
    retrying (every retry starts from that derivative), so it fails at once.
    """
    ctrl = limits.ctrl
    h, last, y_new, f_new, err = trial.h, trial.last, trial.y_new, trial.f_new, trial.err
    t, h_prev, status = s.t, s.h, s.status
    history = s.history()
    n_steps = s.n_steps + active
    if err is None:
        finite = torch.isfinite(y_new).all(dim=-1)
        accept = active & finite
        factor = torch.ones_like(h)
        state = history
    else:
        err = err.detach()
        finite = torch.isfinite(err)
        ok, factor, new_state = ctrl.adapt(err, history, error_order)
        accept = active & ok & finite
        state = new_state.where(active, history)
    if retry_nonfinite:
        finite = finite & torch.isfinite(y_new.detach()).all(dim=-1) & torch.isfinite(f_new.detach()).all(dim=-1)
        if flagged is not None:
            finite = finite & ~flagged
        hopeless = ~torch.isfinite(s.f0.detach()).all(dim=-1) | ~torch.isfinite(h.detach())
        accept = accept & finite & ~hopeless
        # A non-finite trial shrinks the step as much as the controller ever does and leaves
        # the controller's history as a rejection does.
        bad = active & ~finite
        factor = torch.where(bad, torch.full_like(factor, ctrl.factor_min), factor)
        state = ControllerState(torch.where(bad, history.err_prev, state.err_prev),
                                torch.where(bad, history.err_prev2, state.err_prev2), state.rejected_last | bad)
    t_new = torch.where(last, span.t_end, t + h)
    done = accept & last
    h_next = torch.minimum((h.detach() * factor).abs(), limits.dt_max) * span.direction
    h_next = torch.where(done | ~active, h_prev, h_next)
    if retry_nonfinite:
        status = torch.where(active & hopeless, INFINITE_NORM, status)
    else:
        status = torch.where(active & ~finite, INFINITE_NORM, status)
    running = active & ~done & (status == SUCCESS)
    t_after = torch.where(accept, t_new, t)
    too_small = (h_next.abs() < limits.dt_min) | (t_after + h_next == t_after)
    if retry_nonfinite:
        # A row whose non-finite trial leaves it no smaller step to try failed on non-finite
        # values, not on a controller that asked for tiny steps.
        status = torch.where(running & too_small, torch.where(finite, REACHED_DT_MIN, INFINITE_NORM), status)
    else:
        status = torch.where(running & too_small, REACHED_DT_MIN, status)
    status = torch.where(running & (n_steps >= limits.max_steps) & (status == SUCCESS),
                         REACHED_MAX_STEPS, status)
    new = LoopState(
        t=t_after, y=torch.where(accept[:, None], y_new, s.y), f0=torch.where(accept[:, None], f_new, s.f0),
        h=h_next, active=active & ~done & (status == SUCCESS), status=status, n_steps=n_steps,
        n_accepted=s.n_accepted + accept, n_rejected=s.n_rejected + (active & ~accept),
        n_f_evals=s.n_f_evals + active * trial.n_evals,
        err_prev=state.err_prev, err_prev2=state.err_prev2, rejected_last=state.rejected_last,
    )
    return Advanced(new, accept, t_new)


def nonfinite_trial(result: StepResult, h: Tensor) -> Tensor:
    """Rows of an implicit attempt whose trial step met non-finite values (see :func:`advance`)."""
    finite = torch.isfinite(result.y1.detach()).all(dim=-1) & torch.isfinite(result.f1.detach()).all(dim=-1)
    if result.err is not None:
        finite = finite & torch.isfinite(result.err.detach())
    if result.nonfinite is not None:
        finite = finite & ~result.nonfinite
    return (h != 0) & ~finite


def graph_safe_step(
    method: Stepper, rhs: Callable[[Tensor, Tensor], Tensor], t: Tensor, y: Tensor, f0: Tensor, h: Tensor,
    rtol: Tensor, atol: Tensor, mstate: dict[str, Tensor], result: StepResult,
) -> tuple[StepResult, Tensor]:
    """The attempt's result with no non-finite values in autograd's graph, and the rows that met them.

    A rejected row still has its trial in the graph (``torch.where`` sends it a zero gradient),
    and backward through an infinite or NaN value gives 0 * inf = NaN, so one retried overflow
    would make the gradient of a successful solve NaN. When a row met non-finite values the
    attempt is computed again with those rows idle (h = 0, the harmless values inactive rows
    get); the other rows' arithmetic is the same, so their values are too. The rows keep their
    first trial's evaluation counts, counters and retry state, and are rejected as non-finite.
    """
    bad = nonfinite_trial(result, h)
    if not bool(bad.any()):
        return result, result.nonfinite
    redo = method.step(rhs, t, y, f0, torch.where(bad, torch.zeros_like(h), h), rtol, atol, mstate)

    def pick(first, second):
        if not isinstance(first, Tensor) or first.dim() == 0:
            first = torch.as_tensor(first, device=bad.device).expand(bad.shape)
        mask = bad.reshape(bad.shape + (1,) * (first.dim() - 1))
        return torch.where(mask, first, second)

    return dataclasses.replace(
        redo, n_evals=pick(result.n_evals, redo.n_evals),
        counters={**redo.counters, **{k: pick(v, redo.counters.get(k, v)) for k, v in result.counters.items()}},
        retry_state={**redo.retry_state,
                     **{k: pick(v, redo.retry_state.get(k, v)) for k, v in result.retry_state.items()}},
        nonfinite=None,
    ), bad


def outcome(
    limits: Limits, error_order: int | None, s: LoopState, ptr: Tensor, span: Span, trial: Trial,
    retry_nonfinite: bool = False, flagged: Tensor | None = None,
) -> Outcome:
    """:func:`advance` plus the count of interior evaluation times inside (t, t_new] for dense output."""
    new, accept, t_new = advance(limits, error_order, s, s.active, trial, span, retry_nonfinite, flagged)
    if span.n_interior is None:
        count = upto = torch.zeros_like(ptr)
    else:
        upto = torch.searchsorted(span.grid, (span.direction * t_new)[:, None], right=True).squeeze(1)
        upto = torch.minimum(upto, span.n_interior)
        count = torch.where(accept, upto - ptr, torch.zeros_like(upto))
    crossing = next_attempt_crosses(new, ptr + count, span)
    sync = torch.stack([count.max(), new.active.sum(), crossing.sum()])
    return Outcome(new, accept, t_new, trial, count, upto, sync)


def explicit_attempt(
    method: ExplicitRK, limits: Limits, f: RHS, shared: dict[str, Tensor], p: dict[str, Tensor],
    s: LoopState, ptr: Tensor, span: Span,
) -> tuple[Outcome, list[Tensor]]:
    """One explicit RK attempt plus its dense-output bookkeeping (the host records the values)."""
    merged = {**shared, **p}
    h, last = step_size(s, span)
    y_new, f_new, K, err = rk_step(method, lambda tt, yy: f(tt, yy, merged), s.t, s.y, s.f0, h,
                                   limits.rtol, limits.atol)
    trial = Trial(h, last, y_new, f_new, err, method.n_stages)
    return outcome(limits, method.error_order, s, ptr, span, trial), K


def explicit_chunk(
    steps: int, method: ExplicitRK, limits: Limits, f: RHS, shared: dict[str, Tensor], p: dict[str, Tensor],
    s: LoopState, ptr: Tensor, span: Span,
) -> tuple[LoopState, Tensor]:
    """``steps`` explicit attempts with one host read at the end: the fused unit torch.compile captures.

    A row whose next attempt would reach an interior evaluation time waits (stays active,
    unchanged) for the host-driven :func:`explicit_attempt`, which records dense output; rows
    that finish or fail mid-chunk are masked. Every row takes exactly the attempts it takes
    alone, only the grouping into host reads changes. Returns the state and ``sync`` = (rows
    still active, rows waiting for dense output).
    """
    merged = {**shared, **p}
    for _ in range(steps):
        s = chunk_attempt(method, limits, f, merged, s, ptr, span)
    crossing = next_attempt_crosses(s, ptr, span)
    return s, torch.stack([s.active.sum(), crossing.sum()])


# A region compiled once and stamped out for each attempt of a chunk, instead of traced and
# lowered ``steps`` times: a cold compile of the 4-attempt chunk fell from 24 s to 18 s. Eagerly
# it is a plain call; torch < 2.8 lacks it and unrolls.
_compiled_once = getattr(torch.compiler, "nested_compile_region", lambda fn: fn)


@_compiled_once
def chunk_attempt(
    method: ExplicitRK, limits: Limits, f: RHS, merged: dict[str, Tensor], s: LoopState, ptr: Tensor, span: Span,
) -> LoopState:
    """One attempt of a chunk; rows whose attempt would reach an interior evaluation time wait."""
    h, last = step_size(s, span)
    stepping = s.active
    if span.n_interior is not None:
        waiting = stepping & reaches_eval_time(h, last, s.t, span, ptr)
        stepping = stepping & ~waiting
        h = torch.where(waiting, torch.zeros_like(h), h)
    y_new, f_new, _, err = rk_step(method, lambda tt, yy: f(tt, yy, merged), s.t, s.y, s.f0, h,
                                   limits.rtol, limits.atol)
    new = advance(limits, method.error_order, s, stepping, Trial(h, last, y_new, f_new, err, method.n_stages),
                  span).state
    if span.n_interior is not None:
        new = new._replace(active=new.active | waiting)
    return new
