"""The 2-D isotropic elastic wave equation (velocity-stress, Virieux staggered grid).

- ``equation``: what the registry knows without torch (parameters, stability limit, messages,
  parameter rules, the builder).
- ``build``: a propagator from a :class:`~odecli.pde.propagator.Setup`.
- ``reference``: one time step in plain PyTorch (autograd differentiates it; CUDA's path and
  the tests' oracle).
- ``pml``: the convolutional PML's coefficients.
- ``fused`` + ``elastic.c`` (+ ``elastic_adjoint.c``, which it includes): the steps on C
  kernels (bit for bit the reference's) and their hand-written adjoint.
- ``propagator``: :class:`~odecli.pde.elastic.propagator.ElasticPropagator`, the time loop over
  ranks with recomputed time segments.
"""
