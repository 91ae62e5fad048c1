"""An asyncio event loop on a virtual clock, for tests whose assertions are about time.

The loop's clock (``loop.time()``: what asyncio's timers and :class:`AsyncSinkWriter` use) only
moves when no callback is ready to run and no I/O is pending; it then jumps straight to the
next timer instead of sleeping. Timers fire in the same order as on a real loop, never early
and never late, so a test can assert exact delays, and no amount of load on the machine can
make a 20 ms window pass while the test is still setting up. Tests run as fast as their CPU
work allows, whatever delays they simulate.

Only for code that waits on timers and on tasks of the same loop: a loop waiting for a thread
or a socket would see its timers fire at once.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["VirtualClockLoop", "run_on_virtual_clock"]

T = TypeVar("T")

# Any non-zero start, like a real monotonic clock: code must not mistake time 0 for "never".
_START = 1_000.0


class _JumpingSelector(selectors.DefaultSelector):
    """Polls for I/O without blocking; when there is none, advances the clock by the timeout
    the loop asked for (the delay until its next timer) instead of waiting."""

    def __init__(self) -> None:
        super().__init__()
        self.now = _START

    def select(self, timeout: float | None = None) -> list[Any]:
        events: list[Any] = super().select(0)
        if events or timeout == 0:
            return events
        if timeout is None:  # no timer at all: only I/O (e.g. another thread) can wake us
            blocking: list[Any] = super().select(None)
            return blocking
        self.now += timeout
        return []


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose ``time()`` is virtual; see the module docstring."""

    def __init__(self) -> None:
        self._clock = _JumpingSelector()
        super().__init__(self._clock)

    def time(self) -> float:
        return self._clock.now


def run_on_virtual_clock(coroutine: Coroutine[Any, Any, T], *, timeout: float = 20.0) -> T:
    """Like ``asyncio.run(asyncio.wait_for(coroutine, timeout))``, on a :class:`VirtualClockLoop`.

    ``timeout`` is virtual too: a test that waits for something that never happens fails at
    once with ``TimeoutError`` instead of hanging.
    """
    loop = VirtualClockLoop()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(asyncio.wait_for(coroutine, timeout))
    finally:
        try:
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            asyncio.set_event_loop(None)
            loop.close()
