"""Log lines that are visible without any logging set-up, and never printed twice.

Python shows a library's WARNING records through ``logging.lastResort`` only while no handler
exists anywhere on the logger's path, and never its INFO records, whatever level the user sets
on the library's logger. The sinks' loggers get one :class:`FallbackHandler` instead: it writes
to stderr only while the application has configured no root handler, at the levels of the
library's loggers (WARNING unless the user lowers it). Once the application configures logging
(``logging.basicConfig``, a framework's set-up, pytest), it stays silent and records reach the
application's handlers as usual.

One line shows one INFO line per batch::

    logging.getLogger("framework.spark").setLevel(logging.INFO)
"""

from __future__ import annotations

import logging
import sys

__all__ = ["LIBRARY_LOGGERS", "FallbackHandler", "install_fallback_handlers"]

#: The top-level loggers of this distribution's packages.
LIBRARY_LOGGERS = ("framework", "committers")


class FallbackHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to the current ``sys.stderr`` while the root logger has no handler."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr  # follows redirections (pytest's capture, redirect_stderr)
        super().emit(record)

    def handle(self, record: logging.LogRecord) -> bool:
        if logging.getLogger().handlers:
            return False  # the application configured logging: its handlers get the record
        return bool(super().handle(record))


def install_fallback_handlers() -> None:
    """Attach one :class:`FallbackHandler` to each library logger (idempotent)."""
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(h, FallbackHandler) for h in logger.handlers):
            logger.addHandler(FallbackHandler())
