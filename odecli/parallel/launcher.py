"""How many ranks the MPI launcher started, and which one this is, read from its environment without importing MPI
(importing mpi4py initialises MPI; the command line must know before it may, see odecli.__main__)."""

from __future__ import annotations

import os

SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE")  # MPICH/Hydra, Open MPI
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


def launched_ranks() -> int:
    """The number of ranks the launcher started (1 without a launcher)."""
    for var in SIZE_VARIABLES:
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 1


def launched_rank() -> int:
    """This process's rank among them (0 without a launcher)."""
    for var in RANK_VARIABLES:
        if var in os.environ:
            return int(os.environ[var])
    return 0
