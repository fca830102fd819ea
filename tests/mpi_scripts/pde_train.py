"""Run ``train_inverse`` like the CLI does: usage pde_train.py SPEC OUT [--resume] [--iterations N].

Errors print once (rank 0) as ``error: <msg>`` and exit with the error's exit code.
"""

from __future__ import annotations

import sys
from pathlib import Path

from odecli.errors import OdecliError
from odecli.parallel.comm import get_comm
from odecli.app.fit_pde import train_inverse

if __name__ == "__main__":
    args = sys.argv[1:]
    resume = "--resume" in args
    iters = None
    if "--iterations" in args:
        iters = int(args[args.index("--iterations") + 1])
    try:
        code = train_inverse(Path(args[0]), Path(args[1]), iters, resume, True, True)
    except OdecliError as exc:
        if get_comm().rank == 0:
            print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    sys.exit(code)
