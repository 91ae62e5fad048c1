"""Deletion vectors are decoded exactly as PROTOCOL.md and delta-spark spell them, every damaged
or malformed vector fails naming the data file and the vector (never a silent read), and the
vectors of a version replayed from the log (checkpoints of every kind included) are those
delta-rs resolves for tables delta-spark wrote."""

from __future__ import annotations

import json
import random
import re
import struct
import uuid
import zlib
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyroaring import BitMap64

from committers.delta.storage._storage import TableLocation
from committers.delta.table._deletion_vectors import (
    DV_FILE_VERSION,
    DeletionVectorDescriptor,
    DeletionVectorError,
    decode_uuid,
    deleted_rows,
    encode_uuid,
    keep_mask,
    parse_bitmap,
    read_bitmap,
    serialize_bitmap,
    vector_file,
    z85_decode,
    z85_encode,
)
from committers.delta.table._live_vectors import live_deletion_vectors

# PROTOCOL.md, "Deletion Vector Descriptor Schema": examples 1 to 3.
PROTOCOL_U = "ab^-aqEH.-t@S}K{vb[*k^"
PROTOCOL_UUID = uuid.UUID("d2c639aa-8816-431a-aaf6-d3fe2512ff61")
PROTOCOL_INLINE = "wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L"
PROTOCOL_INLINE_ROWS = [3, 4, 7, 11, 18, 29]


def write_vector_file(path: Path, bitmaps: list[bytes]) -> list[int]:
    """A deletion vector file as PROTOCOL.md lays it out (version byte, then each vector's
    big-endian size, bytes and CRC-32); returns each vector's offset."""
    out, offsets = bytearray([DV_FILE_VERSION]), []
    for data in bitmaps:
        offsets.append(len(out))
        out += struct.pack(">i", len(data)) + data + struct.pack(">I", zlib.crc32(data))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(out))
    return offsets


def u_descriptor(value: uuid.UUID, data: bytes, offset: int, cardinality: int, prefix=""):
    return DeletionVectorDescriptor(
        "u", prefix + encode_uuid(value), len(data), cardinality, offset
    )


# -- Z85 and the descriptor's texts ------------------------------------------------------------


def test_z85_matches_the_zeromq_spec_and_the_protocol_examples(tmp_path):
    # ZeroMQ RFC 32's own test vector.
    hello = bytes([0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B])
    assert z85_encode(hello) == "HelloWorld"
    assert z85_decode("HelloWorld") == hello

    # Example 1: a random prefix "ab", then the UUID; the file lies under the prefix.
    assert decode_uuid(PROTOCOL_U[2:]) == PROTOCOL_UUID
    assert encode_uuid(PROTOCOL_UUID) == PROTOCOL_U[2:]
    location = TableLocation.of(str(tmp_path))
    example = DeletionVectorDescriptor("u", PROTOCOL_U, 40, 6, 4)
    assert vector_file(example, location) == (
        f"{tmp_path}/ab/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin"
    )
    assert example.unique_id == f"u{PROTOCOL_U}@4"
    no_prefix = DeletionVectorDescriptor("u", PROTOCOL_U[2:], 40, 6, 4)
    assert vector_file(no_prefix, location) == (
        f"{tmp_path}/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin"
    )
    # Example 2: an absolute path, a URI to decode like an add action's path.
    absolute = DeletionVectorDescriptor("p", "file:///tmp/a%20b/deletion_vector_x.bin", 40, 6, 4)
    assert vector_file(absolute, location) == "/tmp/a b/deletion_vector_x.bin"
    hadoop_style = DeletionVectorDescriptor("p", "file:/tmp/a%20b/deletion_vector_x.bin", 40, 6, 4)
    assert vector_file(hadoop_style, location) == "/tmp/a b/deletion_vector_x.bin"
    on_s3 = DeletionVectorDescriptor("p", "s3://mytable/deletion_vector_x.bin", 40, 6, 4)
    assert vector_file(on_s3, location) == "mytable/deletion_vector_x.bin"

    # Example 3: inline, 40 bytes, the older "native" layout of delta-spark's bitmap array.
    data = z85_decode(PROTOCOL_INLINE, 40)
    assert len(data) == 40
    assert list(parse_bitmap(data)) == PROTOCOL_INLINE_ROWS
    inline = DeletionVectorDescriptor("i", PROTOCOL_INLINE, 40, 6)
    assert list(read_bitmap(inline, location, "f.parquet")) == PROTOCOL_INLINE_ROWS
    assert inline.unique_id == f"i{PROTOCOL_INLINE}"
    assert DeletionVectorDescriptor.from_json(inline.to_json()) == inline
    assert DeletionVectorDescriptor.from_json(example.to_json()) == example


