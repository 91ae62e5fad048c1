"""Engine-agnostic sources (after Flink's FLIP-27): enumerators, readers, splits, serializers.

A :class:`Source` creates a :class:`SplitEnumerator` (on the coordinator: generates splits
lazily, takes back the splits of failed readers, checkpoints what it has not handed out) and a
:class:`SourceReader` per task (reads its splits through a :class:`SplitReader`, emits records
through a :class:`RecordEmitter` that advances each split's :class:`SplitState`, checkpoints
its splits with their progress). :class:`FileGroupSource` is the generic bounded source over
files: a lazily listed set of files bin-packed into :class:`FileGroupSplit` s.

This package imports neither pyspark nor deltalake.
"""

from framework.source._api import (
    Boundedness,
    InputStatus,
    RecordEmitter,
    RecordsBySplits,
    Source,
    SourceOutput,
    SourceReader,
    SourceReaderContext,
    Split,
    SplitEnumerator,
    SplitEnumeratorContext,
    SplitReader,
    SplitState,
)
from framework.source._assigner import BinPackingSplitAssigner, BinPackingState
from framework.source._enumerator import (
    LazyEnumeratorState,
    LazySplitEnumerator,
    LocalEnumeratorContext,
    SplitAssigner,
)
from framework.source._file_reader import FileGroupSplitReader, FileRecordEmitter
from framework.source._file_source import FileEnumeratorState, FileGroupSource
from framework.source._files import (
    DEFAULT_FETCH_SIZE,
    DEFAULT_MAX_SPLIT_BYTES,
    DEFAULT_MAX_SPLITS,
    MIN_MAX_SPLIT_BYTES,
    FileGroupSplit,
    FileGroupSplitState,
    FileRecord,
    FileSourceConfig,
    FileSplit,
)
from framework.source._reader import MultiplexSourceReader
from framework.source._serializers import (
    BinPackingStateSerializer,
    FileGroupSplitSerializer,
    LazyEnumeratorStateSerializer,
)

__all__ = [
    "DEFAULT_FETCH_SIZE",
    "DEFAULT_MAX_SPLITS",
    "DEFAULT_MAX_SPLIT_BYTES",
    "MIN_MAX_SPLIT_BYTES",
    "BinPackingSplitAssigner",
    "BinPackingState",
    "BinPackingStateSerializer",
    "Boundedness",
    "FileEnumeratorState",
    "FileGroupSource",
    "FileGroupSplit",
    "FileGroupSplitReader",
    "FileGroupSplitSerializer",
    "FileGroupSplitState",
    "FileRecord",
    "FileRecordEmitter",
    "FileSourceConfig",
    "FileSplit",
    "InputStatus",
    "LazyEnumeratorState",
    "LazyEnumeratorStateSerializer",
    "LazySplitEnumerator",
    "LocalEnumeratorContext",
    "MultiplexSourceReader",
    "RecordEmitter",
    "RecordsBySplits",
    "Source",
    "SourceOutput",
    "SourceReader",
    "SourceReaderContext",
    "Split",
    "SplitAssigner",
    "SplitEnumerator",
    "SplitEnumeratorContext",
    "SplitReader",
    "SplitState",
]
