"""A clean interpreter exit after reading a table with delta-rs: Arrow's threads go idle first.

``DeltaTable(...).to_pyarrow_table()`` (and ``to_pyarrow_dataset().to_table()``) scan through
``pyarrow.fs.PyFileSystem(DeltaStorageHandler)``, so the Parquet bytes Arrow reads are Python
objects (``arrow::py::PyBuffer``). The scan returns its table to Python *before* Arrow's
worker threads have torn the scan down; tearing it down releases those buffers, and releasing
one takes the GIL. On CPython before 3.14, a thread that takes the GIL once the interpreter is
finalizing is ended with ``pthread_exit()``; here that unwinds through Arrow's ``noexcept``
destructors, and C++ answers with ``std::terminate()``: the process prints ``terminate called
without an active exception`` and dies with SIGABRT (exit code 134) after all work is done.
pyarrow checks ``Py_IsInitialized()`` before taking the GIL, which narrows the race but cannot
close it. Neither delta-rs nor Spark is needed to see it: a plain ``pyarrow.dataset`` read
through any Python filesystem handler, as the last thing a script does, aborts now and then.

The remedy is to let that teardown finish while the interpreter is still whole: at exit, wait
for Arrow's CPU and I/O thread pools to go idle, with the GIL released so their tasks can take
it. pyarrow has no Python API for this, so :func:`wait_for_arrow_idle` calls
``arrow::internal::ThreadPool::WaitForIdle()`` through ``ctypes``. Where those C++ symbols
cannot be found (another C++ ABI, a pyarrow built without threads) it does nothing, which is
the behaviour without this module.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import threading
from collections.abc import Callable

__all__ = ["IDLE_WAIT_SECONDS", "register", "wait_for_arrow_idle"]

log = logging.getLogger("committers.delta")

# Teardown takes milliseconds; the bound only keeps a pool task that never ends (say an endless
# stream the program left open) from holding up the exit for good.
IDLE_WAIT_SECONDS = 10.0

# Itanium C++ ABI names (Linux, macOS) of the libarrow functions used below.
_CPU_POOL = "_ZN5arrow8internal16GetCpuThreadPoolEv"  # arrow::internal::GetCpuThreadPool()
_IO_POOL = "_ZN5arrow2io8internal15GetIOThreadPoolEv"  # arrow::io::internal::GetIOThreadPool()
_WAIT_FOR_IDLE = "_ZN5arrow8internal10ThreadPool11WaitForIdleEv"  # ThreadPool::WaitForIdle()

# A task finishing on one pool can schedule a continuation on the other: a few passes over both.
_PASSES = 3


def _drain_function() -> Callable[[], None] | None:
    """A function that blocks until both Arrow pools are idle, or None where none can be made."""
    try:
        import pyarrow.lib

        # dlopen() of the already loaded extension module returns its handle, and dlsym() on
        # that handle also searches the libraries it depends on, libarrow among them.
        lib = ctypes.CDLL(pyarrow.lib.__file__)
        cpu_pool = getattr(lib, _CPU_POOL)
        io_pool = getattr(lib, _IO_POOL)
        wait = getattr(lib, _WAIT_FOR_IDLE)
    except (ImportError, OSError, AttributeError):
        return None
    cpu_pool.restype = io_pool.restype = ctypes.c_void_p
    cpu_pool.argtypes = io_pool.argtypes = []
    wait.restype = None
    wait.argtypes = [ctypes.c_void_p]  # `this`: the pool

    def drain() -> None:
        # A ctypes.CDLL call releases the GIL for its duration: the tasks waited for can take it.
        for _ in range(_PASSES):
            wait(io_pool())
            wait(cpu_pool())

    return drain


def wait_for_arrow_idle(timeout: float = IDLE_WAIT_SECONDS) -> bool:
    """Block until no task runs or waits in Arrow's CPU and I/O thread pools, at most
    ``timeout`` seconds; True when they went idle. False, at once, where the wait is not
    available."""
    drain = _drain_function()
    if drain is None:
        return False
    # In a daemon thread, so that a task that never ends cannot hold up the exit past timeout.
    waiter = threading.Thread(target=drain, name="arrow-idle-wait", daemon=True)
    try:
        waiter.start()
    except RuntimeError:
        # CPython 3.12 refuses new threads in atexit handlers: wait here, without the bound.
        drain()
        return True
    waiter.join(timeout)
    if waiter.is_alive():
        log.warning("Arrow's thread pools still busy after %.0f s at exit", timeout)
        return False
    return True


_registered = False


def register() -> None:
    """Run :func:`wait_for_arrow_idle` at interpreter exit (once however often called).

    atexit handlers run before the interpreter starts finalizing, so every Arrow task that
    still has Python objects to release can still take the GIL."""
    global _registered
    if not _registered:
        atexit.register(wait_for_arrow_idle)
        _registered = True
