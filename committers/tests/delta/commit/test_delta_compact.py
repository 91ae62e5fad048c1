"""Compaction (``DeltaSink.compact``): the same rows in fewer files, one ``dataChange=false``
commit without a txn, safe against concurrent appends and compactions, clean on failure.

Rows are compared before and after with deltalake and DuckDB's delta extension."""

from __future__ import annotations

import datetime
import decimal
import json
import os
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, Field, QueryBuilder, Schema, write_deltalake
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import CommitProperties, RemoveAction

from committers.delta import DeltaSink, UnsupportedTableFeatureError
from committers.delta.commit._compact import (
    COMMIT_OPERATION,
    MIN_TARGET_FILE_SIZE,
    CompactionConflictError,
    compact_table,
)
from committers.delta.commit._compact_plan import CompactionFile, bin_pack
from committers.delta.spark._spark_staging import RUN_DIR_PREFIX
from committers.delta.storage._staging import STAGING_DIR
from committers.delta.table._table import delta_rs_path
from committers.tests._readers import duckdb_rows
from framework import TwoPhaseSink
from framework.errors import (
    CommitConflictError,
    ConfigurationError,
    NotATableError,
    StagingError,
)

pytestmark = pytest.mark.spark

MIB = 1024 * 1024


@pytest.fixture(params=["arrow", "spark"])
def staging(request) -> str:
    """Who rewrites the files: Python tasks with pyarrow (the default) or Spark itself."""
    return request.param


# -- helpers --------------------------------------------------------------------------------


def _sorted(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: json.dumps(r, default=str, sort_keys=True))


def _rows(uri: str) -> tuple[list[dict], list[dict]]:
    """Every row as deltalake and as DuckDB read it, each sorted."""
    return _sorted(DeltaTable(uri).to_pyarrow_table().to_pylist()), _sorted(duckdb_rows(uri))


def _live(uri: str) -> dict[str, dict]:
    """Live files (as the log names them) -> their add action, from the log itself."""
    live: dict[str, dict] = {}
    for version in range(DeltaTable(uri).version() + 1):
        for action in _actions(uri, version):
            if "add" in action:
                live[action["add"]["path"]] = action["add"]
            elif "remove" in action:
                live.pop(action["remove"]["path"], None)
    return live


def _actions(uri: str, version: int) -> list[dict]:
    text = (Path(uri) / "_delta_log" / f"{version:020d}.json").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _versions(uri: str) -> list[int]:
    return sorted(int(p.name[:20]) for p in (Path(uri) / "_delta_log").glob("*.json"))


def _files_on_disk(uri: str) -> set[str]:
    root = Path(uri)
    return {
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and not p.relative_to(root).as_posix().startswith("_delta_log/")
    }


def _leftovers(uri: str) -> list[str]:
    """Staging manifests and run directories that hold no file the log names."""
    from urllib.parse import unquote

    named = {
        unquote(a[kind]["path"])
        for version in _versions(uri)
        for a in _actions(uri, version)
        for kind in ("add", "remove")
        if kind in a
    }
    staging = [f for f in _files_on_disk(uri) if f.startswith(STAGING_DIR + "/")]
    stray = [f for f in _files_on_disk(uri) - named if not f.startswith(STAGING_DIR + "/")]
    runs = [p.name for p in Path(uri).iterdir() if p.name.startswith(RUN_DIR_PREFIX)]
    empty_runs = [r for r in runs if not any((Path(uri) / r).rglob("*.parquet"))]
    return staging + stray + empty_runs


def _write_small_files(uri: str, batches: int, partition_by=("day",)) -> None:
    """``batches`` delta-rs appends: one small file per partition each (null partition too)."""
    for b in range(batches):
        ids = list(range(b * 6, b * 6 + 6))
        write_deltalake(
            uri,
            pa.table(
                {
                    "id": pa.array(ids, pa.int64()),
                    "s": [None if i % 5 == 0 else f"v{i}" for i in ids],
                    "amount": pa.array([decimal.Decimal(i) / 4 for i in ids], pa.decimal128(10, 2)),
                    "ts": pa.array(
                        [
                            datetime.datetime(2026, 11, 21, i % 24, tzinfo=datetime.timezone.utc)
                            for i in ids
                        ],
                        pa.timestamp("us", "UTC"),
                    ),
                    "day": [None if i % 3 == 0 else f"d{i % 3}" for i in ids],
                }
            ),
            mode="append",
            partition_by=list(partition_by) or None,
        )


