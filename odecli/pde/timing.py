"""Per-rank split of time spent in communication ops (forward and backward) vs. the rest."""

from __future__ import annotations

import time

import torch

from odecli.parallel.ops import halo_exchange, halo_fill


class CommTimer:
    def __init__(self) -> None:
        self.comm_s = 0.0
        self._bw_start = 0.0

    def reset(self) -> None:
        self.comm_s = 0.0

    def add(self, seconds: float) -> None:
        self.comm_s += seconds


class _Mark(torch.autograd.Function):
    """Identity whose backward stamps the clock: 'after' opens, 'before' closes a comm interval."""

    @staticmethod
    def forward(ctx, x, timer, which):
        ctx.timer = timer
        ctx.which = which
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        now = time.perf_counter()
        if ctx.which == "after":
            ctx.timer._bw_start = now
        else:
            ctx.timer.comm_s += now - ctx.timer._bw_start
        return g, None, None


def timed_halo(u, decomp, comm, width: int, fill: float, timer: CommTimer | None,
               in_place: bool = False):
    """``halo_exchange`` (or ``halo_fill`` of a ringed ``u``, ``in_place=True``) that adds its
    forward and backward wall time to ``timer.comm_s``."""
    if in_place:
        t0 = time.perf_counter()
        out = halo_fill(u, decomp, comm, width, clock=None if timer is None else timer.add)
        if timer is not None:
            timer.add(time.perf_counter() - t0)
        return out
    if timer is None:
        return halo_exchange(u, decomp, comm, width, fill=fill)
    track = torch.is_grad_enabled() and u.requires_grad
    if track:
        u = _Mark.apply(u, timer, "before")
    t0 = time.perf_counter()
    out = halo_exchange(u, decomp, comm, width, fill=fill)
    timer.comm_s += time.perf_counter() - t0
    if track:
        out = _Mark.apply(out, timer, "after")
    return out
