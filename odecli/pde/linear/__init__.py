"""Linear solves on the decomposed grid: the matrix-free 5-point diffusion operator, a geometric
multigrid V-cycle, preconditioned conjugate gradients over the halo exchange and all-reduce, and
the solve as one differentiable operation (forward: a solve; backward: the adjoint solve).

Used by the steady ``poisson2d`` equation and by ``heat2d``'s implicit (backward Euler) steps.
"""

from odecli.pde.linear.settings import NotConverged, SolverSettings, solver_problem

__all__ = ["NotConverged", "SolverSettings", "solver_problem"]
