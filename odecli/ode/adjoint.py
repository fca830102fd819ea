"""Gradients through batched solves: ``direct``, ``backsolve`` (continuous adjoint) and ``checkpoint``.

:func:`odeint` is :func:`odecli.ode.solver.solve` with a choice of how the backward pass is done.
The returned ``Solution.y`` / ``Solution.y_final`` are differentiable with respect to ``y0``, the
floating-point entries of ``params`` (per-sample ones get per-sample gradients, shared ones the
batch sum) and the parameters of a ``torch.nn.Module`` right-hand side.

``direct``
    Backpropagation through the solver's own operations (discretise-then-optimise): the exact
    gradient of the discrete solution. Memory grows with the number of steps.
``backsolve``
    The continuous adjoint (optimise-then-discretise). The backward pass calls :func:`solve`
    again, backwards in time, on the per-sample system ``[y, a]`` with ``dy/dt = f`` and
    ``da/dt = -a^T df/dy``: every sample keeps its own steps, step sizes and controller history,
    exactly as in the forward pass. It integrates interval by interval between consecutive
    evaluation columns (each sample with its own span, each interval starting from the step the
    controller last proposed), adds the incoming ``dL/dy`` at each column and restarts ``y`` from
    the value stored in the forward pass there (the forward output is kept anyway, and this
    removes the drift of reconstructing ``y`` backwards). Parameter gradients
    ``-int a^T df/dtheta dt`` are not state: a quadrature over each sample's accepted steps with
    the method's own stage weights (``solve``'s ``on_attempt`` hook, one vjp per attempt through
    the graphs of the attempt's own stage calls, its cotangent scaled per row by
    ``h * b_j * accepted``) sums shared tensors (shared
    ``params``, Module weights) over the batch directly and gives per-sample ``params`` their rows.
    This equals carrying the gradient as extra state under a seminorm (error control on
    ``[y, a]`` only; Kidger, Chen and Lyons 2021, "Hey, that's not an ODE"). Memory is
    O(batch x n_eval), independent of the number of steps. Explicit Runge-Kutta methods only.
``checkpoint``
    The forward pass is split at the evaluation columns; each segment is solved without keeping
    its graph and re-solved with graph in the backward pass (``torch.utils.checkpoint``). The
    gradient is exact for the segmented discrete solution; memory is that of the longest segment.

Backward statistics (per-sample ``n_steps``, ``n_accepted``, ``n_rejected``, ``n_f_evals`` of the
adjoint solve, plus ``status``) appear in ``solution.extra["backward_stats"]`` once ``backward()``
has run (backsolve; checkpoint reports the recomputation's counters). Backsolve adds ``y_drift``,
per sample the largest relative gap between the y it integrated backwards and the stored forward
y at the evaluation times, and warns when that exceeds ``DRIFT_WARNING``.
"""

from __future__ import annotations

import collections
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import Tensor, nn

from odecli.ode.options import SolverOptions, split_options
from odecli.ode.solver import STAT_NAMES, Attempt, Solution, _as_batch_vector, _eval_grid, _split_params, solve
from odecli.ode.stages import weighted_sum
from odecli.ode.stepper import ExplicitStepper, Stepper

ADJOINT_MODES = ("direct", "backsolve", "checkpoint")
DRIFT_WARNING = 1e-2
"""Relative gap between backsolve's backwards-integrated y and the stored forward y at an
evaluation time above which the sample's gradient is reported as unreliable."""
BACKWARD_STAT_NAMES = STAT_NAMES


