"""The staged-upload path alone: the sink's S3Uploader (multipart parts through the async sink
writer) against s3fs's own buffered file upload (``fs.open(path, "wb", block_size=...)``, what
the Python-writer staging used before), side by side on the same bytes.

Each round uploads two objects of SIZE_MIB MiB at once (two threads, like two Spark tasks),
written in 1 MiB chunks as a Parquet writer hands them over, with 8 MiB parts on both sides;
the rounds alternate which side goes first. Printed: medians, MB/s and the time ratio
uploader / s3fs (1.0 = the same speed; lower is faster), with the 1-minute load average
before and after. Usage: python benchmarks/s3_uploader.py [SIZE_MIB] [ROUNDS]
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import machine, median

from committers.delta.storage._storage import TableLocation
from committers.delta.storage._upload import S3Uploader
from integration_tests._s3server import s3_server

PART = 8 * 1024 * 1024
CHUNK = 1024 * 1024


def main() -> None:
    size = (int(sys.argv[1]) if len(sys.argv) > 1 else 22) * 1024 * 1024
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    data = os.urandom(size)
    load_before = os.getloadavg()[0]
    with s3_server(log=lambda _: None) as server:
        bucket = server.create_bucket()
        location = TableLocation.of(f"s3://{bucket}/t", server.storage_options())
        fs = location.filesystem()

        def s3fs_file(path: str) -> None:
            with fs.open(path, "wb", block_size=PART) as stream:
                for start in range(0, size, CHUNK):
                    stream.write(data[start : start + CHUNK])

        def uploader(path: str) -> None:
            upload = S3Uploader(location, part_size=PART, concurrency=4)
            stream = upload.open(path)
            for start in range(0, size, CHUNK):
                stream.write(data[start : start + CHUNK])
            stream.close()
            upload.flush()
            upload.close()

        def two_at_once(upload_one: Callable[[str], None], tag: str) -> float:
            threads = [
                threading.Thread(target=upload_one, args=(f"{bucket}/t/{tag}-{n}",))
                for n in range(2)
            ]
            started = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            return time.perf_counter() - started

        sides = {"s3fs buffered file": s3fs_file, "S3Uploader (async writer)": uploader}
        runs: dict[str, list[float]] = {name: [] for name in sides}
        for name, fn in sides.items():
            two_at_once(fn, f"warm-{name[:4]}")
        for index in range(rounds):
            order = list(sides.items()) if index % 2 == 0 else list(reversed(sides.items()))
            for name, fn in order:
                runs[name].append(two_at_once(fn, f"{index}-{name[:4]}"))
    load_after = os.getloadavg()[0]

    print(f"machine: {machine()}; S3 server: {server.kind} at {server.endpoint}")
    print(f"two objects of {size / 2**20:.0f} MiB at once, {rounds} rounds after a warm-up")
    for name, values in runs.items():
        rate = 2 * size / median(values) / 1e6
        shown = [round(value, 3) for value in values]
        print(f"{name:27s} median {median(values):.3f} s  {rate:6.1f} MB/s  runs {shown}")
    ratio = median(runs["S3Uploader (async writer)"]) / median(runs["s3fs buffered file"])
    print(f"time ratio uploader / s3fs: {ratio:.2f}")
    print(f"load average (1 min): {load_before:.2f} before, {load_after:.2f} after")


if __name__ == "__main__":
    main()
