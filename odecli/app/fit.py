"""The one fit loop of ``odecli train-inverse``, for ODE and PDE fits alike.

It iterates an optimiser (:mod:`odecli.optim`), records the history of the points it reaches,
stops on the tolerances, checkpoints every N iterations and resumes from a checkpoint bit for bit,
and prints progress. What differs by kind comes in through :class:`Objective`: how a point is
evaluated (collectively over the ranks), which history columns it adds, and how a checkpoint is
written and read (the per-kind modules :mod:`odecli.app.fit_ode` and :mod:`odecli.app.fit_pde`).

Points and iterations: point 0 is the initial guess, point ``k`` the parameters after ``k``
iterations (counted from 1 in logs, history and stats; the log calls point 0 ``start``). The
history holds one row per recorded point, row ``k`` for point ``k``; ``wall_time_s`` is the
seconds since the row before (row 0: the initial evaluation), so the rows sum to the fit's time.
A kind that does not record its final point (``record_final`` False: the PDE fits, whose run files
have always had one row per iteration, and whose final loss would cost one more evaluation after
an Adam step) neither records nor tests it. Every recorded point is tested for convergence (the
loss change from point 1 on); the next iteration starts from it.
"""

from __future__ import annotations

import enum
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from odecli.app import faults
from odecli.app.checkpoint import Saved
from odecli.errors import OdecliError
from odecli.interrupts import raise_if_interrupted
from odecli.optim import Optimizer, Space, Vector
from odecli.parallel.comm import failures_end_together

LOSS_COLUMNS = ("loss", "grad_norm", "wall_time_s")  # every kind's history starts with these


class Stop(enum.Enum):
    """Why a fit stopped; each kind names them in its output (``stop_reason``)."""

    ITERATIONS = "iterations"  # ran the iterations asked for
    LOSS_CHANGE = "loss change"  # |f_prev - f| <= tolerance * |f_prev|
    GRADIENT = "gradient"  # |g| <= gtol, or a loss of exactly 0
    LINE_SEARCH = "line search"  # no acceptable point along the search direction
    NO_DECREASE = "no further decrease"  # the same, once the gradient is FLOOR_GRADIENT of its first
    FAILED = "failed"  # the new point could not be evaluated (a sample did not solve)
    RISING = "rising loss"  # the loss rose at RISING_PATIENCE recorded points in a row
    NON_FINITE = "non-finite gradient"  # the gradient at a new point has a NaN or an infinity


# A loss that rises this many iterations in a row, to above the initial loss, ends the fit (Adam's
# momentum makes the loss swing up and back near a minimum: a rise alone is no divergence).
RISING_PATIENCE = 10
# A line search that finds no lower loss once the gradient norm has fallen to this fraction of its
# first value has met the loss's own precision: the fit converged, it did not fail (a converged
# scalars unknown used to stop with "line search failed").
FLOOR_GRADIENT = 1e-4


class Objective(Protocol):
    """The kind-specific half of a fit, as the loop sees it."""

    def evaluate(self, completed: int) -> tuple[float, Vector | None]:
        """Collective: loss and gradient at the optimiser's parameters; ``completed`` iterations
        are done (fault injection and error messages name it); (inf, None) if it cannot be."""

    def columns(self) -> dict[str, float]:
        """The kind's history columns at the point just evaluated (after :data:`LOSS_COLUMNS`)."""

    def save(self, iteration: int, f: float, g: Vector, history: dict[str, list]) -> None:
        """Collective: checkpoint the fit after ``iteration`` iterations at loss ``f``."""


@dataclass
class FitSettings:
    """How the loop runs: what the spec's optimizer section and the command line say."""

    iterations: int
    tolerance: float  # relative loss change that stops the fit (0: only an unchanged loss)
    gtol: float = 0.0  # gradient norm that stops the fit
    checkpoint_every: int = 0  # 0: never
    record_final: bool = True  # evaluate and record the point after the last iteration


