"""Lazy bin-packing of a file listing into :class:`FileGroupSplit` s.

The listing is a callable returning an iterable of :class:`FileSplit`; it is pulled only as far
as the next split needs (one file ahead), so the coordinator never holds the whole listing.
Files are packed in listing order, whole, into the current group while it stays within the
target split size (next-fit): small files share a split, a file larger than the target is a
split of its own, and no file is ever cut.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from framework.errors import ConfigurationError, SinkError
from framework.source._files import FileGroupSplit, FileSourceConfig, FileSplit

__all__ = ["BinPackingSplitAssigner", "BinPackingState"]


@dataclass(frozen=True, kw_only=True)
class BinPackingState:
    """Where a :class:`BinPackingSplitAssigner` continues.

    Attributes:
        files_consumed: files of the listing already packed into splits.
        splits_created: splits generated so far (numbers the next split id).
        target_split_bytes: the split size chosen at the first split; ``None`` before it.
        last_path: path of the last file packed, to check that a restored listing is the same.
    """

    files_consumed: int = 0
    splits_created: int = 0
    target_split_bytes: int | None = None
    last_path: str | None = None


class BinPackingSplitAssigner:
    """Generates :class:`FileGroupSplit` s from a listing, one per :meth:`next_split`.

    The target split size comes from :meth:`FileSourceConfig.target_split_bytes` applied to
    ``total_bytes``, or, without an estimate, to the sum of the sizes the listing reports (one
    pass over the listing at the first split; no file is opened).

    Args:
        list_files: returns the input's files; every call must return the same files in the same
            order (e.g. the files of one pinned table version), since a restored assigner skips
            the files it already packed.
        config: split sizing.
        total_bytes: estimated bytes of the whole listing, or ``None`` to sum it.
        split_id_prefix: split ids are ``"{prefix}-{n}"``.
        state: continue from this state (a restored enumerator), else start from the first file.

    Raises:
        ConfigurationError: ``total_bytes`` is negative or the prefix empty.
    """

    def __init__(
        self,
        list_files: Callable[[], Iterable[FileSplit]],
        *,
        config: FileSourceConfig,
        total_bytes: int | None = None,
        split_id_prefix: str = "files",
        state: BinPackingState | None = None,
    ) -> None:
        if total_bytes is not None and (
            isinstance(total_bytes, bool) or not isinstance(total_bytes, int) or total_bytes < 0
        ):
            raise ConfigurationError(f"total_bytes must be an integer >= 0, got {total_bytes!r}")
        if not split_id_prefix:
            raise ConfigurationError("split_id_prefix must not be empty")
        self._list_files = list_files
        self._config = config
        self._total_bytes = total_bytes
        self._prefix = split_id_prefix
        state = state or BinPackingState()
        self._consumed = state.files_consumed
        self._created = state.splits_created
        self._target = state.target_split_bytes
        self._last_path = state.last_path
        self._files: Iterator[FileSplit] | None = None
        self._ahead: FileSplit | None = None

    def next_split(self) -> FileGroupSplit | None:
        """Pack the next group of files, or return ``None`` when the listing is exhausted.

        Raises:
            SinkError: a restored listing is shorter than before or differs where it resumes.
        """
        files = self._open()
        assert self._target is not None
        group: list[FileSplit] = []
        weight = 0
        while weight < self._target:
            file = self._ahead if self._ahead is not None else next(files, None)
            self._ahead = None
            if file is None:
                break
            if group and weight + file.read_bytes > self._target:
                self._ahead = file
                break
            group.append(file)
            weight += file.read_bytes
        if not group:
            return None
        split = FileGroupSplit(split_id=f"{self._prefix}-{self._created}", files=tuple(group))
        self._consumed += len(group)
        self._created += 1
        self._last_path = group[-1].path
        return split

    def snapshot_state(self) -> BinPackingState:
        """Where to continue; a file read ahead but not packed is not counted as consumed."""
        return BinPackingState(
            files_consumed=self._consumed,
            splits_created=self._created,
            target_split_bytes=self._target,
            last_path=self._last_path,
        )

    def _open(self) -> Iterator[FileSplit]:
        if self._files is not None:
            return self._files
        if self._target is None:
            total = self._total_bytes
            if total is None:
                total = sum(file.read_bytes for file in self._list_files())
            self._target = self._config.target_split_bytes(total)
        files = iter(self._list_files())
        last: FileSplit | None = None
        for index in range(self._consumed):
            last = next(files, None)
            if last is None:
                raise SinkError(
                    f"the listing has {index} files, but {self._consumed} were already packed "
                    "into splits: the listing changed since the state was taken"
                )
        if last is not None and last.path != self._last_path:
            raise SinkError(
                f"file {self._consumed} of the listing is {last.path!r}, but the state says "
                f"{self._last_path!r}: the listing changed since the state was taken"
            )
        self._files = files
        return files
