"""MPI domain decomposition and differentiable communication; knows nothing of physics.

The names below are imported on first use: the differentiable ops import torch, and the
batch-splitting ODE driver (:mod:`.ode_batch`) lives here too but must start without it.
"""

import importlib

_LAZY = {
    "Comm": "comm", "get_comm": "comm",
    "Decomposition": "decomposition", "choose_proc_grid": "decomposition", "decompose": "decomposition",
    "allreduce_sum": "ops", "broadcast": "ops", "gather_global": "ops", "halo_exchange": "ops",
    "halo_fill": "ops", "local_block": "ops", "GhostExchange": "ops",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
