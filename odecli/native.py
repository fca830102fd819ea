"""Small C libraries compiled on first use with the system C compiler and loaded with ctypes.

Why not a build step: odecli installs as pure Python (``pip install -e .`` needs no toolchain),
and a library built on the machine that runs it can use that machine's vector instructions
(``-march=native``), as Devito does. Sources are either files shipped with odecli (the PDE
stencils) or generated for one problem (an ODE spec's right-hand side fused into its solver).
Each shared library is cached under ``$ODECLI_CACHE_DIR`` (default ``~/.cache/odecli``; a
folder in the temporary directory when that is not writable), keyed by the source, the flags,
the compiler and the CPU, and is written atomically so that MPI ranks compiling at once do not
collide. Where no compiler works, :func:`load_source` returns ``None`` with the reason and
callers use their PyTorch reference code. ``ODECLI_NATIVE=0`` turns every library off.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

# -ffp-contract=off: no fused multiply-adds, so every operation rounds as written (and as in
# the torch reference, which the PDE kernels reproduce bit for bit).
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-fPIC", "-shared")


def enabled() -> bool:
    return os.environ.get("ODECLI_NATIVE", "1").strip().lower() not in ("0", "false", "no", "off")


def cache_dir() -> Path:
    root = os.environ.get("ODECLI_CACHE_DIR")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "odecli"


@functools.lru_cache(maxsize=None)
def _cpu_signature() -> str:
    """The CPU's feature flags, so a cache shared between machines never serves foreign code."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _compiler() -> str | None:
    cc = os.environ.get("CC") or "cc"
    return shutil.which(cc) or shutil.which("gcc")


@functools.lru_cache(maxsize=None)
def _compiler_version(cc: str) -> tuple[str, str]:
    """``(version text, "")`` or ``("", why it failed)``; asked once per process."""
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout, ""
    except (OSError, subprocess.SubprocessError) as exc:
        return "", f"{cc} --version failed: {exc}"


@functools.lru_cache(maxsize=64)
def load_source(name: str, source: bytes, extra_flags: Sequence[str] = ()) -> tuple[ctypes.CDLL | None, str]:
    """``(library, "")`` built from C ``source``, or ``(None, why it is unavailable)``.

    ``name`` only labels the cached file (``name-<hash>.so``); the hash decides identity.
    ``extra_flags`` follow :data:`FLAGS` for sources that need more (and are part of the hash).
    """
    flags = (*FLAGS, *extra_flags)
    if not enabled():
        return None, "turned off by ODECLI_NATIVE=0"
    cc = _compiler()
    if cc is None:
        return None, "no C compiler found (set CC)"
    version, why = _compiler_version(cc)
    if why:
        return None, why
    key = hashlib.sha256(b"\0".join([source, " ".join(flags).encode(), version.encode(),
                                     _cpu_signature().encode()])).hexdigest()[:20]
    for folder in (cache_dir(), Path(tempfile.gettempdir()) / f"odecli-{os.getuid()}"):
        target = folder / f"{name}-{key}.so"
        why = "" if target.exists() else _build(cc, flags, name, source, target)
        if not why:
            try:
                return ctypes.CDLL(str(target)), ""
            except OSError as exc:
                why = f"cannot load {target}: {exc}"
        if "not writable" not in why:
            break  # a compiler or loader failure: another folder would not help
    return None, why


def _build(cc: str, flags: Sequence[str], name: str, source: bytes, target: Path) -> str:
    """Compile into a private temporary file, then rename: readers never see a partial library."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=target.stem, suffix=".tmp.so", dir=target.parent)
        os.close(fd)
    except OSError as exc:
        return f"cache directory {target.parent} is not writable: {exc}"
    c_file = tmp[: -len(".so")] + ".c"
    try:
        Path(c_file).write_bytes(source)
        proc = subprocess.run([cc, *flags, "-o", tmp, c_file, "-lm"], capture_output=True,
                              text=True, timeout=120)
        if proc.returncode != 0:
            return f"{cc} failed on {name}.c: {proc.stderr.strip()[:300]}"
        os.replace(tmp, target)
        return ""
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{cc} failed on {name}.c: {exc}"
    finally:
        for leftover in (tmp, c_file):
            if os.path.exists(leftover):
                os.unlink(leftover)
