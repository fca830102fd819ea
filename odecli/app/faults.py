"""Fault injection for the failure-handling tests (environment variables, off by default).

``ODECLI_PDE_FAIL_RANK=r`` (and optionally ``ODECLI_PDE_FAIL_ITER=k``, default 0): rank ``r``
raises at iteration ``k``.  ``ODECLI_PDE_EXIT_AFTER_CHECKPOINT=k`` or
``ODECLI_ODE_EXIT_AFTER_CHECKPOINT=k``: every rank exits abruptly (status 75, no output) right
after the checkpoint written at iteration ``k`` - a simulated kill (the fit loop calls it for
both kinds; the two names are those the tests of each kind set).
"""

from __future__ import annotations

import os
import sys

EXIT_AFTER_CHECKPOINT = ("ODECLI_PDE_EXIT_AFTER_CHECKPOINT", "ODECLI_ODE_EXIT_AFTER_CHECKPOINT")


def maybe_fail(rank: int, iteration: int | None) -> None:
    r = os.environ.get("ODECLI_PDE_FAIL_RANK")
    if r is None or iteration is None:
        return
    if int(r) == rank and int(os.environ.get("ODECLI_PDE_FAIL_ITER", "0")) == iteration:
        raise RuntimeError(f"injected failure on rank {rank} at iteration {iteration}")


def maybe_exit_after_checkpoint(iteration: int) -> None:
    """The simulated kill (see the module docstring)."""
    for variable in EXIT_AFTER_CHECKPOINT:
        k = os.environ.get(variable)
        if k is not None and int(k) == iteration:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(75)
