"""Atomic file output: write to a temporary file beside the target, rename on success.

A crash, an exception, Ctrl-C or SIGTERM mid-write leaves the previous file (or nothing) at
the output path, never a truncated one. Renaming within one folder is atomic on POSIX.
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
import tempfile
from pathlib import Path
from typing import Iterator

import h5py

from odecli.errors import InputError
from odecli.interrupts import note_written, raise_if_interrupted


# The file format's 1.8 features (HDF5 1.8, 2008; every h5py, h5netcdf and netCDF-4 reads them):
# attributes larger than an object header's 64 KiB go to dense storage instead of failing, so a
# spec of thousands of states (its text, its 'states') cannot lose a finished solve at the write
# (issue 42); and object headers carry checksums, so more damage is detected as such.
LIBVER = ("v108", "latest")

NAME_ROOM = 24  # bytes of a file name kept for what is written beside it: ".NAME.ckpt.h5.XXXXXXXX.tmp"


def check_name(path: Path) -> None:
    """Refuse an output name too long for its folder's file system, once the temporary and
    checkpoint files written beside it (longer by up to :data:`NAME_ROOM` bytes) are counted."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    try:
        most = os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        most = 255
    size = len(os.fsencode(path.name))
    if size > most - NAME_ROOM:
        raise InputError(f"{path.name[:40]}...: output file name is {size} bytes long; at most {most - NAME_ROOM} "
                         f"here (the file system allows {most}, less room for the temporary and checkpoint "
                         f"files beside it)")


def check_writable(path: Path, force: bool = True) -> None:
    """Fail early (before any compute) if ``path`` cannot be written."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    check_name(path)
    if path.is_symlink() and not path.exists():
        raise InputError(f"{path}: output path is a symbolic link to {os.readlink(path)}, which does not exist; "
                         "remove the link or choose another name")
    if path.is_dir():
        raise InputError(f"{path}: output path is a folder, expected a file name")
    if path.exists() and not force:
        raise InputError(f"{path}: output file exists; pass --force to overwrite it")
    if path.exists() and not path.is_file():
        raise InputError(f"{path}: output path exists and is not a regular file; choose another name")
    if not folder.is_dir():
        raise InputError(f"{path}: output folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise InputError(f"{path}: output folder {folder} is not writable")


def check_space(path: Path, size: float) -> None:
    """Refuse, before any compute, an output of about ``size`` bytes that the free space of its
    folder cannot hold (an HDF5 write that meets a full disk fails messily: see :func:`atomic_h5`)."""
    folder = Path(path).parent if str(Path(path).parent) else Path(".")
    try:
        st = os.statvfs(folder)
    except OSError:  # not known: the write itself will tell
        return
    free = st.f_bavail * st.f_frsize
    if size > free:
        raise InputError(f"{path}: the output needs about {size / 2**20:.3g} MiB, but only {free / 2**20:.3g} MiB "
                         f"are free in {folder}: No space left on device")


def _new_file_mode(path: Path) -> int:
    """The permissions ``path`` gets: those of the file it replaces, else what ``open`` would
    give (0666 less the umask). ``mkstemp`` makes 0600 files, which the rest of a group on a
    shared cluster could not read."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _move_into_place(tmp: Path, path: Path, replace: bool) -> None:
    """Rename ``tmp`` to ``path``; without ``replace``, never over a file that appeared there
    since the run checked (a hard link fails where the name exists). The result is then kept
    under a free name beside it, and the error says where."""
    if replace:
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path)
    except FileExistsError:
        _keep_beside(tmp, path)
    except OSError:  # a file system without hard links: check, then rename
        if path.exists():
            _keep_beside(tmp, path)
        os.replace(tmp, path)
    else:
        tmp.unlink()


def _keep_beside(tmp: Path, path: Path) -> None:
    kept = _free_name(path)
    os.replace(tmp, kept)
    raise InputError(f"{path}: a file of that name appeared while this run was writing; "
                     f"the result was written to {kept} instead")


def _free_name(path: Path) -> Path:
    """``name-1.ext``, ``name-2.ext``, ... : the first that does not exist."""
    k = 1
    while (candidate := path.with_name(f"{path.stem}-{k}{path.suffix}")).exists():
        k += 1
    return candidate


@contextlib.contextmanager
def atomic_path(path: Path, replace: bool = True, final: bool = True) -> Iterator[Path]:
    """Yield a temporary path in the target's folder; move it onto ``path`` only on success.

    ``replace=False`` (an output the user did not allow to be overwritten) keeps a file that
    another process created at ``path`` during the run. A symbolic link is written through,
    so the link stays. ``final``: the command's result (not a checkpoint), recorded once in
    place, so that a signal arriving afterwards says that it was written."""
    path = Path(os.path.realpath(path)) if Path(path).is_symlink() else Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    mode = _new_file_mode(path)
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise InputError(f"{path}: cannot create output file: {exc.strerror}") from exc
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.chmod(tmp, mode)
        raise_if_interrupted()
        _move_into_place(tmp, path, replace)
        if final:
            note_written(str(path))
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise InputError(f"{path}: cannot write output file: {exc.strerror or exc}") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_h5(path: Path, replace: bool = True, in_memory: bool = True, final: bool = True) -> Iterator[h5py.File]:
    """Open an HDF5 file for writing that appears at ``path`` only when the block succeeds.

    ``in_memory`` (for files that fit in memory: fit results, checkpoints) builds the file in a
    memory buffer and writes its bytes with one plain ``write``. Why: when the disk fills while
    HDF5 itself writes, the library reports the failure from object destructors ("Exception
    ignored" by the dozen) and the process then crashed in HDF5 (SIGSEGV, issue 42); a plain
    write raises one ``OSError`` (ENOSPC, EFBIG), which :func:`atomic_path` turns into one line
    and a removed temporary. Streamed outputs (an ODE batch written chunk by chunk) pass False."""
    with atomic_path(path, replace, final) as tmp:
        if not in_memory:
            with h5py.File(tmp, "w", libver=LIBVER) as handle:
                yield handle
            return
        buffer = io.BytesIO()
        with h5py.File(buffer, "w", libver=LIBVER) as handle:
            yield handle
        with open(tmp, "wb") as out:
            out.write(buffer.getbuffer())
            out.flush()
            os.fsync(out.fileno())
