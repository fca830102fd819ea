"""Per-sample status codes (shared with torchode's numbering so files are comparable)."""

from __future__ import annotations

import enum


class Status(enum.IntEnum):
    SUCCESS = 0
    GENERAL_ERROR = 1
    REACHED_DT_MIN = 2
    REACHED_MAX_STEPS = 3
    INFINITE_NORM = 4

    @property
    def label(self) -> str:
        return self.name.lower()


STATUS_NAMES: dict[int, str] = {int(s): s.label for s in Status}
