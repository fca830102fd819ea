"""The conservative diffusion operator ``-div(kappa grad u)`` of heat2d and poisson2d on a
rank's block: face conductivities from the cell field, and the Dirichlet sides' lift.

Faces carry ``(kappa_i + kappa_j) / 2`` between cells; a Dirichlet side's face carries the
cell's own conductivity and a value held one cell outside the grid; a Neumann side's face
carries nothing (zero flux).  These are the rules heat2d's explicit step has always used, so the
implicit and steady equations discretise the same operator.
"""

from __future__ import annotations

import torch

from odecli.pde.grid import Block, Grid
from odecli.pde.stencils import divergence_flux
from odecli.pde.timing import CommTimer, timed_halo

SIDES = ("top", "bottom", "left", "right")


class DiffusionBoundary:
    """The boundary rules of one rank's block: which physical sides are Dirichlet (``open``),
    their held values as a ghost ring (``ghost``), and the face conductivities of a field."""

    def __init__(self, grid: Grid, block: Block, boundary: dict, decomp, comm,
                 timer: CommTimer | None, dtype: torch.dtype, device=None) -> None:
        self.grid, self.block, self.decomp, self.comm, self.timer = grid, block, decomp, comm, timer
        ny, nx = block.shape
        iy, ix = block.indices(device)
        self.on_boundary = {"top": iy == 0, "bottom": iy == grid.ny - 1,
                            "left": ix == 0, "right": ix == grid.nx - 1}
        self.open = {s: (boundary[s]["type"] == "dirichlet") for s in SIDES}
        ghost = torch.zeros((ny + 2, nx + 2), dtype=dtype, device=device)
        if block.y0 == 0 and self.open["top"]:
            ghost[0, 1:-1] = boundary["top"]["value"]
        if block.y1 == grid.ny and self.open["bottom"]:
            ghost[-1, 1:-1] = boundary["bottom"]["value"]
        if block.x0 == 0 and self.open["left"]:
            ghost[1:-1, 0] = boundary["left"]["value"]
        if block.x1 == grid.nx and self.open["right"]:
            ghost[1:-1, -1] = boundary["right"]["value"]
        self.ghost = ghost

    @property
    def any_dirichlet(self) -> bool:
        return any(self.open.values())

    def faces(self, k: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Face conductivities ``(west, east, north, south)`` of every cell (differentiable;
        collective: exchanges ``k``'s halo)."""
        kp = timed_halo(k, self.decomp, self.comm, 1, 0.0, self.timer)
        ny, nx = k.shape
        on = self.on_boundary

        def face(nb, side):
            avg = (k + nb) * 0.5
            avg = torch.where(on[side], k, avg)  # Dirichlet face: the cell's own conductivity
            if not self.open[side]:
                avg = torch.where(on[side], torch.zeros_like(avg), avg)
            return avg

        return (face(kp[1 : 1 + ny, 0:nx], "left"), face(kp[1 : 1 + ny, 2 : 2 + nx], "right"),
                face(kp[0:ny, 1 : 1 + nx], "top"), face(kp[2 : 2 + ny, 1 : 1 + nx], "bottom"))

    def lift(self, faces: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """``div(kappa grad g)`` of the held Dirichlet values ``g`` (zero inside the grid): what
        moves to the right-hand side when the operator acts on zero ghosts."""
        kw, ke, kn, ks = faces
        return divergence_flux(self.ghost, kw, ke, kn, ks, self.grid.dy, self.grid.dx)


__all__ = ["DiffusionBoundary", "SIDES"]