def odeint(
    f: Callable[..., Tensor],
    y0: Tensor,
    t_start: Tensor | float,
    t_end: Tensor | float,
    t_eval: Tensor | None = None,
    *,
    params: Mapping[str, Tensor] | None = None,
    adjoint: str = "direct",
    module_params: Sequence[Tensor] | None = None,
    adjoint_rtol: float | None = None,
    adjoint_atol: float | None = None,
    **solve_kwargs: Any,
) -> Solution:
    """Solve like :func:`solve`, with ``Solution.y``/``y_final`` differentiable by ``adjoint`` mode.

    ``module_params``: the tensors (usually ``module.parameters()``) that ``f`` uses internally and
    that need gradients in ``backsolve`` mode (like torchdiffeq's ``adjoint_params``). When ``f``
    is an ``nn.Module`` they default to its parameters that require grad. ``direct`` and
    ``checkpoint`` need nothing: autograd sees every tensor ``f`` touches.
    ``adjoint_rtol``/``adjoint_atol`` default to the forward tolerances.
    """
    if adjoint not in ADJOINT_MODES:
        raise ValueError(f"adjoint must be one of {', '.join(ADJOINT_MODES)}, got {adjoint!r}")
    options, loop_kwargs = split_options(solve_kwargs)
    solve_kwargs = {"options": options, **loop_kwargs}
    if adjoint == "direct":
        solution = solve(f, y0, t_start, t_end, t_eval, params=params, **solve_kwargs)
        solution.extra["adjoint"] = "direct"
        return solution
    if adjoint == "checkpoint":
        return _checkpointed(f, y0, t_start, t_end, t_eval, params, solve_kwargs)
    return _backsolve(f, y0, t_start, t_end, t_eval, params, module_params, adjoint_rtol, adjoint_atol, solve_kwargs)


# ------------------------------------------------------------------------------------ backsolve


@dataclass
class _Config:
    f: Callable[..., Tensor]
    batch: int
    t0: Tensor
    t1: Tensor
    grid: Tensor
    ps_names: list[str]  # per-sample floating params (Function inputs)
    sh_names: list[str]  # shared floating params (Function inputs)
    fixed: dict[str, Tensor]  # shared non-floating params, passed through unchanged
    ps_fixed: dict[str, Tensor]  # per-sample non-floating params (compacted with the rows)
    solve_kwargs: dict
    adjoint_rtol: float | None
    adjoint_atol: float | None
    backward_stats: dict = field(default_factory=dict)
    solution: Solution | None = None


def _find_module(f: Callable) -> nn.Module | None:
    if isinstance(f, nn.Module):
        return f
    owner = getattr(f, "__self__", None)
    return owner if isinstance(owner, nn.Module) and getattr(f, "__name__", "") == "forward" else None


def _stepper(solve_kwargs: Mapping[str, Any]) -> Stepper:
    options: SolverOptions = solve_kwargs["options"]
    return options.stepper()


def _check_explicit(solve_kwargs: Mapping[str, Any]) -> None:
    """The parameter quadrature uses the stages of an explicit RK step (see :class:`_ParameterQuadrature`)."""
    stepper = _stepper(solve_kwargs)
    if not isinstance(stepper, ExplicitStepper):
        raise ValueError(f"adjoint='backsolve' needs an explicit Runge-Kutta method, got {stepper.name!r}; "
                         "use adjoint='direct' or 'checkpoint' for implicit methods")


