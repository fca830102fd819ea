"""ODE numerics, free of files and specs: the batched PyTorch loop, its methods and controllers, gradients, the C solver.

Entry points: :func:`odecli.ode.solver.solve` (the batched loop), :func:`odecli.ode.adjoint.odeint`
(the same with a choice of gradient), :func:`odecli.ode.native.solve_native` and
:func:`~odecli.ode.native.solve_native_arrays` (the generated C solver); all take a
:class:`~odecli.ode.options.SolverOptions` and return a :class:`~odecli.ode.solution.Solution`
(or its numpy twin :class:`~odecli.ode.solution.ArraySolution`). Importing this package imports
no torch: the C solver's path never needs it.
"""
