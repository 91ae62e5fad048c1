"""KinesisSink against a real moto server on 127.0.0.1 (PutRecords through aiobotocore).

Records are read back from every shard with boto3 and compared exactly.
"""

from __future__ import annotations

import json
import pickle
import socket
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import boto3
import pyarrow as pa
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from committers.kinesis import (
    KinesisErrorClassifier,
    KinesisJsonConverter,
    KinesisRecord,
    KinesisRecordSerializer,
    KinesisSink,
    KinesisSinkWriter,
)
from committers.tests._async_helpers import run_sink_task
from framework.asyncsink import (
    AsyncSinkTaskWriter,
    AsyncSinkWriterConfig,
    BufferedRequestState,
    IdempotencyKeys,
    JsonLinesDeadLetterQueue,
    RetryPolicy,
)
from framework.errors import ConfigurationError, FatalDeliveryError, InputError
from framework.sink import Epoch, WriterContext

CONTEXT = WriterContext(
    epoch=Epoch(app_id="kinesis-test", epoch_id=0, writer_identity="w", run_id="r"),
    partition_id=0,
    attempt_number=0,
    task_attempt_id=1,
)
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
FAST_RETRIES = RetryPolicy(max_attempts=5, initial_backoff_ms=1, max_backoff_ms=5)
SMALL = AsyncSinkWriterConfig(
    max_batch_size=100, max_in_flight_requests=4, max_buffered_requests=1_000
)


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def kinesis_client(endpoint: str) -> Any:
    return boto3.client("kinesis", region_name="us-east-1", endpoint_url=endpoint, **CREDENTIALS)


@pytest.fixture
def stream(moto_endpoint: str) -> str:
    name = f"stream-{uuid.uuid4().hex[:8]}"
    kinesis_client(moto_endpoint).create_stream(StreamName=name, ShardCount=2)
    return name


