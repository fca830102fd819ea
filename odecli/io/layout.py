"""Reading run files: opening one, checking it is a complete odecli run, and any array layout.

Kept free of torch so readers start fast. Every reader (``stats``, ``plot``, ``export``) opens
run files with :func:`open_run` and states what it cannot do without through :func:`require`, so
a foreign or damaged file is one clean :class:`InputError` naming the file and the missing piece,
in one place, instead of a ``KeyError`` from deep inside a reader.
"""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np

from odecli.errors import InputError

RUN_KINDS = ("ode", "ode-inverse", "pde-inverse")
CHECKPOINT_SUFFIX = ".ckpt.h5"


def open_run(path: Path) -> h5py.File:
    """Open a run file read-only; a folder, a missing, foreign or checkpoint file is an input error."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{path}: is a folder, expected an odecli run file (.h5)")
    if not path.is_file():
        raise InputError(f"{path}: file not found")
    if not os.access(path, os.R_OK):
        raise InputError(f"{path}: cannot read the file (permission denied)")
    try:
        handle = h5py.File(path, "r")
    except OSError:
        raise InputError(f"{path}: not an HDF5 file") from None
    try:
        if "kind" not in handle.attrs:
            raise InputError(f"{path}: not an odecli run file (no 'kind' attribute)")
        kind = run_kind(handle)
        if kind.endswith("-checkpoint"):
            raise _checkpoint_error(path, kind)
        if kind not in RUN_KINDS:
            raise InputError(f"{path}: not an odecli run file: unknown kind {kind!r} "
                             f"(expected one of {', '.join(RUN_KINDS)})")
    except BaseException:
        handle.close()
        raise
    return handle


def _checkpoint_error(path: Path, kind: str) -> InputError:
    """train-inverse's ``OUT.ckpt.h5`` holds optimiser state, not results: say how to use it instead."""
    name = path.name
    output = path.with_name(name[: -len(CHECKPOINT_SUFFIX)] + ".h5") if name.endswith(CHECKPOINT_SUFFIX) else "OUT.h5"
    return InputError(f"{path}: is a checkpoint of an unfinished train-inverse (kind {kind!r}), not a run file; "
                      f"finish the fit with: odecli train-inverse SPEC -o {output} --resume")


def run_kind(h5: h5py.File) -> str:
    """The ``kind`` attribute as text (other programs may store it as fixed-length bytes)."""
    kind = h5.attrs.get("kind", "")
    return kind.decode("utf-8", "replace") if isinstance(kind, bytes) else str(kind)


def require(h5: h5py.File | h5py.Group, *paths: str, attrs: tuple[str, ...] = ()) -> None:
    """Fail with one line naming every missing piece unless ``h5`` holds all of ``paths`` and ``attrs``.

    ``paths`` are datasets, or groups when they end in ``/``; a missing group is named once, not
    once per dataset inside it. Readers call this before reading, so the file's damage is reported
    as such instead of surfacing as a ``KeyError`` from h5py.
    """
    missing: list[str] = []
    wrong: list[str] = []
    for path in paths:
        want_group = path.endswith("/")
        parts = path.strip("/").split("/")
        for depth in range(1, len(parts) + 1):
            prefix = "/".join(parts[:depth])
            node = h5.get(prefix)
            group_wanted = want_group or depth < len(parts)
            if node is None:
                if prefix not in missing:
                    missing.append(prefix)
                break
            if group_wanted != isinstance(node, h5py.Group):
                problem = f"{prefix!r} is not a {'group' if group_wanted else 'dataset'}"
                if problem not in wrong:
                    wrong.append(problem)
                break
    absent = [name for name in attrs if name not in h5.attrs]
    problems = [f"missing {', '.join(map(repr, missing))}"] if missing else []
    if absent:
        problems.append(f"missing attribute{'s' if len(absent) > 1 else ''} {', '.join(map(repr, absent))}")
    problems += wrong
    if problems:
        raise InputError(f"{h5.file.filename}: not a complete odecli run file: {'; '.join(problems)} "
                         f"(written by another program, or damaged)")


def as_batched(t: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """t to (batch, time), y to (batch, time, state), from any layout a run file may hold."""
    if y.ndim == 1:
        y = y[None, :, None]
    elif y.ndim == 2:
        y = y[None]
    if t.ndim == 1:
        t = np.broadcast_to(t, y.shape[:2])
    return t, y
