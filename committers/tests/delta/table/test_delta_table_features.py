"""Tables made by another tool (delta-rs, or hand-written logs where delta-rs cannot create the
feature): every writer feature is honoured or the table is refused, on the local file system and
on the S3 server. Rows are read back with deltalake (pyarrow dataset and its SQL engine) and,
locally, with DuckDB's delta extension."""

from __future__ import annotations

import datetime
import json
import time
import uuid
from dataclasses import dataclass, field

import pyarrow as pa
import pytest
from deltalake import DeltaTable, Field, QueryBuilder, Schema, write_deltalake
from deltalake.schema import StructType

from committers.delta import DeltaSink, UnsupportedTableFeatureError
from committers.delta.storage._storage import TableLocation
from committers.delta.table._snapshot import last_version_at_or_before
from committers.tests._delta_helpers import epoch, stage
from committers.tests._readers import duckdb_rows
from framework import TwoPhaseSink
from framework.errors import (
    ConstraintViolationError,
    NullConstraintError,
    SchemaMismatchError,
    StaleStagingError,
    UnsupportedTypeError,
)

pytestmark = pytest.mark.spark


@dataclass
class Place:
    """Where a test table lives, and the options reaching it."""

    root: str
    options: dict[str, str] = field(default_factory=dict)

    def uri(self, name: str) -> str:
        return f"{self.root}/{name}-{uuid.uuid4().hex[:8]}"

    @property
    def local(self) -> bool:
        return "://" not in self.root

    def create(self, name: str, fields: list[Field], **kwargs) -> str:
        uri = self.uri(name)
        DeltaTable.create(uri, schema=Schema(fields), storage_options=self.options, **kwargs)
        return uri

    def table(self, uri: str) -> DeltaTable:
        return DeltaTable(uri, storage_options=self.options)

    def sink(self, uri: str, **kwargs) -> TwoPhaseSink:
        return TwoPhaseSink(
            DeltaSink(uri, app_id="features", storage_options=self.options, **kwargs)
        )

    def rows(self, uri: str, dataset: bool = True, duckdb: bool = True) -> list[dict]:
        """Rows read by every independent reader available here; they must all agree.

        ``dataset=False`` skips deltalake's pyarrow dataset, which cannot read column-mapped
        tables (it returns nulls, whoever wrote the files) nor deletion-vector tables."""
        table = self.table(uri)
        by_sql = pa.table(QueryBuilder().register("t", table).execute("SELECT * FROM t").read_all())
        readers = [by_sql.to_pylist()]
        if dataset:
            readers.append(table.to_pyarrow_table().to_pylist())
        if self.local and duckdb:
            readers.append(duckdb_rows(uri))
        normalized = [sorted(rows, key=repr) for rows in readers]
        for other in normalized[1:]:
            assert other == normalized[0]
        return normalized[0]


@pytest.fixture(params=["local", "s3"])
def place(request, tmp_path) -> Place:
    if request.param == "local":
        return Place(str(tmp_path))
    s3 = request.getfixturevalue("s3")
    bucket = request.getfixturevalue("bucket")
    return Place(f"s3://{bucket}/features", s3.storage_options())


def _frame(spark, rows, ddl):
    return spark.createDataFrame(rows, ddl)


def _unchanged(place: Place, uri: str, version: int, rows: list[dict]) -> None:
    assert place.table(uri).version() == version
    assert place.rows(uri) == rows


def test_check_constraint_is_enforced(spark, place):
    uri = place.create("check", [Field("id", "long"), Field("amount", "double")])
    place.table(uri).alter.add_constraint({"positive": "amount > 0"})
    place.sink(uri).write(_frame(spark, [(1, 5.0)], "id BIGINT, amount DOUBLE"))
    before = place.rows(uri)
    assert before == [{"id": 1, "amount": 5.0}]
    for bad in ([(2, 1.0), (3, -100.0)], [(4, None)]):
        with pytest.raises(
            ConstraintViolationError, match=r"CHECK constraint positive \(amount > 0\)"
        ):
            place.sink(uri).write(_frame(spark, bad, "id BIGINT, amount DOUBLE"))
        _unchanged(place, uri, 2, before)


def test_the_violation_names_the_offending_values(spark, place):
    uri = place.create("check-msg", [Field("id", "long"), Field("amount", "double")])
    place.table(uri).alter.add_constraint({"positive": "amount > 0"})
    with pytest.raises(ConstraintViolationError, match=r"id = 3, amount = -100\.0"):
        place.sink(uri).write(_frame(spark, [(3, -100.0)], "id BIGINT, amount DOUBLE"))


