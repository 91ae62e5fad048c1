"""S3 staging throughput: TwoPhaseSink(DeltaSink("s3://...")).write(df) in bytes per second,
against a plain s3fs upload of the same Parquet bytes from the same process, side by side.

The S3 server is the integration suite's (``integration_tests/_s3server.py``): an endpoint from
``SINK_TEST_S3_ENDPOINT`` and friends, MinIO through testcontainers when Docker answers, else a
local SeaweedFS on 127.0.0.1. Each repeat (after one warm-up of both):

1. ``sink.write(df)`` into a fresh table (self-test cached, so: Spark job, Parquet encoding,
   multipart uploads from the Spark tasks through the async writer, one Delta commit,
   clean-up); bytes = the Parquet bytes it staged;
2. the very same Parquet files (read into memory beforehand, not timed) uploaded with the same
   s3fs options from this process: ``fs.pipe({path: bytes, ...})``, s3fs's own concurrent batch
   upload, and, for reference, one ``fs.pipe_file`` after another.

For context it also times ``sink.write(df)`` into a local directory: the difference between the
S3 and the local run is what staging to S3 costs the sink, to set beside the plain upload.

Printed: medians, bytes/s and the ratio sink / plain upload (target >= 0.9 against the
concurrent upload). Usage: python benchmarks/s3_staging.py [ROWS] [REPEATS]
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import machine, median, rows_df, spark_session

from committers.delta import DeltaSink
from committers.delta.storage._storage import TableLocation
from framework import TwoPhaseSink
from integration_tests._s3server import s3_server


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 3_000_000
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    with s3_server() as server:
        bucket = server.create_bucket()
        options = server.storage_options()
        spark = spark_session("s3-staging-benchmark")
        df = rows_df(spark, rows).cache()
        df.count()  # materialise once: both sides then measure writing, not generating

        sink_runs: list[tuple[float, int]] = []
        local_runs: list[float] = []
        batch_runs: list[float] = []
        serial_runs: list[float] = []
        scratch = Path(tempfile.mkdtemp(prefix="s3-staging-bench-"))

        def local_write(tag: str) -> float:
            target = scratch / f"local-{tag}"
            # the same (Python writer) staging as on S3, so the difference is S3's cost
            sink = TwoPhaseSink(DeltaSink(str(target), app_id="bench", staging="arrow"))
            start = time.perf_counter()
            sink.write(df)
            elapsed = time.perf_counter() - start
            shutil.rmtree(target)
            return elapsed

        def sink_write(tag: str) -> tuple[float, int, TableLocation]:
            uri = f"s3://{bucket}/sink-{tag}-{uuid.uuid4().hex[:6]}"
            sink = TwoPhaseSink(DeltaSink(uri, app_id="bench", storage_options=options))
            start = time.perf_counter()
            metrics = sink.write(df)
            return time.perf_counter() - start, metrics.bytes, TableLocation.of(uri, options)

        def staged_files(location: TableLocation) -> dict[str, bytes]:
            fs = location.filesystem()
            root = location.path()
            found = fs.find(root)
            parquet = [p for p in found if p.endswith(".parquet") and "/_delta_log/" not in p]
            return {p[len(root) + 1 :]: fs.cat_file(p) for p in parquet}

        def plain_upload(files: dict[str, bytes], concurrent: bool) -> float:
            location = TableLocation.of(f"s3://{bucket}/plain-{uuid.uuid4().hex[:6]}", options)
            fs = location.filesystem()
            targets = {location.path(name): data for name, data in files.items()}
            start = time.perf_counter()
            if concurrent:
                fs.pipe(targets)
            else:
                for path, data in targets.items():
                    fs.pipe_file(path, data)
            return time.perf_counter() - start

        # warm-up: JVM, Python workers, s3fs clients, the self-test (cached afterwards)
        _, _, warm = sink_write("warmup")
        files = staged_files(warm)
        plain_upload(files, concurrent=True)
        plain_upload(files, concurrent=False)
        local_write("warmup")
        for i in range(repeats):
            seconds, nbytes, location = sink_write(str(i))
            sink_runs.append((seconds, nbytes))
            files = staged_files(location)
            assert sum(len(b) for b in files.values()) == nbytes, "staged bytes differ"
            batch_runs.append(plain_upload(files, concurrent=True))
            serial_runs.append(plain_upload(files, concurrent=False))
            local_runs.append(local_write(str(i)))
        spark.stop()
        server.delete_bucket(bucket)
        shutil.rmtree(scratch, ignore_errors=True)

    nbytes = sink_runs[-1][1]
    sink_median = median([s for s, _ in sink_runs])
    batch_median, serial_median = median(batch_runs), median(serial_runs)

    def rate(seconds: float) -> str:
        return f"{nbytes / seconds / 1e6:7.1f} MB/s"

    print(f"machine: {machine()}")
    print(f"S3 server: {server.kind} at {server.endpoint}")
    print(f"rows: {rows:,}, Parquet bytes staged: {nbytes:,} in {len(files)} files")
    print(f"repeats: {repeats} (side by side, after one warm-up)")
    print(
        f"sink.write(df)               median {sink_median:.2f} s  {rate(sink_median)}  "
        f"runs {[round(s, 2) for s, _ in sink_runs]}"
    )
    print(
        f"s3fs pipe (concurrent batch) median {batch_median:.2f} s  {rate(batch_median)}  "
        f"runs {[round(s, 2) for s in batch_runs]}"
    )
    print(
        f"s3fs pipe_file one by one    median {serial_median:.2f} s  {rate(serial_median)}  "
        f"runs {[round(s, 2) for s in serial_runs]}"
    )
    local_median = median(local_runs)
    staging = sink_median - local_median
    print(
        f"sink.write(df) to local disk median {local_median:.2f} s  "
        f"runs {[round(s, 2) for s in local_runs]}"
    )
    print(f"ratio sink / concurrent upload: {batch_median / sink_median:.2f}  (target >= 0.9)")
    print(f"ratio sink / sequential upload: {serial_median / sink_median:.2f}")
    if staging > 0:
        print(
            f"staging cost of S3 in the sink (S3 run - local run): {staging:.2f} s = "
            f"{rate(staging)}; ratio to the concurrent upload: {batch_median / staging:.2f}"
        )
    else:
        print("staging cost of S3 in the sink (S3 run - local run): below measurement noise")


if __name__ == "__main__":
    main()
