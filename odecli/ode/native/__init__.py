"""Generated C solvers for right-hand sides given as expressions (see :mod:`.engine`)."""

from odecli.ode.native.engine import NativeRhs, NativeUnavailable, solve_native, unsupported_reason

__all__ = ["NativeRhs", "NativeUnavailable", "solve_native", "unsupported_reason"]
