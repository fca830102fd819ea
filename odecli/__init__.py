"""odecli: batched, per-sample-independent ODE solving and MPI-parallel PDE inverse problems."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("odecli")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.1.0"
