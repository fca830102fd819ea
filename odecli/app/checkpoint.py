"""Checkpoints beside the output (``OUT.ckpt.h5``): enough state to continue bit-for-bit.

Distributed vectors are gathered to the global grid, so a checkpoint is independent of the rank
layout (resuming on the same number of ranks reproduces the uninterrupted run exactly).

The rules shared with ODE fits (:mod:`odecli.app.checkpoint_ode`) live here too: a checkpoint is
hours of work, so a run never starts over on one silently (:func:`check_start`), Ctrl-C says
where the work is (:func:`note_on_interrupt`), and a damaged one is one clear error
(:func:`open_checkpoint`).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Iterator

import h5py
import numpy as np
import torch

from odecli.errors import InputError
from odecli.io.atomic import atomic_h5, check_writable
from odecli.parallel.ops import gather_global, local_block


def checkpoint_path(output: Path) -> Path:
    output = Path(output)
    return output.with_name(output.stem + ".ckpt.h5")


def check_start(output: Path, resume: bool, force: bool) -> tuple[Path, bool]:
    """Before any compute: the checkpoint path, once it is clear that nothing will be lost, and
    whether the output may replace a file (the writer keeps one that appears meanwhile if not).

    An earlier run's checkpoint is continued only with ``--resume`` and discarded only with
    ``--force`` (a new run would overwrite it at its first checkpoint and delete it at the end).
    An existing output is replaced with ``--force``, or by a resumed run, which supersedes it."""
    cpath = checkpoint_path(output)
    if cpath.exists() and not (resume or force):
        raise InputError(f"{cpath}: a checkpoint of an earlier run exists; pass --resume to "
                         "continue it or --force to start over")
    replace = force or (resume and cpath.exists())
    check_writable(output, replace)
    return cpath, replace


def unusable(path: Path, why: str) -> InputError:
    """The one error for a checkpoint that cannot be resumed from (truncated, edited, foreign)."""
    return InputError(f"{path}: not a usable checkpoint ({why}); delete it, or start over with "
                      "--force instead of --resume")


@contextlib.contextmanager
def open_checkpoint(path: Path, kind: str, spec_text: str) -> Iterator[h5py.File]:
    """``path`` open for reading once it is a ``kind`` checkpoint of this spec.

    Whatever else goes wrong while the body reads it (a part missing or of another shape that
    the body's own checks did not name) is reported as :func:`unusable`, not as a traceback."""
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise unusable(path, f"cannot be opened: {_first_line(exc)}") from None
    with f:
        found = f.attrs.get("kind")
        if found != kind:
            raise unusable(path, f"kind {found!r}, expected {kind!r}" if found is not None
                           else "missing 'kind'")
        if "spec" not in f.attrs:
            raise unusable(path, "missing 'spec'")
        if f.attrs["spec"] != spec_text:
            raise InputError(f"{path}: checkpoint was written for a different spec; restore that "
                             "spec, or start over with --force instead of --resume")
        try:
            yield f
        except KeyError as exc:
            raise unusable(path, f"missing {exc.args[0]!r}" if exc.args else "a part is missing"
                           ) from None
        except (OSError, ValueError, TypeError, IndexError, RuntimeError) as exc:
            raise unusable(path, _first_line(exc)) from None


def _first_line(exc: BaseException) -> str:
    return (str(exc) or type(exc).__name__).splitlines()[0]


def read_attr(f: h5py.File, name: str) -> Any:
    """An attribute of the checkpoint; a missing one is :func:`unusable` by name."""
    if name not in f.attrs:
        raise unusable(Path(f.filename), f"missing {name!r}")
    return f.attrs[name]


def read_array(f: h5py.File, name: str, shape: tuple[int, ...] | None = None,
               rows: int | None = None) -> np.ndarray:
    """Dataset ``name`` checked for ``shape`` (``rows``: the first dimension only); a missing or
    misshapen one is :func:`unusable` by name, before it can end up in the optimiser."""
    path = Path(f.filename)
    if name not in f or not isinstance(f[name], h5py.Dataset):
        raise unusable(path, f"missing {name!r}")
    arr = f[name][...]
    if (shape is not None and arr.shape != tuple(shape)) or (rows is not None and
                                                            (arr.ndim == 0 or len(arr) != rows)):
        want = tuple(shape) if shape is not None else f"{rows} entries"
        raise unusable(path, f"{name!r} has shape {arr.shape}, expected {want}")
    return arr


def saved_iteration(path: Path) -> int | None:
    """The iteration a checkpoint holds, or None when there is none (or it cannot be read)."""
    try:
        with h5py.File(path, "r") as f:
            return int(f.attrs["iteration"])
    except (OSError, KeyError, TypeError, ValueError):
        return None


@contextlib.contextmanager
def note_on_interrupt(cpath: Path) -> Iterator[None]:
    """Ctrl-C (or SIGTERM) in the body is re-raised with a ``kept`` note, which the CLI prints:
    the work up to the checkpoint is kept, and how to continue it, when there is one."""
    try:
        yield
    except KeyboardInterrupt as exc:
        it = saved_iteration(cpath)
        if it is not None:
            exc.kept = f"no output was written; {cpath} keeps the run up to iteration {it}: continue it with --resume"
        raise


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


def load(path: Path, *, spec_text: str, params, distributed, opt, decomp, comm,
         history_keys: tuple[str, ...]) -> tuple[int, dict, dict]:
    """Every rank reads the file and takes its own block; returns (iteration, history, timing).

    Every part is checked (present, of the run's shapes) before the optimiser sees it."""
    with open_checkpoint(path, "pde-inverse-checkpoint", spec_text) as f:
        if read_attr(f, "optimizer") != opt.kind:
            raise InputError(f"{path}: checkpoint optimizer {f.attrs['optimizer']} != {opt.kind}")
        iteration = int(read_attr(f, "iteration"))
        ranks = int(read_attr(f, "ranks"))
        try:
            scalars = json.loads(read_attr(f, "optimizer_scalars"))
        except ValueError:
            raise unusable(path, "'optimizer_scalars' is not JSON") from None

        def read_vec(name, like):
            out = []
            for i, (ref, dist) in enumerate(zip(like, distributed)):
                shape = decomp.global_shape if dist else tuple(ref.shape)
                arr = torch.as_tensor(read_array(f, f"{name}/{i}", shape), dtype=ref.dtype,
                                      device=ref.device)
                if dist and comm.size > 1:
                    arr = local_block(arr, decomp).contiguous()
                out.append(arr.clone())
            return out

        values = read_vec("params", params)
        vecs = _Parts(path, "opt/")
        if "opt" in f:
            for name in f["opt"]:
                vecs[name] = read_vec(f"opt/{name}", params)
        history = {k: list(read_array(f, f"history/{k}", rows=iteration)) for k in history_keys}
        timing = {k: np.asarray(read_array(f, f"timing/{k}", rows=ranks))
                  for k in ("total_s", "comm_s")}
        opt.load(vecs, _Parts(path, "optimizer_scalars.", scalars))
        with torch.no_grad():
            for p, v in zip(params, values):
                p.copy_(v)
        timing["ranks"] = ranks
        return iteration, history, timing


class _Parts(dict):
    """The optimiser's saved state by name; one it needs but the file lacks is :func:`unusable`."""

    def __init__(self, path: Path, prefix: str, items: Any = ()) -> None:
        if not isinstance(items, dict) and items != ():
            raise unusable(path, f"{prefix.rstrip('.')} is not a mapping")
        super().__init__(items)
        self.path, self.prefix = path, prefix

    def __missing__(self, key: str) -> Any:
        raise unusable(self.path, f"missing '{self.prefix}{key}'")
