"""Generated C solvers for right-hand sides given as expressions (see :mod:`.engine`)."""

from odecli.ode.native.engine import (
    ArraySolution, NativeRhs, NativeUnavailable, solve_native, solve_native_arrays, unsupported_reason,
)

__all__ = ["ArraySolution", "NativeRhs", "NativeUnavailable", "solve_native", "solve_native_arrays",
           "unsupported_reason"]
