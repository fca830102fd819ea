"""Build the optimiser an :class:`~odecli.optim.settings.OptimizerSettings` names."""

from __future__ import annotations

import math
from collections.abc import Callable

from odecli.optim.adam import Adam
from odecli.optim.bounds import Box
from odecli.optim.lbfgs import LBFGS, armijo_backtracking, strong_wolfe
from odecli.optim.settings import OptimizerSettings
from odecli.optim.space import Space, Vector
from odecli.optim.step import Optimizer


def make_optimizer(settings: OptimizerSettings, params: Vector, space: Space, bounds: Box | None = None,
                   max_first_step: float = math.inf, scales: list[float] | None = None,
                   iterations: int | None = None,
                   precondition: Callable[[Vector], Vector] | None = None) -> Optimizer:
    """The optimiser ``settings.type`` names, moving ``params`` in place (see :class:`LBFGS` for
    ``max_first_step``; ``scales``: each parameter's natural range, see :mod:`odecli.optim.adam`;
    ``iterations``: the run's length for a schedule, default ``settings.iterations``)."""
    if settings.type == "adam":  # a learning_rate given is a step in the unknown's own units
        default = settings.learning_rate is None  # the scale-aware step, field-shaped on grids
        return Adam(params, settings.learning_rate, settings.betas, bounds=bounds,
                    scales=scales if default else None,
                    schedule=settings.schedule,
                    total=settings.iterations if iterations is None else iterations,
                    precondition=precondition if default else None,
                    fields=space if default and any(space.distributed) else None)
    if settings.type == "lbfgs":
        search = {"strong_wolfe": strong_wolfe, "armijo": armijo_backtracking}[settings.line_search]
        if bounds is not None:
            search = armijo_backtracking  # the only one that projects onto a box
        return LBFGS(params, space, settings.learning_rate, settings.history_size,
                     settings.max_line_search, bounds=bounds, max_first_step=max_first_step,
                     line_search=search, scales=scales, precondition=precondition)
    raise ValueError(f"unknown optimizer type {settings.type!r}")
