"""A generic bounded source over files: lazy bin-packed file groups, resumable reading.

It knows nothing of file formats or tables: the caller supplies how to list the files (sizes
and partition values, from a table log or a directory listing) and how to read one file. A
Parquet data-file source, e.g. the files of one Delta table version, is this source with a
listing from the table's snapshot and a ``read_file`` that yields Arrow record batches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from framework.errors import ConfigurationError
from framework.sink import VersionedSerializer
from framework.source._api import (
    Boundedness,
    Source,
    SourceReader,
    SourceReaderContext,
    SplitEnumeratorContext,
)
from framework.source._assigner import BinPackingSplitAssigner, BinPackingState
from framework.source._enumerator import LazyEnumeratorState, LazySplitEnumerator
from framework.source._file_reader import FileGroupSplitReader, FileRecordEmitter
from framework.source._files import FileGroupSplit, FileGroupSplitState, FileSourceConfig, FileSplit
from framework.source._reader import MultiplexSourceReader
from framework.source._serializers import (
    BinPackingStateSerializer,
    FileGroupSplitSerializer,
    LazyEnumeratorStateSerializer,
)

__all__ = ["FileEnumeratorState", "FileGroupSource"]

R = TypeVar("R")
T = TypeVar("T")

FileEnumeratorState = LazyEnumeratorState[FileGroupSplit, BinPackingState]
"""The checkpointed state of a :class:`FileGroupSource`'s enumerator."""


class FileGroupSource(Source[T, FileGroupSplit, FileEnumeratorState], Generic[R, T]):
    """A bounded source reading the files of a listing, packed into groups of whole files.

    The enumerator packs the listing lazily (see :class:`BinPackingSplitAssigner`); each reader
    reads its groups file after file through ``read_file`` and records, per group, the file it is
    in and the elements of that file it emitted, so a reader restored from its snapshot, or
    given the splits of a failed reader, emits each element exactly once.

    Must pickle (it is shipped to every task): ``list_files``, ``read_file`` and ``convert``
    should be module-level functions or picklable callables.

    Args:
        list_files: returns the files; the same files in the same order on every call.
        read_file: yields the elements of one file, the same ones in the same order every call.
        convert: turns an element into an output record; ``None`` emits elements as they are.
        config: split sizing and fetch size.
        total_bytes: estimated bytes of all files (e.g. from table metadata); ``None`` sums the
            sizes the listing reports, in one pass at the first split request.
        split_id_prefix: split ids are ``"{prefix}-{n}"``.

    Raises:
        ConfigurationError: a callable is missing or an option is out of range.
    """

    def __init__(
        self,
        list_files: Callable[[], Iterable[FileSplit]],
        read_file: Callable[[FileSplit], Iterable[R]],
        *,
        convert: Callable[[R], T] | None = None,
        config: FileSourceConfig | None = None,
        total_bytes: int | None = None,
        split_id_prefix: str = "files",
    ) -> None:
        for name, value in (("list_files", list_files), ("read_file", read_file)):
            if not callable(value):
                raise ConfigurationError(f"{name} must be callable, got {value!r}")
        if convert is not None and not callable(convert):
            raise ConfigurationError(f"convert must be callable or None, got {convert!r}")
        self._list_files = list_files
        self._read_file = read_file
        self._convert = convert
        self._config = config if config is not None else FileSourceConfig()
        self._total_bytes = total_bytes
        self._prefix = split_id_prefix
        self._assigner(None)  # validates total_bytes and the prefix now, not at the first split

    @property
    def boundedness(self) -> Boundedness:
        """Always :attr:`Boundedness.BOUNDED`."""
        return Boundedness.BOUNDED

    @property
    def config(self) -> FileSourceConfig:
        """The sizing and fetch options."""
        return self._config

    def create_enumerator(
        self, context: SplitEnumeratorContext[FileGroupSplit]
    ) -> LazySplitEnumerator[FileGroupSplit, BinPackingState]:
        """An enumerator starting at the first file; nothing is listed before the first request."""
        return LazySplitEnumerator(context, self._assigner(None))

    def restore_enumerator(
        self, context: SplitEnumeratorContext[FileGroupSplit], state: FileEnumeratorState
    ) -> LazySplitEnumerator[FileGroupSplit, BinPackingState]:
        """An enumerator handing out ``state``'s pending splits, then the files not yet packed."""
        return LazySplitEnumerator(context, self._assigner(state.assigner), pending=state.pending)

    def create_reader(self, context: SourceReaderContext) -> SourceReader[T, FileGroupSplit]:
        """A reader of file groups for one task."""
        return MultiplexSourceReader(
            FileGroupSplitReader(self._read_file, fetch_size=self._config.fetch_size),
            FileRecordEmitter(self._convert),
            context,
            initial_state=FileGroupSplitState.of,
        )

    def split_serializer(self) -> VersionedSerializer[FileGroupSplit]:
        """JSON, version 1."""
        return FileGroupSplitSerializer()

    def enumerator_state_serializer(self) -> VersionedSerializer[FileEnumeratorState]:
        """Pending splits and the packing position, version 1."""
        return LazyEnumeratorStateSerializer(
            FileGroupSplitSerializer(), BinPackingStateSerializer()
        )

    def _assigner(self, state: BinPackingState | None) -> BinPackingSplitAssigner:
        return BinPackingSplitAssigner(
            self._list_files,
            config=self._config,
            total_bytes=self._total_bytes,
            split_id_prefix=self._prefix,
            state=state,
        )
