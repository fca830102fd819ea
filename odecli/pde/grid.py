"""The global grid, a rank's block of it, and point snapping.

Axis 0 is ``y`` (depth, rows), axis 1 is ``x`` (columns).  Node ``(iy, ix)`` sits at
``(iy*dy, ix*dx)`` metres.  Every per-point quantity is a function of the *global* node index,
so a rank computes exactly the same numbers for its block as one rank does for the whole grid.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Grid:
    ny: int
    nx: int
    dy: float
    dx: float

    @property
    def shape(self) -> tuple[int, int]:
        return (self.ny, self.nx)

    @property
    def extent(self) -> tuple[float, float]:
        return ((self.ny - 1) * self.dy, (self.nx - 1) * self.dx)

    def snap(self, pos) -> tuple[int, int]:
        """Nearest node to a position ``(y, x)`` in metres; ``None`` if outside the grid."""
        iy = int(round(float(pos[0]) / self.dy))
        ix = int(round(float(pos[1]) / self.dx))
        if not (0 <= iy < self.ny and 0 <= ix < self.nx):
            return None
        return iy, ix


@dataclass(frozen=True)
class Block:
    """The half-open index range ``[y0, y1) x [x0, x1)`` of the global grid owned by one rank."""

    y0: int
    y1: int
    x0: int
    x1: int

    @classmethod
    def of(cls, decomp) -> "Block":
        return cls(int(decomp.y0), int(decomp.y1), int(decomp.x0), int(decomp.x1))

    @classmethod
    def whole(cls, grid: Grid) -> "Block":
        return cls(0, grid.ny, 0, grid.nx)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.y1 - self.y0, self.x1 - self.x0)

    def indices(self, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Global integer node indices ``(IY, IX)`` of this block, each of shape ``shape``."""
        iy = torch.arange(self.y0, self.y1, device=device)
        ix = torch.arange(self.x0, self.x1, device=device)
        return torch.meshgrid(iy, ix, indexing="ij")

    def coords(self, grid: Grid, dtype, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Physical coordinates ``(Y, X)`` in metres of this block's nodes."""
        iy, ix = self.indices(device)
        return iy.to(dtype) * grid.dy, ix.to(dtype) * grid.dx

    def owns(self, iy: int, ix: int) -> bool:
        return self.y0 <= iy < self.y1 and self.x0 <= ix < self.x1
