"""Termination signals as exceptions, so that an output being written is cleaned up.

By default SIGTERM (``timeout``, batch schedulers, ``kill``) and SIGHUP end Python without
unwinding the stack, and a temporary output file of hundreds of MB stays behind. With
:func:`install` they raise :class:`Interrupted`, a ``KeyboardInterrupt``, and unwind like Ctrl-C.

A signal that arrives while Python runs a finaliser (h5py closing its objects, say) has its
exception swallowed there ("Exception ignored in ..."), and the run would go on to write its
output after the user asked it to stop. So every signal is also recorded, and
:func:`raise_if_interrupted` raises it again before an output file is moved into place.
Library users who do not call :func:`install` keep Python's own handling.
"""

from __future__ import annotations

import signal
import threading

_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
_received: int | None = None
_installed = False


class Interrupted(KeyboardInterrupt):
    """A termination signal; the CLI exits with ``128 + signum``, the shell's convention."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(signal.Signals(signum).name)


def _raise(signum: int, _frame) -> None:
    global _received
    _received = signum
    raise Interrupted(signum)


def install() -> None:
    """Turn SIGINT, SIGTERM and SIGHUP into :class:`Interrupted` (from the main thread only)."""
    global _installed
    if threading.current_thread() is threading.main_thread():
        for sig in _SIGNALS:
            signal.signal(sig, _raise)
        _installed = True


def reinstall() -> None:
    """Take the signals back after a library replaced their handlers at the C level, where Python
    does not see it: initialising MPI over UCX makes SIGHUP UCX's debug signal (it then only raises
    UCX's log level, and the run goes on). A no-op unless :func:`install` ran."""
    if _installed:
        install()


def raise_if_interrupted() -> None:
    """Raise the signal received earlier, in case its exception was swallowed on the way."""
    if _received is not None:
        raise Interrupted(_received)
