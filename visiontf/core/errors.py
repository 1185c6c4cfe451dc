"""The one base class for mistakes a user can fix: bad input files, configs, checkpoints, arguments.

Every such error names what is wrong (the file, the field, the entry) and how to fix it. The
command-line tools print an :class:`UserError` as one line on stderr and exit with code 2; any
other exception is a bug and keeps its traceback. Library code raises the specific subclasses
(``AnnotationError``, ``WeightsError``, ...), which stay ``ValueError``/``RuntimeError`` as well so
existing ``except`` clauses keep working.
"""
from __future__ import annotations


class UserError(Exception):
    """A mistake in the user's input, with a message that says how to fix it."""


class UsageError(UserError, ValueError):
    """A command-line option is wrong, unknown or missing; the message names it and the fix."""


__all__ = ["UsageError", "UserError"]
