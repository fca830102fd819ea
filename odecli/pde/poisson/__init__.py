"""The steady 2-D diffusion (Poisson/Darcy) equation ``-div(kappa grad u) = f``.

- ``equation``: what the registry knows without torch (its parameter, sign rule, the boundary
  rule, the builder); steady, so no time step and no stability limit.
- ``propagator``: :class:`~odecli.pde.poisson.propagator.PoissonPropagator`, one
  multigrid-preconditioned CG solve per forward and one adjoint solve per backward
  (:mod:`odecli.pde.linear`).
"""