def _compaction_commits(uri: str) -> list[int]:
    return [
        v
        for v in _versions(uri)
        if any(a.get("commitInfo", {}).get(COMMIT_OPERATION) for a in _actions(uri, v))
    ]


# -- the main guarantees --------------------------------------------------------------------


def test_same_rows_fewer_files_one_data_change_false_commit_without_txn(spark, tmp_path, staging):
    uri = str(tmp_path / "t")
    _write_small_files(uri, batches=5)
    before = _rows(uri)
    files_before = _live(uri)
    partitions_before = {json.dumps(a["partitionValues"]) for a in files_before.values()}
    assert len(files_before) == 15  # 3 partitions (d1, d2, null) x 5 appends

    result = DeltaSink(uri, staging=staging).compact(spark, target_file_size=MIB)

    assert _rows(uri) == before
    files_after = _live(uri)
    assert len(files_after) == 3  # one per partition
    assert {json.dumps(a["partitionValues"]) for a in files_after.values()} == partitions_before
    assert {"day": None} in [a["partitionValues"] for a in files_after.values()]
    assert result.version == 5 and result.read_version == 4
    assert (result.files_removed, result.files_added, result.rows) == (15, 3, 30)
    assert result.bytes_before == sum(a["size"] for a in files_before.values())
    assert result.bytes_after == sum(a["size"] for a in files_after.values())

    actions = _actions(uri, result.version)
    kinds = sorted({next(iter(a)) for a in actions})
    assert kinds == ["add", "commitInfo", "remove"]  # no txn, no metaData, no protocol
    adds = [a["add"] for a in actions if "add" in a]
    removes = [a["remove"] for a in actions if "remove" in a]
    assert len(adds) == 3 and len(removes) == 15
    assert all(a["dataChange"] is False for a in adds + removes)
    assert {r["path"] for r in removes} == set(files_before)
    assert all(r["size"] == files_before[r["path"]]["size"] for r in removes)
    assert all(r["partitionValues"] == files_before[r["path"]]["partitionValues"] for r in removes)
    assert all(json.loads(a["stats"])["numRecords"] > 0 for a in adds)
    info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
    assert info[COMMIT_OPERATION] == "compaction"
    assert info["operationParameters"]["compaction"] == "true"
    assert info["operationMetrics"]["numRemovedFiles"] == "15"
    assert info["isBlindAppend"] is False and info["readVersion"] == 4
    assert "sink.appId" not in info
    assert _leftovers(uri) == []

    # Nothing left to do: no second commit.
    again = DeltaSink(uri, staging=staging).compact(spark, target_file_size=MIB)
    assert again.version is None and again.files_removed == 0
    assert DeltaTable(uri).version() == 5


def test_sink_written_table_keeps_typed_and_escaped_partition_values(spark, tmp_path, staging):
    uri = str(tmp_path / "sink")
    names = ["a b", "x%2By", "c/d=e:f", "é+ü", None]
    sink = TwoPhaseSink(DeltaSink(uri, app_id="w", partition_by=["ts", "name"], staging="spark"))
    for n in range(2):
        df = spark.createDataFrame(
            [
                (n * 100 + i, names[i % len(names)], datetime.datetime(2026, 11, 21, 10, 0, i % 2))
                for i in range(10)
            ],
            "id BIGINT, name STRING, ts TIMESTAMP",
        )
        sink.write(df)
    before = _rows(uri)
    files_before = _live(uri)
    spellings = {json.dumps(a["partitionValues"], sort_keys=True) for a in files_before.values()}

    result = DeltaSink(uri, staging=staging).compact(spark, target_file_size=MIB)

    assert _rows(uri) == before
    files_after = _live(uri)
    assert {json.dumps(a["partitionValues"], sort_keys=True) for a in files_after.values()} == (
        spellings
    )
    assert len(files_after) == len(spellings) < len(files_before)
    assert result.files_removed == len(files_before)
    assert _leftovers(uri) == []


