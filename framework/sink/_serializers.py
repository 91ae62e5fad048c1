"""Versioned serialization: every payload carries the version of the format that wrote it.

A serializer keeps reading every version it ever wrote, so state and committables written by an
older release stay readable after an upgrade (FLIP-143's SimpleVersionedSerializer).
"""

from __future__ import annotations

import struct
from typing import Protocol, TypeVar

from framework.errors import SinkError

T = TypeVar("T")

__all__ = ["VersionedSerializer", "deserialize_versioned", "serialize_versioned"]

_HEADER = struct.Struct(">II")  # version, payload length


class VersionedSerializer(Protocol[T]):
    """Turns objects into bytes and back, for every version it has ever written."""

    @property
    def version(self) -> int:
        """The version :meth:`serialize` writes."""
        ...

    def serialize(self, obj: T) -> bytes:
        """Serialize ``obj`` in the current format."""
        ...

    def deserialize(self, version: int, data: bytes) -> T:
        """Read ``data`` written by format ``version`` (current or older)."""
        ...


def serialize_versioned(serializer: VersionedSerializer[T], obj: T) -> bytes:
    """Serialize ``obj`` and prefix the serializer's version and the payload length."""
    payload = serializer.serialize(obj)
    return _HEADER.pack(serializer.version, len(payload)) + payload


def deserialize_versioned(serializer: VersionedSerializer[T], data: bytes) -> T:
    """Read bytes written by :func:`serialize_versioned`.

    Raises:
        SinkError: the bytes are truncated, or the version is newer than this serializer.
    """
    if len(data) < _HEADER.size:
        raise SinkError(f"serialized data too short ({len(data)} bytes) to hold a version header")
    version, length = _HEADER.unpack_from(data)
    payload = data[_HEADER.size :]
    if len(payload) != length:
        raise SinkError(
            f"serialized data truncated: header says {length} bytes, got {len(payload)}"
        )
    if version > serializer.version:
        raise SinkError(
            f"data was written by format version {version}, newer than this release reads "
            f"(up to {serializer.version}); upgrade before reading it"
        )
    return serializer.deserialize(version, payload)
