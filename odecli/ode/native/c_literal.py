"""C literals for Python floats: shared by the solver generator and the expression compiler."""

from __future__ import annotations

import math


def c_double(number: float) -> str:
    """A C literal that parses back to exactly ``number`` (``repr`` round-trips)."""
    if math.isinf(number):
        return "INFINITY" if number > 0 else "(-INFINITY)"
    if math.isnan(number):
        return "NAN"
    return repr(float(number))
