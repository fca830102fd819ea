"""Reading run files whatever their array layout (kept free of torch so readers start fast)."""

from __future__ import annotations

import numpy as np


def as_batched(t: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """t to (batch, time), y to (batch, time, state), from any layout a run file may hold."""
    if y.ndim == 1:
        y = y[None, :, None]
    elif y.ndim == 2:
        y = y[None]
    if t.ndim == 1:
        t = np.broadcast_to(t, y.shape[:2])
    return t, y
