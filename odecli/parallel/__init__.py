"""MPI domain decomposition and differentiable communication; knows nothing of physics.

The names below are imported on first use: the differentiable ops import torch, and the
work queue of an ODE batch over ranks (:mod:`.work_queue`) lives here too but must start without it.
"""

import importlib

_LAZY = {
    "Comm": "comm", "get_comm": "comm",
    "Decomposition": "decomposition", "choose_proc_grid": "decomposition", "decompose": "decomposition",
    "allreduce_sum": "collectives", "broadcast": "collectives", "gather_global": "collectives",
    "local_block": "collectives", "halo_exchange": "halo", "halo_fill": "halo", "GhostExchange": "halo",
    "HaloPlan": "halo",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
