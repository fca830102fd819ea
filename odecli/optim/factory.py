"""Build the optimiser an :class:`~odecli.optim.settings.OptimizerSettings` names."""

from __future__ import annotations

import math

from odecli.optim.adam import Adam
from odecli.optim.bounds import Box
from odecli.optim.lbfgs import LBFGS
from odecli.optim.settings import OptimizerSettings
from odecli.optim.space import Space, Vector
from odecli.optim.step import Optimizer


def make_optimizer(settings: OptimizerSettings, params: Vector, space: Space, bounds: Box | None = None,
                   max_first_step: float = math.inf) -> Optimizer:
    """The optimiser ``settings.type`` names, moving ``params`` in place (see :class:`LBFGS` for
    ``max_first_step``)."""
    if settings.type == "adam":
        return Adam(params, settings.learning_rate, settings.betas, bounds=bounds)
    if settings.type == "lbfgs":
        return LBFGS(params, space, settings.learning_rate, settings.history_size,
                     settings.max_line_search, bounds=bounds, max_first_step=max_first_step)
    raise ValueError(f"unknown optimizer type {settings.type!r}")
