"""The 2-D heat equation ``u_t = div(kappa grad u) + f``.

- ``equation``: what the registry knows without torch (stability limit, messages, sign rule,
  the builder).
- ``propagator``: :class:`~odecli.pde.heat.propagator.HeatPropagator`, explicit Euler in
  PyTorch (any device; autograd differentiates it).
"""
