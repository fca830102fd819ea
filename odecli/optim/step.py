"""What every optimiser's ``step`` takes and returns, so that one fit loop drives them all."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from odecli.optim.space import Vector

# Loss and gradient at the optimiser's parameters as they are now; collective over the ranks.
# A point that cannot be evaluated (a sample that does not solve) gives (inf, None).
Evaluate = Callable[[], "tuple[float, Vector | None]"]


@dataclass
class Step:
    """The outcome of one optimiser step.

    ``ok`` False: no acceptable point was found and the parameters are as they were. ``f`` and
    ``g`` are the loss and gradient at the new parameters when the step evaluated them (a line
    search does), None when it did not (Adam)."""

    ok: bool
    f: float | None = None
    g: Vector | None = None

    @property
    def evaluated(self) -> bool:
        return self.f is not None and self.g is not None and math.isfinite(self.f)


class Optimizer(Protocol):
    """A deterministic optimiser whose whole state can be saved and loaded (bit-for-bit resume)."""

    kind: str
    params: Vector

    def step(self, f: float, g: Vector, evaluate: Evaluate) -> Step: ...

    def state_vectors(self) -> dict[str, Vector]: ...

    def state_scalars(self) -> dict: ...

    def load(self, vectors: dict[str, Vector], scalars: dict) -> None: ...