@dataclass
class FitOutcome:
    """Where the loop ended: the optimiser's parameters are at the last accepted point."""

    stop: Stop
    iterations: int  # completed
    f: float
    g: Vector
    history: dict[str, list] = field(default_factory=dict)
    message: str = ""  # for the stops that are not convergence: what happened and what to try, one line



def end_every_rank(comm: Any, exc: BaseException, collective: bool) -> None:
    """On several ranks, a failure that this rank alone raised (``collective`` False) would leave
    the others waiting at their next collective for ever: print it with the rank and abort the
    job (with the error's exit code where it has one). A collective one returns, to be raised."""
    if comm.size == 1 or collective or failures_end_together():  # the CLI agrees or aborts (issue 42)
        return
    code = getattr(exc, "exit_code", 1)
    if isinstance(exc, SystemExit):
        code = exc.code if isinstance(exc.code, int) else 1
    msg = str(exc) or type(exc).__name__
    if not isinstance(exc, OdecliError):
        msg = f"{type(exc).__name__}: {msg}"
    sys.stderr.write(f"[rank {comm.rank}] error: {msg}\n")
    sys.stderr.flush()
    comm.abort(code or 1)


def _stop_test(f_prev: float | None, f: float, grad_norm: float, tolerance: float,
               gtol: float) -> Stop | None:
    """Why the fit stops at a point of loss ``f`` reached from one of loss ``f_prev`` (None: the
    initial guess), or None to go on."""
    if f == 0.0 or grad_norm <= gtol:
        return Stop.GRADIENT
    if f_prev is not None and abs(f_prev - f) <= tolerance * max(abs(f_prev), 1e-300):
        return Stop.LOSS_CHANGE
    return None


def _lr_text(opt: Optimizer) -> str:
    lr = getattr(opt, "lr", None)
    return "the scale-aware default" if lr is None else f"{lr:.3g}"


def stop_message(stop: Stop, opt: Optimizer, iteration: int, history: dict[str, list]) -> str:
    """One line for a stop that is not convergence: what happened at ``iteration`` and what to try."""
    lr = getattr(opt, "lr", None)
    if stop is Stop.LINE_SEARCH:
        first = getattr(opt, "last_first_step", math.nan)
        moved = (f"; its first trial moved the unknown by {100 * first:.3g} % of its scale"
                 if isinstance(first, float) and math.isfinite(first) else "")
        smaller = f"try optimizer.learning_rate: {lr / 10:.3g}" if lr is not None else \
            "try a smaller optimizer.learning_rate"
        return (f"line search failed at iteration {iteration}: no point along the search direction "
                f"lowered the loss{moved}; {smaller} or optimizer.max_line_search: "
                f"{2 * getattr(opt, 'max_line_search', 12)}")
    if stop is Stop.RISING:
        loss = history.get("loss", [])
        span = f" (from {loss[-RISING_PATIENCE - 1]:.4g} to {loss[-1]:.4g})" if len(loss) > RISING_PATIENCE else ""
        try_lr = f"optimizer.learning_rate: {lr / 10:.3g}" if lr is not None else "a smaller optimizer.learning_rate"
        return (f"the loss rose for {RISING_PATIENCE} iterations in a row, above its initial value, up to iteration {iteration}{span}; "
                f"the step ({_lr_text(opt)}) is too large: try {try_lr} or optimizer.schedule: cosine")
    if stop is Stop.NON_FINITE:
        return (f"the gradient is not finite at iteration {iteration}; try a smaller optimizer.learning_rate "
                f"(now {_lr_text(opt)}), bounds on the unknown, or a smaller time step")
    return ""


def _rising(history: dict[str, list]) -> bool:
    loss = history["loss"]
    if len(loss) <= RISING_PATIENCE:
        return False
    tail = loss[-RISING_PATIENCE - 1:]
    return all(b > a for a, b in zip(tail[:-1], tail[1:])) and tail[-1] > loss[0]


