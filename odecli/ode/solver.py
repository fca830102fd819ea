"""The batched solver loop: every sample steps independently, the arithmetic stays batched.

Each sample has its own time, step size, accept/reject decision, controller history, evaluation
pointer, status and counters. One loop iteration attempts one step for every *active* sample.
Finished and failed samples are dropped from the working set (compaction) once they make up half
of it, so they stop costing RHS evaluations. The loop synchronises with the host once per step
(how many evaluation times fell into this step, and how many samples are still running), and
once more per evaluation column in steps that hold evaluation times; all other decisions are
per-sample ``torch.where`` masks. For explicit methods one pure function (``_explicit_attempt``)
does a whole attempt, eagerly or under ``torch.compile``.

Dense output is recorded as (row, column, value) triples and scattered into the result once at
the end, which keeps the loop free of in-place writes so autograd can differentiate through it.
"""

from __future__ import annotations

import functools
import math
import time
import types
from dataclasses import dataclass, field
from typing import Callable, Mapping

import torch
from torch import Tensor

from odecli.ode.controllers import ControllerState, PIDController, make_controller
from odecli.ode.initial_step import select_initial_step
from odecli.ode.status import Status
from odecli.ode.methods import ExplicitRK
from odecli.ode.stages import rk_step
from odecli.ode.stepper import ExplicitStepper, Stepper, StepResult, get_stepper

RHS = Callable[[Tensor, Tensor, Mapping[str, Tensor]], Tensor]
"""``f(t, y, p) -> dy/dt`` with t (A,), y (A, n) and p the per-sample parameters of those rows."""

STAT_NAMES = ("n_steps", "n_accepted", "n_rejected", "n_f_evals")
COMPACT_BELOW = 0.5  # compact the working set when fewer than this fraction of it is active
COMPACT_MIN_ROWS = 32  # below this, gathering costs more than the rows it saves (and recompiles)
PROGRESS_INTERVAL_S = 0.2
# Plain ints, not the IntEnum: torch.compile (2.13) mis-evaluates ``tensor == IntEnum member``.
SUCCESS, INFINITE_NORM = int(Status.SUCCESS), int(Status.INFINITE_NORM)
REACHED_DT_MIN, REACHED_MAX_STEPS = int(Status.REACHED_DT_MIN), int(Status.REACHED_MAX_STEPS)
END_SNAP = 1e-7  # relative stretch of a final step allowed to land exactly on t_end


