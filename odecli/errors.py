"""Exceptions that reach the user as one clean line and a documented exit code.

Every layer raises these instead of printing; only the CLI turns them into text and exit codes,
so a library user gets ordinary exceptions and a CLI user never sees a traceback.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_INVALID_INPUT = 2
EXIT_FAILED_SAMPLES = 3


class OdecliError(Exception):
    """Base class; ``exit_code`` is what the CLI returns for it."""

    exit_code = EXIT_INTERNAL


class InputError(OdecliError):
    """Bad input that the user can fix: a missing file, an unknown option, a bad value."""

    exit_code = EXIT_INVALID_INPUT


class SpecError(InputError):
    """A problem in a spec file, located by file name and dotted field path."""

    def __init__(self, file: str, field: str, message: str) -> None:
        self.file = file
        self.field = field
        self.message = message
        where = f"{file}: {field}: " if field else f"{file}: "
        super().__init__(where + message)