def test_partition_filter_compacts_only_the_chosen_partitions(spark, tmp_path):
    uri = str(tmp_path / "t")
    _write_small_files(uri, batches=3)
    before = _rows(uri)
    result = DeltaSink(uri).compact(spark, partition_filter=[("day", "=", "d1")])
    assert result.files_removed == 3 and result.files_added == 1
    live = _live(uri).values()
    assert sum(a["partitionValues"] == {"day": "d1"} for a in live) == 1
    assert sum(a["partitionValues"] == {"day": "d2"} for a in live) == 3
    assert _rows(uri) == before


@pytest.mark.smoke  # make check: the end-to-end test of its feature
def test_unpartitioned_table(spark, tmp_path, staging):
    uri = str(tmp_path / "t")
    _write_small_files(uri, batches=4, partition_by=())
    before = _rows(uri)
    result = DeltaSink(uri, staging=staging).compact(spark)
    assert (result.files_removed, result.files_added) == (4, 1)
    assert _rows(uri) == before
    assert [a["partitionValues"] for a in _live(uri).values()] == [{}]


def test_files_are_packed_up_to_the_target_in_several_groups_per_partition(
    spark, tmp_path, staging
):
    import base64

    uri = str(tmp_path / "t")
    for n in range(5):  # about 0.43 MiB each: groups of two under 1 MiB, one file left over
        ids = range(n * 4000, (n + 1) * 4000)
        text = [base64.b64encode(os.urandom(75)).decode() for _ in ids]
        batch = pa.table({"id": pa.array(ids, pa.int64()), "s": text, "day": ["a"] * len(text)})
        write_deltalake(uri, batch, mode="append", partition_by=["day"])
    before = _rows(uri)
    result = DeltaSink(uri, staging=staging).compact(spark, target_file_size=MIB)
    assert (result.files_removed, result.files_added) == (4, 2)
    assert len(_live(uri)) == 3
    assert all(a["size"] < 1.2 * MIB for a in _live(uri).values())
    assert _rows(uri) == before


def test_bin_packing_groups_files_up_to_the_target_and_leaves_single_files():
    files = [
        CompactionFile(f"f{i}", f"f{i}", size, 1, ()) for i, size in enumerate([5, 40, 45, 50, 90])
    ]
    groups = bin_pack((), files, target=100)
    assert [[f.path for f in g.files] for g in groups] == [["f0", "f1", "f2"]]  # 90 and 50 alone
    assert bin_pack((), files[:1], target=100) == []


def test_groups_are_spread_over_tasks_of_about_equal_bytes():
    from committers.delta.spark._arrow_rewrite import GroupToRewrite, _pack

    groups = [GroupToRewrite(i, ((f"f{i}", size),), ()) for i, size in enumerate([9, 5, 4, 3, 3])]
    tasks = _pack(groups, slots=2)
    assert sorted(g.index for task in tasks for g in task) == [0, 1, 2, 3, 4]  # each once
    assert sorted(sum(g.files[0][1] for g in task) for task in tasks) == [12, 12]
    assert len(_pack(groups[:1], slots=4)) == 1  # never an empty task


# -- concurrency ----------------------------------------------------------------------------


def test_a_concurrent_append_lands_and_the_compaction_commits_after_it(spark, tmp_path, staging):
    uri = str(tmp_path / "t")
    _write_small_files(uri, batches=3)
    attempts: list[int] = []

    def append_first(attempt: int) -> None:  # after the check, before our commit request
        attempts.append(attempt)
        if attempt == 1:
            write_deltalake(
                uri,
                pa.table(
                    {
                        "id": pa.array([1000, 1001], pa.int64()),
                        "s": ["late", "late"],
                        "amount": pa.array([decimal.Decimal(1)] * 2, pa.decimal128(10, 2)),
                        "ts": pa.array([None, None], pa.timestamp("us", "UTC")),
                        "day": ["d1", None],
                    }
                ),
                mode="append",
            )

    before = DeltaTable(uri).to_pyarrow_table().num_rows
    result = compact_table(
        spark,
        DeltaSink(uri).location,
        target_file_size=MIB,
        staging=staging,
        before_commit=append_first,
    )

    assert attempts == [1, 2]  # the first request lost the version to the append
    assert result.version == 4 and _compaction_commits(uri) == [4]
    rows, duck = _rows(uri)
    assert len(rows) == before + 2 == len(duck)
    assert sorted(r["id"] for r in rows if r["s"] == "late") == [1000, 1001]
    assert len({r["id"] for r in rows}) == len(rows)  # nothing doubled
    live = _live(uri).values()
    assert sum(a["dataChange"] for a in live) == 2  # the appended files, untouched
    assert _leftovers(uri) == []


