"""Checkpoints of every fit (``OUT.ckpt.h5`` beside the output): enough state to continue bit for bit.

One layout for ODE and PDE fits (``kind`` tells them apart): the parameters (``params/<i>``), the
gradient at them (``g/<i>``) and the loss (attr ``f``), the optimiser's vectors
(``opt/<name>/<i>``) and scalars (attr ``optimizer_scalars``, JSON), the history of the points
recorded so far (one row per point, ``iteration + 1`` rows), and what the kind adds (its own attrs
and datasets). The optimisers are deterministic given that state, so a killed fit resumed from it
ends exactly as an uninterrupted one. Distributed vectors are gathered to the global grid, so a
checkpoint does not depend on the rank layout; rank 0 writes it and every rank reads it back.

A checkpoint is hours of work, so a run never starts over on one silently (:func:`check_start`),
Ctrl-C says where the work is (:func:`note_on_interrupt`), and a damaged one is one clear error
(:func:`open_checkpoint`). Damage that leaves every part present, of its shape and finite (a
flipped bit in a number) is caught by the ``checksum`` attribute, a SHA-256 of everything else in
the file (:func:`content_digest`), verified after the parts are read and checked, before the
fit continues; damage that would loop the HDF5 library is refused before reading
(:func:`odecli.io.bounded.check_readable`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch

from odecli import __version__
from odecli.errors import InputError
from odecli.io.atomic import atomic_h5, check_name, check_writable
from odecli.io.bounded import check_readable
from odecli.optim import Optimizer, Vector
from odecli.parallel.comm import Comm
from odecli.parallel.decomposition import Decomposition
from odecli.parallel.ops import gather_global, local_block


def checkpoint_path(output: Path) -> Path:
    """Where the checkpoints of a fit that writes ``output`` go."""
    output = Path(output)
    return output.with_name(output.stem + ".ckpt.h5")


def check_start(output: Path, resume: bool, force: bool) -> tuple[Path, bool]:
    """Before any compute: the checkpoint path, once it is clear that nothing will be lost, and
    whether the output may replace a file (the writer keeps one that appears meanwhile if not).

    An earlier run's checkpoint is continued only with ``--resume`` and discarded only with
    ``--force`` (a new run would overwrite it at its first checkpoint and delete it at the end).
    An existing output is replaced with ``--force``, or by a resumed run, which supersedes it."""
    check_name(output)  # before cpath.exists(), which raises on a name too long (issue 42)
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
    check_readable(path, f"{path}: not a usable checkpoint: ")
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


CHECKSUM = "checksum"


def content_digest(h5: h5py.File) -> str:
    """SHA-256 (hex) of every attribute and dataset of ``h5`` but the root's ``checksum``: names,
    types, shapes and values, in sorted order, so the same contents give the same digest."""
    sha = hashlib.sha256()

    def add(label: str, value: Any) -> None:
        array = np.asarray(value)
        sha.update(f"{label}\0{array.dtype.str}\0{array.shape}\0".encode())
        if array.dtype.kind == "O":  # variable-length strings
            sha.update("\0".join(v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
                                  for v in array.ravel()).encode())
        else:
            sha.update(np.ascontiguousarray(array).tobytes())

    names: list[str] = []
    h5.visit(names.append)
    for name in ["", *sorted(names)]:
        node = h5[name] if name else h5
        for key in sorted(node.attrs):
            if name or key != CHECKSUM:
                add(f"{name}@{key}", node.attrs[key])
        if isinstance(node, h5py.Dataset):
            add(name, node[...])
    return sha.hexdigest()


def _verify_checksum(f: h5py.File, path: Path) -> None:
    """Refuse a checkpoint whose contents are not those it was written with."""
    if CHECKSUM not in f.attrs:
        raise unusable(path, f"missing {CHECKSUM!r}: written by an odecli without checkpoint checksums, or damaged")
    if str(f.attrs[CHECKSUM]) != content_digest(f):
        raise unusable(path, "its contents do not match its checksum: the file changed after it was written")


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


@dataclass
class Layout:
    """How one fit's vectors lie over the ranks: which parts are distributed, and over what grid."""

    comm: Comm
    distributed: list[bool]
    decomp: Decomposition | None = None  # None: every part is replicated

    def gather(self, vec: Vector) -> list[np.ndarray | None]:
        """Collective: the global arrays on rank 0 (None elsewhere for the distributed parts)."""
        out = []
        for v, dist in zip(vec, self.distributed):
            if dist and self.comm.size > 1:
                g = gather_global(v.detach(), self.decomp, self.comm, root=0)
                out.append(None if g is None else g.cpu().numpy())
            else:
                out.append(v.detach().cpu().numpy())
        return out


@dataclass
class Saved:
    """A checkpoint read back: the point, the history, and what the kind saved beside them."""

    iteration: int
    f: float
    g: Vector
    history: dict[str, list]
    extra: dict[str, Any]


