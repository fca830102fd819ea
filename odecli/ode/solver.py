"""The batched solver loop: every sample steps independently, the arithmetic stays batched.

Each sample has its own time, step size, accept/reject decision, controller history, evaluation
pointer, status and counters. One loop iteration attempts one step for every *active* sample.
Finished and failed samples are dropped from the working set (compaction) once they make up half
of it, so they stop costing RHS evaluations. Explicit methods run up to ``chunk`` attempts per
host read (``_explicit_chunk``, one pure function, eagerly or under ``torch.compile``): a sample
whose next attempt would pass an evaluation time strictly inside its span waits, unchanged, for a
host-driven attempt (``_explicit_attempt``) that records dense output, so every sample takes
exactly the attempts it takes alone. That attempt, and every attempt of implicit methods, reads
the host once per step (evaluation times in the step, samples still running, samples waiting)
and once more per evaluation column it holds. Evaluation times at t_end take the final state.
All other decisions are per-sample ``torch.where`` masks.

Dense output is recorded as (row, column, value) triples and scattered into the result once at
the end, which keeps the loop free of in-place writes so autograd can differentiate through it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

import torch
from torch import Tensor

from odecli.ode.compiled import COMPILE_MODES, FusedStep, fused_step
from odecli.ode.controllers import END_SNAP, ControllerState, PIDController, make_controller
from odecli.ode.initial_step import select_initial_step
from odecli.ode.status import STAT_NAMES, Progress, Status
from odecli.ode.methods import ExplicitRK
from odecli.ode.stages import rk_step
from odecli.ode.stepper import ExplicitStepper, Stepper, StepResult, get_stepper

RHS = Callable[[Tensor, Tensor, Mapping[str, Tensor]], Tensor]
"""``f(t, y, p) -> dy/dt`` with t (A,), y (A, n) and p the per-sample parameters of those rows."""

LOOP_STATE = ("t", "y", "f0", "h", "active", "status", *STAT_NAMES, "err_prev", "err_prev2", "rejected_last")
"""Per-sample tensors that one attempt reads and replaces (the fused step's state)."""
CHUNK_STEPS = 4  # explicit attempts per host read (solve's ``chunk``); compile time grows with it
COMPACT_BELOW = 0.5  # compact the working set when fewer than this fraction of it is active
COMPACT_MIN_ROWS = 32  # below this, gathering costs more than the rows it saves (and recompiles)
PROGRESS_INTERVAL_S = 0.2
# Plain ints, not the IntEnum: torch.compile (2.13) mis-evaluates ``tensor == IntEnum member``.
SUCCESS, INFINITE_NORM = int(Status.SUCCESS), int(Status.INFINITE_NORM)
REACHED_DT_MIN, REACHED_MAX_STEPS = int(Status.REACHED_DT_MIN), int(Status.REACHED_MAX_STEPS)


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


@dataclass
class Solution:
    """Result of a batched solve; every tensor has the batch as its first dimension."""

    t: Tensor  # (B, n_eval) evaluation times
    y: Tensor  # (B, n_eval, n_states); NaN where a failed sample never reached the time
    status: Tensor  # (B,) int64, see odecli.ode.status.Status
    stats: dict[str, Tensor]  # (B,) int64 counters, plus dt0 / dt_final (B,) floats
    t_final: Tensor  # (B,) time each sample stopped at
    y_final: Tensor  # (B, n_states) state there
    wall_time_s: float = 0.0
    method: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def success(self) -> Tensor:
        return self.status == Status.SUCCESS


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


class _Working:
    """Tensors of the samples currently in the working set (rows map to samples via ``idx``)."""

    def __init__(self, **tensors: Tensor):
        self.__dict__.update(tensors)

    def take(self, rows: Tensor) -> "_Working":
        return _Working(**{k: {n: p[rows] for n, p in v.items()} if isinstance(v, dict) else v[rows]
                           for k, v in self.__dict__.items()})


def solve(
    f: RHS,
    y0: Tensor,
    t_start: Tensor | float,
    t_end: Tensor | float,
    t_eval: Tensor | None = None,
    *,
    params: Mapping[str, Tensor] | None = None,
    method: str | Stepper = "dopri5",
    rtol: float = 1e-6,
    atol: float = 1e-6,
    controller: str | PIDController = "integral",
    dt0: float | Tensor | None = None,
    max_steps: int = 100_000,
    compact: bool = True,
    compile: bool | str = False,
    chunk: int = CHUNK_STEPS,
    progress: Callable[[Progress], None] | None = None,
    on_attempt: Callable[[Attempt], None] | None = None,
) -> Solution:
    """Solve ``dy/dt = f(t, y, p)`` for a batch of independent samples.

    ``y0`` is (B, n). ``t_start``/``t_end`` are scalars or (B,) tensors (either direction).
    ``t_eval`` is None (start and end), a shared (n_eval,) grid or a per-sample (B, n_eval) grid,
    monotone in the direction of integration and inside each span. Per-sample parameters go in
    ``params`` with a leading batch dimension so that ``f`` always sees the rows it is given;
    anything else in ``params`` is passed through unchanged (shared, e.g. for gradients).
    ``dt0`` is the initial step (the fixed step for fixed-step methods); by default it is chosen
    per sample. ``compile=True`` runs each explicit step (stages, error norm, controller and
    bookkeeping) as one torch.compile'd function once the eager step has cost about what
    compiling it does (:mod:`odecli.ode.compiled`); ``compile="wait"`` compiles before the
    first step. Results equal the eager path to round-off; implicit methods ignore it.
    ``chunk`` is how many explicit attempts run at most between host reads (1: one read per
    attempt; eagerly the length starts at 1 and doubles while no sample waits for dense output);
    it changes no sample's steps, only the grouping, and is 1 while autograd records the solve.
    ``progress`` is called about every 0.2 s with a :class:`Progress` (it costs one extra
    reduction then, nothing otherwise). ``on_attempt`` (explicit methods only) is called with
    every :class:`Attempt` after its accept/reject decision; it makes every attempt read the
    host, as ``chunk=1`` does. Returns a :class:`Solution` with per-sample status and statistics.
    """
    started = time.perf_counter()
    method = get_stepper(method) if isinstance(method, str) else method
    ctrl = make_controller(controller) if isinstance(controller, str) else controller
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
    rtol_t, atol_t = _scalar_input(rtol, dtype, device), _scalar_input(atol, dtype, device)
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
    w = _Working(
        idx=torch.arange(batch, device=device), t=t0, y=y0, f0=f_init, h=direction * h_abs,
        t_start=t0, t_end=t1, direction=direction, grid=grid_dir, n_interior=n_interior,
        ptr=zeros_i.clone(), status=zeros_i.clone(), active=t1 != t0,
        n_steps=zeros_i.clone(), n_accepted=zeros_i.clone(), n_rejected=zeros_i.clone(), n_f_evals=n_f_evals,
        err_prev=ctrl0.err_prev, err_prev2=ctrl0.err_prev2, rejected_last=ctrl0.rejected_last, p=per_sample,
        mstate=method.init_state(bound(per_sample), t0, y0, f_init),
        **{name: zeros_i.clone() for name in method.counter_names},
    )
    full = {
        "t": t0.clone(), "y": y0, "status": zeros_i.clone(), "h": w.h.detach().clone(),
        **{name: zeros_i.clone() for name in STAT_NAMES + method.counter_names},
    }
    records: list[tuple[Tensor, Tensor, Tensor]] = []

    def record(rows_valid: Tensor, cols: Tensor, values: Tensor) -> None:
        cols = torch.where(rows_valid, cols, n_eval)  # invalid entries go to a discarded column
        records.append((w.idx, cols, values))

    # Evaluation times equal to the start time take y0 directly; those at t_end take the final
    # state after the loop, so only interior times need dense output.
    at_start = torch.searchsorted(w.grid, (w.direction * w.t)[:, None], right=True).squeeze(1)
    for j in range(int(at_start.max())):
        record(j < at_start, torch.full_like(at_start, j), w.y)
    w.ptr = at_start.clone()  # not a view: the compiled step guards on an input's base

    explicit = isinstance(method, ExplicitStepper)
    fused = _Fused(compile, f, _explicit_attempt) if explicit else None
    # A chunk's masked attempts would cost graph memory when autograd records the solve
    # (direct differentiation), so then every attempt reads the host, as chunk=1 does.
    chunked = explicit and chunk > 1 and not f_init.requires_grad and on_attempt is None
    fused_chunk = _Fused(compile, f, _explicit_chunk) if chunked else None
    attempts_compiled = 0
    dt_min_t, dt_max_t = _scalar_input(ctrl.dt_min, dtype, device), _scalar_input(ctrl.dt_max, dtype, device)

    def attempt_with_dense_output() -> tuple[int, int]:
        """One attempt for every active row, recording the evaluation times it passes.

        Returns (rows still active, rows whose next attempt reaches an interior evaluation time).
        """
        nonlocal attempts_compiled
        s = _loop_state(w)
        n_int = w.n_interior if interior else None
        if fused is not None:
            # Explicit RK: one pure function from state to outcome (torch.compile-able).
            args = (method.method, ctrl, f, shared, w.p, s, w.ptr, w.t_end, w.direction, w.grid, n_int,
                    rtol_t, atol_t, dt_min_t, dt_max_t, max_steps)
            compiled = fused.compiled
            o, K = fused(*args)
            attempts_compiled += compiled and fused.compiled  # not if the compile failed
            result = StepResult(o["y_new"], o["f_new"], None, method.n_stages,
                                dense=functools.partial(method.interpolant, bound(w.p), w.t, w.y, w.f0, o["h_try"],
                                                        o["y_new"], o["f_new"], K))
            if on_attempt is not None:
                on_attempt(Attempt(method.method, w.idx, w.t, w.y, o["h_try"], K, o["accept"], w.p))
        else:
            h, last = _step_size(w.h, w.t, w.t_end, w.direction, w.active)
            result = method.step(bound(w.p), w.t, w.y, w.f0, h, rtol_t, atol_t, w.mstate)
            # Implicit methods retry a non-finite trial step with a smaller one (see _advance).
            flagged = result.nonfinite
            if torch.is_grad_enabled() and (result.y1.requires_grad or result.f1.requires_grad):
                result, flagged = _graph_safe_step(method, bound(w.p), w.t, w.y, w.f0, h, rtol_t, atol_t, w.mstate,
                                                   result)
            o = _outcome(ctrl, method.error_order, s, w.ptr, w.t_end, w.direction, w.grid, n_int,
                         result.n_evals, h, last, result.y1, result.f1, result.err, dt_min_t, dt_max_t, max_steps,
                         retry_nonfinite=True, flagged=flagged)
        max_count, n_active, n_crossing = o["sync"].tolist()
        if max_count > 0:
            o["n_f_evals"] = o["n_f_evals"] + record_dense_output(o, result, max_count)
        for name, increment in result.counters.items():
            setattr(w, name, getattr(w, name) + w.active * increment)
        accept = o["accept"]
        for key, value in result.state.items():
            mask = accept.reshape(accept.shape + (1,) * (value.dim() - 1))
            w.mstate[key] = torch.where(mask, value, w.mstate[key])
        if result.retry_state:
            rejected = w.active & ~accept
            for key, value in result.retry_state.items():
                mask = rejected.reshape(rejected.shape + (1,) * (value.dim() - 1))
                w.mstate[key] = torch.where(mask, value, w.mstate[key])
        w.ptr = w.ptr + o["count"]
        w.__dict__.update({name: o[name] for name in LOOP_STATE})
        return n_active, n_crossing

    def record_dense_output(o: dict[str, Tensor], result: StepResult, max_count: int) -> Tensor:
        """Record y at the interior evaluation times inside this step; returns the extra RHS evaluations."""
        h, t_new, count, upto, y_new = o["h_try"], o["t_new"], o["count"], o["upto"], o["y_new"]
        interp, extra = None, torch.zeros_like(count)
        for j in range(max_count):
            valid = j < count
            col = torch.clamp(w.ptr + j, max=n_eval - 1)
            t_at = w.grid.gather(1, col[:, None]).squeeze(1) * w.direction
            inside = valid & (t_at != t_new)
            if interp is None and bool(inside.any()):
                # Built only when a time falls strictly inside a step: an eval time on the
                # step's end takes y_new as is, and DOP853's extension costs 3 evaluations.
                interp, extra_evals = result.dense()
                last_at = w.grid.gather(1, (upto - 1).clamp(min=0)[:, None]).squeeze(1) * w.direction
                extra = extra_evals * ((count > 1) | ((count == 1) & (last_at != t_new)))
            if interp is None:
                value = y_new
            else:
                theta = (t_at - w.t) / torch.where(h == 0, torch.ones_like(h), h)
                value = torch.where((t_at == t_new)[:, None], y_new, interp(theta))
            record(valid, col, value)
        return extra

    n_active = int(w.active.sum())
    n_crossing = 0  # rows whose next attempt reaches an interior evaluation time
    if fused_chunk is not None and interior:
        n_crossing = int(_next_attempt_crosses(_loop_state(w), w.ptr, w.t_end, w.direction, w.grid, w.n_interior).sum())
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
            args = (method.method, ctrl, f, shared, w.p, _loop_state(w), w.ptr, w.t_end, w.direction, w.grid,
                    w.n_interior if interior else None, rtol_t, atol_t, dt_min_t, dt_max_t, max_steps)
            compiled = fused_chunk.compiled
            length = chunk if compiled else run_length
            new = fused_chunk(length, *args)
            n_active, n_crossing = new.pop("sync").tolist()
            w.__dict__.update(new)
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
            _store(full, w, method.counter_names)
            w = w.take(w.active.nonzero().squeeze(1))
    _store(full, w, method.counter_names)
    if progress is not None:
        progress(Progress(batch, batch, 1.0, iterations))

    y_out = torch.full((batch, n_eval + 1, n_states), math.nan, dtype=dtype, device=device)
    if records:
        rows, cols, values = (torch.cat(parts) for parts in zip(*records))
        y_out = y_out.index_put((rows, cols), values)
    at_end = (grid == t1[:, None]) & (full["status"] == SUCCESS)[:, None]
    y_out = torch.where(at_end[:, :, None], full["y"][:, None, :], y_out[:, :n_eval])
    stats = {name: full[name] for name in STAT_NAMES + method.counter_names}
    stats["dt0"] = h_abs
    stats["dt_final"] = full["h"].abs()
    return Solution(
        t=grid, y=y_out, status=full["status"], stats=stats,
        t_final=full["t"], y_final=full["y"], wall_time_s=time.perf_counter() - started, method=method.name,
        extra={"attempts": iterations, "attempts_compiled": attempts_compiled} if compile and explicit else {},
    )


def _loop_state(w: _Working) -> dict[str, Tensor]:
    return {name: getattr(w, name) for name in LOOP_STATE}


def _step_size(h_prev: Tensor, t: Tensor, t_end: Tensor, direction: Tensor, active: Tensor) -> tuple[Tensor, Tensor]:
    """The step each row attempts (0 for inactive rows) and whether it reaches t_end."""
    remaining = (t_end - t).abs()
    # A step that would stop within a hair of the end takes it, so round-off in t does not
    # leave a sliver of a step (1001 rk4 steps of 0.01 on [0, 10]).
    last = h_prev.abs() * (1 + END_SNAP) >= remaining
    h = torch.where(active, direction * torch.minimum(h_prev.abs(), remaining), torch.zeros_like(h_prev))
    return h, last


def _reaches_eval_time(
    h: Tensor, last: Tensor, t: Tensor, t_end: Tensor, direction: Tensor, ptr: Tensor, grid: Tensor, n_interior: Tensor
) -> Tensor:
    """Rows whose attempt (t, t + h] would reach their next evaluation time before t_end."""
    t_new = torch.where(last, t_end, t + h)
    upcoming = grid.gather(1, ptr.clamp(max=grid.shape[1] - 1)[:, None]).squeeze(1)
    return (ptr < n_interior) & (direction * t_new >= upcoming)


def _next_attempt_crosses(
    s: dict[str, Tensor], ptr: Tensor, t_end: Tensor, direction: Tensor, grid: Tensor, n_interior: Tensor | None
) -> Tensor:
    """Active rows whose next attempt needs dense output, which only the host-driven attempt records."""
    if n_interior is None:
        return torch.zeros_like(s["active"])
    h, last = _step_size(s["h"], s["t"], t_end, direction, s["active"])
    return s["active"] & _reaches_eval_time(h, last, s["t"], t_end, direction, ptr, grid, n_interior)


def _advance(
    ctrl: PIDController, error_order: int | None, s: dict[str, Tensor], active: Tensor, h: Tensor, last: Tensor,
    y_new: Tensor, f_new: Tensor, err: Tensor | None, n_evals: int | Tensor, t_end: Tensor, direction: Tensor,
    dt_min: Tensor, dt_max: Tensor, max_steps: int, retry_nonfinite: bool = False, flagged: Tensor | None = None,
) -> dict[str, Tensor]:
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
    t, h_prev, status = s["t"], s["h"], s["status"]
    history = ControllerState(s["err_prev"], s["err_prev2"], s["rejected_last"])
    n_steps = s["n_steps"] + active
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
        hopeless = ~torch.isfinite(s["f0"].detach()).all(dim=-1) | ~torch.isfinite(h.detach())
        accept = accept & finite & ~hopeless
        # A non-finite trial shrinks the step as much as the controller ever does and leaves
        # the controller's history as a rejection does.
        bad = active & ~finite
        factor = torch.where(bad, torch.full_like(factor, ctrl.factor_min), factor)
        state = ControllerState(torch.where(bad, history.err_prev, state.err_prev),
                                torch.where(bad, history.err_prev2, state.err_prev2), state.rejected_last | bad)
    t_new = torch.where(last, t_end, t + h)
    done = accept & last
    h_next = torch.minimum((h.detach() * factor).abs(), dt_max) * direction
    h_next = torch.where(done | ~active, h_prev, h_next)
    if retry_nonfinite:
        status = torch.where(active & hopeless, INFINITE_NORM, status)
    else:
        status = torch.where(active & ~finite, INFINITE_NORM, status)
    running = active & ~done & (status == SUCCESS)
    t_after = torch.where(accept, t_new, t)
    too_small = (h_next.abs() < dt_min) | (t_after + h_next == t_after)
    if retry_nonfinite:
        # A row whose non-finite trial leaves it no smaller step to try failed on non-finite
        # values, not on a controller that asked for tiny steps.
        status = torch.where(running & too_small, torch.where(finite, REACHED_DT_MIN, INFINITE_NORM), status)
    else:
        status = torch.where(running & too_small, REACHED_DT_MIN, status)
    status = torch.where(running & (n_steps >= max_steps) & (status == SUCCESS),
                         REACHED_MAX_STEPS, status)
    return {
        "t": t_after, "y": torch.where(accept[:, None], y_new, s["y"]),
        "f0": torch.where(accept[:, None], f_new, s["f0"]), "h": h_next,
        "active": active & ~done & (status == SUCCESS), "status": status, "n_steps": n_steps,
        "n_accepted": s["n_accepted"] + accept, "n_rejected": s["n_rejected"] + (active & ~accept),
        "n_f_evals": s["n_f_evals"] + active * n_evals,
        "err_prev": state.err_prev, "err_prev2": state.err_prev2, "rejected_last": state.rejected_last,
        "accept": accept, "t_new": t_new,
    }


def _nonfinite_trial(result: StepResult, h: Tensor) -> Tensor:
    """Rows of an implicit attempt whose trial step met non-finite values (see :func:`_advance`)."""
    finite = torch.isfinite(result.y1.detach()).all(dim=-1) & torch.isfinite(result.f1.detach()).all(dim=-1)
    if result.err is not None:
        finite = finite & torch.isfinite(result.err.detach())
    if result.nonfinite is not None:
        finite = finite & ~result.nonfinite
    return (h != 0) & ~finite


def _graph_safe_step(
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
    bad = _nonfinite_trial(result, h)
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


def _outcome(
    ctrl: PIDController, error_order: int | None, s: dict[str, Tensor], ptr: Tensor, t_end: Tensor,
    direction: Tensor, grid: Tensor, n_interior: Tensor | None, n_evals: int | Tensor, h: Tensor, last: Tensor,
    y_new: Tensor, f_new: Tensor, err: Tensor | None, dt_min: Tensor, dt_max: Tensor, max_steps: int,
    retry_nonfinite: bool = False, flagged: Tensor | None = None,
) -> dict[str, Tensor]:
    """:func:`_advance` plus the count of interior evaluation times inside (t, t_new] for dense output.

    ``sync`` packs the three numbers the host reads after the step: most evaluation times in
    one row's step, rows still running, and rows whose next attempt reaches an evaluation time.
    ``n_interior`` is None when no row has an evaluation time strictly inside its span.
    """
    o = _advance(ctrl, error_order, s, s["active"], h, last, y_new, f_new, err, n_evals, t_end, direction,
                 dt_min, dt_max, max_steps, retry_nonfinite, flagged)
    if n_interior is None:
        count = upto = torch.zeros_like(ptr)
    else:
        upto = torch.searchsorted(grid, (direction * o["t_new"])[:, None], right=True).squeeze(1)
        upto = torch.minimum(upto, n_interior)
        count = torch.where(o["accept"], upto - ptr, torch.zeros_like(upto))
    crossing = _next_attempt_crosses(o, ptr + count, t_end, direction, grid, n_interior)
    o.update(h_try=h, y_new=y_new, f_new=f_new, count=count, upto=upto,
             sync=torch.stack([count.max(), o["active"].sum(), crossing.sum()]))
    return o


def _explicit_attempt(
    method: ExplicitRK, ctrl: PIDController, f: RHS, shared: dict[str, Tensor], p: dict[str, Tensor],
    s: dict[str, Tensor], ptr: Tensor, t_end: Tensor, direction: Tensor, grid: Tensor, n_interior: Tensor | None,
    rtol: Tensor, atol: Tensor, dt_min: Tensor, dt_max: Tensor, max_steps: int,
) -> tuple[dict[str, Tensor], list[Tensor]]:
    """One explicit RK attempt plus its dense-output bookkeeping (the host records the values)."""
    merged = {**shared, **p}
    h, last = _step_size(s["h"], s["t"], t_end, direction, s["active"])
    y_new, f_new, K, err = rk_step(method, lambda tt, yy: f(tt, yy, merged), s["t"], s["y"], s["f0"], h, rtol, atol)
    outcome = _outcome(ctrl, method.error_order, s, ptr, t_end, direction, grid, n_interior, method.n_stages,
                       h, last, y_new, f_new, err, dt_min, dt_max, max_steps)
    return outcome, K


def _explicit_chunk(
    steps: int, method: ExplicitRK, ctrl: PIDController, f: RHS, shared: dict[str, Tensor], p: dict[str, Tensor],
    s: dict[str, Tensor], ptr: Tensor, t_end: Tensor, direction: Tensor, grid: Tensor, n_interior: Tensor | None,
    rtol: Tensor, atol: Tensor, dt_min: Tensor, dt_max: Tensor, max_steps: int,
) -> dict[str, Tensor]:
    """``steps`` explicit attempts with one host read at the end: the fused unit torch.compile captures.

    A row whose next attempt would reach an interior evaluation time waits (stays active,
    unchanged) for the host-driven :func:`_explicit_attempt`, which records dense output; rows
    that finish or fail mid-chunk are masked. Every row takes exactly the attempts it takes
    alone, only the grouping into host reads changes. ``sync`` = (rows still active, rows
    waiting for dense output).
    """
    merged = {**shared, **p}
    for _ in range(steps):
        s = _chunk_attempt(method, ctrl, f, merged, s, ptr, t_end, direction, grid, n_interior,
                           rtol, atol, dt_min, dt_max, max_steps)
    crossing = _next_attempt_crosses(s, ptr, t_end, direction, grid, n_interior)
    return {**s, "sync": torch.stack([s["active"].sum(), crossing.sum()])}


# A region compiled once and stamped out for each attempt of a chunk, instead of traced and
# lowered ``steps`` times: a cold compile of the 4-attempt chunk fell from 24 s to 18 s. Eagerly
# it is a plain call; torch < 2.8 lacks it and unrolls.
_compiled_once = getattr(torch.compiler, "nested_compile_region", lambda fn: fn)


@_compiled_once
def _chunk_attempt(
    method: ExplicitRK, ctrl: PIDController, f: RHS, merged: dict[str, Tensor], s: dict[str, Tensor],
    ptr: Tensor, t_end: Tensor, direction: Tensor, grid: Tensor, n_interior: Tensor | None,
    rtol: Tensor, atol: Tensor, dt_min: Tensor, dt_max: Tensor, max_steps: int,
) -> dict[str, Tensor]:
    """One attempt of a chunk; rows whose attempt would reach an interior evaluation time wait."""
    h, last = _step_size(s["h"], s["t"], t_end, direction, s["active"])
    stepping = s["active"]
    if n_interior is not None:
        waiting = stepping & _reaches_eval_time(h, last, s["t"], t_end, direction, ptr, grid, n_interior)
        stepping = stepping & ~waiting
        h = torch.where(waiting, torch.zeros_like(h), h)
    y_new, f_new, _, err = rk_step(method, lambda tt, yy: f(tt, yy, merged), s["t"], s["y"], s["f0"], h, rtol, atol)
    new = _advance(ctrl, method.error_order, s, stepping, h, last, y_new, f_new, err, method.n_stages,
                   t_end, direction, dt_min, dt_max, max_steps)
    if n_interior is not None:
        new["active"] = new["active"] | waiting
    return {name: new[name] for name in LOOP_STATE}


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


def _progress(w: _Working, batch: int, n_active: int, iterations: int) -> Progress:
    span_done = ((w.t - w.t_start).abs() / (w.t_end - w.t_start).abs().clamp_min(1e-300))
    slowest = float(torch.where(w.active, span_done, torch.ones_like(span_done)).min())
    return Progress(batch - n_active, batch, slowest, iterations)


def _store(full: dict[str, Tensor], w: _Working, counter_names: tuple[str, ...]) -> None:
    """Copy the working rows' current values into the full-batch results (out of place)."""
    full["t"] = full["t"].index_put((w.idx,), w.t.detach())
    full["y"] = full["y"].index_put((w.idx,), w.y)
    full["h"] = full["h"].index_put((w.idx,), w.h.detach())
    full["status"] = full["status"].index_put((w.idx,), w.status)
    for name in STAT_NAMES + counter_names:
        full[name] = full[name].index_put((w.idx,), getattr(w, name))
