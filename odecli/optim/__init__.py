"""The optimisers of every fit: one Adam, one L-BFGS, on flat parameter vectors.

:func:`make_optimizer` builds the one an :class:`OptimizerSettings` names; the fit loop
(:mod:`odecli.app.fit`) drives it through the :class:`Optimizer` protocol.
"""

from __future__ import annotations

import math

from odecli.optim.adam import Adam
from odecli.optim.lbfgs import LBFGS, armijo_backtracking
from odecli.optim.settings import OptimizerSettings
from odecli.optim.space import Space, Vector
from odecli.optim.step import Evaluate, Optimizer, Step
from odecli.optim.transforms import Box


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


__all__ = ["Adam", "Box", "Evaluate", "LBFGS", "Optimizer", "OptimizerSettings", "Space", "Step",
           "Vector", "armijo_backtracking", "make_optimizer"]