def run_fit(objective: Objective, opt: Optimizer, space: Space, settings: FitSettings, *,
            history_columns: tuple[str, ...], resumed: Saved | None = None,
            may_fail: bool = False, log: Callable[[str], None] | None = None,
            extra_log: Callable[[], str] = lambda: "") -> FitOutcome:
    """Run the fit from the initial guess, or from ``resumed`` (a checkpoint read back).

    ``may_fail``: a point that cannot be evaluated ends the fit at the previous one (the ODE
    fits; the parameters are then kept to restore them). ``extra_log`` adds to a progress line."""
    n = settings.iterations
    history: dict[str, list] = {k: [] for k in (*LOSS_COLUMNS, *history_columns)}
    last = time.perf_counter()

    def record(f: float, g: Vector, done: int) -> float:
        nonlocal last
        now = time.perf_counter()
        gn = space.norm(g)
        history["loss"].append(f)
        history["grad_norm"].append(gn)
        history["wall_time_s"].append(now - last)
        for name, value in objective.columns().items():
            history[name].append(value)
        if log is not None:
            head = "start     " if done == 0 else f"iter {done:>4}/{n}"
            log(f"{head}  loss {f:.6e}  |grad| {gn:.4e}  {now - last:6.2f} s{extra_log()}")
        last = now
        return gn

    stop: Stop | None = None
    if resumed is not None:
        done, f, g = resumed.iteration, resumed.f, resumed.g
        history.update({k: list(v) for k, v in resumed.history.items()})
    else:
        done = 0
        f, g = objective.evaluate(0)
        stop = _stop_test(None, f, record(f, g, 0), settings.tolerance, settings.gtol)
    while stop is None and done < n:
        # a signal whose exception a finaliser swallowed (one arriving while an import's lock
        # callback ran, say): raised here, so a rank that writes no output stops too
        raise_if_interrupted()
        before = [p.detach().clone() for p in opt.params] if may_fail else None
        step = opt.step(f, g, lambda completed=done: objective.evaluate(completed))
        if not step.ok:
            grad_norm = history["grad_norm"]
            stop = Stop.NO_DECREASE if grad_norm[-1] <= FLOOR_GRADIENT * grad_norm[0] else Stop.LINE_SEARCH
            break
        done += 1
        if done == n and not settings.record_final:  # neither recorded nor tested, even when known
            if log is not None:
                log(f"iter {done:>4}/{n}  {time.perf_counter() - last:6.2f} s  (final point: see the output)")
            history["wall_time_s"][-1] += time.perf_counter() - last  # the rows sum to the loop's time
            break
        if step.evaluated:
            f_new, g_new = step.f, step.g
        else:
            f_new, g_new = objective.evaluate(done)
            if g_new is None or not math.isfinite(f_new):
                with torch.no_grad():
                    for p, x in zip(opt.params, before):
                        p.copy_(x)
                done -= 1
                stop = Stop.FAILED
                break
        f_prev, f, g = f, f_new, g_new
        gn = record(f, g, done)
        if not math.isfinite(gn):
            stop = Stop.NON_FINITE
            break
        stop = _stop_test(f_prev, f, gn, settings.tolerance, settings.gtol)
        if stop is None and _rising(history):
            stop = Stop.RISING
        if stop is None and settings.checkpoint_every and done % settings.checkpoint_every == 0 and done < n:
            objective.save(done, f, g, history)
            faults.maybe_exit_after_checkpoint(done)
    if stop is None:
        stop = Stop.ITERATIONS
    message = stop_message(stop, opt, done + 1 if stop is Stop.LINE_SEARCH else done, history)
    if not settings.record_final and stop is Stop.ITERATIONS:  # one row per iteration, also when
        history = {k: v[:done] for k, v in history.items()}  # resumed from a later checkpoint
    return FitOutcome(stop, done, f, g, history, message)
