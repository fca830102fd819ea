"""The optimisers of every fit: one Adam, one L-BFGS, on flat parameter vectors.

:func:`make_optimizer` builds the one an :class:`OptimizerSettings` names; the fit loop
(:mod:`odecli.app.fit`) drives it through the :class:`Optimizer` protocol.

The names load on first use: the spec layer imports :mod:`odecli.optim.settings` and
:mod:`odecli.optim.transforms` without torch, which the others import.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOME = {
    "Adam": "adam", "LBFGS": "lbfgs", "armijo_backtracking": "lbfgs", "strong_wolfe": "lbfgs", "Box": "bounds",
    "OptimizerSettings": "settings", "Space": "space", "Vector": "space",
    "Evaluate": "step", "Optimizer": "step", "Step": "step", "make_optimizer": "factory",
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'odecli.optim' has no attribute {name!r}")
    return getattr(importlib.import_module(f"odecli.optim.{_HOME[name]}"), name)


__all__ = [
    "LBFGS",
    "Adam",
    "Box",
    "Evaluate",
    "Optimizer",
    "OptimizerSettings",
    "Space",
    "Step",
    "Vector",
    "armijo_backtracking",
    "strong_wolfe",
    "make_optimizer",
]
