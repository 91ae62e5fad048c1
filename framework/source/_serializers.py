"""Versioned serializers of file-group splits and of lazy enumerator state.

Each is a :class:`~framework.sink.VersionedSerializer`: write with
:func:`~framework.sink.serialize_versioned`, which puts the format version in front of the
bytes, and read with :func:`~framework.sink.deserialize_versioned`. A serializer keeps reading
every version it ever wrote; an unknown version is refused with an error naming the versions
this release reads.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from framework.errors import SinkError
from framework.sink import (
    VersionedSerializer,
    deserialize_versioned,
    serialize_versioned,
)
from framework.source._api import Split
from framework.source._assigner import BinPackingState
from framework.source._enumerator import LazyEnumeratorState
from framework.source._files import FileGroupSplit, FileSplit

__all__ = [
    "BinPackingStateSerializer",
    "FileGroupSplitSerializer",
    "LazyEnumeratorStateSerializer",
]

SplitT = TypeVar("SplitT", bound=Split)
AssignerStateT = TypeVar("AssignerStateT")
V = TypeVar("V")

_LENGTH = struct.Struct(">I")


def _check_version(kind: str, version: int, supported: tuple[int, ...]) -> None:
    if version not in supported:
        raise SinkError(
            f"unknown {kind} format version {version}; this release reads version(s) "
            f"{', '.join(map(str, supported))}"
        )


def _decode(kind: str, data: bytes, build: Callable[[Any], V]) -> V:
    try:
        return build(json.loads(data))
    except (ValueError, KeyError, TypeError) as err:
        raise SinkError(f"corrupt {kind} data: {err}") from err


def _dumps(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


class FileGroupSplitSerializer:
    """JSON serializer of :class:`FileGroupSplit`, progress included.

    Version 1 is the only version so far; a future version must keep reading version 1.
    """

    SUPPORTED_VERSIONS = (1,)

    @property
    def version(self) -> int:
        """The format version :meth:`serialize` writes."""
        return 1

    def serialize(self, obj: FileGroupSplit) -> bytes:
        """Serialize ``obj`` in format version 1."""
        return _dumps(
            {
                "splitId": obj.split_id,
                "files": [
                    {
                        "path": file.path,
                        "sizeBytes": file.size_bytes,
                        "start": file.start,
                        "length": file.length,
                        "partitionValues": dict(file.partition_values),
                        "metadata": dict(file.metadata),
                    }
                    for file in obj.files
                ],
                "fileIndex": obj.file_index,
                "recordsEmitted": obj.records_emitted,
            }
        )

    def deserialize(self, version: int, data: bytes) -> FileGroupSplit:
        """Read a split written by format ``version``.

        Raises:
            SinkError: unknown version, or the data is not a valid split.
        """
        _check_version("FileGroupSplit", version, self.SUPPORTED_VERSIONS)
        return _decode("FileGroupSplit", data, _split_from_json)


def _split_from_json(raw: Any) -> FileGroupSplit:
    return FileGroupSplit(
        split_id=raw["splitId"],
        files=tuple(
            FileSplit(
                path=file["path"],
                size_bytes=file["sizeBytes"],
                start=file["start"],
                length=file["length"],
                partition_values=file["partitionValues"],
                metadata=file["metadata"],
            )
            for file in raw["files"]
        ),
        file_index=raw["fileIndex"],
        records_emitted=raw["recordsEmitted"],
    )


class BinPackingStateSerializer:
    """JSON serializer of :class:`BinPackingState`. Version 1 is the only version so far."""

    SUPPORTED_VERSIONS = (1,)

    @property
    def version(self) -> int:
        """The format version :meth:`serialize` writes."""
        return 1

    def serialize(self, obj: BinPackingState) -> bytes:
        """Serialize ``obj`` in format version 1."""
        return _dumps(
            {
                "filesConsumed": obj.files_consumed,
                "splitsCreated": obj.splits_created,
                "targetSplitBytes": obj.target_split_bytes,
                "lastPath": obj.last_path,
            }
        )

    def deserialize(self, version: int, data: bytes) -> BinPackingState:
        """Read a state written by format ``version``.

        Raises:
            SinkError: unknown version, or the data is not a valid state.
        """
        _check_version("BinPackingState", version, self.SUPPORTED_VERSIONS)
        return _decode(
            "BinPackingState",
            data,
            lambda raw: BinPackingState(
                files_consumed=raw["filesConsumed"],
                splits_created=raw["splitsCreated"],
                target_split_bytes=raw["targetSplitBytes"],
                last_path=raw["lastPath"],
            ),
        )


class LazyEnumeratorStateSerializer(Generic[SplitT, AssignerStateT]):
    """Serializer of :class:`LazyEnumeratorState`, built from the serializers of its parts.

    Format version 1: the number of pending splits, then each split and finally the assigner
    state, each as a length-prefixed payload that carries its own version (so the parts evolve
    independently of this envelope).

    Args:
        split_serializer: serializer of the pending splits.
        assigner_state_serializer: serializer of the assigner's state.
    """

    SUPPORTED_VERSIONS = (1,)

    def __init__(
        self,
        split_serializer: VersionedSerializer[SplitT],
        assigner_state_serializer: VersionedSerializer[AssignerStateT],
    ) -> None:
        self._splits = split_serializer
        self._assigner = assigner_state_serializer

    @property
    def version(self) -> int:
        """The format version :meth:`serialize` writes."""
        return 1

    def serialize(self, obj: LazyEnumeratorState[SplitT, AssignerStateT]) -> bytes:
        """Serialize ``obj`` in format version 1."""
        parts = [_LENGTH.pack(len(obj.pending))]
        payloads = [serialize_versioned(self._splits, split) for split in obj.pending]
        payloads.append(serialize_versioned(self._assigner, obj.assigner))
        for payload in payloads:
            parts += [_LENGTH.pack(len(payload)), payload]
        return b"".join(parts)

    def deserialize(self, version: int, data: bytes) -> LazyEnumeratorState[SplitT, AssignerStateT]:
        """Read a state written by format ``version``.

        Raises:
            SinkError: unknown version (of the envelope or of a part), or the data is truncated
                or has trailing bytes.
        """
        _check_version("enumerator state", version, self.SUPPORTED_VERSIONS)
        view = memoryview(data)
        if len(view) < _LENGTH.size:
            raise SinkError("enumerator state truncated: no split count")
        (count,) = _LENGTH.unpack_from(view, 0)
        offset = _LENGTH.size

        def take() -> bytes:
            nonlocal offset
            if offset + _LENGTH.size > len(view):
                raise SinkError("enumerator state truncated in a length header")
            (length,) = _LENGTH.unpack_from(view, offset)
            start, offset = offset + _LENGTH.size, offset + _LENGTH.size + length
            if offset > len(view):
                raise SinkError("enumerator state truncated in a payload")
            return bytes(view[start:offset])

        pending = tuple(deserialize_versioned(self._splits, take()) for _ in range(count))
        assigner = deserialize_versioned(self._assigner, take())
        if offset != len(view):
            raise SinkError(f"enumerator state has {len(view) - offset} trailing bytes")
        return LazyEnumeratorState(pending=pending, assigner=assigner)
