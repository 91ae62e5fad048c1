"""The campaign's Kafka source (``--source kafka``): a topic of three partitions on a local
KRaft broker (``tools/kafka_broker.py``, started for the campaign), read by Spark's own Kafka
source (``readStream.format("kafka")``, ``maxOffsetsPerTrigger`` one file's worth of records).

Each "file" is that many JSON records of fresh ids, produced idempotently (``acks=all``); the
producer's delivery reports say where each record landed, and the check then asks that every
(partition, offset) produced is in the table exactly once (the table keeps both columns),
besides the ids the other sources are checked by.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from committers.tests._campaign import (
    IDS_PER_FILE,
    CampaignReport,
    _deltalake_rows,
    _Source,
    _Target,
)
from committers.tests._jars import broker_jars, tool

TOPIC = "campaign"
PARTITIONS = 3


def start_broker(directory: Path) -> Any:
    """A started local broker with its data under ``directory``.

    Raises:
        RuntimeError: the broker's jars are missing (run `make jars`).
    """
    jars, missing = broker_jars()
    if jars is None:
        raise RuntimeError(missing)
    return tool("kafka_broker").LocalBroker(jars, directory, partitions=PARTITIONS).start()


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
        from confluent_kafka import Producer

        producer = Producer(
            {"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "acks": "all"}
        )
        failures: list[str] = []

        def delivered(error: Any, message: Any) -> None:
            if error is not None:
                failures.append(str(error))
            else:
                self.positions.add((message.partition(), message.offset()))

        for row in self._rows():
            producer.produce(
                self.topic, key=str(row["id"]), value=json.dumps(row), on_delivery=delivered
            )
        left = producer.flush(60)
        if failures or left:
            raise RuntimeError(f"producing to {self.topic} failed: {failures[:3]}, {left} left")
        self.next_id += IDS_PER_FILE
        self.files += 1


def check_positions(report: CampaignReport, table: _Target, source: KafkaSource) -> None:
    """Every record produced is in the table once by (partition, offset), and nothing else."""
    from deltalake import DeltaTable

    dt = DeltaTable(table.uri, storage_options=table.check_options)
    rows = _deltalake_rows(dt, "kafka_partition, kafka_offset")
    counts = Counter((r["kafka_partition"], r["kafka_offset"]) for r in rows)
    report.duplicates = max(report.duplicates, sum(n - 1 for n in counts.values()))
    report.lost = max(report.lost, len(source.positions - set(counts)))
    report.unexpected = max(report.unexpected, len(set(counts) - source.positions))
