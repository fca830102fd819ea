"""MPI domain decomposition and differentiable communication; knows nothing of physics."""

from .comm import Comm, get_comm
from .decomposition import Decomposition, choose_proc_grid, decompose
from .ops import allreduce_sum, broadcast, gather_global, halo_exchange, halo_fill, local_block

__all__ = [
    "Comm",
    "Decomposition",
    "allreduce_sum",
    "broadcast",
    "choose_proc_grid",
    "decompose",
    "gather_global",
    "get_comm",
    "halo_exchange",
    "halo_fill",
    "local_block",
]