@dataclass(frozen=True)
class Progress:
    """A snapshot for progress displays: how many samples finished and how far the slowest got."""

    finished: int
    batch: int
    slowest_fraction: float  # min over running samples of (t - t_start) / (t_end - t_start)
    loop_iterations: int


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
    return vec.expand(batch).clone() if vec.dim() == 0 else vec.reshape(batch).clone()


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
        return _Working(**{k: (v.index(rows) if isinstance(v, ControllerState) else
                               {n: p[rows] for n, p in v.items()} if isinstance(v, dict) else v[rows])
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
    compile: bool = False,
    progress: Callable[[Progress], None] | None = None,
) -> Solution:
    """Solve ``dy/dt = f(t, y, p)`` for a batch of independent samples.

    ``y0`` is (B, n). ``t_start``/``t_end`` are scalars or (B,) tensors (either direction).
    ``t_eval`` is None (start and end), a shared (n_eval,) grid or a per-sample (B, n_eval) grid,
    monotone in the direction of integration and inside each span. Per-sample parameters go in
    ``params`` with a leading batch dimension so that ``f`` always sees the rows it is given;
    anything else in ``params`` is passed through unchanged (shared, e.g. for gradients).
    ``dt0`` is the initial step (the fixed step for fixed-step methods); by default it is chosen
    per sample. ``compile=True`` runs each explicit step (stages, error norm, controller and
    bookkeeping) as one torch.compile'd function: worth its one-off compilation for long or
    large solves; results equal the eager path to round-off (implicit methods ignore it).
    ``progress`` is called about every 0.2 s with a :class:`Progress` (it costs one extra
    reduction then, nothing otherwise). Returns a :class:`Solution` with per-sample status and
    statistics.
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
    batch, n_states = y0.shape
    dtype, device = y0.dtype, y0.device
    t0 = _as_batch_vector(t_start, batch, dtype, device)
    t1 = _as_batch_vector(t_end, batch, dtype, device)
    grid = _eval_grid(t_eval, t0, t1)
    n_eval = grid.shape[1]
    per_sample, shared = _split_params(params, batch)
    rtol_t = torch.as_tensor(rtol, dtype=dtype, device=device)
    atol_t = torch.as_tensor(atol, dtype=dtype, device=device)
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

    w = _Working(
        idx=torch.arange(batch, device=device), t=t0, y=y0, f0=f_init, h=direction * h_abs,
        t_start=t0, t_end=t1, direction=direction, grid=grid * direction[:, None],
        ptr=zeros_i.clone(), status=zeros_i.clone(), active=t1 != t0,
        n_steps=zeros_i.clone(), n_accepted=zeros_i.clone(), n_rejected=zeros_i.clone(), n_f_evals=n_f_evals,
        ctrl=ControllerState.initial(batch, dtype, device), p=per_sample,
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

    # Evaluation times equal to the start time take y0 directly.
    at_start = torch.searchsorted(w.grid, (w.direction * w.t)[:, None], right=True).squeeze(1)
    for j in range(int(at_start.max())):
        record(j < at_start, torch.full_like(at_start, j), w.y)
    w.ptr = at_start

    n_active = int(w.active.sum())
    reported = time.perf_counter()
    total_steps = 0
    fused = _fused_explicit_attempt(compile, f) if isinstance(method, ExplicitStepper) else None
    dt_min_t = torch.as_tensor(ctrl.dt_min, dtype=dtype, device=device)
    dt_max_t = torch.as_tensor(ctrl.dt_max, dtype=dtype, device=device)
    while n_active > 0:
        if fused is not None:
            # Explicit RK: one pure function from state to outcome (torch.compile-able).
            o, K = fused(method.method, ctrl, f, shared, w.p, w.t, w.y, w.f0, w.h, w.t_end, w.direction,
                         w.active, w.status, _counters(w), w.ptr, w.grid, w.ctrl.err_prev, w.ctrl.err_prev2,
                         w.ctrl.rejected_last, rtol_t, atol_t, dt_min_t, dt_max_t, max_steps)
            rhs = bound(w.p)
            result = StepResult(o["y_new"], o["f_new"], None, method.n_stages,
                                dense=functools.partial(method.interpolant, rhs, w.t, w.y, w.f0, o["h"], o["y_new"], o["f_new"], K))
        else:
            h, last = _step_size(w.h, w.t, w.t_end, w.direction, w.active)
            rhs = bound(w.p)
            result = method.step(rhs, w.t, w.y, w.f0, h, rtol_t, atol_t, w.mstate)
            o = _outcome(ctrl, method.error_order, w.t, w.y, w.f0, w.h, w.t_end, w.direction, w.active,
                         w.status, _counters(w), result.n_evals, w.ptr, w.grid, w.ctrl.err_prev,
                         w.ctrl.err_prev2, w.ctrl.rejected_last, h, last, result.y1, result.f1, result.err,
                         dt_min_t, dt_max_t, max_steps)
        h, y_new, t_new, count, upto, accept, still_active = (
            o["h"], o["y_new"], o["t_new"], o["count"], o["upto"], o["accept"], o["still_active"])
        w.n_steps, w.n_accepted, w.n_rejected, w.n_f_evals = (
            o["n_steps"], o["n_accepted"], o["n_rejected"], o["n_f_evals"])
        for name, increment in result.counters.items():
            setattr(w, name, getattr(w, name) + w.active * increment)
        w.ctrl = ControllerState(o["err_prev"], o["err_prev2"], o["rejected_last"])
        f_new = o["f_new"]

        max_count, n_active = o["sync"].tolist()
        if max_count > 0:
            interp = None
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
                    needs_dense = (count > 1) | ((count == 1) & (last_at != t_new))
                    w.n_f_evals = w.n_f_evals + extra_evals * needs_dense
                if interp is None:
                    value = y_new
                else:
                    theta = (t_at - w.t) / torch.where(h == 0, torch.ones_like(h), h)
                    value = torch.where((t_at == t_new)[:, None], y_new, interp(theta))
                record(valid, col, value)
            w.ptr = w.ptr + count

        w.t, w.y, w.f0, w.h, w.status = o["t"], o["y"], o["f0"], o["h_next"], o["status"]
        for key, value in result.state.items():
            mask = accept.reshape(accept.shape + (1,) * (value.dim() - 1))
            w.mstate[key] = torch.where(mask, value, w.mstate[key])
        if result.retry_state:
            rejected = w.active & ~accept
            for key, value in result.retry_state.items():
                mask = rejected.reshape(rejected.shape + (1,) * (value.dim() - 1))
                w.mstate[key] = torch.where(mask, value, w.mstate[key])
        w.active = still_active

        total_steps += 1
        if progress is not None and time.perf_counter() - reported > PROGRESS_INTERVAL_S:
            reported = time.perf_counter()
            progress(_progress(w, batch, n_active, total_steps))
        if compact and w.idx.shape[0] > COMPACT_MIN_ROWS and 0 < n_active <= COMPACT_BELOW * w.idx.shape[0]:
            _store(full, w, method.counter_names)
            w = w.take(w.active.nonzero().squeeze(1))
    _store(full, w, method.counter_names)
    if progress is not None:
        progress(Progress(batch, batch, 1.0, total_steps))

    y_out = torch.full((batch, n_eval + 1, n_states), math.nan, dtype=dtype, device=device)
    if records:
        rows, cols, values = (torch.cat(parts) for parts in zip(*records))
        y_out = y_out.index_put((rows, cols), values)
    stats = {name: full[name] for name in STAT_NAMES + method.counter_names}
    stats["dt0"] = h_abs
    stats["dt_final"] = full["h"].abs()
    return Solution(
        t=grid, y=y_out[:, :n_eval], status=full["status"], stats=stats,
        t_final=full["t"], y_final=full["y"], wall_time_s=time.perf_counter() - started, method=method.name,
    )


def _counters(w: _Working) -> dict[str, Tensor]:
    return {name: getattr(w, name) for name in STAT_NAMES}


def _step_size(h_prev: Tensor, t: Tensor, t_end: Tensor, direction: Tensor, active: Tensor) -> tuple[Tensor, Tensor]:
    """The step each row attempts (0 for inactive rows) and whether it reaches t_end."""
    remaining = (t_end - t).abs()
    # A step that would stop within a hair of the end takes it, so round-off in t does not
    # leave a sliver of a step (1001 rk4 steps of 0.01 on [0, 10]).
    last = h_prev.abs() * (1 + END_SNAP) >= remaining
    h = torch.where(active, direction * torch.minimum(h_prev.abs(), remaining), torch.zeros_like(h_prev))
    return h, last


def _outcome(
    ctrl: PIDController, error_order: int | None, t: Tensor, y: Tensor, f0: Tensor, h_prev: Tensor,
    t_end: Tensor, direction: Tensor, active: Tensor, status: Tensor, counters: dict[str, Tensor],
    n_evals: int | Tensor, ptr: Tensor, grid: Tensor, err_prev: Tensor, err_prev2: Tensor,
    rejected_last: Tensor, h: Tensor, last: Tensor, y_new: Tensor, f_new: Tensor, err: Tensor | None,
    dt_min: Tensor, dt_max: Tensor, max_steps: int,
) -> dict[str, Tensor]:
    """Everything one attempted step decides, per sample, as pure tensor code (no host sync).

    Accept/reject and the next step come from the controller; failures set the status; the
    count of evaluation times inside (t, t_new] drives dense output. ``sync`` packs the two
    numbers the host reads after each step (most eval times in a step, samples still running).
    """
    n_steps = counters["n_steps"] + active
    if err is None:
        finite = torch.isfinite(y_new).all(dim=-1)
        accept = active & finite
        factor = torch.ones_like(h)
        state = ControllerState(err_prev, err_prev2, rejected_last)
    else:
        err = err.detach()
        finite = torch.isfinite(err)
        ok, factor, new_state = ctrl.adapt(err, ControllerState(err_prev, err_prev2, rejected_last), error_order)
        accept = active & ok & finite
        state = new_state.where(active, ControllerState(err_prev, err_prev2, rejected_last))
    t_new = torch.where(last, t_end, t + h)
    done = accept & last
    upto = torch.searchsorted(grid, (direction * t_new)[:, None], right=True).squeeze(1)
    count = torch.where(accept, upto - ptr, torch.zeros_like(upto))

    h_next = torch.minimum((h.detach() * factor).abs(), dt_max) * direction
    h_next = torch.where(done | ~active, h_prev, h_next)
    status = torch.where(active & ~finite, INFINITE_NORM, status)
    running = active & ~done & (status == SUCCESS)
    t_after = torch.where(accept, t_new, t)
    too_small = (h_next.abs() < dt_min) | (t_after + h_next == t_after)
    status = torch.where(running & too_small, REACHED_DT_MIN, status)
    status = torch.where(running & (n_steps >= max_steps) & (status == SUCCESS),
                         REACHED_MAX_STEPS, status)
    still_active = active & ~done & (status == SUCCESS)
    return {
        "h": h, "t_new": t_new, "y_new": y_new, "f_new": f_new, "count": count, "upto": upto,
        "accept": accept, "still_active": still_active,
        "sync": torch.stack([count.max(), still_active.sum()]),
        "n_accepted": counters["n_accepted"] + accept,
        "n_rejected": counters["n_rejected"] + (active & ~accept),
        "n_f_evals": counters["n_f_evals"] + active * n_evals,
        "t": t_after, "y": torch.where(accept[:, None], y_new, y), "f0": torch.where(accept[:, None], f_new, f0),
        "h_next": h_next, "status": status, "n_steps": n_steps,
        "err_prev": state.err_prev, "err_prev2": state.err_prev2, "rejected_last": state.rejected_last,
    }


def _explicit_attempt(
    method: ExplicitRK, ctrl: PIDController, f: RHS, shared: dict[str, Tensor], p: dict[str, Tensor],
    t: Tensor, y: Tensor, f0: Tensor, h_prev: Tensor, t_end: Tensor, direction: Tensor, active: Tensor,
    status: Tensor, counters: dict[str, Tensor], ptr: Tensor, grid: Tensor, err_prev: Tensor,
    err_prev2: Tensor, rejected_last: Tensor, rtol: Tensor, atol: Tensor, dt_min: Tensor, dt_max: Tensor,
    max_steps: int,
) -> tuple[dict[str, Tensor], list[Tensor]]:
    """One explicit RK attempt plus its bookkeeping: the fused unit that torch.compile captures."""
    merged = {**shared, **p}
    h, last = _step_size(h_prev, t, t_end, direction, active)
    y_new, f_new, K, err = rk_step(method, lambda tt, yy: f(tt, yy, merged), t, y, f0, h, rtol, atol)
    outcome = _outcome(ctrl, method.error_order, t, y, f0, h_prev, t_end, direction, active, status,
                       counters, method.n_stages, ptr, grid, err_prev, err_prev2, rejected_last, h, last,
                       y_new, f_new, err, dt_min, dt_max, max_steps)
    return outcome, K


def _fused_explicit_attempt(compiled: bool, f: RHS) -> Callable:
    """The eager reference, or the same function under torch.compile (dynamic batch size)."""
    return _compiled_attempt_for(f) if compiled else _explicit_attempt


@functools.lru_cache(maxsize=16)
def _compiled_attempt_for(f: RHS) -> Callable:
    """A compiled attempt of its own for each right-hand side.

    Dynamo keeps compiled graphs on the code object and relies on guards to tell callers apart;
    a private copy of the code per RHS keeps one RHS's graph from ever serving another. Values
    such as the controller's safety factor are constants of the graph, and torch 2.13's
    AOTAutograd cache can hand back a graph compiled for other constants, so it stays off.
    """
    import torch._functorch.config as functorch_config

    functorch_config.enable_autograd_cache = False
    # One graph per dtype/device plus specialisations of small batch sizes; dynamo's default of
    # 8 recompiles would silently fall back to eager in a long session.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    code = _explicit_attempt.__code__.replace()
    private = types.FunctionType(code, _explicit_attempt.__globals__, _explicit_attempt.__name__)
    return torch.compile(private, dynamic=True)


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