def test_compactions_while_a_streaming_query_appends_keep_every_row_once(spark, tmp_path):
    uri = str(tmp_path / "t")
    stream = spark.readStream.format("rate").option("rowsPerSecond", 400).load()
    rows = stream.selectExpr("value AS id", "CAST(value % 3 AS STRING) AS day")
    sink = TwoPhaseSink(DeltaSink(uri, app_id="appender", partition_by=["day"]))
    query = sink.write_stream(
        rows,
        checkpoint_location=str(tmp_path / "chk"),
        trigger={"processingTime": "300 milliseconds"},
    )
    results = []
    try:
        deadline = time.monotonic() + 60
        while len([r for r in results if r.version is not None]) < 3:
            assert time.monotonic() < deadline, "no compaction committed within a minute"
            time.sleep(1)  # a few more micro-batches, a few more small files
            if DeltaTable.is_deltatable(uri):  # the first batch creates it
                results.append(DeltaSink(uri).compact(spark, target_file_size=MIB))
    finally:
        query.stop()
    table = DeltaTable(uri)
    ids = table.to_pyarrow_table(columns=["id"]).column("id").to_pylist()
    assert sorted(ids) == list(range(len(ids)))  # every generated row once: none lost, none doubled
    assert len(ids) == len(_rows(uri)[1])  # DuckDB reads the same count
    appended = [
        a for v in _versions(uri) for a in _actions(uri, v) if a.get("add", {}).get("dataChange")
    ]
    assert len(_live(uri)) < len(appended)  # file count down
    assert _leftovers(uri) == []


def test_a_concurrent_compaction_of_the_same_files_fails_the_second_cleanly(spark, tmp_path):
    uri = str(tmp_path / "t")
    _write_small_files(uri, batches=3)
    before = _rows(uri)
    location = DeltaSink(uri).location
    inner: list = []

    def other_compaction(attempt: int) -> None:
        if attempt == 1:
            inner.append(compact_table(spark, location, target_file_size=MIB))

    with pytest.raises(CompactionConflictError, match=r"removed .* by another commit") as caught:
        compact_table(spark, location, target_file_size=MIB, before_commit=other_compaction)

    assert isinstance(caught.value, CommitConflictError)
    assert inner[0].version == 3
    assert DeltaTable(uri).version() == 3 and _compaction_commits(uri) == [3]
    assert _rows(uri) == before
    assert len(_live(uri)) == 3
    assert _leftovers(uri) == []  # the loser's run directory and manifest are gone


# -- failures leave nothing -----------------------------------------------------------------


def _corrupt_one_file(uri: str) -> None:
    victim = Path(uri) / next(iter(_live(uri)))
    victim.write_bytes(b"not parquet" * 100)


def test_a_failed_rewrite_commits_nothing_and_leaves_no_files(spark, tmp_path, staging):
    uri = str(tmp_path / "t")
    _write_small_files(uri, batches=3)
    _corrupt_one_file(uri)  # the job fails on it
    failed = "failed while Spark rewrote" if staging == "spark" else "could not read"
    on_disk = _files_on_disk(uri)
    with pytest.raises(StagingError, match=failed):
        DeltaSink(uri, staging=staging).compact(spark, target_file_size=MIB)
    assert DeltaTable(uri).version() == 2
    assert _files_on_disk(uri) == on_disk

    os.remove(Path(uri) / next(iter(_live(uri))))  # missing (Spark: when the scan is planned)
    on_disk = _files_on_disk(uri)
    with pytest.raises(StagingError, match=failed):
        DeltaSink(uri, staging=staging).compact(spark, target_file_size=MIB)
    assert DeltaTable(uri).version() == 2
    assert _files_on_disk(uri) == on_disk


