"""Maps between a bounded unknown and the unbounded variable an optimiser moves."""

from __future__ import annotations

# How close to a bound a bounded unknown's initial value may come: its inverse transform
# (logit or log) must stay finite.
TRANSFORM_EDGE = 1e-6
