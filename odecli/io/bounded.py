"""A damaged HDF5 file must not hang a reader: its structure is walked first in a child process, with a deadline.

Why a child process: some byte flips make the HDF5 library itself loop forever. One found by
flipping bytes of run files (issue 42): a flipped size field of an object in a global heap
collection (where variable-length strings live: ``kind``, ``spec``, ``states``) makes reading
the attribute spin without end (seen with h5py 3.16's bundled HDF5 2.0.0; the loop is inside
the library, with the GIL held, so no Python timer, signal handler or thread can interrupt it).
The file format has no checksum over global heaps (only over some metadata, and only in the
newer format versions), so nothing can check the bytes before HDF5 reads them, short of
re-implementing the format. So :func:`check_readable`
forks a child that opens the file and walks every object: each attribute, the values of those
in a global heap, each dataset's type and shape, and each chunked dataset's chunk index (a
damaged B-tree would loop there too). The parent waits at most :data:`DEADLINE_S` and refuses
the file with one line when the child has not finished, or died of a signal; a walk that merely raises is left to the
caller's own reading, which words that error as before. Measured on the 2-core VM while five
other sessions ran (load 5 to 12, so upper bounds): a fork 6 ms (11 ms with torch imported), the
walk 6 ms for an ode-inverse run and 17-21 ms for a run with event groups (most of it opening
the dimension scales' attributes), so ``open_run`` 3 ms unguarded and 30-45 ms guarded; against
a hang without it.

Where ``os.fork`` does not exist the walk is skipped (the reader reads unguarded, as before).
"""

from __future__ import annotations

import os
import select
import signal
import time
from pathlib import Path

import h5py
import numpy as np

from odecli.errors import InputError

DEADLINE_S = 20.0
"""How long the walk may take; a sane file's takes milliseconds (its data are not read)."""


def check_readable(path: Path, what: str = "") -> None:
    """Refuse ``path`` when walking its structure does not finish within :data:`DEADLINE_S`.

    ``what`` prefixes the message (say ``spec.yaml: inverse.data.file: ``); the default names
    only the file. Errors the walk raises are not reported here: the caller's reading meets them.
    """
    if not hasattr(os, "fork"):
        return
    pid = os.fork()
    if pid == 0:  # the child: walk, and leave without running any of the parent's cleanup
        code = 1
        try:
            _walk(path)
            code = 0
        finally:
            os._exit(code)
    status = _wait(pid, DEADLINE_S)
    if status is None:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise InputError(f"{what or f'{path}: '}damaged HDF5 file: reading its structure did not finish in "
                         f"{DEADLINE_S:g} s (the HDF5 library loops on some damaged bytes)")
    if os.WIFSIGNALED(status):
        name = signal.Signals(os.WTERMSIG(status)).name
        raise InputError(f"{what or f'{path}: '}damaged HDF5 file: reading its structure crashes the HDF5 "
                         f"library ({name})")


def _wait(pid: int, seconds: float) -> int | None:
    """The child's wait status, or None when it is still running after ``seconds``.

    Linux: a pidfd, readable when the child ends (no polling delay); elsewhere polling, the
    interval doubling from 0.1 ms to 10 ms."""
    if hasattr(os, "pidfd_open"):
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            fd = None
        if fd is not None:
            try:
                ready, _, _ = select.select([fd], [], [], seconds)
            finally:
                os.close(fd)
            return os.waitpid(pid, 0)[1] if ready else None
    deadline, interval = time.monotonic() + seconds, 1e-4
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            return None
        time.sleep(interval)
        interval = min(2 * interval, 0.01)


def _walk(path: Path) -> None:
    """Read every attribute and every dataset's type, shape and chunk index of ``path`` (no data),
    through h5py's low-level API: the high-level objects cost ten times as much here."""
    fid = h5py.h5f.open(os.fsencode(path), h5py.h5f.ACC_RDONLY)
    try:
        _object(h5py.h5o.open(fid, b"/"))
        names: list[bytes] = []
        h5py.h5o.visit(fid, names.append)
        for name in names:
            _object(h5py.h5o.open(fid, name))
    finally:
        fid.close()


def _object(oid) -> None:
    for index in range(h5py.h5a.get_num_attrs(oid)):
        attr = h5py.h5a.open(oid, index=index)
        if _in_global_heap(attr.get_type()):  # the others are read from the object header itself
            value = np.empty(attr.shape, dtype=attr.dtype)
            attr.read(value)
    if isinstance(oid, h5py.h5d.DatasetID):
        oid.get_type(), oid.get_space().get_simple_extent_dims()
        if oid.get_create_plist().get_layout() == h5py.h5d.CHUNKED and hasattr(oid, "chunk_iter"):
            # one pass over the chunk index (0.4 s for 100,000 chunks); get_chunk_info(i) would
            # search it from the start for every i (30 ms a call at 100,000 chunks)
            oid.chunk_iter(lambda info: None)


def _in_global_heap(tid) -> bool:
    """Whether values of this type live in a global heap: variable-length strings and sequences."""
    kind = tid.get_class()
    return kind == h5py.h5t.VLEN or (kind == h5py.h5t.STRING and tid.is_variable_str())
