"""Reading back what a sink left in S3: rows (through delta-rs), committed and staged objects."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from deltalake import DeltaTable

from committers.delta.commit._staging_cleanup import wait_all_idle
from integration_tests._s3server import S3Server

STAGING_DIR = "_sink_staging"


@dataclass(frozen=True)
class S3Table:
    """A table location on the test server plus the options reaching it."""

    server: S3Server
    uri: str
    options: dict[str, str] = field(repr=False)

    @property
    def bucket(self) -> str:
        return self.uri[len("s3://") :].split("/", 1)[0]

    @property
    def prefix(self) -> str:
        return self.uri[len("s3://") :].split("/", 1)[1]

    def sink_kwargs(self, **extra: Any) -> dict[str, Any]:
        return {"storage_options": dict(self.options), **extra}

    def delta(self) -> DeltaTable:
        return DeltaTable(self.uri, storage_options=self.server.storage_options())

    def exists(self) -> bool:
        return DeltaTable.is_deltatable(self.uri, storage_options=self.server.storage_options())

    def ids(self) -> list[int]:
        """Every ``id`` in the table, sorted (read with delta-rs through a pyarrow dataset)."""
        table = self.delta().to_pyarrow_dataset().to_table(columns=["id"])
        return sorted(table.column("id").to_pylist())

    def keys(self) -> list[str]:
        """Every object key under the table root, relative to it, once the staging clean-up
        this process handed to background workers is done (a stream's last batch returns
        before it)."""
        assert wait_all_idle(60.0), "the background staging clean-up did not finish in 60 s"
        start = len(self.prefix) + 1
        return [k[start:] for k in self.server.list_keys(self.bucket, self.prefix + "/")]

    def data_keys(self) -> set[str]:
        return {
            k
            for k in self.keys()
            if k.endswith(".parquet") and not k.startswith(("_delta_log/", STAGING_DIR + "/"))
        }

    def committed_keys(self) -> set[str]:
        root = self.uri + "/"
        return {uri[len(root) :] for uri in self.delta().file_uris()}

    def staged_leftovers(self) -> list[str]:
        return [k for k in self.keys() if k.startswith(STAGING_DIR + "/")]

    def log_texts(self) -> list[str]:
        """The text of every JSON commit in ``_delta_log``."""
        client = self.server.client()
        texts = []
        for key in self.keys():
            if key.startswith("_delta_log/") and key.endswith(".json"):
                body = client.get_object(Bucket=self.bucket, Key=f"{self.prefix}/{key}")["Body"]
                texts.append(body.read().decode())
        return texts

    def assert_no_orphans(self) -> None:
        """Every Parquet object is referenced by the table and nothing is left staged."""
        assert self.data_keys() == self.committed_keys()
        assert self.staged_leftovers() == []

    def assert_nothing_written(self) -> None:
        """No object at all under the table root: nothing committed, nothing staged."""
        assert self.keys() == []


def assert_no_duplicates(values: list[int]) -> None:
    dupes = [v for v, n in Counter(values).items() if n > 1]
    assert not dupes, f"duplicated: {dupes[:10]}"
