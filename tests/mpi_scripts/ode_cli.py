"""Run the ``odecli`` command line as ``mpiexec -n N python ode_cli.py solve SPEC -o OUT ...``."""

from __future__ import annotations

from odecli.cli import app

if __name__ == "__main__":
    app(prog_name="odecli")
