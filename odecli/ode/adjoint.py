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
    again, backwards in time, on the augmented per-sample system ``[y, a, g]`` with
    ``dy/dt = f``, ``da/dt = -a^T df/dy``, ``dg/dt = -a^T df/dtheta``: every sample keeps its own
    steps, step sizes and controller history, exactly as in the forward pass. It integrates
    interval by interval between consecutive evaluation columns (each sample with its own span),
    adds the incoming ``dL/dy`` at each column and restarts ``y`` from the value stored in the
    forward pass there (the forward output is kept anyway, and this removes the drift of
    reconstructing ``y`` backwards). Memory is O(batch x n_eval), independent of the number of
    steps. Gradients of shared tensors (shared ``params`` entries, Module weights) are integrated
    per sample (``torch.func.vmap`` over rows) and summed over the batch at the end.
``checkpoint``
    The forward pass is split at the evaluation columns; each segment is solved without keeping
    its graph and re-solved with graph in the backward pass (``torch.utils.checkpoint``). The
    gradient is exact for the segmented discrete solution; memory is that of the longest segment.

Backward statistics (per-sample ``n_steps``, ``n_accepted``, ``n_rejected``, ``n_f_evals`` of the
adjoint solve, plus ``status``) appear in ``solution.extra["backward_stats"]`` once ``backward()``
has run (backsolve; checkpoint reports the recomputation's counters).
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import Tensor, nn

from odecli.ode.solver import STAT_NAMES, Solution, _eval_grid, _as_batch_vector, _split_params, solve
from odecli.ode.status import Status

ADJOINT_MODES = ("direct", "backsolve", "checkpoint")
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
    module: nn.Module | None
    module_names: list[str] | None  # names of module_params inside module (None: not addressable)
    n_module: int
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


def _backsolve(f, y0, t_start, t_end, t_eval, params, module_params, adjoint_rtol, adjoint_atol, solve_kwargs) -> Solution:
    if y0.dim() != 2:
        raise ValueError(f"y0 must have shape (batch, n_states), got {tuple(y0.shape)}")
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

    module = _find_module(f)
    if module_params is None:
        module_params = [p for p in module.parameters() if p.requires_grad] if module is not None else []
    module_params = list(module_params)
    module_names = None
    if module is not None:
        by_id = {id(p): name for name, p in module.named_parameters()}
        names = [by_id.get(id(p)) for p in module_params]
        module_names = None if any(n is None for n in names) else names

    cfg = _Config(
        f=f, batch=batch, t0=t0, t1=t1, grid=grid, ps_names=ps_names, sh_names=sh_names, fixed=fixed,
        ps_fixed=ps_fixed, module=module, module_names=module_names, n_module=len(module_params), solve_kwargs=dict(solve_kwargs),
        adjoint_rtol=adjoint_rtol, adjoint_atol=adjoint_atol,
    )
    tensors = [per_sample[k] for k in ps_names] + [shared[k] for k in sh_names] + module_params
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
        ctx.save_for_backward(sol.y, sol.y_final, sol.t_final, *tensors)
        return sol.y, sol.y_final

    @staticmethod
    def backward(ctx, grad_ys: Tensor | None, grad_y_final: Tensor | None):
        cfg: _Config = ctx.cfg
        ys, y_final, t_final, *tensors = ctx.saved_tensors
        needs = ctx.needs_input_grad[2:]
        grads = _adjoint_backward(cfg, ys, y_final, t_final, tensors, needs, grad_ys, grad_y_final)
        return (None, *grads)


def _adjoint_backward(cfg, ys, y_final, t_final, tensors, needs, grad_ys, grad_y_final):
    started = time.perf_counter()
    batch, n_eval, n = ys.shape
    dtype, device = ys.dtype, ys.device
    ps, sh, mod = _split_tensors(cfg, tensors)
    n_ps, n_sh = len(cfg.ps_names), len(cfg.sh_names)
    need_ps = [k for k, nd in zip(cfg.ps_names, needs[:n_ps]) if nd]
    need_sh = [k for k, nd in zip(cfg.sh_names, needs[n_ps:n_ps + n_sh]) if nd]
    need_mod = [i for i, nd in enumerate(needs[n_ps + n_sh:]) if nd]
    ps_sizes = [ps[k][0].numel() for k in need_ps]
    sh_sizes = [sh[k].numel() for k in need_sh] + [mod[i].numel() for i in need_mod]
    n_g = sum(ps_sizes) + sum(sh_sizes)

    rhs = _AugmentedRHS(cfg, n, ps, sh, mod, need_ps, need_sh, need_mod)
    grid = cfg.grid
    direction = torch.where(cfg.t1 >= cfg.t0, 1.0, -1.0).to(dtype)
    grad_ys = torch.zeros_like(ys) if grad_ys is None else grad_ys
    reached = (direction[:, None] * grid <= direction[:, None] * t_final[:, None]) & torch.isfinite(ys).all(-1)
    grad_ys = torch.where(reached[..., None], grad_ys, torch.zeros_like(grad_ys))

    a = torch.zeros_like(y_final) if grad_y_final is None else grad_y_final.clone()
    y = y_final
    g = torch.zeros(batch, n_g, dtype=dtype, device=device)
    t_cur = t_final.clone()
    kwargs = dict(cfg.solve_kwargs)
    kwargs.pop("compact", None)
    if cfg.adjoint_rtol is not None:
        kwargs["rtol"] = cfg.adjoint_rtol
    if cfg.adjoint_atol is not None:
        kwargs["atol"] = cfg.adjoint_atol
    totals = {name: torch.zeros(batch, dtype=torch.int64, device=device) for name in STAT_NAMES}
    status = torch.zeros(batch, dtype=torch.int64, device=device)
    n_solves = 0
    for j in range(n_eval - 1, -2, -1):
        target = cfg.t0 if j < 0 else torch.where(reached[:, j], grid[:, j], t_cur)
        if bool((target != t_cur).any()):
            z = torch.cat([y, a, g], dim=1)
            s = solve(rhs, z, t_cur, target, None, params={**ps, **cfg.ps_fixed}, **kwargs)
            n_solves += 1
            for name in STAT_NAMES:
                totals[name] = totals[name] + s.stats[name]
            status = torch.where(status == 0, s.status, status)
            z = s.y_final
            y, a, g = z[:, :n], z[:, n:2 * n], z[:, 2 * n:]
        if j >= 0:
            col = reached[:, j, None]
            y = torch.where(col, ys[:, j], y)
            a = a + grad_ys[:, j]
        t_cur = target

    grads: list[Tensor | None] = [None] * len(tensors)
    grads_y0 = a
    offset = 0
    for k, size in zip(need_ps, ps_sizes):
        grads[cfg.ps_names.index(k)] = g[:, offset:offset + size].reshape(ps[k].shape).to(ps[k].dtype)
        offset += size
    sh_targets = [(n_ps + cfg.sh_names.index(k), sh[k]) for k in need_sh] + [(n_ps + n_sh + i, mod[i]) for i in need_mod]
    for (index, ref), size in zip(sh_targets, sh_sizes):
        grads[index] = g[:, offset:offset + size].sum(0).reshape(ref.shape).to(ref.dtype)
        offset += size

    cfg.backward_stats.clear()
    cfg.backward_stats.update(totals)
    cfg.backward_stats["status"] = status
    cfg.backward_stats["n_solves"] = n_solves
    cfg.backward_stats["per_sample_shared_grads"] = rhs.mode
    cfg.backward_stats["wall_time_s"] = time.perf_counter() - started
    return [grads_y0, *grads]


class _AugmentedRHS:
    """``[y, a, g] -> [f, -a^T f_y, -a^T f_theta]`` row by row (per-sample shared gradients)."""

    def __init__(self, cfg: _Config, n: int, ps, sh, mod, need_ps, need_sh, need_mod):
        self.cfg, self.n = cfg, n
        self.sh, self.mod = sh, mod
        self.need_ps, self.need_sh, self.need_mod = need_ps, need_sh, need_mod
        self.need_shared = bool(need_sh or need_mod)
        if not self.need_shared:
            self.mode = "none"
        elif need_mod and (cfg.module is None or cfg.module_names is None):
            self.mode = "loop"
        elif not need_mod and all(sh[k].dim() == 0 for k in need_sh):
            self.mode = "expand"  # scalars: hand f one copy per row, then plain batched autograd
            self._expand_checked = False
        else:
            self.mode = "vmap"
        if self.mode == "loop":
            warnings.warn("backsolve: module_params do not belong to an nn.Module right-hand side; per-sample "
                          "gradients of shared tensors fall back to a slow row loop", RuntimeWarning, stacklevel=4)

    def _call(self, t, y, p, mod_values=None):
        cfg = self.cfg
        p = {**cfg.fixed, **p}
        if mod_values is None:
            return cfg.f(t, y, p)
        names = [cfg.module_names[i] for i in self.need_mod]
        return torch.func.functional_call(cfg.module, dict(zip(names, mod_values)), (t, y, p))

    def __call__(self, t: Tensor, z: Tensor, p: Mapping[str, Tensor]) -> Tensor:
        n = self.n
        y, a = z[:, :n], z[:, n:2 * n]
        if self.mode == "expand" and not self._expand_checked:
            self._expand_checked = True
            with torch.no_grad():
                rows = y.shape[0]
                expanded = {k: self.sh[k].detach().expand(rows) for k in self.need_sh}
                try:
                    same = torch.equal(self.cfg.f(t, y, {**self.cfg.fixed, **self.sh, **p}),
                                       self.cfg.f(t, y, {**self.cfg.fixed, **self.sh, **expanded, **p}))
                except Exception:  # noqa: BLE001 - f does not broadcast a per-row copy
                    same = False
            if not same:
                self.mode = "vmap"
        if self.mode == "vmap":
            try:
                return self._vmap(t, y, a, p)
            except Exception as exc:  # noqa: BLE001 - f may not be vmappable; stay correct, get slower
                warnings.warn(f"backsolve: right-hand side is not vmappable ({type(exc).__name__}: {exc}); "
                              "using a row loop for shared-parameter gradients", RuntimeWarning, stacklevel=2)
                self.mode = "loop"
        return self._autograd(t, y, a, p)

    def _vmap(self, t, y, a, p):
        sh_grad = {k: self.sh[k].detach() for k in self.need_sh}
        sh_rest = {k: v for k, v in self.sh.items() if k not in sh_grad}
        ps_grad = {k: p[k].detach() for k in self.need_ps}
        ps_rest = {k: v for k, v in p.items() if k not in ps_grad}
        mod_vals = [self.mod[i].detach() for i in self.need_mod]
        use_module = bool(self.need_mod)

        def one(t_b, y_b, a_b, ps_b, rest_b, sh_b, mod_b):
            def inner(y_b, ps_b, sh_b, mod_b):
                params = {**sh_rest, **sh_b, **{k: v[None] for k, v in rest_b.items()}, **{k: v[None] for k, v in ps_b.items()}}
                return self._call(t_b[None], y_b[None], params, mod_b if use_module else None)[0]

            out, vjp = torch.func.vjp(inner, y_b, ps_b, sh_b, mod_b)
            return out, vjp(a_b)

        with torch.enable_grad():
            fval, (gy, gps, gsh, gmod) = torch.func.vmap(one, in_dims=(0, 0, 0, 0, 0, None, None))(
                t, y.detach(), a.detach(), ps_grad, ps_rest, sh_grad, mod_vals)
        rows = y.shape[0]
        parts = [fval, -gy]
        parts += [-gps[k].reshape(rows, -1) for k in self.need_ps]
        parts += [-gsh[k].reshape(rows, -1) for k in self.need_sh]
        parts += [-gm.reshape(rows, -1) for gm in gmod]
        return torch.cat([x.detach().to(y.dtype) for x in parts], dim=1)

    def _autograd(self, t, y, a, p):
        rows = y.shape[0]
        with torch.enable_grad():
            y_ = y.detach().requires_grad_(True)
            ps_ = {k: (v.detach().requires_grad_(True) if k in self.need_ps else v) for k, v in p.items()}
            expand = self.mode == "expand"
            sh_ = {k: (v.detach().expand(rows).clone().requires_grad_(True) if expand else
                       v.detach().requires_grad_(True)) if k in self.need_sh else v for k, v in self.sh.items()}
            fval = self.cfg.f(t, y_, {**self.cfg.fixed, **sh_, **ps_})
            inputs = [y_] + [ps_[k] for k in self.need_ps] + ([sh_[k] for k in self.need_sh] if expand else [])
            loop = self.need_shared and not expand
            grads = torch.autograd.grad(fval, inputs, a, allow_unused=True, retain_graph=loop)
            parts = [fval.detach()]
            parts += [-(gr if gr is not None else torch.zeros_like(x)).reshape(rows, -1) for gr, x in zip(grads, inputs)]
            if loop:
                shared_inputs = [sh_[k] for k in self.need_sh] + [self.mod[i] for i in self.need_mod]
                per_row = []
                for b in range(rows):
                    gb = torch.autograd.grad(fval[b], shared_inputs, a[b], allow_unused=True, retain_graph=True)
                    per_row.append(torch.cat([(x if x is not None else torch.zeros_like(s)).reshape(-1)
                                              for x, s in zip(gb, shared_inputs)]))
                parts.append(-torch.stack(per_row).to(y.dtype))
        return torch.cat([x.detach() for x in parts], dim=1)


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
    m = solve_kwargs.get("method", "dopri5")
    method = m if isinstance(m, str) else m.name
    return Solution(
        t=grid, y=torch.stack(columns, dim=1), status=status, stats=totals, t_final=t_cur, y_final=y,
        wall_time_s=time.perf_counter() - started, method=method,
        extra={"adjoint": "checkpoint", "backward_stats": recompute_stats, "n_segments": len(targets)},
    )