def test_z85_round_trips_any_bytes_padding_to_whole_words():
    rng = random.Random(7)
    for size in range(13):
        data = bytes(rng.randrange(256) for _ in range(size))
        text = z85_encode(data)
        assert len(text) == 5 * -(-size // 4)
        assert z85_decode(text, size) == data
    assert z85_encode(b"\xff\xff\xff\xff") == "%nSc0"
    assert z85_decode("%nSc0") == b"\xff\xff\xff\xff"
    for _ in range(20):
        value = uuid.UUID(int=rng.getrandbits(128))
        assert len(encode_uuid(value)) == 20
        assert decode_uuid(encode_uuid(value)) == value


@pytest.mark.parametrize(
    ("text", "size", "message"),
    [
        ("Hello", None, None),
        ("Hell", None, "4 characters, not a multiple of 5"),
        ("Hell~", None, "'~' is not a Z85 character"),
        ("%%%%%", None, "out of range"),
        ("Hello", 5, "holds 4 bytes, fewer than the 5 expected"),
    ],
)
def test_z85_refuses_malformed_text(text, size, message):
    if message is None:
        assert len(z85_decode(text, size)) == 4
        return
    with pytest.raises(ValueError, match=message):
        z85_decode(text, size)


# -- bitmaps -----------------------------------------------------------------------------------


def _bitmaps() -> dict[str, BitMap64]:
    rng = random.Random(11)
    scattered = {rng.randrange(2**20) for _ in range(5000)}
    return {
        "empty": BitMap64(),
        "one row": BitMap64([0]),
        "a run": BitMap64(range(100, 200_000)),
        "scattered": BitMap64(scattered),
        "every other row": BitMap64(range(0, 300_000, 2)),
        "beyond 2**32": BitMap64([5, 2**32 - 1, 2**32, 2**32 + 7, 3 * 2**32 + 1, 2**40 + 3]),
        "runs in several buckets": BitMap64(
            [*range(2**32 - 10, 2**32 + 10), *range(5 * 2**32, 5 * 2**32 + 70_000)]
        ),
        "largest key Delta allows": BitMap64([2**62 + 1, 2**63 - 1]),
    }


@pytest.mark.parametrize("name", list(_bitmaps()))
def test_bitmaps_round_trip_through_the_serialized_format(name):
    bitmap = _bitmaps()[name]
    data = serialize_bitmap(bitmap)
    assert data[:4] == struct.pack("<I", 1681511377)
    assert parse_bitmap(data) == bitmap
    # The portable 64-bit layout: a 64-bit count of 32-bit buckets, ascending keys.
    highs = sorted({v >> 32 for v in bitmap})
    assert struct.unpack_from("<Q", data, 4)[0] == len(highs)


def test_a_vector_file_with_several_vectors_reads_each_at_its_offset(tmp_path):
    bitmaps = list(_bitmaps().values())
    value = uuid.uuid4()
    offsets = write_vector_file(
        tmp_path / "r7" / f"deletion_vector_{value}.bin", [serialize_bitmap(b) for b in bitmaps]
    )
    assert offsets[0] == 1  # right after the version byte
    location = TableLocation.of(str(tmp_path))
    for bitmap, offset in zip(bitmaps, offsets, strict=True):
        descriptor = u_descriptor(value, serialize_bitmap(bitmap), offset, len(bitmap), "r7")
        assert read_bitmap(descriptor, location, "f.parquet") == bitmap
        rows = deleted_rows(descriptor, location, "f.parquet")
        assert rows.dtype == np.uint64
        assert rows.tolist() == list(bitmap)
    assert deleted_rows(None, location, "f.parquet").tolist() == []
    # An inline vector holds the same bytes, in Z85.
    bitmap = _bitmaps()["beyond 2**32"]
    data = serialize_bitmap(bitmap)
    inline = DeletionVectorDescriptor("i", z85_encode(data), len(data), len(bitmap))
    assert read_bitmap(inline, location, "f.parquet") == bitmap


# -- which rows survive ------------------------------------------------------------------------


def test_keep_mask_marks_exactly_the_deleted_rows_of_each_batch():
    deleted = np.array([0, 9, 10, 19, 2**32 + 1, 2**32 + 5], dtype=np.uint64)
    assert keep_mask(deleted, 1, 8) is None  # nothing deleted in rows 1..8
    assert keep_mask(deleted, 20, 1000) is None
    assert keep_mask(np.empty(0, np.uint64), 0, 10) is None
    assert keep_mask(deleted, 0, 1).tolist() == [False]
    assert keep_mask(deleted, 9, 2).tolist() == [False, False]  # both ends of a batch
    assert keep_mask(deleted, 5, 10).tolist() == [True] * 4 + [False, False] + [True] * 4
    assert keep_mask(deleted, 10, 10).tolist() == [False] + [True] * 8 + [False]
    assert keep_mask(deleted, 2**32, 6).tolist() == [True, False, True, True, True, False]
    # Batch after batch, the masks drop exactly the deleted rows of a file.
    everything = np.arange(2**32 - 3, 2**32 + 8, dtype=np.uint64)
    kept, first = [], int(everything[0])
    for rows in (3, 1, 4, 3):
        mask = keep_mask(deleted, first, rows)
        batch = list(range(first, first + rows))
        kept += batch if mask is None else [r for r, keep in zip(batch, mask, strict=True) if keep]
        first += rows
    assert kept == [r for r in everything.tolist() if r not in {2**32 + 1, 2**32 + 5}]
    # Deleted indexes past the rows asked for do not matter.
    assert keep_mask(np.array([3, 50], dtype=np.uint64), 0, 5).tolist() == [
        True,
        True,
        True,
        False,
        True,
    ]


# -- damaged and malformed vectors -------------------------------------------------------------


@pytest.fixture
def good_vector(tmp_path):
    """A table root with one vector file holding one vector of rows 1, 3 and 2**33."""
    value = uuid.UUID("00000000-0000-4000-8000-000000000001")
    data = serialize_bitmap(BitMap64([1, 3, 2**33]))
    path = tmp_path / f"deletion_vector_{value}.bin"
    (offset,) = write_vector_file(path, [data])
    return TableLocation.of(str(tmp_path)), path, u_descriptor(value, data, offset, 3)


def _damage(kind: str, location, path: Path, good: DeletionVectorDescriptor):
    """A descriptor (and the file change) that breaks the vector in one way, and the message."""
    raw = bytearray(path.read_bytes())
    size = good.size_in_bytes
    if kind == "flipped byte":
        raw[good.offset + 4 + size // 2] ^= 0x40
        path.write_bytes(bytes(raw))
        return good, "CRC-32 of the vector at offset 1 .* does not match"
    if kind == "wrong magic":
        body = bytes(raw[5 : 5 + size])
        body = struct.pack("<I", 1681511378) + body[4:]
        write_vector_file(path, [body])
        return good, "magic number 1681511378 instead of 1681511377"
    if kind == "unparsable bitmap":
        body = bytes(raw[5 : 5 + size])[:12]
        write_vector_file(path, [body])
        return (
            DeletionVectorDescriptor("u", good.path_or_inline_dv, len(body), 3, 1),
            "the Roaring bitmap does not parse",
        )
    if kind == "short file":
        path.write_bytes(bytes(raw[:-3]))
        return good, "ends 3 bytes before the vector at offset 1 does"
    if kind == "wrong size":
        return (
            DeletionVectorDescriptor("u", good.path_or_inline_dv, size - 4, 3, 1),
            f"stores {size} bytes at offset 1, the descriptor says {size - 4}",
        )
    if kind == "wrong offset":
        return (
            DeletionVectorDescriptor("u", good.path_or_inline_dv, size, 3, 0),
            "stores .* bytes at offset 0",
        )
    if kind == "wrong cardinality":
        return (
            DeletionVectorDescriptor("u", good.path_or_inline_dv, size, 4, 1),
            "it holds 3 rows, not the 4 its descriptor says",
        )
    if kind == "missing file":
        path.unlink()
        return good, f"its file {path} does not exist"
    if kind == "bad Z85 in the UUID":
        text = good.path_or_inline_dv[:-1] + "~"
        return DeletionVectorDescriptor("u", text, size, 3, 1), "'~' is not a Z85 character"
    if kind == "no UUID":
        return DeletionVectorDescriptor("u", "abc", size, 3, 1), "'abc' holds no UUID"
    if kind == "bad inline Z85":
        return DeletionVectorDescriptor("i", "Hell~", 4, 3), "'~' is not a Z85 character"
    if kind == "inline shorter than its size":
        text = z85_encode(serialize_bitmap(BitMap64([1, 3, 2**33])))
        return DeletionVectorDescriptor("i", text, size + 8, 3), "fewer than the"
    raise AssertionError(kind)


DAMAGE = [
    "flipped byte",
    "wrong magic",
    "unparsable bitmap",
    "short file",
    "wrong size",
    "wrong offset",
    "wrong cardinality",
    "missing file",
    "bad Z85 in the UUID",
    "no UUID",
    "bad inline Z85",
    "inline shorter than its size",
]


@pytest.mark.parametrize("kind", DAMAGE)
def test_a_damaged_vector_fails_naming_the_data_file_and_the_vector(kind, good_vector):
    location, path, good = good_vector
    assert list(read_bitmap(good, location, "p=1/part-0.parquet")) == [1, 3, 2**33]
    descriptor, detail = _damage(kind, location, path, good)
    with pytest.raises(DeletionVectorError) as failure:
        deleted_rows(descriptor, location, "p=1/part-0.parquet")
    message = str(failure.value)
    assert "data file p=1/part-0.parquet" in message
    assert descriptor.describe() in message
    assert re.search(detail, message), message


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"storageType": "x", "pathOrInlineDv": "a", "sizeInBytes": 1, "cardinality": 1}, "'x'"),
        ({"storageType": "u", "pathOrInlineDv": "a", "cardinality": 1}, "malformed"),
        ({"storageType": "u", "pathOrInlineDv": "a", "sizeInBytes": "x", "cardinality": 1}, "x"),
        (
            {
                "storageType": "u",
                "pathOrInlineDv": "a",
                "sizeInBytes": 1,
                "cardinality": 1,
                "offset": [],
            },
            "malformed",
        ),
    ],
)
def test_malformed_descriptors_are_refused(value, message):
    with pytest.raises(DeletionVectorError, match=message):
        DeletionVectorDescriptor.from_json(value)
    with pytest.raises(
        DeletionVectorError, match=r"inline deletion vector \(0 rows\): it has no file"
    ):
        vector_file(DeletionVectorDescriptor("i", "", 0, 0), TableLocation.of("/t"))


