"""What a solve reports, free of torch: per-sample status codes, counter names, progress snapshots.

The status numbering is torchode's (0-4), so files from either are comparable; 5 ``event`` is
odecli's own (a terminal event ended the sample).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

STAT_NAMES = ("n_steps", "n_accepted", "n_rejected", "n_f_evals")
"""Per-sample integer counters every engine reports (``Solution.stats``)."""


class Status(enum.IntEnum):
    SUCCESS = 0
    GENERAL_ERROR = 1
    REACHED_DT_MIN = 2
    REACHED_MAX_STEPS = 3
    INFINITE_NORM = 4
    EVENT = 5  # odecli's own: a terminal event ended the sample (torchode has no events)

    @property
    def label(self) -> str:
        """The name files, ``odecli stats`` and plots use (the member names are torchode's)."""
        return _LABELS.get(self, self.name.lower())

    @property
    def description(self) -> str:
        """What happened, in the README's words (for summaries a person reads)."""
        return _DESCRIPTIONS[self]


# torchode's INFINITE_NORM covers any non-finite value (error norm, solution, Newton iterate),
# which is what the documents call it.
_LABELS = {Status.INFINITE_NORM: "non_finite"}

_DESCRIPTIONS = {
    Status.SUCCESS: "success",
    Status.GENERAL_ERROR: "general error",
    Status.REACHED_DT_MIN: "step size below dt_min",
    Status.REACHED_MAX_STEPS: "max_steps reached",
    Status.INFINITE_NORM: "non-finite values",
    Status.EVENT: "stopped at a terminal event",
}


STATUS_NAMES: dict[int, str] = {int(s): s.label for s in Status}


@dataclass(frozen=True)
class Progress:
    """A snapshot for progress displays: how many samples finished and how far the slowest got."""

    finished: int
    batch: int
    slowest_fraction: float  # min over running samples of (t - t_start) / (t_end - t_start)
    loop_iterations: int