def test_rows_that_do_not_come_back_fail_the_compaction(spark, tmp_path):
    uri = str(tmp_path / "t")
    _write_small_files(uri, batches=3)
    _corrupt_one_file(uri)
    on_disk = _files_on_disk(uri)
    spark.conf.set("spark.sql.files.ignoreCorruptFiles", "true")  # Spark skips it silently
    try:
        with pytest.raises(StagingError, match="did not reproduce the rows"):
            DeltaSink(uri, staging="spark").compact(spark, target_file_size=MIB)
    finally:
        spark.conf.unset("spark.sql.files.ignoreCorruptFiles")
    assert DeltaTable(uri).version() == 2
    assert _files_on_disk(uri) == on_disk


# -- nothing to do, bad input, refused tables -----------------------------------------------


def test_nothing_to_do_commits_nothing(spark, tmp_path):
    empty = str(tmp_path / "empty")
    DeltaTable.create(empty, schema=Schema([Field("id", "long")]))
    assert DeltaSink(empty).compact(spark).version is None
    assert _versions(empty) == [0]

    one_per_partition = str(tmp_path / "one")
    _write_small_files(one_per_partition, batches=1)
    result = DeltaSink(one_per_partition).compact(spark)
    assert (result.version, result.read_version, result.files_removed) == (None, 0, 0)
    assert _versions(one_per_partition) == [0]


def test_a_path_that_is_not_a_table_is_refused(spark, tmp_path):
    with pytest.raises(NotATableError, match=r"is not a Delta table \(no _delta_log there\)"):
        DeltaSink(str(tmp_path / "missing")).compact(spark)
    assert not (tmp_path / "missing").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(NotATableError, match="compaction rewrites the files of an existing"):
        DeltaSink(str(tmp_path / "empty")).compact(spark)
    assert list((tmp_path / "empty").iterdir()) == []
    plain = tmp_path / "plain"
    plain.mkdir()
    pq.write_table(pa.table({"id": [1]}), plain / "data.parquet")
    with pytest.raises(NotATableError, match="is not a Delta table"):
        DeltaSink(str(plain)).compact(spark)
    assert [p.name for p in plain.iterdir()] == ["data.parquet"]


@pytest.mark.parametrize("size", [0, -1, 1000, MIN_TARGET_FILE_SIZE - 1, True, 2.5, "big"])
def test_bad_target_file_size(spark, tmp_path, size):
    with pytest.raises(ConfigurationError, match=r"target_file_size must be .* at least"):
        DeltaSink(str(tmp_path / "t")).compact(spark, target_file_size=size)


def test_partition_filter_must_name_partition_columns(spark, tmp_path):
    uri = str(tmp_path / "t")
    _write_small_files(uri, batches=2)
    sink = DeltaSink(uri)
    with pytest.raises(ConfigurationError, match="'id', which is not a partition column"):
        sink.compact(spark, partition_filter=[("id", "=", "1")])
    with pytest.raises(ConfigurationError, match=r"list of \(column, op, value\) tuples"):
        sink.compact(spark, partition_filter="day = 'd1'")
    with pytest.raises(ConfigurationError, match="is invalid"):
        sink.compact(spark, partition_filter=[("day", "~~", "d1")])

    flat = str(tmp_path / "flat")
    _write_small_files(flat, batches=2, partition_by=())
    with pytest.raises(ConfigurationError, match="not partitioned"):
        DeltaSink(flat).compact(spark, partition_filter=[("day", "=", "d1")])
    assert DeltaTable(uri).version() == 1 and DeltaTable(flat).version() == 1


