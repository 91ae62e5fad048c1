"""Bring our own exceptions back from Spark tasks and from failed streaming queries.

An exception raised in a Python worker reaches the driver as a Py4J/PySpark exception whose text
holds the worker's traceback. The first line naming one of our exception classes (the
innermost raise in the worker) is turned back
into that class, so ``except NullConstraintError`` works on the driver too. Our classes are
those of ``framework.errors`` and every ``SinkError`` subclass a traceback names by its module
(``committers.delta.read._stream.SourceTableChangedError: ...``), when that module is already
imported in this process (nothing is imported because of a text).

A streaming query that failed in its foreachBatch function carries the same kind of text in
``query.exception()`` (classic: ``An exception was raised by the Python Proxy ... Traceback``;
Spark Connect: ``Found error inside foreachBatch Python process: Traceback``), read the same way;
so does one whose Python data source failed (a source's ``latestOffset`` or ``partitions``
raised in Spark's Python streaming-source worker).

The text is only ever matched line by line (``re.M``, never ``re.S``): a traceback is one
exception per line, and an unanchored match across lines could pick a class name out of data.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys

from framework import errors

__all__ = [
    "OwnSinkErrorLogFilter",
    "install_py4j_log_filter",
    "mark_reported",
    "sink_error_in_text",
    "translate_task_error",
]

_OUR_ERROR = re.compile(
    r"(?:^|\s)(?:(?P<module>[\w.]+)\.)?(?P<name>[A-Z]\w*Error): (?P<message>.*)$", re.M
)
# raise_error() in a task (a row check of an InputPlan) ends its message with Spark's SQLSTATE.
_SQLSTATE_TAIL = re.compile(r"\s*SQLSTATE: \w+\s*$")
# An error translated once already (task -> driver) and found again in a query's text.
_ORIGIN_TAIL = re.compile(r"\s*\(raised in [^()]*\)\s*$")

# Set on the exceptions a TwoPhaseSink foreachBatch function raised; see OwnSinkErrorLogFilter.
_REPORTED = "_two_phase_sink_reported"


def sink_error_in_text(text: str, *, origin: str) -> errors.SinkError | None:
    """The first ``SinkError`` subclass a traceback text names, rebuilt with its message (plus
    ``(raised in <origin>)``), or ``None``. The first one is the innermost raise."""
    for match in _OUR_ERROR.finditer(text):
        cls = _error_class(match.group("module"), match.group("name"))
        if cls is not None:
            message = _SQLSTATE_TAIL.sub("", match.group("message"))
            message = _ORIGIN_TAIL.sub("", message).strip()
            return cls(f"{message} (raised in {origin})")
    return None


def _error_class(module: str | None, name: str) -> type[errors.SinkError] | None:
    """The ``SinkError`` subclass a traceback line names: by its module when that module is
    imported here, else by its name in ``framework.errors``."""
    for owner in (sys.modules.get(module) if module else None, errors):
        cls = getattr(owner, name, None) if owner is not None else None
        if isinstance(cls, type) and issubclass(cls, errors.SinkError):
            return cls
    return None


def translate_task_error(err: BaseException, *, origin: str = "a Spark task") -> BaseException:
    """Return a ``SinkError`` subclass instance if ``err`` carries one, else ``err`` itself.

    The returned error has ``err`` as its ``__cause__``, so the worker's traceback stays
    attached.
    """
    if isinstance(err, errors.SinkError):
        return err
    found = sink_error_in_text(str(err), origin=origin)
    if found is None:
        return err
    found.__cause__ = err
    return found


def mark_reported(err: BaseException) -> None:
    """Mark ``err`` as raised by a TwoPhaseSink foreachBatch function (Spark reports it)."""
    # An exception type with __slots__ cannot be marked: its record simply stays.
    with contextlib.suppress(Exception):
        setattr(err, _REPORTED, True)


class OwnSinkErrorLogFilter(logging.Filter):
    """Drops the ``py4j.clientserver`` ERROR record about an exception our foreachBatch function
    raised (classic Spark only).

    Py4J logs every exception a Python callback raises, with its traceback, before handing it
    to the JVM, which logs it again (``MicroBatchExecution ... terminated with error``) and
    fails the query with it. For our own ``SinkError``s that first copy adds nothing: the other
    two carry the same traceback. Records about any other exception, or about a ``SinkError``
    that did not come out of our function, are kept.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (isinstance(exc, errors.SinkError) and getattr(exc, _REPORTED, False))


def install_py4j_log_filter() -> None:
    """Add :class:`OwnSinkErrorLogFilter` to the ``py4j.clientserver`` logger (once)."""
    logger = logging.getLogger("py4j.clientserver")
    if not any(isinstance(f, OwnSinkErrorLogFilter) for f in logger.filters):
        logger.addFilter(OwnSinkErrorLogFilter())
