"""Run one odecli command in-process and send this process a signal at the K-th call into h5py
(or, with K = -1, during interpreter shutdown, after the command has finished; with K = -2, right
after its output was moved into place, before the command returns; with K = -3 under mpiexec, to
rank 1 while it waits in MPI_Finalize for rank 0, which lingers 3 s in an atexit callback).

    python tests/fault_campaign/signal_at_call.py K SIGNAME odecli-args...

A profile hook counts Python and C-level calls whose code lives in h5py (its Python modules and
its Cython extension functions), and calls os.kill(getpid(), SIG) at call K: the signal's handler
then runs at the next bytecode boundary, inside h5py's own code - the "signal exactly during the
HDF5 write" of issue 42, made deterministic. Not run by pytest; campaign.py drives it, and
tests/test_fault_signals.py uses it for the cases found.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import time

from odecli.cli import run

K = int(sys.argv[1])
SIG = getattr(signal, sys.argv[2])
sys.argv = ["odecli", *sys.argv[3:]]
count = 0


def _in_h5py(frame, event, arg) -> bool:
    if event in ("call", "return", "line"):
        return f"h5py{os.sep}" in frame.f_code.co_filename
    if event in ("c_call", "c_return"):
        return (getattr(arg, "__module__", None) or "").startswith("h5py")
    return False


def hook(frame, event, arg):
    global count
    if _in_h5py(frame, event, arg):
        count += 1
        if count == K:
            sys.setprofile(None)
            sys.settrace(None)
            os.kill(os.getpid(), SIG)


def tracer(frame, event, arg):
    """Line events inside h5py's Python modules (setprofile sees calls and returns only)."""
    if event == "call" and f"h5py{os.sep}" not in frame.f_code.co_filename:
        return None
    if event != "call":  # calls are counted by the profile hook
        hook(frame, event, arg)
    return tracer


def at_shutdown() -> None:
    os.kill(os.getpid(), SIG)
    time.sleep(0.2)  # the handler runs here, inside an atexit callback


if K == -1:
    atexit.register(at_shutdown)
elif K == -3:
    import subprocess

    if os.environ.get("PMI_RANK", "0") == "0":
        atexit.register(time.sleep, 3.0)
    else:  # 1 s after its Python shutdown began: inside MPI_Finalize, after Python's own finalisation
        atexit.register(subprocess.Popen, ["sh", "-c", f"sleep 1; kill -{SIG.name[3:]} {os.getpid()}"])
elif K == -2:
    from odecli import interrupts

    noted = interrupts.note_written

    def note_then_signal(path: str) -> None:
        noted(path)
        os.kill(os.getpid(), SIG)

    interrupts.note_written = note_then_signal
    import odecli.io.atomic

    odecli.io.atomic.note_written = note_then_signal
elif K > 0:
    sys.setprofile(hook)
    sys.settrace(tracer)
try:
    run()
finally:
    sys.setprofile(None)
    sys.settrace(None)
    if K > 0:
        sys.stderr.write(f"[campaign] h5py calls counted: {count}\n")
