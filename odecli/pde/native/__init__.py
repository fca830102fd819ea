"""Small C kernels compiled on first use with the system C compiler and loaded with ctypes.

Why not a build step: odecli installs as pure Python (``pip install -e .`` needs no toolchain),
and a kernel built on the machine that runs it can use that machine's vector instructions
(``-march=native``), as Devito does.  The shared library is cached under
``$ODECLI_CACHE_DIR`` (default ``~/.cache/odecli``; a folder in the temporary directory when
that is not writable), keyed by the source, the flags, the compiler and the CPU, and is written
atomically so that MPI ranks compiling at once do not collide.
Where no compiler works, :func:`load` returns ``None`` with the reason and callers use their
PyTorch reference code.  ``ODECLI_NATIVE=0`` turns the kernels off.
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

HERE = Path(__file__).resolve().parent
# -ffp-contract=off: no fused multiply-adds, so every operation rounds as in the torch reference.
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-fPIC", "-shared")


def enabled() -> bool:
    return os.environ.get("ODECLI_NATIVE", "1").strip().lower() not in ("0", "false", "no", "off")


def cache_dir() -> Path:
    root = os.environ.get("ODECLI_CACHE_DIR")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "odecli"


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
def load(name: str) -> tuple[ctypes.CDLL | None, str]:
    """``(library, "")`` for ``name.c`` beside this file, or ``(None, why it is unavailable)``."""
    if not enabled():
        return None, "turned off by ODECLI_NATIVE=0"
    cc = _compiler()
    if cc is None:
        return None, "no C compiler found (set CC)"
    source = (HERE / f"{name}.c").read_bytes()
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"{cc} --version failed: {exc}"
    key = hashlib.sha256(b"\0".join([source, " ".join(FLAGS).encode(), version.encode(),
                                     _cpu_signature().encode()])).hexdigest()[:20]
    why = ""
    for folder in (cache_dir(), Path(tempfile.gettempdir()) / f"odecli-{os.getuid()}"):
        target = folder / f"{name}-{key}.so"
        why = "" if target.exists() else _build(cc, HERE / f"{name}.c", target)
        if not why:
            try:
                return ctypes.CDLL(str(target)), ""
            except OSError as exc:
                why = f"cannot load {target}: {exc}"
        if "not writable" not in why:
            break  # a compiler or loader failure: another folder would not help
    return None, why


def _build(cc: str, source: Path, target: Path) -> str:
    """Compile into a private temporary file, then rename: readers never see a partial library."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=target.stem, suffix=".tmp.so", dir=target.parent)
        os.close(fd)
    except OSError as exc:
        return f"cache directory {target.parent} is not writable: {exc}"
    try:
        proc = subprocess.run([cc, *FLAGS, "-o", tmp, str(source)], capture_output=True,
                              text=True, timeout=120)
        if proc.returncode != 0:
            return f"{cc} failed on {source.name}: {proc.stderr.strip()[:300]}"
        os.replace(tmp, target)
        return ""
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{cc} failed on {source.name}: {exc}"
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
