"""Atomic file output: write to a temporary file beside the target, rename on success.

A crash, an exception or Ctrl-C mid-write leaves the previous file (or nothing) at the
output path, never a truncated one. Renaming within one folder is atomic on POSIX.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator

import h5py

from odecli.errors import InputError


def check_writable(path: Path, force: bool = True) -> None:
    """Fail early (before any compute) if ``path`` cannot be written."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if path.exists() and not force:
        raise InputError(f"{path}: output file exists; pass --force to overwrite it")
    if path.is_dir():
        raise InputError(f"{path}: output path is a folder, expected a file name")
    if not folder.is_dir():
        raise InputError(f"{path}: output folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise InputError(f"{path}: output folder {folder} is not writable")


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path in the target's folder; move it onto ``path`` only on success."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise InputError(f"{path}: cannot create output file: {exc.strerror}") from exc
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise InputError(f"{path}: cannot write output file: {exc.strerror or exc}") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_h5(path: Path) -> Iterator[h5py.File]:
    """Open an HDF5 file for writing that appears at ``path`` only when the block succeeds."""
    with atomic_path(path) as tmp:
        with h5py.File(tmp, "w") as handle:
            yield handle
