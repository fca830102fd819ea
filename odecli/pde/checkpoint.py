"""Checkpoints beside the output (``OUT.ckpt.h5``): enough state to continue bit-for-bit.

Distributed vectors are gathered to the global grid, so a checkpoint is independent of the rank
layout (resuming on the same number of ranks reproduces the uninterrupted run exactly).

The rules shared with ODE fits (:mod:`odecli.inverse_checkpoint`) live here too: a checkpoint is
hours of work, so a run never starts over on one silently (:func:`check_start`), and Ctrl-C says
where the work is (:func:`note_on_interrupt`).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Iterator

import h5py
import numpy as np
import torch

from odecli.errors import InputError
from odecli.io.atomic import atomic_h5, check_writable
from odecli.parallel.ops import gather_global, local_block


def checkpoint_path(output: Path) -> Path:
    output = Path(output)
    return output.with_name(output.stem + ".ckpt.h5")


def check_start(output: Path, resume: bool, force: bool) -> Path:
    """Before any compute: the checkpoint path, once it is clear that nothing will be lost.

    An earlier run's checkpoint is continued only with ``--resume`` and discarded only with
    ``--force`` (a new run would overwrite it at its first checkpoint and delete it at the end).
    An existing output is replaced with ``--force``, or by a resumed run, which supersedes it."""
    cpath = checkpoint_path(output)
    if cpath.exists() and not (resume or force):
        raise InputError(f"{cpath}: a checkpoint of an earlier run exists; pass --resume to "
                         "continue it or --force to start over")
    check_writable(output, force or (resume and cpath.exists()))
    return cpath


def saved_iteration(path: Path) -> int | None:
    """The iteration a checkpoint holds, or None when there is none (or it cannot be read)."""
    try:
        with h5py.File(path, "r") as f:
            return int(f.attrs["iteration"])
    except (OSError, KeyError, TypeError, ValueError):
        return None


@contextlib.contextmanager
def note_on_interrupt(cpath: Path) -> Iterator[None]:
    """Ctrl-C in the body is re-raised as a KeyboardInterrupt whose message says that the work up
    to the checkpoint is kept and how to continue it (the CLI prints it), when there is one."""
    try:
        yield
    except KeyboardInterrupt as exc:
        it = None if str(exc) else saved_iteration(cpath)
        if it is None:
            raise
        raise KeyboardInterrupt(f"no output was written; {cpath} keeps the run up to iteration "
                                f"{it}: continue it with --resume") from None


def _gather(vec, distributed, decomp, comm):
    out = []
    for v, dist in zip(vec, distributed):
        if dist and comm.size > 1:
            g = gather_global(v.detach(), decomp, comm, root=0)
            out.append(None if g is None else g.cpu().numpy())
        else:
            out.append(v.detach().cpu().numpy())
    return out


def save(path: Path, *, spec_text: str, iteration: int, params, distributed, opt, history: dict,
         timing: dict, decomp, comm) -> None:
    """Collective: gather on rank 0, which writes ``path`` atomically."""
    vecs = {"params": _gather(params, distributed, decomp, comm)}
    for name, vec in opt.state_vectors().items():
        vecs[f"opt/{name}"] = _gather(vec, distributed, decomp, comm)
    if comm.rank != 0:
        return
    with atomic_h5(path) as f:
        f.attrs["kind"] = "pde-inverse-checkpoint"
        f.attrs["spec"] = spec_text
        f.attrs["iteration"] = iteration
        f.attrs["optimizer"] = opt.kind
        f.attrs["optimizer_scalars"] = json.dumps(opt.state_scalars())
        f.attrs["ranks"] = comm.size
        for name, vec in vecs.items():
            grp = f.create_group(name)
            for i, arr in enumerate(vec):
                grp.create_dataset(str(i), data=arr)
        h = f.create_group("history")
        for k, v in history.items():
            h.create_dataset(k, data=np.asarray(v, dtype=np.float64))
        t = f.create_group("timing")
        for k, v in timing.items():
            t.create_dataset(k, data=np.asarray(v, dtype=np.float64))


def load(path: Path, *, spec_text: str, params, distributed, opt, decomp, comm) -> tuple[int, dict, dict]:
    """Every rank reads the file and takes its own block; returns (iteration, history, timing)."""
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise InputError(f"{path}: cannot read checkpoint: {exc}") from None
    with f:
        if f.attrs.get("kind") != "pde-inverse-checkpoint":
            raise InputError(f"{path}: not a pde-inverse checkpoint")
        if f.attrs["spec"] != spec_text:
            raise InputError(f"{path}: checkpoint was written for a different spec; "
                             "rerun without --resume (or restore the spec)")
        if f.attrs["optimizer"] != opt.kind:
            raise InputError(f"{path}: checkpoint optimizer {f.attrs['optimizer']} != {opt.kind}")

        def read_vec(name, like):
            out = []
            for i, (ref, dist) in enumerate(zip(like, distributed)):
                arr = torch.as_tensor(f[name][str(i)][...], dtype=ref.dtype, device=ref.device)
                if dist and comm.size > 1:
                    arr = local_block(arr, decomp).contiguous()
                out.append(arr.clone())
            return out

        with torch.no_grad():
            for p, v in zip(params, read_vec("params", params)):
                p.copy_(v)
        vecs = {}
        if "opt" in f:
            for name in f["opt"]:
                vecs[name] = read_vec(f"opt/{name}", params)
        opt.load(vecs, json.loads(f.attrs["optimizer_scalars"]))
        history = {k: list(f["history"][k][...]) for k in f["history"]}
        timing = {k: np.asarray(f["timing"][k][...]) for k in f["timing"]}
        timing["ranks"] = int(f.attrs["ranks"])
        return int(f.attrs["iteration"]), history, timing
