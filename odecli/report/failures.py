"""Why samples failed, in one clause of a run's summary line: counts per status and the first failure.

A summary that says only ``2 failed`` sends the user to ``odecli stats``; this says which statuses and
where the first failing sample stopped, so the next step is obvious from the line itself.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from odecli.ode.status import Status


@dataclass
class FailureTally:
    """Failed samples, added chunk by chunk (chunks may arrive in any order, as under MPI)."""

    counts: Counter = field(default_factory=Counter)
    first: tuple[int, int, float] | None = None  # (sample, status, time it stopped at)

    def add(self, start: int, status: np.ndarray, t_final: np.ndarray) -> None:
        """Samples ``start .. start + len(status) - 1`` with their statuses and stopping times."""
        failed = np.flatnonzero((status != Status.SUCCESS) & (status != Status.EVENT))  # a terminal event is an end, not a failure
        self.counts.update(int(code) for code in status[failed])
        if failed.size and (self.first is None or start + failed[0] < self.first[0]):
            i = int(failed[0])
            self.first = (start + i, int(status[i]), float(t_final[i]))

    @property
    def failed(self) -> int:
        return sum(self.counts.values())

    def clause(self) -> str:
        """``" (2 non-finite values; first: sample 0 stopped at t = 0)"``, or ``""`` when none failed."""
        if self.first is None:
            return ""
        parts = ", ".join(f"{n} {_describe(code)}" for code, n in sorted(self.counts.items()))
        sample, _, t = self.first
        return f" ({parts}; first: sample {sample} stopped at t = {t:.6g})"


def _describe(code: int) -> str:
    try:
        return Status(code).description
    except ValueError:
        return f"status {code}"
