"""Reading :class:`FileGroupSplit` s: the split reader and the record emitter.

Progress through a group is (index of the file, elements of that file already emitted). A
reader resuming a split opens that file again and skips the elements emitted, so the elements
``read_file`` yields for a file must come in the same order every time.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from framework.errors import ConfigurationError, SinkError
from framework.source._api import RecordEmitter, RecordsBySplits, SourceOutput, SplitReader
from framework.source._files import (
    DEFAULT_FETCH_SIZE,
    FileGroupSplit,
    FileGroupSplitState,
    FileRecord,
    FileSplit,
)

__all__ = ["FileGroupSplitReader", "FileRecordEmitter"]

R = TypeVar("R")
T = TypeVar("T")


@dataclass
class _Cursor(Generic[R]):
    """How far fetches got through one split (ahead of what was emitted)."""

    split: FileGroupSplit
    file_index: int
    offset: int
    elements: Iterator[R] | None = None

    def close(self) -> None:
        close = getattr(self.elements, "close", None)
        self.elements = None
        if callable(close):
            close()


class FileGroupSplitReader(SplitReader[FileRecord[R], FileGroupSplit]):
    """Reads the files of each split in order through ``read_file``, one split at a time.

    Each :meth:`fetch` returns at most ``fetch_size`` elements, tagged with their position.
    :meth:`wake_up` makes a fetch return after the element being read (an element ``read_file``
    is blocked on cannot be interrupted; the fetch returns as soon as it arrives).

    When ``read_file`` raises, the fetch raises and forgets what it read: the next fetch reads
    those elements again, from the position the previous successful fetch reached.

    Args:
        read_file: yields the elements of one file (records or record batches), the same ones in
            the same order on every call.
        fetch_size: most elements one fetch returns.

    Raises:
        ConfigurationError: ``fetch_size`` is not a positive integer.
    """

    def __init__(
        self,
        read_file: Callable[[FileSplit], Iterable[R]],
        *,
        fetch_size: int = DEFAULT_FETCH_SIZE,
    ) -> None:
        if isinstance(fetch_size, bool) or not isinstance(fetch_size, int) or fetch_size < 1:
            raise ConfigurationError(f"fetch_size must be a positive integer, got {fetch_size!r}")
        self._read_file = read_file
        self._fetch_size = fetch_size
        self._cursors: deque[_Cursor[R]] = deque()
        self._wake = threading.Event()

    def handle_splits_changes(self, splits: Sequence[FileGroupSplit]) -> None:
        """Queue ``splits``; each is read from the progress it carries."""
        for split in splits:
            self._cursors.append(_Cursor(split, split.file_index, split.records_emitted))

    def fetch(self) -> RecordsBySplits[FileRecord[R]]:
        """Read up to ``fetch_size`` elements, finishing splits along the way.

        Raises:
            SinkError: a file yields fewer elements than the split's progress says were emitted
                (it changed since).
            Exception: whatever ``read_file`` raised; nothing of this fetch counts as read.
        """
        saved = [(cursor, cursor.file_index, cursor.offset) for cursor in self._cursors]
        records: dict[str, list[FileRecord[R]]] = {}
        finished: set[str] = set()
        budget = self._fetch_size
        try:
            while self._cursors and budget > 0 and not self._woken():
                cursor = self._cursors[0]
                if cursor.file_index >= len(cursor.split.files):
                    finished.add(cursor.split.split_id)
                    self._cursors.popleft()
                    continue
                elements = cursor.elements if cursor.elements is not None else self._open(cursor)
                try:
                    element = next(elements)
                except StopIteration:
                    cursor.close()
                    cursor.file_index, cursor.offset = cursor.file_index + 1, 0
                    continue
                records.setdefault(cursor.split.split_id, []).append(
                    FileRecord(element, cursor.file_index, cursor.offset)
                )
                cursor.offset += 1
                budget -= 1
        except BaseException:
            for cursor, file_index, offset in saved:
                cursor.close()
                cursor.file_index, cursor.offset = file_index, offset
            self._cursors = deque(cursor for cursor, _, _ in saved)
            raise
        return RecordsBySplits(records, frozenset(finished))

    def wake_up(self) -> None:
        """Make the running fetch return after its current element, or the next one at once."""
        self._wake.set()

    def close(self) -> None:
        """Close the files being read."""
        for cursor in self._cursors:
            cursor.close()
        self._cursors.clear()

    def _woken(self) -> bool:
        if self._wake.is_set():
            self._wake.clear()
            return True
        return False

    def _open(self, cursor: _Cursor[R]) -> Iterator[R]:
        file = cursor.split.files[cursor.file_index]
        elements = iter(self._read_file(file))
        cursor.elements = elements
        for skipped in range(cursor.offset):
            if next(elements, _MISSING) is _MISSING:
                raise SinkError(
                    f"{file.path} yields {skipped} elements, but {cursor.offset} were already "
                    f"read from it (split {cursor.split.split_id!r}): the file changed"
                )
        return elements


_MISSING: Any = object()


class FileRecordEmitter(RecordEmitter[FileRecord[R], T, FileGroupSplitState]):
    """Emits ``convert(element)`` and moves the split's progress past the element.

    Idempotent: an element at or before the recorded progress was emitted already and is
    dropped, so elements fetched again after an interruption do not repeat.

    Args:
        convert: turns an element into the output record; ``None`` emits elements as they are.
    """

    def __init__(self, convert: Callable[[R], T] | None = None) -> None:
        self._convert = convert if convert is not None else cast(Callable[[R], T], _identity)

    def emit_record(
        self,
        element: FileRecord[R],
        output: SourceOutput[T],
        split_state: FileGroupSplitState,
    ) -> None:
        """Emit ``element`` unless already emitted.

        Raises:
            SinkError: the element lies beyond the next one expected (an element was skipped).
        """
        position = (element.file_index, element.offset)
        expected = (split_state.file_index, split_state.records_emitted)
        if position < expected:
            return
        if element.offset != (expected[1] if element.file_index == expected[0] else 0):
            raise SinkError(
                f"element {element.offset} of file {element.file_index} of split "
                f"{split_state.split_id!r} arrived while the next expected is element "
                f"{expected[1]} of file {expected[0]}: elements were skipped"
            )
        output.collect(self._convert(element.record))
        split_state.file_index = element.file_index
        split_state.records_emitted = element.offset + 1


def _identity(value: Any) -> Any:
    return value