def _backsolve(f, y0, t_start, t_end, t_eval, params, module_params, adjoint_rtol, adjoint_atol, solve_kwargs) -> Solution:
    if y0.dim() != 2:
        raise ValueError(f"y0 must have shape (batch, n_states), got {tuple(y0.shape)}")
    _check_explicit(solve_kwargs)
    batch = y0.shape[0]
    dtype, device = y0.dtype, y0.device
    t0 = _as_batch_vector(t_start, batch, dtype, device).detach()
    t1 = _as_batch_vector(t_end, batch, dtype, device).detach()
    grid = _eval_grid(t_eval, t0, t1).detach()
    per_sample, shared = _split_params(params, batch)
    fixed = {k: v for k, v in shared.items() if not v.is_floating_point()}
    ps_fixed = {k: v for k, v in per_sample.items() if not v.is_floating_point()}
    ps_names = [k for k, v in per_sample.items() if v.is_floating_point()]
    sh_names = [k for k, v in shared.items() if v.is_floating_point()]

    if module_params is None:
        module = _find_module(f)
        module_params = [p for p in module.parameters() if p.requires_grad] if module is not None else []
    cfg = _Config(
        f=f, batch=batch, t0=t0, t1=t1, grid=grid, ps_names=ps_names, sh_names=sh_names, fixed=fixed,
        ps_fixed=ps_fixed, solve_kwargs=dict(solve_kwargs), adjoint_rtol=adjoint_rtol, adjoint_atol=adjoint_atol,
    )
    tensors = [per_sample[k] for k in ps_names] + [shared[k] for k in sh_names] + list(module_params)
    ys, y_final = _BacksolveFn.apply(cfg, y0, *tensors)
    sol = cfg.solution
    assert sol is not None
    cfg.solution = None  # the Function keeps what it needs; do not hold the tensors twice
    solution = Solution(
        t=sol.t, y=ys, status=sol.status, stats=sol.stats, t_final=sol.t_final, y_final=y_final,
        wall_time_s=sol.wall_time_s, method=sol.method,
        extra={"adjoint": "backsolve", "backward_stats": cfg.backward_stats},
    )
    return solution


def _split_tensors(cfg: _Config, tensors: Sequence[Tensor]) -> tuple[dict[str, Tensor], dict[str, Tensor], list[Tensor]]:
    n_ps, n_sh = len(cfg.ps_names), len(cfg.sh_names)
    ps = dict(zip(cfg.ps_names, tensors[:n_ps]))
    sh = dict(zip(cfg.sh_names, tensors[n_ps:n_ps + n_sh]))
    mod = list(tensors[n_ps + n_sh:])
    return ps, sh, mod


class _BacksolveFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, cfg: _Config, y0: Tensor, *tensors: Tensor):
        ps, sh, _ = _split_tensors(cfg, tensors)
        with torch.no_grad():
            sol = solve(cfg.f, y0, cfg.t0, cfg.t1, cfg.grid, params={**ps, **cfg.ps_fixed, **sh, **cfg.fixed},
                        **cfg.solve_kwargs)
        cfg.solution = sol
        ctx.cfg = cfg
        ctx.save_for_backward(sol.y, sol.y_final, sol.t_final, sol.stats["dt_final"], *tensors)
        return sol.y, sol.y_final

    @staticmethod
    def backward(ctx, grad_ys: Tensor | None, grad_y_final: Tensor | None):
        cfg: _Config = ctx.cfg
        ys, y_final, t_final, dt_final, *tensors = ctx.saved_tensors
        needs = ctx.needs_input_grad[2:]
        grads = _adjoint_backward(cfg, ys, y_final, t_final, dt_final, tensors, needs, grad_ys, grad_y_final)
        return (None, *grads)


