"""Time segments: the time loop cut into pieces that the backward pass recomputes one at a time,
so that a gradient keeps the segments' starting fields instead of every step's."""

from __future__ import annotations

import math


def default_segment_count(nt: int) -> int:
    """``round(sqrt(nt))``: about ``sqrt(nt)`` starts plus one segment of ``sqrt(nt)`` steps, the
    fewest fields a gradient can keep."""
    return max(1, round(math.sqrt(nt)))


def segment_bounds(nt: int, segments: int) -> list[tuple[int, int]]:
    """``[t0, t1)`` of each of (at most) ``segments`` nearly equal runs of the ``nt`` steps."""
    segments = max(1, min(segments, nt))
    size = math.ceil(nt / segments)
    return [(t0, min(nt, t0 + size)) for t0 in range(0, nt, size)]
