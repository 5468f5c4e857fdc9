"""User-facing errors.

Every problem a user can fix (bad input, a broken rule file, a missing tool) is raised as a
``ToastError`` whose ``str()`` is one actionable line; the command line prints that line and
exits non-zero without a traceback.
"""

from __future__ import annotations


class ToastError(Exception):
    """A problem the user can act on; ``str(err)`` is a single line."""


class InputError(ToastError):
    """The program to analyze is malformed or unsupported (``file:line:col: message``)."""


class RuleError(ToastError):
    """A ``.dl`` rule file is malformed (``file:line: message``)."""

    def __init__(self, path: str, line: int | None, message: str) -> None:
        self.path = path
        self.line = line
        self.message = message
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {message}")


class EngineError(ToastError):
    """A Datalog engine is missing, failed or timed out."""


class InvalidRules(ToastError):
    """The rules' invariants fail: their ``invalid`` output has rows (a rule file, often a user's, breaks them).

    ``str(err)`` is one line, ``FILE:LINE: CHECK: DETAIL`` of the first row and a count of the rest; ``rows``
    holds every row (``toast.analysis.Invalid``: check, file, line, detail).
    """

    def __init__(self, message: str, rows: tuple[object, ...]) -> None:
        super().__init__(message)
        self.rows = rows

    def __reduce__(self) -> tuple[type[InvalidRules], tuple[str, tuple[object, ...]]]:
        return type(self), (str(self), self.rows)  # through a worker's pipe: both arguments