def _adjoint_backward(cfg, ys, y_final, t_final, dt_final, tensors, needs, grad_ys, grad_y_final):
    """Integrate ``[y, a]`` back from each sample's end, column by column; the quadrature collects parameter gradients."""
    started = time.perf_counter()
    batch, n_eval, n = ys.shape
    dtype, device = ys.dtype, ys.device
    ps, sh, mod = _split_tensors(cfg, tensors)
    n_ps, n_sh = len(cfg.ps_names), len(cfg.sh_names)
    need_ps = {k: ps[k] for k, nd in zip(cfg.ps_names, needs[:n_ps]) if nd}
    need_sh = [k for k, nd in zip(cfg.sh_names, needs[n_ps:n_ps + n_sh]) if nd]
    need_mod = [x for x, nd in zip(mod, needs[n_ps + n_sh:]) if nd]
    shared_values = {**cfg.fixed, **{k: v.detach() for k, v in sh.items()}}
    quadrature = _ParameterQuadrature(cfg.f, n, shared_values, need_sh, need_mod, need_ps)
    rhs = _AdjointRHS(cfg.f, n, shared_values)

    grid = cfg.grid
    direction = torch.where(cfg.t1 >= cfg.t0, 1.0, -1.0).to(dtype)
    grad_ys = torch.zeros_like(ys) if grad_ys is None else grad_ys
    reached = (direction[:, None] * grid <= direction[:, None] * t_final[:, None]) & torch.isfinite(ys).all(-1)
    grad_ys = torch.where(reached[..., None], grad_ys, torch.zeros_like(grad_ys))

    a = torch.zeros_like(y_final) if grad_y_final is None else grad_y_final.clone()
    y = y_final
    t_cur = t_final.clone()
    kwargs = dict(cfg.solve_kwargs)
    kwargs.pop("compact", None)
    options: SolverOptions = kwargs["options"]
    if cfg.adjoint_rtol is not None:
        options = options.replace(rtol=cfg.adjoint_rtol)
    if cfg.adjoint_atol is not None:
        options = options.replace(atol=cfg.adjoint_atol)
    kwargs["options"] = options
    # Each interval starts with the step the controller proposed at the end of the previous one
    # (the forward solve's last one for the first): no initial-step search per restart.
    stepper = _stepper(kwargs)
    carry_step = options.dt0 is None and stepper.adaptive
    if quadrature.active and not kwargs.get("compile"):  # graphs recorded inside torch.compile: no
        rhs.record_into(quadrature, stepper.method.n_stages)
    h_carry = dt_final.clone()
    totals = {name: torch.zeros(batch, dtype=torch.int64, device=device) for name in STAT_NAMES}
    status = torch.zeros(batch, dtype=torch.int64, device=device)
    n_solves = 0
    drift = torch.zeros(batch, dtype=dtype, device=device)  # of the reconstructed y from the stored one
    for j in range(n_eval - 1, -2, -1):
        target = cfg.t0 if j < 0 else torch.where(reached[:, j], grid[:, j], t_cur)
        if bool((target != t_cur).any()):
            if carry_step:
                kwargs["options"] = options.replace(dt0=torch.where(h_carry > 0, h_carry, (target - t_cur).abs()))
            s = solve(rhs, torch.cat([y, a], dim=1), t_cur, target, None, params={**ps, **cfg.ps_fixed},
                      on_attempt=quadrature if quadrature.active else None, **kwargs)
            n_solves += 1
            for name in STAT_NAMES:
                totals[name] = totals[name] + s.stats[name]
            status = torch.where(status == 0, s.status, status)
            h_carry = torch.where(s.stats["dt_final"] > 0, s.stats["dt_final"], h_carry)
            y, a = s.y_final[:, :n], s.y_final[:, n:]
        if j >= 0:
            col = reached[:, j, None]
            gap = (y - ys[:, j]).abs().amax(-1) / (ys[:, j].abs().amax(-1) + options.atol)
            drift = torch.where(col[:, 0] & torch.isfinite(y).all(-1), torch.maximum(drift, gap), drift)
            y = torch.where(col, ys[:, j], y)
            a = a + grad_ys[:, j]
        t_cur = target

    grads: list[Tensor | None] = [None] * len(tensors)
    for k, g in quadrature.per_sample.items():
        grads[cfg.ps_names.index(k)] = g.to(ps[k].dtype)
    shared_index = [n_ps + i for i, nd in enumerate(needs[n_ps:]) if nd]
    for index, g in zip(shared_index, quadrature.sums):
        grads[index] = g.to(tensors[index].dtype)

    cfg.backward_stats.clear()
    cfg.backward_stats.update(totals)
    cfg.backward_stats["status"] = status
    cfg.backward_stats["n_solves"] = n_solves
    cfg.backward_stats["y_drift"] = drift
    _warn_on_drift(drift)
    cfg.backward_stats["wall_time_s"] = time.perf_counter() - started
    return [a, *grads]