def _column(values: list) -> np.ndarray:
    integer = bool(values) and all(isinstance(v, (int, np.integer)) for v in values)
    return np.asarray(values, dtype=np.int64 if integer else np.float64)


def save(path: Path, layout: Layout, *, kind: str, spec_text: str, iteration: int, f: float, g: Vector,
         opt: Optimizer, history: dict[str, list], attrs: dict[str, Any] | None = None,
         arrays: dict[str, np.ndarray] | None = None) -> None:
    """Collective: gather on rank 0, which writes ``path`` atomically; its failure is raised on
    every rank, so that none waits for a rank that has stopped."""
    comm = layout.comm
    vecs = {"params": layout.gather(opt.params), "g": layout.gather(g)}
    for name, vec in opt.state_vectors().items():
        vecs[f"opt/{name}"] = layout.gather(vec)
    error = None
    if comm.rank == 0:
        try:
            with atomic_h5(path, final=False) as h5:
                a = h5.attrs
                a["kind"] = kind
                a["spec"] = spec_text
                a["iteration"] = iteration
                a["f"] = f
                a["optimizer"] = opt.kind
                a["optimizer_scalars"] = json.dumps(opt.state_scalars())
                a["ranks"] = comm.size
                a["odecli_version"] = __version__
                for name, value in (attrs or {}).items():
                    a[name] = value
                for name, vec in vecs.items():
                    grp = h5.create_group(name)
                    for i, arr in enumerate(vec):
                        grp.create_dataset(str(i), data=arr)
                hist = h5.create_group("history")
                for name, values in history.items():
                    hist.create_dataset(name, data=_column(values))
                for name, arr in (arrays or {}).items():
                    h5.create_dataset(name, data=arr)
                a[CHECKSUM] = content_digest(h5)  # last: of everything written above
        except InputError as exc:
            error = str(exc)
    if comm.size > 1:
        error = comm.bcast_object(error, root=0)
    if error is not None:
        raise InputError(error)


def load(path: Path, layout: Layout, *, kind: str, spec_text: str, opt: Optimizer,
         history_keys: tuple[str, ...],
         read_extra: Callable[[h5py.File], dict[str, Any]] = lambda f: {}) -> Saved:
    """Every rank reads ``path`` and takes its own block; the parameters are set in ``opt.params``
    and the optimiser's state is loaded. ``read_extra`` reads what the kind saved beside them.

    Every part is checked (present, of the run's shapes) before the optimiser sees it; a
    checkpoint of another spec or a damaged one is one clear error."""
    params = opt.params
    with open_checkpoint(path, kind, spec_text) as f:
        if read_attr(f, "optimizer") != opt.kind:
            raise InputError(f"{path}: checkpoint optimizer {f.attrs['optimizer']} != {opt.kind}")
        iteration = int(read_attr(f, "iteration"))
        loss = float(read_attr(f, "f"))
        try:
            scalars = json.loads(read_attr(f, "optimizer_scalars"))
        except ValueError:
            raise unusable(path, "'optimizer_scalars' is not JSON") from None

        def read_vec(name: str) -> Vector:
            out = []
            for i, (ref, dist) in enumerate(zip(params, layout.distributed)):
                shape = layout.decomp.global_shape if dist else tuple(ref.shape)
                arr = torch.as_tensor(read_array(f, f"{name}/{i}", shape), dtype=ref.dtype,
                                      device=ref.device)
                if not bool(torch.isfinite(arr).all()):  # a damaged file, not a state a fit can have
                    raise unusable(path, f"'{name}/{i}' holds non-finite values")
                if dist and layout.comm.size > 1:
                    arr = local_block(arr, layout.decomp).contiguous()
                out.append(arr.clone())
            return out

        values = read_vec("params")
        g = read_vec("g")
        vecs = _Parts(path, "opt/")
        if "opt" in f:
            for name in f["opt"]:
                vecs[name] = read_vec(f"opt/{name}")
        history = {k: read_array(f, f"history/{k}", rows=iteration + 1).tolist() for k in history_keys}
        extra = read_extra(f)
        opt.load(vecs, _Parts(path, "optimizer_scalars.", scalars))  # names what it misses
        _verify_checksum(f, path)  # after the named checks (they say more); a failure ends the run
        with torch.no_grad():
            for p, v in zip(params, values):
                p.copy_(v)
        return Saved(iteration, loss, g, history, extra)


class _Parts(dict):
    """The optimiser's saved state by name; one it needs but the file lacks is :func:`unusable`."""

    def __init__(self, path: Path, prefix: str, items: Any = ()) -> None:
        if not isinstance(items, dict) and items != ():
            raise unusable(path, f"{prefix.rstrip('.')} is not a mapping")
        super().__init__(items)
        self.path, self.prefix = path, prefix

    def __missing__(self, key: str) -> Any:
        raise unusable(self.path, f"missing '{self.prefix}{key}'")
