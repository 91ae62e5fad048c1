"""Bring our own exceptions back from Spark tasks.

An exception raised in a Python worker reaches the driver as a Py4J/PySpark exception whose text
holds the worker's traceback. The first line naming one of our exception classes (the
innermost raise in the worker) is turned back
into that class, so ``except NullConstraintError`` works on the driver too.
"""

from __future__ import annotations

import re

from framework import errors

__all__ = ["translate_task_error"]

_OUR_ERROR = re.compile(r"(?:^|\s)(?:[\w.]+\.)?(?P<name>[A-Z]\w*Error): (?P<message>.*)$", re.M)
# raise_error() in a task (a row check of an InputPlan) ends its message with Spark's SQLSTATE.
_SQLSTATE_TAIL = re.compile(r"\s*SQLSTATE: \w+\s*$")


def translate_task_error(err: BaseException) -> BaseException:
    """Return a ``SinkError`` subclass instance if ``err`` carries one, else ``err`` itself."""
    if isinstance(err, errors.SinkError):
        return err
    found: BaseException | None = None
    for match in _OUR_ERROR.finditer(str(err)):
        cls = getattr(errors, match.group("name"), None)
        if isinstance(cls, type) and issubclass(cls, errors.SinkError):
            message = _SQLSTATE_TAIL.sub("", match.group("message")).strip()
            found = cls(f"{message} (raised in a Spark task)")
            break  # the first one is the innermost raise in the worker traceback
    if found is not None:
        found.__cause__ = err
        return found
    return err