def _warn_on_drift(drift: Tensor) -> None:
    """Say so when y integrated backwards lost the forward solution: the adjoint was then
    evaluated along a wrong trajectory (stiff or strongly dissipative systems, whose backward
    flow amplifies every error), and the gradient cannot be trusted."""
    bad = drift > DRIFT_WARNING
    if bool(bad.any()):
        warnings.warn(
            f"adjoint='backsolve': y integrated backwards drifted from the forward solution by up to "
            f"{float(drift.max()):.3g} (relative) in {int(bad.sum())} of {drift.numel()} samples, so their "
            "gradients are unreliable; use adjoint='direct' (exact for the discrete solution)",
            RuntimeWarning, stacklevel=4,
        )


class _AdjointRHS:
    """``[y, a] -> [f, -a^T df/dy]``: the per-sample system the backward solve integrates.

    Parameter gradients are not part of the state (see :class:`_ParameterQuadrature`), so the
    error control sees only ``[y, a]``: the seminorm of Kidger, Chen and Lyons (2021).
    """

    def __init__(self, f: Callable[..., Tensor], n: int, shared: dict[str, Tensor]):
        self.f, self.n, self.shared = f, n, shared
        self.quadrature: _ParameterQuadrature | None = None

    def record_into(self, quadrature: _ParameterQuadrature, n_stages: int) -> None:
        """Keep the graphs of the last ``n_stages + 1`` calls (one attempt's) for ``quadrature``.

        Each call then also tracks the parameters, and the quadrature backpropagates their
        gradient through the stages' own graphs instead of evaluating ``f`` there again.
        """
        self.quadrature = quadrature
        quadrature.calls = collections.deque(maxlen=n_stages + 1)

    def __call__(self, t: Tensor, z: Tensor, p: Mapping[str, Tensor]) -> Tensor:
        y, a = z[:, :self.n], z[:, self.n:]
        quad = self.quadrature
        with torch.enable_grad():
            y_ = y.detach().requires_grad_(True)
            if quad is None:
                fval = self.f(t, y_, {**self.shared, **p})
                (gy,) = torch.autograd.grad(fval, y_, a, allow_unused=True)
            else:
                ps = {k: p[k].detach().requires_grad_(True) for k in quad.per_sample}
                fval = self.f(t, y_, {**self.shared, **quad.sh_leaves, **p, **ps})
                (gy,) = torch.autograd.grad(fval, y_, a, allow_unused=True, retain_graph=True)
                quad.calls.append(_StageCall(t, z, fval, ps))
        return torch.cat([fval.detach(), -gy if gy is not None else torch.zeros_like(y)], dim=1)


@dataclass
class _StageCall:
    """One recorded right-hand-side call: its inputs and ``f`` with the graph back to the parameters."""

    t: Tensor
    z: Tensor
    fval: Tensor
    per_sample: dict[str, Tensor]  # the call's leaves for per-sample parameters


