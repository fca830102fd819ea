"""Right-hand sides written as C expressions, for the generated solver, and its "cannot run" error.

:class:`NativeRhs` is the expression kind (every ``equations:`` spec); the MLP kind is
:class:`~odecli.ode.native.mlp.NativeMLP`. Both give the solver the same pieces: C source for
one sample and for a block of lanes, shared weights, and a pullback for the gradient sweep.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from odecli.ode.native.codegen import equations_c, events_c
from odecli.ode.native.vjp import equations_pullback_c


class NativeUnavailable(RuntimeError):
    """The generated solver cannot run here (no compiler, turned off, unsupported input)."""


@dataclass(frozen=True)
class NativeEvent:
    """An event as C: ``expression`` over ``t``, ``y[i]``, ``p[j]`` (as the equations), its direction
    (+1 rising, -1 falling, 0 both), terminal count (0: recorded only) and name."""

    expression: str
    direction: int = 0
    terminal: int = 0
    name: str = ""


@dataclass(frozen=True)
class NativeRhs:
    """``dy/dt`` as one C expression per state over ``t``, ``y[i]`` and ``p[j]``.

    ``params`` names the columns of ``p`` in order; the values come from the solve's
    ``params`` mapping (per-sample (B,) arrays or tensors, or scalars).
    """

    equations: tuple[str, ...]
    params: tuple[str, ...] = ()
    events: tuple[NativeEvent, ...] = ()
    """Events located per sample on the dense output (:mod:`odecli.ode.native.events`)."""

    c_flags = ()
    """Compiler flags this right-hand side's C needs beyond :data:`odecli.native.FLAGS`."""

    @property
    def n_states(self) -> int:
        return len(self.equations)

    def c_source(self) -> str:
        """``rhs`` and ``rhs_lanes`` in C (:func:`~odecli.ode.native.codegen.equations_c`)."""
        return equations_c(self.equations) + events_c(
            [e.expression for e in self.events], [e.direction for e in self.events], [e.terminal for e in self.events])

    def shared_weights(self) -> np.ndarray:
        """Values every sample reads (none for expressions; one element keeps a valid pointer)."""
        return np.zeros(1)

    def tensors(self) -> list:
        """Shared tensors that take gradients: none (parameters come through ``params``)."""
        return []

    def gradient_size(self) -> int:
        """Doubles of the shared weights' cotangent array per block of the gradient sweep (unused)."""
        return 1

    def keep_size(self) -> int:
        """Values an evaluation keeps for its pullback: none (the vjp recomputes what it needs)."""
        return 0

    def pullback_c(self) -> str:
        """``rhs_pullback`` for the gradient sweep; ``ValueError`` for text the vjp cannot differentiate."""
        return equations_pullback_c(self.equations)

