"""Issue 42: a byte-flipped run file must not hang ``stats``, ``plot`` or ``export``.

The damage is the one byte-flipping run files found: a size field of an object in the file's
global heap (where variable-length strings such as ``kind`` live) grown by one bit, after which
the HDF5 library loops forever reading the attribute. Each command runs in a subprocess with a
hard timeout, so a hang fails the test instead of hanging the suite; the reader's deadline is
cut to 3 s for it (:data:`odecli.io.bounded.DEADLINE_S`).
"""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_damaged_runs import runs  # noqa: F401 - the fixture: one real run file of each kind

RUN = """
import sys
import odecli.io.bounded
odecli.io.bounded.DEADLINE_S = 3.0
from odecli.cli import run
sys.argv = ["odecli", *sys.argv[1:]]
run()
"""


def grow_global_heap_object(src: Path, dst: Path, which: int = 0) -> None:
    """Copy ``src`` with bit 11 set in the size of the ``which``-th object of its first global heap collection."""
    data = bytearray(src.read_bytes())
    start = data.find(b"GCOL")
    assert start >= 0, "the run file has no global heap"
    end = start + struct.unpack("<Q", data[start + 8:start + 16])[0]
    at, index = start + 16, 0
    while at < end:
        size = struct.unpack("<Q", data[at + 8:at + 16])[0]
        if index == which:
            data[at + 8:at + 16] = struct.pack("<Q", size | 0x800)
            break
        at += 16 + (size + 7) // 8 * 8
        index += 1
    dst.write_bytes(bytes(data))


def _odecli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", RUN, *args], capture_output=True, text=True, timeout=60, cwd=cwd)


@pytest.mark.parametrize("command", [["stats"], ["plot", "-o", "p.png"], ["export", "--csv", "csv"]])
def test_a_byte_flip_that_loops_hdf5_is_one_line_not_a_hang(runs, tmp_path, command):  # noqa: F811
    damaged = tmp_path / "damaged.h5"
    grow_global_heap_object(runs["ode-inverse"], damaged)
    result = _odecli(command[0], str(damaged), *command[1:], cwd=tmp_path)
    assert result.returncode == 2, result.stderr + result.stdout
    lines = (result.stderr + result.stdout).strip().splitlines()
    assert lines == [f"error: {damaged}: damaged HDF5 file: reading its structure did not finish in 3 s "
                     "(the HDF5 library loops on some damaged bytes)"]
    assert not (tmp_path / "p.png").exists() and not (tmp_path / "csv").exists()


def test_an_intact_file_reads_as_before(runs, tmp_path):  # noqa: F811
    result = _odecli("stats", str(runs["ode-inverse"]), cwd=tmp_path)
    assert result.returncode == 0, result.stderr


def test_resume_from_a_checkpoint_that_loops_hdf5_is_one_line_not_a_hang(tmp_path):
    from tests.test_ode_inverse import _checkpoint_4

    spec, out, cpath = _checkpoint_4(tmp_path)
    intact = cpath.read_bytes()
    grow_global_heap_object(cpath, cpath)
    assert cpath.read_bytes() != intact
    result = _odecli("train-inverse", str(spec), "-o", str(out), "--resume", cwd=tmp_path)
    assert result.returncode == 2, result.stderr + result.stdout
    assert (result.stderr + result.stdout).strip().splitlines() == [
        f"error: {cpath}: not a usable checkpoint: damaged HDF5 file: reading its structure did not finish in 3 s "
        "(the HDF5 library loops on some damaged bytes)"]
    assert cpath.exists() and not out.exists()