class _ParameterQuadrature:
    """Parameter gradients ``-int a^T df/dtheta dt`` by each sample's own accepted backward steps.

    An ``on_attempt`` hook of :func:`solve`: for an attempt of step ``h`` it backpropagates
    ``a^T df/dtheta`` from the RK stages with nonzero weight ``b_j``, all stages in one call, with
    the vjp's cotangent scaled per row by ``h * b_j * accepted``. Rejected attempts and finished
    rows thus add nothing, and the per-row weighting happens inside the vjp, so a shared tensor's
    gradient arrives already summed over the batch: no per-sample copies of the parameters. The
    result equals integrating the gradient as extra state with the same RK method under a
    seminorm (the state's error control ignores it).

    When the adjoint right-hand side records its calls (:meth:`_AdjointRHS.record_into`), the
    stages reuse the graphs of the calls that computed them, so ``f`` is not evaluated again;
    a stage whose call is gone or holds a non-finite value is evaluated again.
    """

    def __init__(self, f: Callable[..., Tensor], n: int, shared_values: dict[str, Tensor], sh_names: list[str],
                 mod: list[Tensor], ps: dict[str, Tensor]):
        self.f, self.n, self.shared_values = f, n, shared_values
        self.sh_names, self.mod = sh_names, mod  # shared tensors: named ``params`` entries, then module tensors
        self.sh_leaves = {k: shared_values[k].detach().requires_grad_(True) for k in sh_names}
        self.sums = [torch.zeros_like(shared_values[k]) for k in sh_names] + [torch.zeros_like(x) for x in mod]
        self.per_sample = {k: torch.zeros_like(v) for k, v in ps.items()}
        self.active = bool(self.sums or self.per_sample)
        self.calls: collections.deque[_StageCall] | None = None

    def __call__(self, attempt: Attempt) -> None:
        m = attempt.method
        nodes = [j for j, b in enumerate(m.b) if b != 0.0]
        recorded = self._recorded(attempt, nodes)
        evaluate = [j for j in nodes if j not in recorded]
        outputs, cotangents, per_sample = [], [], []
        if evaluate:
            fval, cotangent, ps = self._evaluate(attempt, evaluate)
            outputs.append(fval)
            cotangents.append(cotangent)
            per_sample.append(ps)
        for j, call in recorded.items():
            outputs.append(call.fval)
            cotangents.append(call.z[:, self.n:] * (attempt.h * attempt.accept * m.b[j])[:, None])
            per_sample.append(call.per_sample)
        ps_inputs = [leaf for ps in per_sample for leaf in ps.values()]
        inputs = [*self.sh_leaves.values(), *self.mod, *ps_inputs]
        grads = torch.autograd.grad(outputs, inputs, cotangents, allow_unused=True)
        n_shared = len(self.sums)
        self.sums = [s if g is None else s - g for s, g in zip(self.sums, grads[:n_shared])]
        ps_grads = iter(grads[n_shared:])
        for ps in per_sample:
            for k in ps:
                g = next(ps_grads)
                if g is not None:
                    rows = g.reshape(-1, attempt.rows.shape[0], *g.shape[1:]).sum(0)
                    self.per_sample[k] = self.per_sample[k].index_add(0, attempt.rows, -rows)

    def _recorded(self, attempt: Attempt, nodes: list[int]) -> dict[int, _StageCall]:
        """The attempt's own calls for those of ``nodes`` they can serve (stage index -> call).

        The last calls are the attempt's stages 1..s-1 and f at its end (rk_step's order), and
        the one before may be the first stage (the solve's first evaluation, or the previous
        attempt's end when every row took it). Stage times and states are checked, so any other
        call pattern falls back to evaluating again, as does a non-finite value (in a
        zero-weight row it would turn 0 * inf into NaN in the sums).
        """
        m, rows = attempt.method, attempt.rows.shape[0]
        calls = list(self.calls or ())
        if len(calls) < m.n_stages or any(c.fval.shape[0] != rows for c in calls):
            return {}
        later = {j: calls[len(calls) - m.n_stages + j - 1] for j in nodes if j > 0}
        first = calls[-m.n_stages - 1] if 0 in nodes and len(calls) > m.n_stages else None

        def usable(c: _StageCall) -> Tensor:
            return torch.isfinite(c.z).all() & torch.isfinite(c.fval).all()

        checks = [torch.stack([(c.t == torch.add(attempt.t, attempt.h, alpha=m.c[j])).all() & usable(c)
                               for j, c in later.items()]).all() if later else torch.tensor(True)]
        if first is not None:
            checks.append((first.t == attempt.t).all() & (first.z == attempt.y).all() & usable(first))
        later_ok, first_ok = (torch.stack(checks).tolist() + [False])[:2]
        return {**(later if later_ok else {}), **({0: first} if first_ok else {})}

    def _evaluate(self, attempt: Attempt, nodes: list[int]) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """``f`` at the stages ``nodes`` again, stacked along the rows, with the cotangent to use."""
        m, reps = attempt.method, len(nodes)
        t, z = self._stages(attempt, nodes)
        weight = torch.cat([attempt.h * attempt.accept * m.b[j] for j in nodes])
        # Zero-weight rows (rejected, finished) are evaluated at the accepted start state, so a
        # diverged stage cannot turn 0 * inf into NaN in the sums.
        z = torch.where((weight != 0)[:, None], z, attempt.y.repeat(reps, 1))
        y, a = z[:, :self.n], z[:, self.n:]
        with torch.enable_grad():
            p = {k: v.repeat(reps, *(1,) * (v.dim() - 1)) for k, v in attempt.params.items()}
            ps = {k: p[k].detach().requires_grad_(True) for k in self.per_sample}
            fval = self.f(t, y, {**self.shared_values, **self.sh_leaves, **p, **ps})
        return fval, a * weight[:, None], ps

    @staticmethod
    def _stages(attempt: Attempt, nodes: list[int]) -> tuple[Tensor, Tensor]:
        """Times and states of the stages ``nodes``, stacked along the rows (as in rk_step)."""
        m, t, z, h, K = attempt.method, attempt.t, attempt.y, attempt.h, attempt.K
        times = [t if j == 0 else torch.add(t, h, alpha=m.c[j]) for j in nodes]
        states = [z if j == 0 else torch.addcmul(z, h[:, None], weighted_sum(m.a[j], K)) for j in nodes]
        return torch.cat(times), torch.cat(states)


