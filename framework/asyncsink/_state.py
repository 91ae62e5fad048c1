"""The buffered entries of a writer, as a snapshot that can be stored and restored (FLIP-171).

A snapshot holds the entries the writer accepted but has not yet handed to the destination
(buffered, or waiting for a retry), in order, with their size and how often each already failed,
so that a restored writer continues each entry's retry budget instead of restarting it.
Entries in flight are not part of it: take a snapshot after ``flush()``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from framework.errors import SinkError

__all__ = [
    "BufferedRequestState",
    "BufferedRequestStateSerializer",
    "BytesEntrySerializer",
    "EntrySerializer",
    "RequestEntryWrapper",
]

RequestEntryT = TypeVar("RequestEntryT")

_COUNT = struct.Struct(">I")
_ENTRY_HEADER = struct.Struct(">QII")  # size_in_bytes, failed_attempts, payload length


@dataclass(frozen=True, slots=True)
class RequestEntryWrapper(Generic[RequestEntryT]):
    """One buffered entry with its size and the number of times it already failed."""

    entry: RequestEntryT
    size_in_bytes: int
    failed_attempts: int = 0


@dataclass(frozen=True, slots=True)
class BufferedRequestState(Generic[RequestEntryT]):
    """The entries a writer holds, oldest first."""

    entries: tuple[RequestEntryWrapper[RequestEntryT], ...] = ()

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def size_in_bytes(self) -> int:
        """Total size of the entries."""
        return sum(wrapper.size_in_bytes for wrapper in self.entries)


class EntrySerializer(Protocol[RequestEntryT]):
    """Turns one request entry into bytes and back."""

    def serialize(self, entry: RequestEntryT) -> bytes:
        """The bytes of ``entry``."""
        ...

    def deserialize(self, data: bytes) -> RequestEntryT:
        """The entry :meth:`serialize` turned into ``data``."""
        ...


class BytesEntrySerializer:
    """For entries that already are bytes (e.g. encoded JSON documents)."""

    def serialize(self, entry: bytes) -> bytes:
        """Return ``entry`` itself."""
        return bytes(entry)

    def deserialize(self, data: bytes) -> bytes:
        """Return ``data`` itself."""
        return data


class BufferedRequestStateSerializer(Generic[RequestEntryT]):
    """A :class:`~framework.sink.VersionedSerializer` of :class:`BufferedRequestState`.

    Format version 1: entry count, then per entry its size, failed attempts, payload length and
    payload (all big-endian). Use it with :func:`~framework.sink.serialize_versioned`.

    Args:
        entry_serializer: how one entry becomes bytes.
    """

    def __init__(self, entry_serializer: EntrySerializer[RequestEntryT]) -> None:
        self._entries = entry_serializer

    @property
    def version(self) -> int:
        """The format version :meth:`serialize` writes."""
        return 1

    def serialize(self, obj: BufferedRequestState[RequestEntryT]) -> bytes:
        """Serialize ``obj`` in format version 1."""
        parts = [_COUNT.pack(len(obj.entries))]
        for wrapper in obj.entries:
            payload = self._entries.serialize(wrapper.entry)
            parts.append(
                _ENTRY_HEADER.pack(wrapper.size_in_bytes, wrapper.failed_attempts, len(payload))
            )
            parts.append(payload)
        return b"".join(parts)

    def deserialize(self, version: int, data: bytes) -> BufferedRequestState[RequestEntryT]:
        """Read a state written by format ``version``.

        Raises:
            SinkError: unknown version, or the data is truncated or has trailing bytes.
        """
        if version != 1:
            raise SinkError(f"unknown buffered-state format version {version}; this reads 1")
        view = memoryview(data)
        if len(view) < _COUNT.size:
            raise SinkError("buffered state truncated: no entry count")
        (count,) = _COUNT.unpack_from(view, 0)
        offset = _COUNT.size
        wrappers: list[RequestEntryWrapper[RequestEntryT]] = []
        for index in range(count):
            if offset + _ENTRY_HEADER.size > len(view):
                raise SinkError(f"buffered state truncated in the header of entry {index}")
            size, attempts, length = _ENTRY_HEADER.unpack_from(view, offset)
            offset += _ENTRY_HEADER.size
            if offset + length > len(view):
                raise SinkError(f"buffered state truncated in the payload of entry {index}")
            entry = self._entries.deserialize(bytes(view[offset : offset + length]))
            offset += length
            wrappers.append(RequestEntryWrapper(entry, size, attempts))
        if offset != len(view):
            raise SinkError(f"buffered state has {len(view) - offset} trailing bytes")
        return BufferedRequestState(tuple(wrappers))
