"""Driver-side commit latency of the Delta sink over long histories, beside raw delta-rs.

Tables are built as a long stream of this sink leaves them, quickly: version 0 by delta-rs,
then commit files written directly (two adds and the sink's txn per version, our commitInfo
keys), and a checkpoint written by ``deltalake``'s ``create_checkpoint()`` at the last
multiple of 100 (the checkpoint a reader starts from); each table is checked to open at the
right version with the right files and txn. For each history length, batches of
``FILES`` staged files are committed through the sink's whole commit step (replay check,
commit, clean-up):

* ``warm``: one committer for all batches (a running stream); its first batch loads the
  committer's view of the log (a restart's cost, as in ``cold``) and is reported apart, as
  ``first``, so the percentiles are those of the running stream;
* ``cold``: a new committer per batch (a restart before each);
* ``delta-rs``: the same adds and txn through ``DeltaTable.create_write_transaction`` on a
  handle kept between batches (refreshed first, as a replay check would).

Reported per point: wall-clock p50 / p99 and the median CPU time of the calling process
(``time.process_time``; background log maintenance included). Measure ratios only on a quiet
machine.

Usage: python benchmarks/commit_latency.py [--versions 10,1000,10000,100000] [--batches 22]
       [--files 100] [--s3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.transaction import AddAction

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # integration_tests (--s3)

from _common import machine

from committers.delta import DeltaSink, StagedFile
from committers.delta.storage._storage import TableLocation
from framework.sink import Epoch, WriterContext

SCHEMA = pa.schema([("id", pa.int64()), ("s", pa.string())])
APP_ID = "bench"


def build_table(uri: str, options: dict[str, str] | None, versions: int) -> None:
    """A table at version ``versions - 1``: a stream's commits, a checkpoint at the last
    multiple of 100."""
    write_deltalake(uri, pa.table({"id": [0], "s": ["x"]}, schema=SCHEMA), storage_options=options)
    location = TableLocation.of(uri, options)
    fs = location.filesystem()
    for version in range(1, versions):
        lines = [
            {
                "commitInfo": {
                    "timestamp": 1_790_000_000_000 + version,
                    "operation": "WRITE",
                    "operationParameters": {"mode": "Append"},
                    "sink.appId": APP_ID,
                    "sink.epochId": str(version),
                }
            },
            *(
                {
                    "add": {
                        "path": f"old/{version}-{i}.parquet",
                        "partitionValues": {},
                        "size": 500,
                        "modificationTime": 1_790_000_000_000,
                        "dataChange": True,
                        "stats": '{"numRecords":1}',
                    }
                }
                for i in range(2)
            ),
            {"txn": {"appId": APP_ID, "version": version}},
        ]
        body = "".join(json.dumps(line) + "\n" for line in lines).encode()
        fs.pipe_file(location.path(f"_delta_log/{version:020d}.json"), body)
    last_checkpoint = (versions - 1) // 100 * 100
    if last_checkpoint:
        DeltaTable(uri, version=last_checkpoint, storage_options=options).create_checkpoint()
    table = DeltaTable(uri, storage_options=options)
    assert table.version() == versions - 1, table.version()
    assert len(table.file_uris()) == 1 + 2 * (versions - 1)
    assert table.transaction_version(APP_ID) == (versions - 1 if versions > 1 else None)


def staged_files(sink: DeltaSink, epoch: Epoch, count: int) -> list[StagedFile]:
    files = []
    for task in range(count):
        context = WriterContext(
            epoch=epoch, partition_id=task, attempt_number=0, task_attempt_id=task
        )
        writer = sink.create_writer(context)
        writer.write(pa.RecordBatch.from_pydict({"id": [task], "s": ["x"]}, schema=SCHEMA))
        files.extend(writer.prepare_commit(True))
    return files


def new_epoch(epoch_id: int) -> Epoch:
    return Epoch(
        app_id=APP_ID, epoch_id=epoch_id, writer_identity="bench-writer", run_id=uuid.uuid4().hex
    )


def timed(step) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    step()
    return time.perf_counter() - wall, time.process_time() - cpu


def sink_commits(sink: DeltaSink, first_epoch: int, batches: int, files: int, cold: bool):
    committer = sink.create_global_committer()
    samples = []
    for n in range(batches):
        epoch = new_epoch(first_epoch + n)
        staged = staged_files(sink, epoch, files)
        if cold:
            committer = sink.create_global_committer()

        def step(epoch=epoch, staged=staged, committer=committer):
            assert not committer.is_committed(epoch)
            committer.commit([committer.combine(epoch, staged)])
            committer.clean_up(epoch)

        samples.append(timed(step))
    committer.close()
    return samples


def delta_rs_commits(sink: DeltaSink, first_epoch: int, batches: int, files: int):
    options = sink.location.delta_storage_options()
    table = DeltaTable(sink.table_uri, storage_options=options)
    samples = []
    for n in range(batches):
        epoch = new_epoch(first_epoch + n)
        staged = staged_files(sink, epoch, files)
        adds = [AddAction(f.path, f.size, {}, f.modification_time, True, f.stats) for f in staged]

        def step(epoch=epoch, adds=adds):
            table.update_incremental()
            assert (table.transaction_version(APP_ID) or -1) < epoch.epoch_id
            table.create_write_transaction(
                adds,
                mode="append",
                schema=table.schema(),
                commit_properties=CommitProperties(
                    app_transactions=[Transaction(APP_ID, epoch.epoch_id)]
                ),
            )

        samples.append(timed(step))
    return samples


def summary(samples: list[tuple[float, float]]) -> str:
    walls = sorted(w * 1000 for w, _ in samples)
    p99 = walls[min(len(walls) - 1, round(0.99 * (len(walls) - 1)))]
    cpu = statistics.median(c * 1000 for _, c in samples)
    return f"p50 {statistics.median(walls):7.1f} ms  p99 {p99:7.1f} ms  CPU {cpu:6.1f} ms"


def run(root: str, options: dict[str, str] | None, versions: list[int], batches: int, files: int):
    for count in versions:
        uri = f"{root}/t{count}"
        started = time.perf_counter()
        build_table(uri, options, count)
        print(f"{count:>7} versions (built in {time.perf_counter() - started:.1f}s)")
        sink = DeltaSink(uri, app_id=APP_ID, storage_options=options)
        sink.prepare(SCHEMA)
        epoch = count + 1
        for name in ("warm", "cold", "delta-rs"):
            if name == "delta-rs":
                samples = delta_rs_commits(sink, epoch, batches, files)
            else:
                samples = sink_commits(sink, epoch, batches, files, cold=name == "cold")
            if name == "warm":
                print(f"    {'first':<9} {samples[0][0] * 1000:7.1f} ms", flush=True)
                samples = samples[1:]
            print(f"    {name:<9} {summary(samples)}", flush=True)
            epoch += batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", default="10,1000,10000,100000")
    parser.add_argument("--batches", type=int, default=22)
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--s3", action="store_true")
    args = parser.parse_args()
    versions = [int(v) for v in args.versions.split(",")]
    print(machine())
    if args.s3:
        from integration_tests._s3server import s3_server

        with s3_server(log=print) as server:
            bucket = server.create_bucket()
            run(
                f"s3://{bucket}/commit-latency",
                server.storage_options(),
                versions,
                args.batches,
                args.files,
            )
        return
    root = tempfile.mkdtemp(prefix="commit-latency-")
    try:
        run(root, None, versions, args.batches, args.files)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
