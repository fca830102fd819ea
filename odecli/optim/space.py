"""Inner products of the optimisers' flat parameter vectors, summed over MPI ranks where distributed.

A *vector* is a list of tensors, one per parameter. A parameter is *distributed* (each rank holds
its block of a grid field) or *replicated* (every rank holds the same copy). Inner products sum the
distributed parts with an all-reduce and add the replicated parts once; the result is broadcast
from rank 0 so that every rank takes exactly the same decisions (a rank-dependent round-off in a
line search test would let the ranks' paths diverge).
"""

from __future__ import annotations

import math
from typing import Protocol

import torch

Vector = list[torch.Tensor]


class Reducer(Protocol):
    """The two collectives a distributed :class:`Space` needs (:class:`odecli.parallel.comm.Comm`)."""

    size: int

    def allreduce_scalar(self, value: float, op: str = "sum") -> float: ...

    def bcast_object(self, obj: object, root: int = 0) -> object: ...


class Space:
    """Dot products and norms of vectors whose parts are distributed or replicated."""

    def __init__(self, comm: Reducer | None, distributed: list[bool]) -> None:
        self.comm, self.distributed = comm, distributed

    def _reduce(self, local_dist: float, replicated: float, op: str = "sum") -> float:
        if self.comm is not None and self.comm.size > 1:
            local_dist = self.comm.allreduce_scalar(float(local_dist), op=op)
            local_dist = self.comm.bcast_object(local_dist, root=0)
        return (local_dist + replicated) if op == "sum" else max(local_dist, replicated)

    def dot(self, a: Vector, b: Vector) -> float:
        d = r = 0.0
        for dist, x, y in zip(self.distributed, a, b):
            v = float(torch.sum(x * y))
            if dist:
                d += v
            else:
                r += v
        return self._reduce(d, r)

    def norm(self, a: Vector) -> float:
        return math.sqrt(max(self.dot(a, a), 0.0))

    def absmax(self, a: Vector) -> float:
        d = r = 0.0
        for dist, x in zip(self.distributed, a):
            v = float(x.abs().max()) if x.numel() else 0.0
            if dist:
                d = max(d, v)
            else:
                r = max(r, v)
        return self._reduce(d, r, op="max")
