"""The PDE's C kernels (``*.c`` beside this file), built and cached by :mod:`odecli.native`."""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

from odecli import native

HERE = Path(__file__).resolve().parent


@functools.lru_cache(maxsize=None)
def load(name: str) -> tuple[ctypes.CDLL | None, str]:
    """``(library, "")`` for ``name.c`` beside this file, or ``(None, why it is unavailable)``.

    Cached per process: the kernels look their library up on every call.
    """
    if not native.enabled():  # checked before reading the file: the switch must always work
        return None, "turned off by ODECLI_NATIVE=0"
    return native.load_source(name, (HERE / f"{name}.c").read_bytes())