def read_stream(endpoint: str, name: str) -> list[dict[str, Any]]:
    """Every record of every shard (bounded: a fixed number of GetRecords calls per shard)."""
    client = kinesis_client(endpoint)
    found = []
    for shard in client.describe_stream(StreamName=name)["StreamDescription"]["Shards"]:
        iterator = client.get_shard_iterator(
            StreamName=name, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        for _ in range(20):
            answer = client.get_records(ShardIterator=iterator, Limit=10_000)
            found.extend(answer["Records"])
            if not answer["Records"]:
                break
            iterator = answer["NextShardIterator"]
    return found


def make_sink(endpoint: str, stream: str, **kwargs: Any) -> KinesisSink:
    kwargs.setdefault("config", SMALL)
    kwargs.setdefault("retry_policy", FAST_RETRIES)
    return KinesisSink(
        stream,
        region_name="us-east-1",
        endpoint_url=endpoint,
        client_options=CREDENTIALS,
        **kwargs,
    )


def run_task(sink: KinesisSink, *batches: pa.RecordBatch) -> AsyncSinkTaskWriter[KinesisRecord]:
    return run_sink_task(sink, *batches, context=CONTEXT)


def rows(count: int, start: int = 0) -> pa.RecordBatch:
    ids = list(range(start, start + count))
    return pa.RecordBatch.from_pydict({"id": ids, "user": [f"user-{i % 7}" for i in ids]})


def test_every_row_becomes_exactly_one_record(moto_endpoint: str, stream: str):
    sink = make_sink(moto_endpoint, stream, partition_key_field="user")
    writer = run_task(sink, rows(250), rows(100, start=250))
    records = read_stream(moto_endpoint, stream)
    decoded = [json.loads(record["Data"]) for record in records]
    assert sorted(row["id"] for row in decoded) == list(range(350))
    assert all(record["PartitionKey"] == json.loads(record["Data"])["user"] for record in records)
    assert writer.async_writer is not None
    metrics = writer.async_writer.metrics
    assert (metrics.num_records_out, metrics.num_retries, metrics.num_requests) == (350, 0, 4)


def test_a_task_run_again_sends_its_records_with_the_same_idempotency_keys(
    moto_endpoint: str, stream: str
):
    sink = make_sink(moto_endpoint, stream, idempotency_keys=IdempotencyKeys())
    run_task(sink, rows(30))
    run_task(sink, rows(20), rows(10, start=20))  # the task again, its input batched otherwise
    decoded = [json.loads(record["Data"]) for record in read_stream(moto_endpoint, stream)]
    sent = Counter((row["id"], row["idempotency_key"]) for row in decoded)
    assert set(sent.values()) == {2}  # each row twice, with the same key both times
    assert len(sent) == len({key for _, key in sent}) == 30  # one key per row


class FlakyKinesisWriter(KinesisSinkWriter):
    """Marks even ids as throttled on their first attempt, as Kinesis does per record, and
    forwards only the others to the real server (FLIP-171's partial-failure path)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.refused: set[int] = set()

    async def put_records(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        refuse = []
        for index, record in enumerate(records):
            row_id = json.loads(record["Data"])["id"]
            if row_id % 2 == 0 and row_id not in self.refused:
                self.refused.add(row_id)
                refuse.append(index)
        forwarded = [record for index, record in enumerate(records) if index not in refuse]
        answer = await super().put_records(forwarded) if forwarded else {"Records": []}
        real = iter(answer["Records"])
        results = [
            {"ErrorCode": "ProvisionedThroughputExceededException", "ErrorMessage": "slow down"}
            if index in refuse
            else next(real)
            for index in range(len(records))
        ]
        return {"FailedRecordCount": len(refuse), "Records": results}


class FlakyKinesisSink(KinesisSink):
    def create_async_writer(
        self,
        context: WriterContext | None,
        initial_state: Sequence[BufferedRequestState[KinesisRecord]] = (),
    ) -> KinesisSinkWriter:
        return FlakyKinesisWriter(
            stream_name=self.stream_name,
            client_options=self.client_options,
            **self.writer_kwargs(context, initial_state),
        )


def test_records_a_response_marks_as_failed_are_requeued_and_delivered_once(
    moto_endpoint: str, stream: str
):
    sink = FlakyKinesisSink(
        stream,
        region_name="us-east-1",
        endpoint_url=moto_endpoint,
        client_options=CREDENTIALS,
        config=SMALL,
        retry_policy=FAST_RETRIES,
    )
    writer = run_task(sink, rows(200))
    ids = sorted(json.loads(record["Data"])["id"] for record in read_stream(moto_endpoint, stream))
    assert ids == list(range(200))  # each exactly once
    assert writer.async_writer is not None
    metrics = writer.async_writer.metrics
    assert metrics.num_records_out == 200
    assert metrics.num_retries == 100
    # Every request carrying first-time even ids was throttled; AIMD then shrank the batches.
    assert metrics.num_throttled_requests >= 2


def test_a_missing_stream_fails_the_job_even_with_a_dead_letter_queue(moto_endpoint, tmp_path):
    sink = make_sink(
        moto_endpoint,
        "no-such-stream",
        dead_letter_queue=JsonLinesDeadLetterQueue(str(tmp_path / "dlq")),
    )
    with pytest.raises(FatalDeliveryError, match="ResourceNotFoundException"):
        run_task(sink, rows(3))
    assert not (tmp_path / "dlq").exists()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: KinesisSink("bad name!"), "stream_name must be 1 to 128"),
        (lambda: KinesisSink(""), "stream_name must be 1 to 128"),
        (
            lambda: KinesisSink(
                "s", config=AsyncSinkWriterConfig(max_batch_size=501, max_buffered_requests=1000)
            ),
            "max_batch_size is 501, but Kinesis PutRecords accepts at most 500",
        ),
        (
            lambda: KinesisSink(
                "s",
                config=AsyncSinkWriterConfig(
                    max_batch_size_in_bytes=6 * 1024 * 1024,
                    max_record_size_in_bytes=2 * 1024 * 1024,
                ),
            ),
            "max_batch_size_in_bytes is 6291456, but Kinesis PutRecords accepts at most",
        ),
        (
            lambda: KinesisSink(
                "s",
                config=AsyncSinkWriterConfig(max_record_size_in_bytes=2 * 1024 * 1024),
            ),
            "max_record_size_in_bytes is 2097152",
        ),
    ],
)
def test_each_bad_configuration_is_rejected_at_construction(make, message):
    with pytest.raises(ConfigurationError, match=message):
        make()


def test_the_sink_pickles_and_hides_credentials():
    sink = KinesisSink("clicks", region_name="eu-west-1", client_options=CREDENTIALS)
    clone = pickle.loads(pickle.dumps(sink))
    assert clone.client_options["region_name"] == "eu-west-1"
    assert "testing" not in repr(sink)


def test_errors_are_classified_by_aws_error_code():
    classifier = KinesisErrorClassifier()

    def client_error(code: str, status: int = 400) -> ClientError:
        return ClientError(
            {
                "Error": {"Code": code, "Message": "m"},
                "ResponseMetadata": {"HTTPStatusCode": status},
            },
            "PutRecords",
        )

    throttled = classifier.classify(client_error("ProvisionedThroughputExceededException"))
    assert (throttled.retryable, throttled.throttled) == (True, True)
    assert classifier.classify(client_error("InternalFailure", 500)).retryable
    assert classifier.classify(client_error("SomethingNew", 503)).retryable
    invalid = classifier.classify(client_error("ValidationException"))
    assert (invalid.retryable, invalid.caused_by_entries) == (False, True)
    missing = classifier.classify(client_error("ResourceNotFoundException"))
    assert (missing.retryable, missing.caused_by_entries) == (False, False)
    assert classifier.classify(EndpointConnectionError(endpoint_url="http://x")).retryable
    assert not classifier.classify(ValueError("bug")).retryable


def test_converter_keys_and_state_serializer():
    converter = KinesisJsonConverter()
    record = converter.apply({"id": 1}, None)
    assert record == converter.apply({"id": 1}, None)  # deterministic key: same shard on retry
    assert json.loads(record.data) == {"id": 1}
    with pytest.raises(InputError, match="partition key column 'user' is missing"):
        KinesisJsonConverter("user").apply({"id": 1}, None)
    with pytest.raises(InputError, match="1 to 256 characters"):
        KinesisJsonConverter("user").apply({"user": "x" * 257}, None)
    serializer = KinesisRecordSerializer()
    original = KinesisRecord(b"\x00data", "key-\u00e9")
    assert serializer.deserialize(serializer.serialize(original)) == original