def test_generated_column_is_computed_when_absent_and_checked_when_given(spark, place):
    doubled = Field("doubled", "double", metadata={"delta.generationExpression": "amount * 2"})
    uri = place.create("generated", [Field("amount", "double"), doubled])
    place.sink(uri).write(_frame(spark, [(1.5,), (None,)], "amount DOUBLE"))
    place.sink(uri).write(_frame(spark, [(4.0, 8.0)], "amount DOUBLE, doubled DOUBLE"))
    expected = [
        {"amount": 1.5, "doubled": 3.0},
        {"amount": 4.0, "doubled": 8.0},
        {"amount": None, "doubled": None},
    ]
    assert place.rows(uri) == sorted(expected, key=repr)
    with pytest.raises(ConstraintViolationError, match=r"generated column 'doubled' = amount \* 2"):
        place.sink(uri).write(_frame(spark, [(5.0, 999.0)], "amount DOUBLE, doubled DOUBLE"))
    assert place.table(uri).version() == 2


@pytest.mark.parametrize("mode", ["name", "id"])
def test_column_mapping_writes_physical_names_ids_and_stats(spark, place, mode):
    nested = StructType([Field("x", "long"), Field("y y", "string")])
    uri = place.create(
        f"mapped-{mode}",
        [Field("id", "long"), Field("a.b", "string"), Field("s", nested), Field("day", "string")],
        partition_by=["day"],
        configuration={"delta.columnMapping.mode": mode},
    )
    ddl = "id BIGINT, `a.b` STRING, s STRUCT<x: BIGINT, `y y`: STRING>, day STRING"
    place.sink(uri).write(_frame(spark, [(1, "one", (10, "ten"), "d1")], ddl))
    # delta-rs appends to the same table: both writers' rows must read back whole.
    other = pa.table(
        {
            "id": [2],
            "a.b": ["two"],
            "s": [{"x": 20, "y y": "twenty"}],
            "day": ["d2"],
        }
    )
    write_deltalake(uri, other, mode="append", storage_options=place.options)
    # DuckDB 1.5.5 reads every partition value of a column-mapped table as null, delta-rs's
    # own rows included: it reads the data columns only.
    rows = place.rows(uri, dataset=False, duckdb=False)
    if place.local:
        data_only = [{k: v for k, v in r.items() if k != "day"} for r in rows]
        duck = [{k: v for k, v in r.items() if k != "day"} for r in duckdb_rows(uri)]
        assert sorted(duck, key=repr) == sorted(data_only, key=repr)
    assert rows == [
        {"id": 1, "a.b": "one", "s": {"x": 10, "y y": "ten"}, "day": "d1"},
        {"id": 2, "a.b": "two", "s": {"x": 20, "y y": "twenty"}, "day": "d2"},
    ]
    table = place.table(uri)
    fields = {f["name"]: f for f in json.loads(table.schema().to_json())["fields"]}
    physical = {
        name: f["metadata"]["delta.columnMapping.physicalName"] for name, f in fields.items()
    }
    ours = [a for a in _adds(place, uri) if a["partitionValues"].get(physical["day"]) == "d1"]
    assert len(ours) == 1
    stats = json.loads(ours[0]["stats"])
    assert stats["minValues"][physical["id"]] == 1
    assert stats["minValues"][physical["a.b"]] == "one"
    assert set(stats["nullCount"]) == {physical[n] for n in ("id", "a.b", "s")}
    # Stats pruning on the physical names gives the right answer, too.
    query = 'SELECT "a.b" FROM t WHERE id = 1'
    filtered = pa.table(QueryBuilder().register("t", table).execute(query).read_all())
    assert filtered.column(0).to_pylist() == ["one"]


def _adds(place: Place, uri: str) -> list[dict]:
    table = place.table(uri)
    adds = []
    for version in range(table.version() + 1):
        path = f"{uri}/_delta_log/{version:020d}.json"
        fs = TableLocation.of(uri, place.options or None).filesystem()
        with fs.open(path.replace("s3://", "") if not place.local else path, "rb") as src:
            for line in src.read().decode().splitlines():
                action = json.loads(line)
                if "add" in action:
                    adds.append(action["add"])
    return adds


def test_invariant_is_enforced(spark, place):
    invariant = json.dumps({"expression": {"expression": "amount > 0"}})
    uri = place.create(
        "invariant", [Field("amount", "double", metadata={"delta.invariants": invariant})]
    )
    place.sink(uri).write(_frame(spark, [(1.0,)], "amount DOUBLE"))
    with pytest.raises(
        ConstraintViolationError, match=r"invariant of column 'amount' \(amount > 0\)"
    ):
        place.sink(uri).write(_frame(spark, [(-1.0,)], "amount DOUBLE"))
    _unchanged(place, uri, 1, [{"amount": 1.0}])


