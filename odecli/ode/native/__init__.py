"""Generated C solvers for right-hand sides given as expressions or as MLPs.

The entry points are :mod:`.solve` (``solve_native``, ``solve_native_arrays``) and
:mod:`.gradient` (``solve_native_with_grad``); :mod:`.engine` lays out and runs a batch,
:mod:`.codegen` writes the C header the solver template (``solver_template.c``) includes.
"""

from odecli.ode.native.engine import unsupported_reason
from odecli.ode.native.mlp import NativeMLP
from odecli.ode.native.rhs import NativeEvent, NativeRhs, NativeUnavailable
from odecli.ode.native.solve import solve_native, solve_native_arrays
from odecli.ode.solution import ArraySolution

__all__ = ["ArraySolution", "NativeEvent", "NativeMLP", "NativeRhs", "NativeUnavailable", "solve_native", "solve_native_arrays",
           "unsupported_reason"]
