"""PDE numerics, knowing no files, specs or CLI: the grid and a rank's block, sources and
receivers, coefficient models, unknowns, stencils, time segments, timing, and the
:class:`~odecli.pde.propagator.Propagator` interface with one package per equation
(``acoustic/``, ``heat/``) registered in :data:`~odecli.pde.propagator.EQUATIONS`.

Kept free of imports: ``odecli validate`` reads the stability limits without torch.
"""
