"""``python -m odecli`` and the ``odecli`` script: the command line, its termination signals turned
into a clean stop before anything else is imported.

Why first: typer and rich take about 0.3 s to import (seconds on a loaded machine), and a SIGTERM
in that time killed the process by the signal's default action; under mpirun the launcher then
reported the job as killed (code 15) instead of odecli's line and 143 (issue 42's campaign).
Under mpirun such a rank must not simply exit, though: the others wait in MPI_Init for it, and
the launcher waits for them, for ever (a rank exiting before MPI_Init is not a failure to
MPICH's launcher). So it initialises MPI and aborts the job with 143, as every later failure
of one rank does (:func:`odecli.parallel.comm.abort_now`).
"""

import signal
import sys

from odecli.interrupts import install


def main() -> None:
    install()
    try:
        from odecli.cli import run
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM/SIGHUP via odecli.interrupts, while importing
        signum = getattr(exc, "signum", signal.SIGINT)
        what = "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
        line = f"{what}; no output was written"
        from odecli.parallel.launcher import launched_ranks

        if launched_ranks() > 1:
            from odecli.parallel.comm import abort_now

            abort_now(line, 128 + signum)  # does not return
        sys.stderr.write(line + "\n")
        sys.exit(128 + signum)
    run()


if __name__ == "__main__":
    main()
