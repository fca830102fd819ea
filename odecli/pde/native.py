"""Load an equation's C kernels: ``<name>.c`` in the equation's package (``odecli/pde/<name>/``),
with the ``.c`` files it ``#include``s beside it, built and cached by source hash by
:mod:`odecli.native`."""

from __future__ import annotations

import ctypes
import functools
import re
from pathlib import Path

from odecli import native

HERE = Path(__file__).resolve().parent


def source_path(name: str) -> Path:
    """Where the C source of equation package ``name`` lies: beside its Python."""
    return HERE / name / f"{name}.c"


@functools.lru_cache(maxsize=None)
def load(name: str) -> tuple[ctypes.CDLL | None, str]:
    """``(library, "")`` for :func:`source_path` of ``name``, or ``(None, why it is unavailable)``.

    Cached per process: the kernels look their library up on every call.
    """
    if not native.enabled():  # checked before reading the file: the switch must always work
        return None, "turned off by ODECLI_NATIVE=0"
    return native.load_source(name, source_text(source_path(name)))


def source_text(path: Path) -> bytes:
    """The C file with each of its ``#include "file.c"`` lines replaced by that file (beside
    it, recursively): one text to build and hash, while a long kernel file can be split."""
    out = []
    for line in path.read_bytes().splitlines(keepends=True):
        local = re.match(rb'#include "([\w.]+\.c)"', line)
        out.append(source_text(path.parent / local.group(1).decode()) if local else line)
    return b"".join(out)


DTYPES = ("float64", "float32")  # the kernels' real types


def available(name: str, like) -> tuple[bool, str]:
    """Whether equation ``name``'s kernels can run on tensors like ``like`` (and if not, why):
    CPU tensors of a dtype the kernels are built for, and the library built."""
    if like.device.type != "cpu":
        return False, f"the fused {name} kernels are CPU-only (tensors on {like.device})"
    if str(like.dtype).removeprefix("torch.") not in DTYPES:
        return False, f"no fused {name} kernel for {like.dtype}"
    lib, why = load(name)
    return lib is not None, why
