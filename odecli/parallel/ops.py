"""The communication ops by the names the engines and tests import them under.

:mod:`odecli.parallel.halo` holds the one planned halo exchange (``GhostExchange`` is its plan;
``halo_exchange``, ``halo_fill``, ``fill_ring_`` and ``fill_ring_adjoint_`` run it out of place,
in place with autograd, and in place without); :mod:`odecli.parallel.collectives` the
differentiable sums, broadcasts and gathers.
"""

from .collectives import allreduce_sum, broadcast, gather_global, local_block
from .halo import (
           GhostExchange,
           HaloPlan,
           fill_ring_,
           fill_ring_adjoint_,
           halo_exchange,
           halo_fill,
)

__all__ = ["GhostExchange", "HaloPlan", "allreduce_sum", "broadcast", "fill_ring_", "fill_ring_adjoint_",
           "gather_global", "halo_exchange", "halo_fill", "local_block"]