def test_nested_not_null_is_enforced(spark, place):
    nested = StructType([Field("x", "long", nullable=False)])
    uri = place.create("nested", [Field("id", "long"), Field("s", nested)])
    ddl = "id BIGINT, s STRUCT<x: BIGINT>"
    place.sink(uri).write(_frame(spark, [(1, (1,)), (2, None)], ddl))
    with pytest.raises(NullConstraintError, match=r"NOT NULL column 's\.x'"):
        place.sink(uri).write(_frame(spark, [(3, (None,))], ddl))
    _unchanged(place, uri, 1, [{"id": 1, "s": {"x": 1}}, {"id": 2, "s": None}])


def test_append_only_cdf_and_deletion_vector_tables_take_appends(spark, place):
    uri = place.create(
        "features",
        [Field("id", "long")],
        configuration={
            "delta.appendOnly": "true",
            "delta.enableChangeDataFeed": "true",
            "delta.enableDeletionVectors": "true",
        },
    )
    place.sink(uri).write(_frame(spark, [(1,), (2,)], "id BIGINT"))
    assert place.rows(uri, dataset=False) == [{"id": 1}, {"id": 2}]
    changes = pa.table(place.table(uri).load_cdf(starting_version=0).read_all()).to_pylist()
    assert sorted((c["id"], c["_change_type"]) for c in changes) == [(1, "insert"), (2, "insert")]


def test_timestamp_ntz_table(spark, place):
    uri = place.create("ntz", [Field("t", "timestamp_ntz")])
    value = datetime.datetime(9999, 12, 31, 23, 59, 59, 999999)
    place.sink(uri).write(_frame(spark, [(value,)], "t TIMESTAMP_NTZ"))
    assert place.rows(uri) == [{"t": value}]


_SCHEMA_STRING = json.dumps(
    {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]}
)


def _hand_written_table(
    place: Place,
    name: str,
    protocol: dict,
    schema: str = _SCHEMA_STRING,
    configuration: dict | None = None,
    in_commit_timestamp: int | None = None,
) -> str:
    """A table whose first commit is written by hand, for features delta-rs cannot create."""
    uri = place.uri(name)
    location = TableLocation.of(uri, place.options or None)
    stamp = {} if in_commit_timestamp is None else {"inCommitTimestamp": in_commit_timestamp}
    actions = [
        {"commitInfo": {**stamp, "timestamp": 0, "operation": "CREATE TABLE"}},
        {"protocol": protocol},
        {
            "metaData": {
                "id": str(uuid.uuid4()),
                "format": {"provider": "parquet", "options": {}},
                "schemaString": schema,
                "partitionColumns": [],
                "configuration": configuration or {},
                "createdTime": 0,
            }
        },
    ]
    fs = location.filesystem()
    fs.makedirs(location.path("_delta_log"), exist_ok=True)
    with fs.open(location.path(f"_delta_log/{0:020d}.json"), "wb") as out:
        out.write("\n".join(json.dumps(a) for a in actions).encode() + b"\n")
    return uri


@pytest.mark.parametrize(
    "features",
    [
        ["variantShredding-preview"],
        ["icebergCompatV2"],
        ["someFutureFeature"],
    ],
)
def test_features_the_sink_cannot_honour_are_refused(spark, place, features):
    protocol = {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        # (a reader-writer one)
        "readerFeatures": [f for f in features if f == "variantShredding-preview"],
        "writerFeatures": features,
    }
    uri = _hand_written_table(place, "refused", protocol)
    with pytest.raises(UnsupportedTableFeatureError, match=features[0]) as caught:
        place.sink(uri).write(_frame(spark, [(1,)], "id BIGINT"))
    assert "nothing was written" in str(caught.value)
    assert place.table(uri).version() == 0
    fs = TableLocation.of(uri, place.options or None).filesystem()
    root = uri.replace("s3://", "") if not place.local else uri
    assert [p for p in fs.find(root) if "/_delta_log/" not in p] == []


