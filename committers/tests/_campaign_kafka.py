"""The campaign's Kafka sources, topics on a local KRaft broker (``tools/kafka_broker.py``,
started for the campaign) read by Spark's own Kafka source (``readStream.format("kafka")``,
``maxOffsetsPerTrigger`` one file's worth of records).

``--source kafka``: a topic of three partitions; each "file" is that many JSON records of fresh
ids, produced idempotently (``acks=all``); the producer's delivery reports say where each
record landed, and the check then asks that every (partition, offset) produced is in the
table exactly once (the table keeps both columns), besides the ids the other sources are
checked by.

``--source kafka-changes``: the ``changes`` source's changes as Debezium-style change events
(``{"payload": {"before", "after", "op": "c"|"u"|"d", "source": {"seq"}}}``, keyed by id), in
a topic of one partition, so that each micro-batch holds exactly one file's changes (as the
file source's ``maxFilesPerTrigger`` 1 does) and the change feed can be checked change by
change; upserted by key into a table with deletion vectors and the change feed on.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from committers.tests._campaign import (
    IDS_PER_FILE,
    CampaignReport,
    _ChangeSource,
    _deltalake_rows,
    _Source,
    _Target,
)
from committers.tests._jars import broker_jars, tool

TOPIC = "campaign"
PARTITIONS = 3


def start_broker(directory: Path) -> Any:
    """A started broker with its log under ``directory``: in a container of the ``kafka``
    image where ``make images`` built it, else a local process.

    Raises:
        RuntimeError: the broker's jars are missing (run `make jars`).
    """
    from integration_tests._containers import ContainerBroker, image

    if image("kafka") is not None:
        return ContainerBroker(directory, partitions=PARTITIONS).start()
    jars, missing = broker_jars()
    if jars is None:
        raise RuntimeError(missing)
    return tool("kafka_broker").LocalBroker(jars, directory, partitions=PARTITIONS).start()


def produce(bootstrap: str, topic: str, records: list[tuple[str, str]]) -> set[tuple[int, int]]:
    """Produces ``records`` (key, value) to ``topic`` idempotently (``acks=all``), in order;
    returns the (partition, offset) each landed at.

    Raises:
        RuntimeError: a record was not delivered within 60 s (with the first errors).
    """
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    landed: set[tuple[int, int]] = set()
    failures: list[str] = []

    def delivered(error: Any, message: Any) -> None:
        if error is not None:
            failures.append(str(error))
        else:
            landed.add((message.partition(), message.offset()))

    for key, value in records:
        producer.produce(topic, key=key, value=value, on_delivery=delivered)
    left = producer.flush(60)
    if failures or left:
        raise RuntimeError(f"producing to {topic} failed: {failures[:3]}, {left} left")
    return landed


class KafkaSource(_Source):
    """Records of consecutive unique ids in one topic, and where each landed."""

    def __init__(self, broker: Any, topic: str = TOPIC) -> None:
        super().__init__(Path(broker.directory), kind="kafka")
        self.bootstrap = broker.bootstrap
        self.topic = topic
        self.positions: set[tuple[int, int]] = set()

    def location(self) -> str:
        return f"{self.bootstrap}/{self.topic}"

    def add_file(self) -> None:
        records = [(str(row["id"]), json.dumps(row)) for row in self._rows()]
        self.positions |= produce(self.bootstrap, self.topic, records)
        self.next_id += IDS_PER_FILE
        self.files += 1


class KafkaChangeSource(_ChangeSource):
    """The ``changes`` source's changes, produced as Debezium-style events."""

    def __init__(self, broker: Any, rng: Any, topic: str = "changes") -> None:
        super().__init__(Path(broker.directory), rng)
        self.kind = "kafka-changes"
        self.bootstrap = broker.bootstrap
        self.topic = topic
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})  # (alive until done)
        created = admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
        created[topic].result(60)

    def location(self) -> str:
        return f"{self.bootstrap}/{self.topic}"

    def _write(self, rows: list[dict[str, object]]) -> None:
        records = []
        for row in rows:
            key = {"id": row["id"], "day": row["day"]}
            after = {k: row[k] for k in ("id", "day", "v")}
            op = {"I": "c", "U": "u", "D": "d"}[str(row["op"])]
            event = {
                "payload": {
                    "before": key if op != "c" else None,
                    "after": after if op != "d" else None,
                    "op": op,
                    "source": {"seq": row["seq"]},
                }
            }
            records.append((json.dumps(key), json.dumps(event)))
        produce(self.bootstrap, self.topic, records)


def kafka_source(kind: str, broker: Any, rng: Any, table: _Target) -> _Source:
    """The campaign's source of ``kind`` (``kafka`` or ``kafka-changes``) on ``broker``; for
    changes, the target table is created as the ``changes`` source creates it."""
    if kind == "kafka":
        return KafkaSource(broker)
    source = KafkaChangeSource(broker, rng)
    source.create_table(table)
    return source


def check_positions(report: CampaignReport, table: _Target, source: KafkaSource) -> None:
    """Every record produced is in the table once by (partition, offset), and nothing else."""
    from deltalake import DeltaTable

    dt = DeltaTable(table.uri, storage_options=table.check_options)
    rows = _deltalake_rows(dt, "kafka_partition, kafka_offset")
    counts = Counter((r["kafka_partition"], r["kafka_offset"]) for r in rows)
    report.duplicates = max(report.duplicates, sum(n - 1 for n in counts.values()))
    report.lost = max(report.lost, len(source.positions - set(counts)))
    report.unexpected = max(report.unexpected, len(set(counts) - source.positions))
