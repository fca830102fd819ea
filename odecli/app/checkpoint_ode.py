"""Checkpoints of ``kind: ode`` fits (``OUT.ckpt.h5`` beside the output) for ``train-inverse --resume``.

The optimisers are deterministic given their state, so saving that state (plus the history and the
evaluation count) lets a killed fit continue to exactly the result of an uninterrupted one. Every
rank holds the same state (see :mod:`odecli.app.fit_ode`): rank 0 writes the file alone and every
rank reads it back on resume.

``ODECLI_ODE_EXIT_AFTER_CHECKPOINT=k`` makes every rank exit abruptly (status 75, no output) right
after the checkpoint of iteration ``k``: the simulated kill of the resume tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from odecli import __version__
from odecli.errors import InputError
from odecli.io.atomic import atomic_h5
from odecli.parallel.comm import Comm
from odecli.app import faults
from odecli.app.checkpoint import open_checkpoint, read_array, read_attr

KIND = "ode-inverse-checkpoint"
HISTORY = ("loss", "grad_norm", "wall_time_s", "n_evals")  # one entry per iteration, and the start


@dataclass
class OptState:
    """What an optimiser carries from one iteration to the next (after ``it`` completed ones)."""

    x: np.ndarray
    f: float
    g: np.ndarray
    it: int = 0
    m: np.ndarray | None = None  # Adam's moment estimates (None before its first step)
    v: np.ndarray | None = None
    s: list[np.ndarray] = field(default_factory=list)  # L-BFGS's steps and gradient changes
    y: list[np.ndarray] = field(default_factory=list)


def save(path: Path, comm: Comm, *, spec_text: str, optimizer: str, state: OptState,
         history: dict[str, list[float]], n_evals: int) -> None:
    """Collective: rank 0 writes ``path`` atomically; its failure is raised on every rank, so none
    waits for a rank that has stopped."""
    error = None
    if comm.rank == 0:
        try:
            with atomic_h5(path) as h5:
                a = h5.attrs
                a["kind"] = KIND
                a["spec"] = spec_text
                a["optimizer"] = optimizer
                a["iteration"] = state.it
                a["f"] = state.f
                a["n_evals"] = n_evals
                a["ranks"] = comm.size
                a["odecli_version"] = __version__
                h5.create_dataset("x", data=state.x)
                h5.create_dataset("g", data=state.g)
                if state.m is not None:
                    h5.create_dataset("m", data=state.m)
                    h5.create_dataset("v", data=state.v)
                for name in ("s", "y"):  # (n_pairs, n_unknowns); no pairs for Adam
                    h5.create_dataset(name, data=np.reshape(getattr(state, name), (-1, state.x.size)))
                hist = h5.create_group("history")
                for name, values in history.items():
                    dtype = np.int64 if name == "n_evals" else np.float64
                    hist.create_dataset(name, data=np.asarray(values, dtype=dtype))
        except InputError as exc:
            error = str(exc)
    error = comm.bcast_object(error, root=0)
    if error is not None:
        raise InputError(error)


def load(path: Path, spec_text: str, size: int) -> tuple[OptState, dict[str, list[float]], int]:
    """(state, history, n_evals) from ``path`` for a fit of ``size`` unknowns; refuses a checkpoint
    written for another spec, and a damaged one by the part it lacks (none reaches the optimiser)."""
    with open_checkpoint(path, KIND, spec_text) as h5:
        it = int(read_attr(h5, "iteration"))
        pairs = read_array(h5, "s").shape[0] if "s" in h5 else 0
        adam = read_attr(h5, "optimizer") == "adam"
        state = OptState(
            x=read_array(h5, "x", (size,)), f=float(read_attr(h5, "f")), g=read_array(h5, "g", (size,)),
            it=it, m=read_array(h5, "m", (size,)) if adam else None,
            v=read_array(h5, "v", (size,)) if adam else None,
            s=list(read_array(h5, "s", (pairs, size))), y=list(read_array(h5, "y", (pairs, size))),
        )
        history = {name: read_array(h5, f"history/{name}", rows=it + 1).tolist() for name in HISTORY}
        return state, history, int(read_attr(h5, "n_evals"))


def maybe_exit_after_checkpoint(iteration: int) -> None:
    """The simulated kill (see the module docstring); off unless the variable is set."""
    faults.maybe_exit_after_checkpoint(iteration, "ODECLI_ODE_EXIT_AFTER_CHECKPOINT")