def test_in_commit_timestamps_follow_the_previous_commits(spark, place):
    """Every commit to a table with in-commit timestamps starts with one after the previous
    commit's (here an hour ahead of this clock), and time travel resolves by them."""
    ahead = int(time.time() * 1000) + 3_600_000
    protocol = {
        "minReaderVersion": 1,
        "minWriterVersion": 7,
        "writerFeatures": ["inCommitTimestamp"],
    }
    uri = _hand_written_table(
        place,
        "ict",
        protocol,
        configuration={"delta.enableInCommitTimestamps": "true"},
        in_commit_timestamp=ahead,
    )
    sink = place.sink(uri)
    sink.write(_frame(spark, [(1,)], "id BIGINT"), epoch_id=0)
    sink.write(_frame(spark, [(2,)], "id BIGINT"), epoch_id=1)
    location = TableLocation.of(uri, place.options or None)
    fs = location.filesystem()
    for version in (1, 2):
        with fs.open(location.path(f"_delta_log/{version:020d}.json")) as commit:
            first = json.loads(commit.readline())
        assert first["commitInfo"]["inCommitTimestamp"] == ahead + version
    when = datetime.datetime.fromtimestamp((ahead + 1) / 1000, datetime.timezone.utc)
    assert last_version_at_or_before(location, when, "timestampAsOf") == 1
    assert place.rows(uri) == [{"id": 1}, {"id": 2}]


def test_a_variant_column_is_refused_by_type(spark, place):
    schema = json.dumps(
        {
            "type": "struct",
            "fields": [
                {"name": "id", "type": "long", "nullable": True, "metadata": {}},
                {"name": "payload", "type": "variant", "nullable": True, "metadata": {}},
            ],
        }
    )
    protocol = {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": ["variantType"],
        "writerFeatures": ["variantType"],
    }
    uri = _hand_written_table(place, "variant", protocol, schema)
    with pytest.raises(UnsupportedTypeError, match="cannot write Delta type 'variant'"):
        place.sink(uri).write(_frame(spark, [(1,)], "id BIGINT"))
    assert place.table(uri).version() == 0


_IDENTITY_SCHEMA = json.dumps(
    {
        "type": "struct",
        "fields": [
            {
                "name": "id",
                "type": "long",
                "nullable": True,
                "metadata": {
                    "delta.identity.start": 1,
                    "delta.identity.step": 1,
                    "delta.identity.allowExplicitInsert": False,
                },
            },
            {"name": "v", "type": "long", "nullable": True, "metadata": {}},
        ],
    }
)


def _identity_mark(place: Place, uri: str) -> int | None:
    fields = json.loads(place.table(uri).schema().to_json())["fields"]
    return fields[0]["metadata"].get("delta.identity.highWaterMark")


def test_legacy_writer_version_6_means_identity_columns_whose_values_appends_generate(spark, place):
    """Writer version 6 implies identity columns: the sink's log writer (local and S3) commits
    the generated values with the metaData that advances the mark, twice."""
    uri = _hand_written_table(
        place, "v6", {"minReaderVersion": 1, "minWriterVersion": 6}, _IDENTITY_SCHEMA
    )
    place.sink(uri).write(_frame(spark, [(10,), (11,)], "v BIGINT"))
    assert _identity_mark(place, uri) == 2
    place.sink(uri).write(_frame(spark, [(12,)], "v BIGINT"), epoch_id=1)
    assert place.table(uri).version() == 2
    # the one row is in the second of the DataFrame's two partitions: value 3 + 1 (a gap)
    assert _identity_mark(place, uri) == 4
    assert place.rows(uri) == [{"id": 1, "v": 10}, {"id": 2, "v": 11}, {"id": 4, "v": 12}]


def test_new_columns_for_an_identity_table_are_refused(spark, tmp_path):
    place = Place(str(tmp_path))
    uri = _hand_written_table(
        place, "v6", {"minReaderVersion": 1, "minWriterVersion": 6}, _IDENTITY_SCHEMA
    )
    with pytest.raises(SchemaMismatchError, match=r"new columns \['x'\].*identity columns"):
        place.sink(uri, schema_mode="merge").write(_frame(spark, [(1, 2)], "v BIGINT, x INT"))
    assert place.table(uri).version() == 0


def test_a_rule_added_while_staging_fails_the_commit(place, tmp_path):
    """The committer re-plans on the table it commits to: a constraint added after the rows
    were checked stops the commit as stale, nothing lands (TwoPhaseSink then stages the
    batch again: test_interop_alter_while_writing.py)."""
    uri = place.create("late-rule", [Field("id", "long"), Field("amount", "double")])
    sink = DeltaSink(uri, app_id="late", storage_options=place.options)
    schema = pa.schema([("id", pa.int64()), ("amount", pa.float64())])
    sink.prepare(schema)
    ep = epoch(0, app_id="late")
    files = stage(
        sink, ep, [pa.RecordBatch.from_pydict({"id": [1], "amount": [-5.0]}, schema=schema)]
    )
    place.table(uri).alter.add_constraint({"positive": "amount > 0"})
    committer = sink.create_global_committer()
    with pytest.raises(StaleStagingError, match="changed while batch 0"):
        committer.commit([committer.combine(ep, files)])
    committer.abort(ep)
    assert place.table(uri).version() == 1  # the constraint only
    assert place.rows(uri) == []
