"""The 2-D constant-density acoustic wave equation ``u_tt = c^2 lap(u) + f``.

- ``equation``: what the registry knows without torch (stability limit, messages, sign rule,
  the builder).
- ``build``: a spec's settings turned into a propagator (sponge, exchange cadence, segments).
- ``propagator``: :class:`~odecli.pde.acoustic.propagator.AcousticPropagator`, and the PyTorch
  reference time loop (any device; autograd differentiates it).
- ``reference``: one leapfrog step in plain PyTorch.
- ``kernels``: the fused C kernels (``acoustic.c``) bound to one problem.
- ``fused``: the time loop on those kernels as one autograd operation, with its adjoint loop.
- ``loop``: what that loop is planned with: segments, halo exchanges every K steps, windows.
- ``workspace``: buffers kept between evaluations.
- ``cuda_build``, ``cuda_loop``: on one GPU, the CUDA kernels (``cuda_point.h``, ``cuda_blocks.h``;
  NVRTC, or a host build for the tests) and their time loop (``cuda_steps.c``) with the adjoint.
"""