@pytest.mark.parametrize("staging", ["arrow", "spark"])
def test_column_mapped_tables_are_compacted_under_physical_names(spark, tmp_path, staging):
    """A table delta-rs made column-mapped: the Python tasks and Spark's writer both rewrite
    its files under the physical names, with the field ids."""
    uri = str(tmp_path / "t")
    configuration = {"delta.columnMapping.mode": "name"}
    DeltaTable.create(uri, schema=Schema([Field("id", "long")]), configuration=configuration)
    for n in range(2):
        write_deltalake(uri, pa.table({"id": pa.array([n], pa.int64())}), mode="append")
    assert DeltaSink(uri, staging=staging).compact(spark).version == 3
    table = DeltaTable(uri)
    (field,) = json.loads(table.schema().to_json())["fields"]
    (added,) = table.file_uris()
    written = pq.read_schema(added.replace("file://", ""))
    assert written.names == [field["metadata"]["delta.columnMapping.physicalName"]]
    assert (
        written.field(0).metadata[b"PARQUET:field_id"]
        == b"%d" % (field["metadata"]["delta.columnMapping.id"])
    )
    query = QueryBuilder().register("t", table).execute("SELECT id FROM t ORDER BY id")
    assert pa.table(query).to_pylist() == [{"id": 0}, {"id": 1}]


def test_append_only_table_and_its_change_feed_see_no_change(spark, tmp_path):
    uri = str(tmp_path / "t")
    DeltaTable.create(
        uri,
        schema=Schema([Field("id", "long")]),
        configuration={"delta.appendOnly": "true", "delta.enableChangeDataFeed": "true"},
    )
    for n in range(3):
        write_deltalake(uri, pa.table({"id": pa.array([n], pa.int64())}), mode="append")
    before = _rows(uri)
    result = DeltaSink(uri).compact(spark)
    assert (result.version, result.files_removed, result.files_added) == (4, 3, 1)
    assert _rows(uri) == before
    changes = DeltaTable(uri).load_cdf(starting_version=4).read_all()
    assert changes.num_rows == 0  # dataChange=false: nothing for change readers


def test_tables_the_sink_refuses_get_the_sinks_error(spark, tmp_path):
    uri = str(tmp_path / "future")
    field = {"name": "id", "type": "long", "nullable": True, "metadata": {}}
    schema = {"type": "struct", "fields": [field]}
    log_dir = Path(uri) / "_delta_log"
    log_dir.mkdir(parents=True)
    actions = [
        {"commitInfo": {"timestamp": 0, "operation": "CREATE TABLE"}},
        {
            "protocol": {
                "minReaderVersion": 1,
                "minWriterVersion": 7,
                "writerFeatures": ["someFutureFeature"],
            }
        },
        {
            "metaData": {
                "id": str(uuid.uuid4()),
                "format": {"provider": "parquet", "options": {}},
                "schemaString": json.dumps(schema),
                "partitionColumns": [],
                "configuration": {},
                "createdTime": 0,
            }
        },
    ]
    (log_dir / f"{0:020d}.json").write_text("\n".join(json.dumps(a) for a in actions) + "\n")
    with pytest.raises(UnsupportedTableFeatureError) as from_sink:
        DeltaSink(uri).prepare(pa.schema([("id", pa.int64())]))
    with pytest.raises(UnsupportedTableFeatureError) as from_compaction:
        DeltaSink(uri).compact(spark)
    assert str(from_compaction.value) == str(from_sink.value)


def test_what_only_spark_cannot_rewrite_is_refused_with_staging_spark_and_done_in_python(
    spark, monkeypatch, tmp_path
):
    from deltalake.schema import StructType

    import committers.delta.commit._compact_rewrite as compact_module

    uri = str(tmp_path / "t")
    _write_small_files(uri, batches=2)
    before = _rows(uri)
    monkeypatch.setattr(compact_module, "hadoop_can_write", lambda df, uri: False)
    with pytest.raises(ConfigurationError, match="Spark cannot write"):
        DeltaSink(uri, staging="spark").compact(spark)
    assert DeltaTable(uri).version() == 1
    assert DeltaSink(uri).compact(spark).files_removed == 6  # Python tasks need no Hadoop
    assert _rows(uri) == before
    monkeypatch.undo()

    nested = str(tmp_path / "nested")  # NOT NULL inside a struct: Spark's writer drops it
    inner = StructType([Field("x", "long", nullable=False), Field("y", "string")])
    DeltaTable.create(nested, schema=Schema([Field("id", "long"), Field("s", inner)]))
    struct = pa.struct([pa.field("x", pa.int64(), nullable=False), pa.field("y", pa.string())])
    for n in range(2):
        data = pa.table(
            {
                "id": pa.array([n], pa.int64()),
                "s": pa.array([{"x": n, "y": None}], struct),
            }
        )
        write_deltalake(nested, data, mode="append")
    before = _rows(nested)
    with pytest.raises(ConfigurationError, match="NOT NULL fields inside structs"):
        DeltaSink(nested, staging="spark").compact(spark)
    result = DeltaSink(nested).compact(spark)
    assert (result.files_removed, result.files_added) == (2, 1)
    assert _rows(nested) == before  # deltalake reads the rewritten file (and DuckDB)


