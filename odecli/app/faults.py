"""Fault injection for the failure-handling tests (environment variables, off by default).

``ODECLI_PDE_FAIL_RANK=r`` (and optionally ``ODECLI_PDE_FAIL_ITER=k``, default 0): rank ``r``
raises at iteration ``k``.  ``ODECLI_PDE_EXIT_AFTER_CHECKPOINT=k``: every rank exits abruptly
(status 75, no output) right after the checkpoint written at iteration ``k`` - a simulated kill.
"""

from __future__ import annotations

import os
import sys


def maybe_fail(rank: int, iteration: int | None) -> None:
    r = os.environ.get("ODECLI_PDE_FAIL_RANK")
    if r is None or iteration is None:
        return
    if int(r) == rank and int(os.environ.get("ODECLI_PDE_FAIL_ITER", "0")) == iteration:
        raise RuntimeError(f"injected failure on rank {rank} at iteration {iteration}")


def maybe_exit_after_checkpoint(iteration: int, variable: str = "ODECLI_PDE_EXIT_AFTER_CHECKPOINT") -> None:
    """The simulated kill; ``variable`` names the switch (ODE fits use their own)."""
    k = os.environ.get(variable)
    if k is not None and int(k) == iteration:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(75)
