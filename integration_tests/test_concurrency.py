"""Many writers on one table at once, on the local file system and on the S3 server: four
streaming queries with their own app ids and a bounded job, then two instances of one app id.
Rows are read back with deltalake (and DuckDB for the local table)."""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from pathlib import Path

import pytest

from committers.delta import DeltaSink
from committers.tests._delta_helpers import assert_no_orphans, ids
from committers.tests._readers import duckdb_rows
from committers.tests._spark_helpers import file_stream, make_source
from framework import TwoPhaseSink
from framework.errors import CheckpointResetError, ConcurrentWriterError
from integration_tests._s3helpers import S3Table

pytestmark = [pytest.mark.spark, pytest.mark.slow]

QUERIES, FILES, PER_FILE = 4, 3, 10
BOUNDED_START, BOUNDED_ROWS = 10_000, 200


class _Place:
    """A table on the local file system or on the S3 server, read back the same way."""

    def __init__(self, uri: str, options: dict[str, str] | None, s3: S3Table | None) -> None:
        self.uri, self.options, self.s3 = uri, options, s3

    def sink(self, app_id: str) -> TwoPhaseSink:
        return TwoPhaseSink(
            DeltaSink(self.uri, app_id=app_id, partition_by=["day"], storage_options=self.options)
        )

    def ids(self) -> list[int]:
        return self.s3.ids() if self.s3 else ids(self.uri)

    def transaction_version(self, app_id: str) -> int | None:
        table = self.s3.delta() if self.s3 else None
        if table is None:
            from deltalake import DeltaTable

            table = DeltaTable(self.uri)
        return table.transaction_version(app_id)

    def check_readers_and_orphans(self, expected: Counter) -> None:
        if self.s3:
            self.s3.assert_no_orphans()
        else:
            assert Counter(row["id"] for row in duckdb_rows(self.uri)) == expected
            assert_no_orphans(self.uri)


@pytest.fixture(params=["local", "s3"])
def place(request, tmp_path: Path) -> _Place:
    if request.param == "local":
        return _Place(str(tmp_path / "table"), None, None)
    s3_table: S3Table = request.getfixturevalue("table")
    return _Place(s3_table.uri, dict(s3_table.options), s3_table)


def test_four_streaming_queries_and_a_bounded_job_share_one_table(spark, place, tmp_path):
    queries = []
    for index in range(QUERIES):
        app = f"query-{index}"
        src = make_source(tmp_path, FILES, PER_FILE, start=index * 1000, name=app)
        queries.append(
            place.sink(app).write_stream(
                file_stream(spark, src),
                checkpoint_location=str(tmp_path / f"chk-{app}"),
                trigger={"availableNow": True},
            )
        )
    bounded_error: list[BaseException] = []

    def bounded() -> None:
        try:
            df = spark.range(BOUNDED_START, BOUNDED_START + BOUNDED_ROWS).selectExpr(
                "id", "concat('d', cast(id % 3 as string)) as day"
            )
            place.sink("backfill").write(df, epoch_id=1)
        except BaseException as err:  # surfaced below
            bounded_error.append(err)

    job = threading.Thread(target=bounded)
    job.start()
    for query in queries:
        query.awaitTermination()
    job.join()
    assert not bounded_error, bounded_error
    assert all(query.exception() is None for query in queries)

    expected = Counter(range(BOUNDED_START, BOUNDED_START + BOUNDED_ROWS))
    for index in range(QUERIES):
        expected.update(range(index * 1000, index * 1000 + FILES * PER_FILE))
    assert Counter(place.ids()) == expected
    for index in range(QUERIES):
        assert place.transaction_version(f"query-{index}") == FILES - 1
    assert place.transaction_version("backfill:write") == 1
    place.check_readers_and_orphans(expected)


def test_two_instances_of_one_app_id_one_fails_and_nothing_is_doubled(spark, place, tmp_path):
    """A deployment started twice: both read the same source under the same app id (two
    checkpoints). The first commit wins; the other instance fails with ConcurrentWriterError
    (or, if the first had committed before it started, CheckpointResetError) instead of
    skipping batches as replays or writing them again."""
    src = make_source(tmp_path, FILES, PER_FILE, name="shared")
    sinks = [place.sink("orders") for _ in range(2)]
    queries, failures = [], []
    for index, sink in enumerate(sinks):
        try:
            queries.append(
                sink.write_stream(
                    file_stream(spark, src),
                    checkpoint_location=str(tmp_path / f"chk-{index}"),
                    trigger={"availableNow": True},
                )
            )
        except CheckpointResetError as err:  # the first one committed already
            failures.append(err)
    for sink, query in zip(sinks, queries, strict=False):
        with contextlib.suppress(Exception):  # one of them fails: checked below
            query.awaitTermination()
        failures.append(sink.failure(query))
    refused = [f for f in failures if f is not None]
    assert len(refused) == 1 and failures.count(None) == 1, failures
    assert isinstance(refused[0], (ConcurrentWriterError, CheckpointResetError)), refused
    expected = Counter(range(FILES * PER_FILE))
    assert Counter(place.ids()) == expected
    assert place.transaction_version("orders") == FILES - 1