def test_files_whose_logged_path_delta_rs_would_spell_differently_are_left_alone(spark, tmp_path):
    """A remove names its file by the path delta-rs spells; a log written by another tool may
    spell the same file otherwise, and then the remove would miss it (rows doubled)."""
    uri = str(tmp_path / "t")
    for n in range(2):
        write_deltalake(uri, pa.table({"id": pa.array([n], pa.int64())}), mode="append")
    (Path(uri) / "dir x").mkdir()
    foreign = Path(uri) / "dir x" / "f+é.parquet"
    pq.write_table(pa.table({"id": pa.array([7], pa.int64())}), foreign)
    add = {
        "path": "dir%20x/f+é.parquet",  # delta-rs would write dir%20x/f+%C3%A9.parquet
        "partitionValues": {},
        "size": foreign.stat().st_size,
        "modificationTime": int(time.time() * 1000),
        "dataChange": True,
        "stats": json.dumps({"numRecords": 1}),
    }
    (Path(uri) / "_delta_log" / f"{2:020d}.json").write_text(
        json.dumps({"commitInfo": {"operation": "WRITE"}}) + "\n" + json.dumps({"add": add}) + "\n",
        encoding="utf-8",
    )
    before = _rows(uri)
    result = DeltaSink(uri).compact(spark)
    assert (result.files_removed, result.files_added) == (2, 1)
    assert _rows(uri) == before
    assert "dir%20x/f+é.parquet" in _live(uri)


# -- what delta-rs does, which the design relies on -----------------------------------------


def _remove(path: str) -> RemoveAction:
    return RemoveAction(path=path, data_change=False, deletion_timestamp=int(time.time() * 1000))


def test_delta_rs_neither_checks_removes_nor_rebases_with_zero_retries(tmp_path):
    uri = str(tmp_path / "t")
    for n in range(2):
        write_deltalake(uri, pa.table({"id": pa.array([n], pa.int64())}), mode="append")
    first, second = DeltaTable(uri), DeltaTable(uri)
    path = pa.table(first.get_add_actions(flatten=True)).column("path")[0].as_py()
    first.create_write_transaction([_remove(path)], mode="append", schema=first.schema())
    # The same file removed again from a handle that read it live: delta-rs commits it.
    second.create_write_transaction([_remove(path)], mode="append", schema=second.schema())
    assert DeltaTable(uri).version() == 3
    # With max_commit_retries=0 a commit whose version was taken fails instead of rebasing.
    stale = DeltaTable(uri)
    write_deltalake(uri, pa.table({"id": pa.array([9], pa.int64())}), mode="append")
    with pytest.raises(CommitFailedError):
        stale.create_write_transaction(
            [_remove("nothing.parquet")],
            mode="append",
            schema=stale.schema(),
            commit_properties=CommitProperties(max_commit_retries=0),
        )
    assert DeltaTable(uri).version() == 4


def test_delta_rs_spells_remove_paths_as_the_compaction_expects(tmp_path):
    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"id": pa.array([0], pa.int64())}))
    table = DeltaTable(uri)
    characters = [chr(c) for c in range(0x20, 0x7F) if chr(c) != "/"] + ["é", "€", "\U0001f600"]
    paths = [f"d=x{c}y/p{c}q.parquet" for c in characters]
    table.create_write_transaction(
        [_remove(p) for p in paths], mode="append", schema=table.schema()
    )
    logged = [a["remove"]["path"] for a in _actions(uri, 1) if "remove" in a]
    assert logged == [delta_rs_path(p) for p in paths]
