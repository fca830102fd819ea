"""Wavelets, and source/receiver geometry mapped onto a rank's block.

Positions are in metres ``(y, x)`` and are snapped to the nearest grid node.  Each shot is a set of
point sources fired together; shots form the batch dimension of the simulation.  Receivers are
shared by all shots.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import torch

from odecli.pde.grid import Block


def ricker(peak_frequency: float, nt: int, dt: float, delay: float | None = None) -> np.ndarray:
    """Ricker wavelet ``(1 - 2 pi^2 f^2 tau^2) exp(-pi^2 f^2 tau^2)``, ``tau = t - delay``.

    The default delay is ``1.5 / f`` so the wavelet starts near zero.
    """
    if delay is None:
        delay = 1.5 / peak_frequency
    t = np.arange(nt, dtype=np.float64) * dt
    a = (math.pi * peak_frequency * (t - delay)) ** 2
    return (1.0 - 2.0 * a) * np.exp(-a)


@dataclass
class Geometry:
    """Global source/receiver node lists (indices), independent of the decomposition."""

    shots: list[list[tuple[int, int, float]]]  # per shot: (iy, ix, amplitude)
    receivers: list[tuple[int, int]]
    wavelet: np.ndarray  # (nt,)

    @property
    def nshots(self) -> int:
        return len(self.shots)

    @property
    def nrec(self) -> int:
        return len(self.receivers)

    def local(self, block: Block, device, dtype) -> "LocalGeometry":
        sb, sy, sx, sa = [], [], [], []
        for b, shot in enumerate(self.shots):
            for iy, ix, amp in shot:
                if block.owns(iy, ix):
                    sb.append(b)
                    sy.append(iy - block.y0)
                    sx.append(ix - block.x0)
                    sa.append(amp)
        rid, ry, rx = [], [], []
        for r, (iy, ix) in enumerate(self.receivers):
            if block.owns(iy, ix):
                rid.append(r)
                ry.append(iy - block.y0)
                rx.append(ix - block.x0)
        li = lambda v: torch.tensor(v, dtype=torch.long, device=device)  # noqa: E731
        return LocalGeometry(
            src_shot=li(sb),
            src_iy=li(sy),
            src_ix=li(sx),
            src_amp=torch.tensor(sa, dtype=dtype, device=device),
            rec_ids=li(rid),
            rec_iy=li(ry),
            rec_ix=li(rx),
            wavelet=torch.as_tensor(self.wavelet, dtype=dtype, device=device),
            nshots=self.nshots,
            nrec=self.nrec,
        )


@dataclass
class LocalGeometry:
    src_shot: torch.Tensor
    src_iy: torch.Tensor
    src_ix: torch.Tensor
    src_amp: torch.Tensor
    rec_ids: torch.Tensor  # global receiver number of each local receiver
    rec_iy: torch.Tensor
    rec_ix: torch.Tensor
    wavelet: torch.Tensor
    nshots: int
    nrec: int

    def ringed(self, ring: int) -> "LocalGeometry":
        """The same geometry for fields stored with a ghost ring of width ``ring``."""
        return replace(self, src_iy=self.src_iy + ring, src_ix=self.src_ix + ring,
                       rec_iy=self.rec_iy + ring, rec_ix=self.rec_ix + ring)

    @property
    def has_sources(self) -> bool:
        return self.src_shot.numel() > 0

    @property
    def nrec_local(self) -> int:
        return int(self.rec_ids.numel())

    def record(self, u: torch.Tensor) -> torch.Tensor:
        """Values of ``u`` (B, ny, nx) at the local receivers: (B, nrec_local)."""
        return u[:, self.rec_iy, self.rec_ix]

    def inject(self, u: torch.Tensor, scale: float, it: int,
               gain: torch.Tensor | None = None) -> torch.Tensor:
        """Add ``scale * amp * wavelet[it]`` (times ``gain`` per source) at the source nodes, in place.

        ``u`` must be a fresh temporary (not saved by autograd), as in the time loops.
        """
        if not self.has_sources:
            return u
        vals = self.src_amp * (self.wavelet[it] * scale)
        if gain is not None:
            vals = vals * gain
        return self.add_at_sources(u, vals)

    def source_values(self, scale: float, gain: torch.Tensor | None = None) -> torch.Tensor:
        """What :meth:`inject` adds at every step, ``(nt, sources)``, computed in one go (the same
        products, so the same numbers) for loops where a few ops per step matter."""
        vals = self.src_amp[None, :] * (self.wavelet[:, None] * scale)
        return vals * gain[None, :] if gain is not None else vals

    def add_at_sources(self, u: torch.Tensor, vals: torch.Tensor) -> torch.Tensor:
        """Add ``vals`` (one per source) at the source nodes of ``u``, in place."""
        if not self.has_sources:
            return u
        return u.index_put_((self.src_shot, self.src_iy, self.src_ix), vals, accumulate=True)

    def scatter_traces(self, local_traces: torch.Tensor) -> torch.Tensor:
        """Place (B, nrec_local, nt) traces into a zero (B, nrec, nt) array (for exact all-reduce)."""
        b, _, nt = local_traces.shape
        full = local_traces.new_zeros((b, self.nrec, nt))
        full[:, self.rec_ids, :] = local_traces
        return full


__all__ = ["ricker", "Geometry", "LocalGeometry"]
