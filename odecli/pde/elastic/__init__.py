"""The 2-D isotropic elastic wave equation (velocity-stress, Virieux staggered grid).

- ``equation``: what the registry knows without torch (parameters, stability limit, messages,
  parameter rules, the builder).
- ``reference``: one time step in plain PyTorch (autograd differentiates it).
- ``pml``: the convolutional PML's damping profiles.
- ``propagator``: :class:`~odecli.pde.elastic.propagator.ElasticPropagator`, the time loop over
  ranks with checkpointed time segments.
"""
