"""Load an equation's C kernels: ``<name>.c`` in the equation's package (``odecli/pde/<name>/``),
built and cached by source hash by :mod:`odecli.native`."""

from __future__ import annotations

import ctypes
import functools
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
    return native.load_source(name, source_path(name).read_bytes())
