"""Termination signals as exceptions, so that an output being written is cleaned up.

By default SIGTERM (``timeout``, batch schedulers, ``kill``) and SIGHUP end Python without
unwinding the stack, and a temporary output file of hundreds of MB stays behind. With
:func:`install` they raise :class:`Interrupted`, a ``KeyboardInterrupt``, and unwind like Ctrl-C.

A signal that arrives while Python runs a finaliser (h5py closing its objects, say) has its
exception swallowed there ("Exception ignored in ..."), and the run would go on to write its
output after the user asked it to stop. So every signal is also recorded, and
:func:`raise_if_interrupted` raises it again before an output file is moved into place.
Library users who do not call :func:`install` keep Python's own handling.

Once the command has finished (:func:`finish`), termination signals are ignored: one that
arrived while the interpreter shut down raised inside an atexit callback, printed "Exception
ignored ... Traceback" and changed nothing, or, inside MPI_Finalize, killed the rank (issue 42).
And an output moved into place is recorded (:func:`note_written`), so that a signal arriving
after that, while the command prints its summary, says the output was written instead of "no
output was written".

Python runs a signal's handler in the main thread between bytecodes, so not while that thread
waits inside a C call that does not return (a blocking MPI collective whose peer has failed).
:func:`watch_stuck` starts a watchdog thread that the C-level handler wakes (through
``signal.set_wakeup_fd``); if Python's handler has not run :data:`STUCK_S` seconds later, the
watchdog calls its action (under mpirun: abort every rank with ``128 + signum``).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
_received: int | None = None
_installed = False
_watching = False
_written: list[str] = []  # outputs moved into place by this process (atomic_path)
STUCK_S = 3.0  # how long a signal may wait for Python's handler before the watchdog acts


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


def finish() -> None:
    """The command has finished (its output, if any, is in place): from now on a termination
    signal is ignored and the process exits as it was going to, without a traceback from
    whichever shutdown callback the handler would have interrupted.

    Ignored, not recorded by a Python handler: Python's finalisation puts back the default action
    of every signal that has a Python handler, and mpi4py's MPI_Finalize runs after that (a
    ``Py_AtExit`` callback), waiting for the slower ranks; a signal there killed the rank, and the
    launcher reported the job as killed by it (code 15 or -2, once each in 160 signals). An
    ignored signal stays ignored through both. The watchdog of :func:`watch_stuck` does not
    run there either way (its thread ends with the interpreter). A no-op unless :func:`install` ran."""
    global _installed
    if _installed and threading.current_thread() is threading.main_thread():
        for sig in _SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        _installed = False  # reinstall() must not turn the signals back into exceptions


def note_written(path: str) -> None:
    """Record that an output is complete at ``path`` (for the line a later signal prints)."""
    _written.append(path)


def forget_written() -> None:
    """A new command starts: outputs earlier commands of this process wrote are not its own."""
    _written.clear()


def written() -> list[str]:
    """The outputs :func:`note_written` recorded, oldest first."""
    return list(_written)


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


def watch_stuck(action: Callable[[int], None], after_s: float = STUCK_S) -> None:
    """Call ``action(signum)`` from a watchdog thread when a termination signal arrived and its
    Python handler has not run within ``after_s`` seconds. Once per process; main thread only."""
    global _watching
    if _watching or threading.current_thread() is not threading.main_thread():
        return
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    _watching = True

    def watch() -> None:
        while True:
            signum = os.read(read_end, 1)[0]
            if signum not in _SIGNALS:
                continue
            time.sleep(after_s)
            if _received is None:  # the main thread never got to the handler
                action(signum)

    threading.Thread(target=watch, name="odecli-signal-watchdog", daemon=True).start()
