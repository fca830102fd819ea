"""Checkpoints of ``kind: ode`` fits (``OUT.ckpt.h5`` beside the output) for ``train-inverse --resume``.

The optimisers are deterministic given their state, so saving that state (plus the history and the
evaluation count) lets a killed fit continue to exactly the result of an uninterrupted one. Every
rank holds the same state (see :mod:`odecli.inverse_ode`): rank 0 writes the file alone and every
rank reads it back on resume.

``ODECLI_ODE_EXIT_AFTER_CHECKPOINT=k`` makes every rank exit abruptly (status 75, no output) right
after the checkpoint of iteration ``k``: the simulated kill of the resume tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from odecli import __version__
from odecli.errors import InputError
from odecli.io.atomic import atomic_h5
from odecli.parallel.comm import Comm
from odecli.pde import faults

KIND = "ode-inverse-checkpoint"


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


def load(path: Path, spec_text: str) -> tuple[OptState, dict[str, list[float]], int]:
    """(state, history, n_evals) from ``path``; refuses a checkpoint written for another spec."""
    try:
        h5 = h5py.File(path, "r")
    except OSError as exc:
        raise InputError(f"{path}: cannot read checkpoint: {exc}") from None
    with h5:
        if h5.attrs.get("kind") != KIND:
            raise InputError(f"{path}: not an ode-inverse checkpoint")
        if h5.attrs["spec"] != spec_text:
            raise InputError(f"{path}: checkpoint was written for a different spec; "
                             "rerun without --resume (or restore the spec)")
        state = OptState(
            x=h5["x"][...], f=float(h5.attrs["f"]), g=h5["g"][...], it=int(h5.attrs["iteration"]),
            m=h5["m"][...] if "m" in h5 else None, v=h5["v"][...] if "v" in h5 else None,
            s=list(h5["s"][...]), y=list(h5["y"][...]),
        )
        history = {name: h5["history"][name][...].tolist() for name in h5["history"]}
        return state, history, int(h5.attrs["n_evals"])


def maybe_exit_after_checkpoint(iteration: int) -> None:
    """The simulated kill (see the module docstring); off unless the variable is set."""
    faults.maybe_exit_after_checkpoint(iteration, "ODECLI_ODE_EXIT_AFTER_CHECKPOINT")
