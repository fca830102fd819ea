"""What every equation provides: a :class:`Propagator` (the time loop on one rank's block), the
module interface of an :class:`Equation`, and the registry :data:`EQUATIONS` from the spec's
``equation`` name to that module.

Adding an equation is one package ``odecli/pde/<name>/`` whose ``equation`` module satisfies
:class:`Equation`, and one line in :data:`EQUATIONS`.  The ``equation`` modules import no torch
(``odecli validate`` reads their stability limits and messages); their ``build`` imports the
propagator itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from odecli.pde.acoustic import equation as acoustic_equation
from odecli.pde.elastic import equation as elastic_equation
from odecli.pde.heat import equation as heat_equation
from odecli.pde.poisson import equation as poisson_equation

if TYPE_CHECKING:  # torch is imported by the propagators, not by the registry
    import torch

    from odecli.pde.grid import Block, Grid
    from odecli.pde.sources import Geometry, LocalGeometry
    from odecli.pde.timing import CommTimer


class Propagator(Protocol):
    """The forward problem on one rank's block: a coefficient field in, receiver traces out.

    ``forward`` is an autograd operation of the coefficient: ``backward`` of a loss of the traces
    runs the equation's adjoint (a hand-written adjoint loop or autograd through the reference
    steps, the time segments recomputed from their starts either way) and leaves the coefficient's
    gradient.  All ranks call it together: steps exchange the ``halo`` ghost cells.
    """

    halo: int  # ghost cells per side that one step reads from the neighbours
    segments: list[tuple[int, int]]  # the time segments the backward recomputes, [t0, t1)
    fused: bool | None  # whether the loop runs on compiled kernels (None: wherever they run)

    def stability_limit(self) -> float:
        """The largest coefficient value for which the time step is stable."""
        ...

    def forward(self, coefficient: torch.Tensor, return_field: bool = False) -> Any:
        """Receiver traces ``(shots, local receivers, nt)`` for the block's coefficient field;
        with ``return_field`` also ``(traces, the final field on the block)``."""
        ...

    def engine(self) -> str:
        """What runs the time loop, in words (result files and ``odecli stats`` show it)."""
        ...


class SetupError(ValueError):
    """A spec value the propagator cannot run with; ``field`` is the spec's dotted key.  Every
    rank raises it at the same point (the checks depend on the decomposition only)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass
class Setup:
    """Everything an equation's ``build`` receives for one rank: the discretisation, the rank's
    place in the decomposition, and the spec's settings that shape the time loop."""

    grid: Grid
    block: Block
    decomp: Any  # odecli.parallel.decomposition.Decomposition
    comm: Any  # odecli.parallel.comm communicator
    dt: float
    nt: int
    geometry: Geometry  # every shot and receiver, on the whole grid
    local: LocalGeometry  # those on this rank's block
    boundary: dict  # the spec's ``boundary`` section
    initial_condition: float | None  # the field's starting value (heat2d; None elsewhere)
    time_segments: int | str  # the spec's ``compute.time_segments``: a count or "auto"
    threads: int  # kernel threads per rank
    exchange_every: int | str  # the spec's ``parallel.exchange_every``: a count or "auto"
    timer: CommTimer
    dtype: torch.dtype
    device: torch.device
    solver: dict | None = None  # linear solves (poisson2d, implicit heat2d): {"rtol", "max_iterations"}
    time_scheme: str = "explicit"  # heat2d: "explicit" (forward Euler) or "implicit" (backward Euler)
    source_type: str = "pressure"  # elastic2d: "pressure" (explosive), "fy" or "fx" (point force)
    receiver_components: list[str] | None = None  # elastic2d: per receiver "vy" | "vx" | "pressure"


class Equation(Protocol):
    """The names an ``odecli/pde/<name>/equation.py`` module defines (a module satisfies this)."""

    QUANTITY: str  # what its coefficient field is called in messages ("wave speed")
    LEAST: str  # the coefficient's sign rule, as messages state it ("> 0")

    def violates_sign(self, low: float) -> bool:
        """Whether a field whose minimum is ``low`` (finite) breaks :attr:`LEAST`."""
        ...

    def stability_limit(self, dt: float, dy: float, dx: float) -> float:
        """The largest stable coefficient value for this time step and grid spacing."""
        ...

    def limit_text(self, most: float, dt: float) -> str:
        """The limit as a user can check it by hand: the scheme's bound and the coefficient's."""
        ...

    def build(self, setup: Setup) -> Propagator:
        """The propagator for one rank (collective: every rank calls it)."""
        ...


EQUATIONS: dict[str, Equation] = {
    "acoustic2d": acoustic_equation,
    "elastic2d": elastic_equation,
    "heat2d": heat_equation,
    "poisson2d": poisson_equation,
}
