"""Splits of a file-based bounded source: files packed into groups, and the sizing options.

A :class:`FileGroupSplit` is a tuple of whole files (or of byte ranges a listing chose) plus
the reader's progress through them: the index of the file being read and how many elements of
that file were already emitted. Elements are whatever the source's ``read_file`` yields (records
or record batches); their order within a file must be deterministic.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Generic, TypeVar

from framework.errors import ConfigurationError
from framework.source._api import Split, SplitState

__all__ = [
    "DEFAULT_FETCH_SIZE",
    "DEFAULT_MAX_SPLITS",
    "DEFAULT_MAX_SPLIT_BYTES",
    "MIN_MAX_SPLIT_BYTES",
    "FileGroupSplit",
    "FileGroupSplitState",
    "FileRecord",
    "FileSourceConfig",
    "FileSplit",
]

R = TypeVar("R")

MiB = 1024 * 1024
DEFAULT_MAX_SPLIT_BYTES = 128 * MiB
"""Like Spark's ``spark.sql.files.maxPartitionBytes``."""
MIN_MAX_SPLIT_BYTES = 1 * MiB
"""The floor of ``max_split_bytes``: smaller splits only multiply the splits (and tasks)."""
DEFAULT_MAX_SPLITS = 100_000
"""Above this many splits the split size grows with the data instead."""
DEFAULT_FETCH_SIZE = 256
"""Elements one fetch returns at most."""


