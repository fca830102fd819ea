"""odecli: batched, per-sample-independent ODE solving and MPI-parallel PDE inverse problems.

``odecli.solve`` (the batched solver), ``odecli.odeint`` (the same with a choice of gradient
method), ``odecli.SolverOptions`` (how either steps) and ``odecli.Solution`` are imported on first use, so commands that only read files
(stats, plot, export) do not pay for importing torch.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("odecli")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.1.0"

_LAZY = {
    "solve": ("odecli.ode.solver", "solve"),
    "Solution": ("odecli.ode.solution", "Solution"),
    "SolverOptions": ("odecli.ode.options", "SolverOptions"),
    "odeint": ("odecli.ode.adjoint", "odeint"),
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attribute = _LAZY[name]
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'odecli' has no attribute {name!r}")
