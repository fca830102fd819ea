"""Maps between a bounded unknown and the unbounded variable an optimiser moves.

Imported by the spec layer, which must not import torch (``odecli validate`` stays fast): keep it
free of torch. The box projection of unknowns moved without a transform is :mod:`odecli.optim.bounds`.
"""

from __future__ import annotations

# How close to a bound a bounded unknown's initial value may come: its inverse transform
# (logit or log) must stay finite.
TRANSFORM_EDGE = 1e-6
