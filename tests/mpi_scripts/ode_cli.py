"""Run the ``odecli`` command line as ``mpiexec -n N python ode_cli.py solve SPEC -o OUT ...``.

With ``ODECLI_TEST_NO_TORCH=1`` a rank that imported torch fails (exit code 9): equations specs
run on the C solver, which must not pay for ``import torch`` on every rank.
"""

from __future__ import annotations

import os
import sys

from odecli.cli import app

if __name__ == "__main__":
    try:
        app(prog_name="odecli")
    except SystemExit:
        if os.environ.get("ODECLI_TEST_NO_TORCH") == "1" and "torch" in sys.modules:
            print("torch was imported", file=sys.stderr)
            sys.exit(9)
        raise
