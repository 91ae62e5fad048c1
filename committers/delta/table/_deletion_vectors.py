"""Deletion vectors: the rows of a data file that a table version no longer holds.

A logical file of a Delta table is a data file plus an optional deletion vector (PROTOCOL.md,
"Deletion Vectors" and "Deletion Vector Format"): a set of row indexes (positions in the file,
from 0) that readers must skip. The vector's descriptor in the ``add`` action says where it is:

* ``u``: in a file under the table root, ``<prefix>/deletion_vector_<uuid>.bin``, whose name
  is the descriptor's text (an optional random prefix, then the UUID in Z85, 20 characters);
* ``i``: inline, the serialized bitmap in Z85 in the descriptor itself;
* ``p``: in a file at an absolute URI.

A vector file starts with one version byte (1), then holds vectors at offsets: each is its size
(4 bytes, big-endian), the serialized bitmap, and the CRC-32 of the bitmap (4 bytes,
big-endian). A serialized bitmap is the magic number 1681511377 (4 bytes, little-endian)
followed by a 64-bit Roaring bitmap in the portable format of the RoaringFormatSpec, which is
what ``pyroaring.BitMap64`` reads and writes.

Everything read is checked: the magic number, the size the descriptor names, the checksum, the
cardinality. A vector that fails a check, or whose file is missing, raises
:class:`DeletionVectorError` naming the data file and the vector; rows are never returned
unfiltered.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np
from pyroaring import BitMap, BitMap64

from committers.delta.storage._storage import TableLocation
from framework.errors import DestinationError

__all__ = [
    "DV_FILE_VERSION",
    "DV_MAGIC",
    "DeletionVectorDescriptor",
    "DeletionVectorError",
    "decode_uuid",
    "deleted_rows",
    "deleted_rows_of",
    "encode_uuid",
    "encode_vector_file",
    "keep_mask",
    "parse_bitmap",
    "read_bitmap",
    "serialize_bitmap",
    "unique_id",
    "vector_file",
    "vector_path",
    "write_vector_file",
    "z85_decode",
    "z85_encode",
]

#: The magic number in front of every serialized bitmap.
DV_MAGIC = 1681511377
#: The format version a deletion vector file starts with.
DV_FILE_VERSION = 1

_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_VALUES = {c: i for i, c in enumerate(_Z85)}
_UUID_CHARACTERS = 20
_MAGIC_BYTES = struct.pack("<I", DV_MAGIC)
_NATIVE_MAGIC_BYTES = struct.pack(">I", DV_MAGIC - 1)


class DeletionVectorError(DestinationError):
    """A deletion vector cannot be read or does not match its descriptor (missing file,
    wrong size, checksum or cardinality, unknown format); nothing was read from its file."""


def z85_encode(data: bytes) -> str:
    """``data`` in Z85 (ZeroMQ's Base85), padded with zero bytes to a multiple of 4, as Delta
    pads inline vectors (the descriptor's size says how many bytes are real)."""
    padded = data + b"\0" * (-len(data) % 4)
    out: list[str] = []
    for (word,) in struct.iter_unpack(">I", padded):
        chunk = []
        for _ in range(5):
            word, digit = divmod(word, 85)
            chunk.append(_Z85[digit])
        out.extend(reversed(chunk))
    return "".join(out)


def z85_decode(text: str, size: int | None = None) -> bytes:
    """The bytes Z85 ``text`` encodes, the first ``size`` of them if given.

    Raises:
        ValueError: the length is not a multiple of 5, a character is not Z85, a group is
            out of range, or ``size`` exceeds the decoded length.
    """
    if len(text) % 5:
        raise ValueError(f"Z85 text has {len(text)} characters, not a multiple of 5")
    words = []
    for start in range(0, len(text), 5):
        word = 0
        for ch in text[start : start + 5]:
            value = _Z85_VALUES.get(ch)
            if value is None:
                raise ValueError(f"{ch!r} is not a Z85 character")
            word = word * 85 + value
        if word > 0xFFFFFFFF:
            raise ValueError(f"Z85 group {text[start : start + 5]!r} is out of range")
        words.append(word)
    data = struct.pack(f">{len(words)}I", *words)
    if size is None:
        return data
    if size > len(data):
        raise ValueError(f"Z85 text holds {len(data)} bytes, fewer than the {size} expected")
    return data[:size]


def encode_uuid(value: uuid.UUID) -> str:
    """A UUID as the 20 Z85 characters of a ``u`` descriptor."""
    return z85_encode(value.bytes)


def decode_uuid(text: str) -> uuid.UUID:
    """The UUID of 20 Z85 characters (see :func:`encode_uuid`)."""
    return uuid.UUID(bytes=z85_decode(text))


def parse_bitmap(data: bytes) -> BitMap64:
    """A serialized bitmap: the magic number, then the portable 64-bit Roaring format (what
    delta-spark writes); or the older "native" layout of PROTOCOL.md's inline example (magic
    1681511376 and counts big-endian, then each 32-bit bitmap with its size).

    Raises:
        ValueError: the magic number is wrong or the bitmap does not parse.
    """
    try:
        if data[:4] == _MAGIC_BYTES:
            return BitMap64.deserialize(data[4:])
        if data[:4] == _NATIVE_MAGIC_BYTES:
            return _parse_native(data)
    except (ValueError, struct.error) as err:
        raise ValueError(f"the Roaring bitmap does not parse: {err}") from err
    found = struct.unpack("<I", data[:4])[0] if len(data) >= 4 else None
    raise ValueError(f"magic number {found} instead of {DV_MAGIC}")


def _parse_native(data: bytes) -> BitMap64:
    (count,) = struct.unpack_from(">i", data, 4)
    position, result = 8, BitMap64()
    for high in range(count):
        (size,) = struct.unpack_from(">i", data, position)
        low = BitMap.deserialize(data[position + 4 : position + 4 + size])
        position += 4 + size
        result.update(np.frombuffer(low.to_array(), dtype=np.uint32).astype(np.uint64) | high << 32)
    return result


def serialize_bitmap(bitmap: BitMap64) -> bytes:
    """The magic number and ``bitmap`` in the portable 64-bit Roaring format, run-optimized
    as delta-spark writes them."""
    copy = BitMap64(bitmap)
    copy.run_optimize()
    return _MAGIC_BYTES + copy.serialize()


@dataclass(frozen=True)
class DeletionVectorDescriptor:
    """Where a deletion vector is and what it holds (PROTOCOL.md "Deletion Vector Descriptor
    Schema").

    Attributes:
        storage_type: ``u`` (relative file named by a UUID), ``i`` (inline) or ``p``
            (absolute path).
        path_or_inline_dv: the prefix and Z85 UUID, the Z85 bitmap, or the absolute path.
        size_in_bytes: the serialized bitmap's size (before Z85 for inline vectors).
        cardinality: how many rows the vector deletes.
        offset: where the vector's size field starts in its file (None inline).
    """

    storage_type: str
    path_or_inline_dv: str
    size_in_bytes: int
    cardinality: int
    offset: int | None = None

    @classmethod
    def from_json(
        cls, value: Mapping[str, Any], data_file: str | None = None
    ) -> DeletionVectorDescriptor:
        """From the ``deletionVector`` struct of an ``add`` or ``remove`` action (of
        ``data_file``, named in errors).

        Raises:
            DeletionVectorError: a field is missing or of the wrong kind.
        """
        of = "" if data_file is None else f" of data file {data_file}"
        try:
            storage_type = str(value["storageType"])
            descriptor = cls(
                storage_type=storage_type,
                path_or_inline_dv=str(value["pathOrInlineDv"]),
                size_in_bytes=int(value["sizeInBytes"]),
                cardinality=int(value["cardinality"]),
                offset=None if value.get("offset") is None else int(value["offset"]),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise DeletionVectorError(
                f"malformed deletion vector descriptor{of}: {value!r} ({err!r})"
            ) from err
        if storage_type not in ("u", "i", "p"):
            raise DeletionVectorError(
                f"deletion vector storage type {storage_type!r}{of} is not one of 'u', 'i', "
                f"'p' (descriptor {value!r})"
            )
        return descriptor

    def to_json(self) -> dict[str, Any]:
        """The descriptor as the log spells it."""
        out: dict[str, Any] = {
            "storageType": self.storage_type,
            "pathOrInlineDv": self.path_or_inline_dv,
        }
        if self.offset is not None:
            out["offset"] = self.offset
        out["sizeInBytes"] = self.size_in_bytes
        out["cardinality"] = self.cardinality
        return out

    @property
    def unique_id(self) -> str:
        """The protocol's ``uniqueId``: what tells two vectors of one file apart."""
        base = f"{self.storage_type}{self.path_or_inline_dv}"
        return base if self.offset is None else f"{base}@{self.offset}"

    def describe(self) -> str:
        """A short text for error messages."""
        if self.storage_type == "i":
            return f"inline deletion vector ({self.cardinality} rows)"
        return f"deletion vector {self.unique_id} ({self.cardinality} rows)"


def vector_file(descriptor: DeletionVectorDescriptor, location: TableLocation) -> str:
    """The fsspec path of the file holding ``descriptor``'s vector.

    Raises:
        DeletionVectorError: an inline vector (no file), or a ``u`` text that holds no UUID
            in Z85.
    """
    try:
        return _vector_path(descriptor, location)
    except ValueError as err:
        raise DeletionVectorError(f"{descriptor.describe()}: {err}") from err


def vector_path(descriptor: DeletionVectorDescriptor, location: TableLocation) -> str | None:
    """The path, relative to the table root, of the file holding ``descriptor``'s vector: the
    file a ``u`` descriptor names, or a ``p`` descriptor's when it is under the root (what the
    clean-ups must keep while an action references it); ``None`` for inline vectors and files
    outside the table."""
    if descriptor.storage_type == "i":
        return None
    full = vector_file(descriptor, location)
    relative = location.relative(full)
    return None if relative == full else relative


def _vector_path(descriptor: DeletionVectorDescriptor, location: TableLocation) -> str:
    """See :func:`vector_file`; raises ValueError."""
    text = descriptor.path_or_inline_dv
    if descriptor.storage_type == "u":
        if len(text) < _UUID_CHARACTERS:
            raise ValueError(f"{text!r} holds no UUID")
        prefix, encoded = text[:-_UUID_CHARACTERS], text[-_UUID_CHARACTERS:]
        name = f"deletion_vector_{decode_uuid(encoded)}.bin"
        return location.path(f"{prefix}/{name}" if prefix else name)
    if descriptor.storage_type == "p":
        parsed = urlparse(text)
        if parsed.scheme in ("", "file"):
            return unquote(parsed.path)
        return f"{parsed.netloc}{unquote(parsed.path)}"
    raise ValueError("it has no file")


def read_bitmap(
    descriptor: DeletionVectorDescriptor, location: TableLocation, data_file: str
) -> BitMap64:
    """The row indexes ``descriptor`` deletes from ``data_file`` (named in errors only).

    Raises:
        DeletionVectorError: the vector's file is missing or unreadable, or the vector's
            size, checksum, magic number or cardinality does not match; the message names the
            data file and the vector.
    """
    try:
        data = _vector_bytes(descriptor, location)
        bitmap = parse_bitmap(data)
    except (ValueError, OSError) as err:
        raise DeletionVectorError(
            f"cannot apply the {descriptor.describe()} of data file {data_file}: {err}. "
            "Nothing was read from that file; the vector or its file is damaged or missing."
        ) from err
    if len(bitmap) != descriptor.cardinality:
        raise DeletionVectorError(
            f"cannot apply the {descriptor.describe()} of data file {data_file}: it holds "
            f"{len(bitmap)} rows, not the {descriptor.cardinality} its descriptor says. "
            "Nothing was read from that file."
        )
    return bitmap


def _vector_bytes(descriptor: DeletionVectorDescriptor, location: TableLocation) -> bytes:
    size = descriptor.size_in_bytes
    if descriptor.storage_type == "i":
        return z85_decode(descriptor.path_or_inline_dv, size)
    path = _vector_path(descriptor, location)
    offset = descriptor.offset or 0
    fs = location.filesystem()
    try:
        with fs.open(path, "rb") as handle:
            handle.seek(offset)
            framed = handle.read(size + 8)
    except FileNotFoundError:
        raise OSError(f"its file {path} does not exist") from None
    if len(framed) < size + 8:
        raise ValueError(
            f"its file {path} ends {size + 8 - len(framed)} bytes before the vector at "
            f"offset {offset} does"
        )
    (stored_size,) = struct.unpack(">i", framed[:4])
    if stored_size != size:
        raise ValueError(
            f"the file {path} stores {stored_size} bytes at offset {offset}, the descriptor "
            f"says {size}"
        )
    data: bytes = framed[4 : 4 + size]
    (checksum,) = struct.unpack(">I", framed[4 + size : 8 + size])
    if zlib.crc32(data) != checksum:
        raise ValueError(f"the CRC-32 of the vector at offset {offset} in {path} does not match")
    return data


def deleted_rows(
    descriptor: DeletionVectorDescriptor | None, location: TableLocation, data_file: str
) -> np.ndarray:
    """The sorted row indexes (``uint64``) ``descriptor`` deletes; empty without one."""
    if descriptor is None:
        return np.empty(0, dtype=np.uint64)
    bitmap = read_bitmap(descriptor, location, data_file)
    return np.frombuffer(bitmap.to_array(), dtype=np.uint64)


def deleted_rows_of(
    location: TableLocation, vectors: Mapping[str, DeletionVectorDescriptor]
) -> dict[str, np.ndarray]:
    """:func:`deleted_rows` of each data file (path relative to the root, or absolute) ->
    vector, read side by side on object stores (one request each), in turn on local disk.

    Raises:
        DeletionVectorError: as :func:`read_bitmap`, for the first damaged vector.
    """
    items = list(vectors.items())
    if not items:
        return {}
    workers = 1 if location.is_local else min(16, len(items))
    with ThreadPoolExecutor(workers) as pool:
        rows = list(pool.map(lambda item: deleted_rows(item[1], location, item[0]), items))
    return {path: deleted for (path, _), deleted in zip(items, rows, strict=True)}


def unique_id(vector: DeletionVectorDescriptor | None) -> str | None:
    """``vector``'s unique id (``None``: no vector): with the path, what names a logical file."""
    return None if vector is None else vector.unique_id


def keep_mask(deleted: np.ndarray, first_row: int, rows: int) -> np.ndarray | None:
    """Which of the rows ``first_row .. first_row + rows - 1`` survive ``deleted`` (sorted
    row indexes), as a boolean mask; None when all do."""
    low, high = np.searchsorted(deleted, [first_row, first_row + rows])
    if low == high:
        return None
    mask = np.ones(rows, dtype=bool)
    mask[(deleted[low:high] - np.uint64(first_row)).astype(np.int64)] = False
    return mask


def encode_vector_file(bitmaps: list[BitMap64]) -> tuple[bytes, list[tuple[int, int]]]:
    """A deletion vector file holding ``bitmaps``, and each one's ``(offset, sizeInBytes)``:
    the version byte, then per vector its size (big-endian), the serialized bitmap and its
    CRC-32 (big-endian), as delta-spark writes them."""
    parts = [bytes([DV_FILE_VERSION])]
    position = 1
    placed = []
    for bitmap in bitmaps:
        data = serialize_bitmap(bitmap)
        parts += [struct.pack(">i", len(data)), data, struct.pack(">I", zlib.crc32(data))]
        placed.append((position, len(data)))
        position += len(data) + 8
    return b"".join(parts), placed


def write_vector_file(
    location: TableLocation, bitmaps: list[BitMap64], *, prefix: str = ""
) -> tuple[str, list[DeletionVectorDescriptor]]:
    """Write ``bitmaps`` into a new ``<prefix>/deletion_vector_<uuid>.bin`` under the table
    root (one PUT on object stores: a reader never sees part of it); the file's path relative
    to the root, and one ``u`` descriptor per bitmap, in order.

    Raises:
        OSError: the file could not be written (a partial local file is not left behind by
            fsspec's local writes; a failed PUT leaves nothing).
    """
    name = uuid.uuid4()
    relative = f"deletion_vector_{name}.bin"
    if prefix:
        relative = f"{prefix}/{relative}"
    data, placed = encode_vector_file(bitmaps)
    fs = location.filesystem()
    path = location.path(relative)
    if prefix:
        fs.makedirs(location.path(prefix), exist_ok=True)
    with fs.open(path, "wb") as handle:
        handle.write(data)
    text = f"{prefix}{encode_uuid(name)}"
    descriptors = [
        DeletionVectorDescriptor("u", text, size, len(bitmap), offset)
        for bitmap, (offset, size) in zip(bitmaps, placed, strict=True)
    ]
    return relative, descriptors
