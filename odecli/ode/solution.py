"""What a solve returns: :class:`Solution` (tensors, from any engine) and :class:`ArraySolution` (numpy).

Both carry the same fields, batch first. The generated C solver fills an :class:`ArraySolution`
without importing torch; run-file writers and reports take either, and each converts to the
other. This module imports neither torch nor the solvers, so every engine and every reader can
depend on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from odecli.ode.status import Status

if TYPE_CHECKING:
    import numpy as np
    from torch import Tensor

PER_SAMPLE_FIELDS = ("t", "y", "status", "t_final", "y_final")
"""The fields holding one row per sample (``stats`` holds a dict of them)."""


@dataclass
class EventRecord:
    """One event's occurrences, per sample in time order, NaN-padded to the most any sample had.

    ``t`` (B, K) and ``y`` (B, K, n_states) hold the times and states of the occurrences,
    ``count`` (B,) how many each sample had (the rest of its row is NaN); K = max(count).
    Tensors in a :class:`Solution`, numpy arrays in an :class:`ArraySolution`.
    """

    t: Any
    y: Any
    count: Any


@dataclass
class Solution:
    """Result of a batched solve; every tensor has the batch as its first dimension."""

    t: Tensor  # (B, n_eval) evaluation times
    y: Tensor  # (B, n_eval, n_states); NaN where a failed sample never reached the time
    status: Tensor  # (B,) int64, see odecli.ode.status.Status
    stats: dict[str, Tensor]  # (B,) int64 counters, plus dt0 / dt_final (B,) floats
    t_final: Tensor  # (B,) time each sample stopped at
    y_final: Tensor  # (B, n_states) state there
    wall_time_s: float = 0.0
    method: str = ""
    extra: dict = field(default_factory=dict)
    events: dict[str, EventRecord] = field(default_factory=dict)  # event name -> its occurrences

    @property
    def success(self) -> Tensor:
        """Samples that ended normally: at t_end (status 0) or at a terminal event (status 5)."""
        return (self.status == Status.SUCCESS) | (self.status == Status.EVENT)


@dataclass
class ArraySolution:
    """The fields of :class:`Solution` as numpy arrays, as the C solver fills them.

    Run-file writers and reports accept either; :func:`~odecli.ode.native.solve_native` wraps
    these in tensors.
    """

    t: np.ndarray  # (B, n_eval)
    y: np.ndarray  # (B, n_eval, n_states); NaN where a failed sample never reached the time
    status: np.ndarray  # (B,) int64, see odecli.ode.status.Status
    stats: dict[str, np.ndarray]  # (B,) int64 counters, plus dt0 / dt_final (B,) floats
    t_final: np.ndarray  # (B,)
    y_final: np.ndarray  # (B, n_states)
    wall_time_s: float = 0.0
    method: str = ""
    extra: dict = field(default_factory=dict)
    events: dict[str, EventRecord] = field(default_factory=dict)  # event name -> its occurrences

    @property
    def success(self) -> np.ndarray:
        """Samples that ended normally: at t_end (status 0) or at a terminal event (status 5)."""
        return (self.status == Status.SUCCESS) | (self.status == Status.EVENT)

    def to_tensors(self) -> Solution:
        """The same result as a :class:`Solution` (CPU tensors sharing the memory)."""
        import torch

        return Solution(
            **{name: torch.from_numpy(getattr(self, name)) for name in PER_SAMPLE_FIELDS},
            stats={name: torch.from_numpy(values) for name, values in self.stats.items()},
            wall_time_s=self.wall_time_s, method=self.method, extra=dict(self.extra),
            events={name: EventRecord(*(torch.from_numpy(v) for v in (r.t, r.y, r.count)))
                    for name, r in self.events.items()},
        )

    @classmethod
    def from_solution(cls, solution: Solution) -> ArraySolution:
        """A tensor :class:`Solution` (any device) as numpy arrays."""
        def numpy(tensor: Tensor) -> np.ndarray:
            return tensor.detach().cpu().numpy()

        return cls(
            **{name: numpy(getattr(solution, name)) for name in PER_SAMPLE_FIELDS},
            stats={name: numpy(values) for name, values in solution.stats.items()},
            wall_time_s=solution.wall_time_s, method=solution.method, extra=dict(solution.extra),
            events={name: EventRecord(numpy(r.t), numpy(r.y), numpy(r.count)) for name, r in solution.events.items()},
        )