def _require_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(f"{name} must be an integer >= {minimum}, got {value!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class FileSourceConfig:
    """How a file source cuts its input into splits and reads them.

    The split size is estimated from the file sizes the listing reports, never by reading data.
    Files are packed whole into groups of at most the *target* split size, where

        target = max(max_split_bytes, ceil(2 * total_bytes / max_splits))

    so the number of splits stays at most ``max_splits`` however small ``max_split_bytes`` is
    and however large the input grows: past that many splits, splits grow with the data rather
    than their number (no threshold that starts failing as a table grows). The factor 2 covers
    whole-file packing, whose groups can be up to half empty.

    Attributes:
        max_split_bytes: bytes of file data per split; a single file larger than this is a
            split of its own. At least :data:`MIN_MAX_SPLIT_BYTES`.
        max_splits: most splits one run produces (given a correct size estimate).
        fetch_size: most elements one fetch returns; a reader holds at most this many elements
            fetched and not yet emitted.

    Raises:
        ConfigurationError: a value is out of range; the message names the option and the fix.
    """

    max_split_bytes: int = DEFAULT_MAX_SPLIT_BYTES
    max_splits: int = DEFAULT_MAX_SPLITS
    fetch_size: int = DEFAULT_FETCH_SIZE

    def __post_init__(self) -> None:
        _require_int("max_split_bytes", self.max_split_bytes, 1)
        if self.max_split_bytes < MIN_MAX_SPLIT_BYTES:
            raise ConfigurationError(
                f"max_split_bytes={self.max_split_bytes} is below the floor of 1 MiB "
                f"({MIN_MAX_SPLIT_BYTES} bytes): splits that small multiply the number of splits "
                f"and tasks for no gain; set max_split_bytes to at least {MIN_MAX_SPLIT_BYTES}, "
                f"or leave the default of 128 MiB ({DEFAULT_MAX_SPLIT_BYTES})"
            )
        _require_int("max_splits", self.max_splits, 1)
        _require_int("fetch_size", self.fetch_size, 1)

    def target_split_bytes(self, total_bytes: int) -> int:
        """The split size for an input of ``total_bytes`` (see the class docstring)."""
        return max(self.max_split_bytes, -(-2 * total_bytes // self.max_splits))


@dataclass(frozen=True, kw_only=True)
class FileSplit:
    """One file of the input, or a byte range of it: the unit packed into a group.

    Attributes:
        path: where the file is, as ``read_file`` understands it.
        size_bytes: the size of the whole file.
        start: first byte to read (0 for the whole file).
        length: bytes to read from ``start``; ``None`` reads to the end of the file.
        partition_values: partition column -> value (``None`` for null), as the listing knows it.
        metadata: opaque strings the listing passes to ``read_file`` (statistics, a deletion
            vector descriptor, ...); the framework never interprets them.

    Raises:
        ConfigurationError: the path is empty or the range lies outside the file.
    """

    path: str
    size_bytes: int
    start: int = 0
    length: int | None = None
    partition_values: Mapping[str, str | None] = field(default_factory=dict)
    metadata: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path:
            raise ConfigurationError(f"a file's path must be a non-empty string, got {self.path!r}")
        _require_int(f"size_bytes of {self.path}", self.size_bytes, 0)
        _require_int(f"start of {self.path}", self.start, 0)
        if self.length is not None:
            _require_int(f"length of {self.path}", self.length, 0)
        if self.start + (self.length or 0) > self.size_bytes:
            raise ConfigurationError(
                f"range [{self.start}, {self.start + (self.length or 0)}) of {self.path} lies "
                f"outside the file ({self.size_bytes} bytes)"
            )
        # Own copies: a caller mutating its dict must not change a split already handed out.
        object.__setattr__(self, "partition_values", dict(self.partition_values))
        object.__setattr__(self, "metadata", dict(self.metadata))

    @property
    def read_bytes(self) -> int:
        """Bytes of the file this split covers: its weight when packing."""
        return self.size_bytes - self.start if self.length is None else self.length


@dataclass(frozen=True, kw_only=True)
class FileGroupSplit(Split):
    """Files read one after the other by one reader, with the progress made through them.

    Attributes:
        files: the files, in read order.
        file_index: index in ``files`` of the file to read next (``len(files)`` when done).
        records_emitted: elements of ``files[file_index]`` already emitted; a reader skips them.

    Raises:
        ConfigurationError: no files, or the progress lies outside them.
    """

    files: tuple[FileSplit, ...]
    file_index: int = 0
    records_emitted: int = 0

    def __post_init__(self) -> None:
        Split.__post_init__(self)
        object.__setattr__(self, "files", tuple(self.files))
        if not self.files:
            raise ConfigurationError(f"split {self.split_id!r} has no files")
        if isinstance(self.file_index, bool) or not 0 <= self.file_index <= len(self.files):
            raise ConfigurationError(
                f"file_index of split {self.split_id!r} must be in 0..{len(self.files)}, "
                f"got {self.file_index!r}"
            )
        _require_int(f"records_emitted of split {self.split_id!r}", self.records_emitted, 0)

    @property
    def size_bytes(self) -> int:
        """Bytes of file data in the split (all files, whatever the progress)."""
        return sum(file.read_bytes for file in self.files)


@dataclass(kw_only=True)
class FileGroupSplitState(SplitState[FileGroupSplit]):
    """The mutable progress through a :class:`FileGroupSplit`.

    Attributes:
        split: the split as assigned (or restored).
        file_index: index of the file being read.
        records_emitted: elements of that file already emitted.
    """

    split: FileGroupSplit
    file_index: int
    records_emitted: int

    @classmethod
    def of(cls, split: FileGroupSplit) -> FileGroupSplitState:
        """The state of a newly assigned split, starting at the progress it carries."""
        return cls(split=split, file_index=split.file_index, records_emitted=split.records_emitted)

    @property
    def split_id(self) -> str:
        """The id of the split."""
        return self.split.split_id

    def to_split(self) -> FileGroupSplit:
        """The split with the progress recorded here."""
        return replace(self.split, file_index=self.file_index, records_emitted=self.records_emitted)


@dataclass(frozen=True, slots=True)
class FileRecord(Generic[R]):
    """One element read from a file of a group, with its position.

    Attributes:
        record: what ``read_file`` yielded.
        file_index: index of the file in the group.
        offset: index of the element within that file (0-based).
    """

    record: R
    file_index: int
    offset: int