# ----------------------------------------------------------------------------------- checkpoint


def _checkpointed(f, y0, t_start, t_end, t_eval, params, solve_kwargs) -> Solution:
    from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

    started = time.perf_counter()
    if y0.dim() != 2:
        raise ValueError(f"y0 must have shape (batch, n_states), got {tuple(y0.shape)}")
    batch, n = y0.shape
    dtype, device = y0.dtype, y0.device
    t0 = _as_batch_vector(t_start, batch, dtype, device).detach()
    t1 = _as_batch_vector(t_end, batch, dtype, device).detach()
    grid = _eval_grid(t_eval, t0, t1).detach()
    names = list((params or {}).keys())
    values = [torch.as_tensor(params[k]) for k in names] if params else []
    targets = [grid[:, j] for j in range(grid.shape[1])] + [t1]
    recompute_stats: dict[str, Tensor] = {}
    in_forward = [True]

    def segment(t_a, t_b, y, *vals):
        s = solve(f, y, t_a, t_b, None, params=dict(zip(names, vals)), **solve_kwargs)
        if not in_forward[0]:  # the recomputation in backward: count its work
            for name in STAT_NAMES:
                recompute_stats[name] = recompute_stats.get(name, 0) + s.stats[name]
        return (s.y_final, s.status, s.t_final, *[s.stats[k] for k in STAT_NAMES])

    totals = {name: torch.zeros(batch, dtype=torch.int64, device=device) for name in STAT_NAMES}
    status = torch.zeros(batch, dtype=torch.int64, device=device)
    y, t_cur = y0, t0
    columns = []
    for j, target in enumerate(targets):
        ok = status == 0
        t_b = torch.where(ok, target, t_cur)
        if bool((t_b != t_cur).any()):
            with set_checkpoint_early_stop(False):  # run segments to the end so their counters exist
                out = checkpoint(segment, t_cur, t_b, y, *values, use_reentrant=False)
            y_new, seg_status, seg_t = out[0], out[1], out[2]
            for name, value in zip(STAT_NAMES, out[3:]):
                totals[name] = totals[name] + value
            status = torch.where(ok, seg_status, status)
            t_cur = torch.where(ok, seg_t, t_cur)
            y = torch.where(ok[:, None], y_new, y)
        if j < grid.shape[1]:
            good = (status == 0)[:, None]
            columns.append(torch.where(good, y, torch.full_like(y, math.nan)))
    in_forward[0] = False
    method = solve_kwargs["options"].method_name
    return Solution(
        t=grid, y=torch.stack(columns, dim=1), status=status, stats=totals, t_final=t_cur, y_final=y,
        wall_time_s=time.perf_counter() - started, method=method,
        extra={"adjoint": "checkpoint", "backward_stats": recompute_stats, "n_segments": len(targets)},
    )
