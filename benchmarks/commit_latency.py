"""Driver-side commit latency of the Delta global committer, per micro-batch.

For 10 and 100 staged files per batch, at table histories of 10 and 1,000 versions, measures
p50 / p95 of (a) the commit itself and (b) the whole driver overhead of a batch (replay check +
commit + staging cleanup). No Spark needed: the committables are real Parquet files staged
through the sink's own writer.

With ``--s3`` the same runs go to the integration suite's S3 server (an external endpoint from
``SINK_TEST_S3_ENDPOINT``, MinIO through Docker, or a local SeaweedFS), where delta-rs lists the
log with a start-after offset instead of reading the whole ``_delta_log`` directory.

Usage: python benchmarks/commit_latency.py [BATCHES_PER_POINT] [--s3]
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine

from committers.delta import DeltaSink, StagedFile
from framework.sink import Epoch, WriterContext

SCHEMA = pa.schema([("id", pa.int64()), ("s", pa.string())])


def staged_files(sink: DeltaSink, epoch: Epoch, count: int) -> list[StagedFile]:
    """Stage ``count`` small files, one writer (task) each, as Spark tasks would."""
    files = []
    for task in range(count):
        context = WriterContext(
            epoch=epoch, partition_id=task, attempt_number=0, task_attempt_id=task
        )
        writer = sink.create_writer(context)
        writer.write(pa.RecordBatch.from_pydict({"id": [task], "s": ["x"]}, schema=SCHEMA))
        files.extend(writer.prepare_commit(True))
    return files


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def run(table_root: str, storage_options: dict[str, str] | None, batches: int) -> None:
    results = {}
    for history in (10, 1000):
        sink = DeltaSink(
            f"{table_root}/t{history}", app_id="bench", storage_options=storage_options
        )
        sink.prepare(SCHEMA)
        committer = sink.create_global_committer()
        epoch_id = 0
        # build history: one file per version (the first commit creates the table)
        while (table := committer.table()) is None or table.version() < history:
            ep = Epoch(app_id="bench", epoch_id=epoch_id, writer_identity="w", run_id="r")
            committer.commit([committer.combine(ep, staged_files(sink, ep, 1))])
            committer.clean_up(ep)
            epoch_id += 1
        for file_count in (10, 100):
            commit_ms, driver_ms = [], []
            for _ in range(batches):
                ep = Epoch(
                    app_id="bench", epoch_id=epoch_id, writer_identity="w", run_id=str(uuid.uuid4())
                )
                files = staged_files(sink, ep, file_count)
                start = time.perf_counter()
                assert not committer.is_committed(ep)
                checked = time.perf_counter()
                committer.commit([committer.combine(ep, files)])
                committed = time.perf_counter()
                committer.clean_up(ep)
                done = time.perf_counter()
                commit_ms.append((committed - checked) * 1000)
                driver_ms.append((done - start) * 1000)
                epoch_id += 1
            results[(history, file_count)] = (commit_ms, driver_ms)
            print(
                f"history {history:>5} versions, {file_count:>3} files: commit p50 "
                f"{statistics.median(commit_ms):6.1f} ms p95 {percentile(commit_ms, 95):6.1f} ms"
                f" | driver total p50 {statistics.median(driver_ms):6.1f} ms p95 "
                f"{percentile(driver_ms, 95):6.1f} ms"
            )
    for file_count in (10, 100):
        small = statistics.median(results[(10, file_count)][0])
        large = statistics.median(results[(1000, file_count)][0])
        ratio = large / small
        print(f"{file_count} files: p50 at 1,000 versions / p50 at 10 versions = {ratio:.2f}")


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    batches = int(args[0]) if args else 40
    print(f"machine: {machine()}; {batches} batches per point")
    if "--s3" in sys.argv:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from integration_tests._s3server import s3_server

        with s3_server() as server:
            bucket = server.create_bucket()
            run(f"s3://{bucket}/bench", server.storage_options(), batches)
        return
    work = Path(tempfile.mkdtemp(prefix="commit-bench-"))
    try:
        run(str(work), None, batches)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
