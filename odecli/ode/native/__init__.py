"""Generated C solvers for right-hand sides given as expressions or as MLPs (see :mod:`.engine`)."""

from odecli.ode.native.engine import (
    ArraySolution, NativeRhs, NativeUnavailable, solve_native, solve_native_arrays, unsupported_reason,
)
from odecli.ode.native.mlp import NativeMLP

__all__ = ["ArraySolution", "NativeMLP", "NativeRhs", "NativeUnavailable", "solve_native", "solve_native_arrays",
           "unsupported_reason"]