# -- the live vectors of each version, against delta-rs ------------------------------------------


def _delta_rs_deleted_rows(uri: str, version: int) -> dict[str, list[int]]:
    """Relative path -> deleted row indexes, from delta-rs's selection vectors."""
    root = f"file://{uri}/"
    found = {}
    for row in pa.table(DeltaTable(uri, version=version).deletion_vectors()).to_pylist():
        assert row["filepath"].startswith(root), row["filepath"]
        path = unquote(row["filepath"][len(root) :])
        found[path] = [i for i, keep in enumerate(row["selection_vector"]) if not keep]
    return found


@pytest.mark.spark
def test_live_vectors_of_every_version_match_delta_rs(delta_spark, tmp_path):
    """One delta-spark table crossing every kind of checkpoint: a classic one, a multi-part
    one, then (after switching to v2 checkpoints) a v2 JSON one with several sidecars and a v2
    Parquet one; its files get vectors replaced twice and one is removed after having one."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    log = tmp_path / "t" / "_delta_log"

    def sql(text: str) -> None:
        spark.sql(text.replace("{t}", f"delta.`{uri}`"))

    conf = {
        "spark.databricks.delta.checkpoint.partSize": None,
        "spark.databricks.delta.checkpointV2.topLevelFileFormat": None,
    }
    try:
        sql(
            "CREATE TABLE {t} (id BIGINT, s STRING) USING delta TBLPROPERTIES "
            "('delta.enableDeletionVectors' = 'true', 'delta.checkpointInterval' = '2')"
        )
        rows = spark.range(0, 400, 1, 4).selectExpr("id", "CAST(id AS STRING) AS s")
        rows.write.format("delta").mode("append").save(uri)  # 1: four files
        sql("DELETE FROM {t} WHERE id % 10 = 1")  # 2: a vector each; classic checkpoint
        sql("DELETE FROM {t} WHERE id % 10 = 2")  # 3: each vector replaced
        spark.conf.set("spark.databricks.delta.checkpoint.partSize", "2")
        sql("DELETE FROM {t} WHERE id < 100 OR id % 10 = 3")  # 4: replaced again, one file gone
        spark.conf.set("spark.databricks.delta.checkpoint.partSize", "1")
        spark.conf.set("spark.databricks.delta.checkpointV2.topLevelFileFormat", "json")
        sql("ALTER TABLE {t} SET TBLPROPERTIES ('delta.checkpointPolicy' = 'v2')")  # 5
        sql("DELETE FROM {t} WHERE id = 150")  # 6: v2 checkpoint in JSON, several sidecars
        spark.conf.set("spark.databricks.delta.checkpointV2.topLevelFileFormat", "parquet")
        spark.range(1000, 1010, 1, 1).selectExpr("id", "CAST(id AS STRING) AS s").write.format(
            "delta"
        ).mode("append").save(uri)  # 7
        sql("DELETE FROM {t} WHERE id = 1005")  # 8: v2 checkpoint in Parquet
    finally:
        for key in conf:
            spark.conf.unset(key)

    names = {p.name for p in log.iterdir()}
    assert "00000000000000000002.checkpoint.parquet" in names
    parts = [n for n in names if re.fullmatch(r"0{19}4\.checkpoint\.\d{10}\.\d{10}\.parquet", n)]
    assert len(parts) > 1 and all(n.endswith(f".{len(parts):010d}.parquet") for n in parts)
    assert any(re.fullmatch(r"0{19}6\.checkpoint\.[0-9a-f-]{36}\.json", n) for n in names)
    assert any(re.fullmatch(r"0{19}8\.checkpoint\.[0-9a-f-]{36}\.parquet", n) for n in names)
    sidecars = [p.name for p in (log / "_sidecars").iterdir()]
    assert len([n for n in sidecars if n.startswith("0" * 19 + "6")]) > 1

    location = TableLocation.of(uri)
    by_version = []
    for version in range(9):
        ours = {
            path: deleted_rows(vector, location, path).tolist()
            for path, vector in live_deletion_vectors(location, version).items()
        }
        assert ours == _delta_rs_deleted_rows(uri, version), version
        by_version.append(ours)
    assert by_version[1] == {}
    assert len(by_version[3]) == 4 and all(len(r) == 20 for r in by_version[3].values())
    assert len(by_version[4]) == 3 and all(len(r) == 30 for r in by_version[4].values())
    assert len(by_version[8]) == 4
    removed = set(by_version[3]) - set(by_version[4])
    assert len(removed) == 1 and not removed & set(by_version[8])


def _hand_made_log(root: Path, commits: dict[int, list[dict]]) -> None:
    log = root / "_delta_log"
    log.mkdir(parents=True)
    for version, actions in commits.items():
        lines = "".join(json.dumps(a) + "\n" for a in actions)
        (log / f"{version:020d}.json").write_text(lines)


def test_a_malformed_descriptor_in_the_log_fails_naming_its_data_file(tmp_path):
    good = DeletionVectorDescriptor("i", PROTOCOL_INLINE, 40, 6).to_json()
    bad = {**good, "storageType": "q"}
    add = {"path": "p=a%20b/f.parquet", "size": 1, "dataChange": True, "partitionValues": {}}
    _hand_made_log(
        tmp_path,
        {
            0: [{"add": {**add, "deletionVector": good}}],
            1: [{"add": {**add, "path": "g.parquet", "deletionVector": bad}}],
        },
    )
    location = TableLocation.of(str(tmp_path))
    assert live_deletion_vectors(location, 0) == {
        "p=a b/f.parquet": DeletionVectorDescriptor.from_json(good)
    }
    with pytest.raises(DeletionVectorError, match=r"type 'q' of data file g\.parquet is not one"):
        live_deletion_vectors(location, 1)
    with pytest.raises(DeletionVectorError, match=r"malformed .* of data file f\.parquet: "):
        DeletionVectorDescriptor.from_json({"storageType": "u"}, "f.parquet")


def _checkpoint_part(path: Path, adds: list[dict | None]) -> None:
    vector = pa.struct(
        [
            ("storageType", pa.string()),
            ("pathOrInlineDv", pa.string()),
            ("offset", pa.int32()),
            ("sizeInBytes", pa.int32()),
            ("cardinality", pa.int64()),
        ]
    )
    add = pa.struct([("path", pa.string()), ("deletionVector", vector)])
    pq.write_table(pa.table({"add": pa.array(adds, add)}), path)


def test_a_complete_multi_part_checkpoint_is_found_beside_an_incomplete_one(tmp_path):
    """Version 1 has a complete 2-part checkpoint and 2 of 3 parts of another; version 0
    was cleaned up, so only the complete checkpoint rebuilds version 1."""
    inline = DeletionVectorDescriptor("i", PROTOCOL_INLINE, 40, 6).to_json()
    _hand_made_log(tmp_path, {1: [], 2: [{"remove": {"path": "b.parquet", "dataChange": True}}]})
    log = tmp_path / "_delta_log"
    stem = f"{1:020d}.checkpoint"
    _checkpoint_part(log / f"{stem}.0000000001.0000000003.parquet", [None])
    _checkpoint_part(log / f"{stem}.0000000002.0000000003.parquet", [None])
    _checkpoint_part(
        log / f"{stem}.0000000001.0000000002.parquet",
        [{"path": "a%20b.parquet", "deletionVector": inline}, None],
    )
    _checkpoint_part(
        log / f"{stem}.0000000002.0000000002.parquet",
        [{"path": "b.parquet", "deletionVector": inline}, {"path": "c.parquet"}],
    )
    location = TableLocation.of(str(tmp_path))
    expected = DeletionVectorDescriptor.from_json(inline)
    assert live_deletion_vectors(location, 1) == {"a b.parquet": expected, "b.parquet": expected}
    assert live_deletion_vectors(location, 2) == {"a b.parquet": expected}
