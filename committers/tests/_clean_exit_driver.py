"""Write a Delta table with DeltaSink, read it back with delta-rs, and return: a script whose
interpreter exit must be clean (exit code 0, no "terminate called ..." on stderr).

Usage: python -m committers.tests._clean_exit_driver TABLE [FILES]

The sink is driven as TwoPhaseSink drives it (FILES writer tasks, then one commit and the
clean-up on the driver) but without Spark, which the exit has nothing to do with. The read is
``DeltaTable(TABLE).to_pyarrow_table()``, the last thing the script does, as in a script that
checks what it wrote; each file read is one more buffer that Arrow's threads release after the
read has returned (see ``committers/delta/table/_shutdown.py``).
"""

from __future__ import annotations

import sys
import uuid

import pyarrow as pa
from deltalake import DeltaTable

from committers.delta import DeltaSink
from framework.sink import Epoch, WriterContext

ROWS_PER_FILE = 100
SCHEMA = pa.schema([("id", pa.int64()), ("day", pa.string())])


def write(table: str, files: int) -> None:
    sink = DeltaSink(table, app_id="clean-exit", partition_by=["day"])
    sink.prepare(SCHEMA)
    epoch = Epoch(
        app_id="clean-exit", epoch_id=0, writer_identity="driver", run_id=str(uuid.uuid4())
    )
    staged = []
    for task in range(files):
        context = WriterContext(
            epoch=epoch, partition_id=task, attempt_number=0, task_attempt_id=task
        )
        writer = sink.create_writer(context)
        ids = range(task * ROWS_PER_FILE, (task + 1) * ROWS_PER_FILE)
        writer.write(
            pa.RecordBatch.from_pydict(
                {"id": list(ids), "day": [f"2026-11-{21 + i % 2}" for i in ids]}, schema=SCHEMA
            )
        )
        staged.extend(writer.prepare_commit(True))
        writer.close()
    committer = sink.create_global_committer()
    assert committer.commit([committer.combine(epoch, staged)]) == []
    committer.clean_up(epoch)


def main() -> None:
    table = sys.argv[1]
    files = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    write(table, files)
    rows = DeltaTable(table).to_pyarrow_table()
    assert rows.num_rows == files * ROWS_PER_FILE, rows.num_rows
    print("ROWS", rows.num_rows)


if __name__ == "__main__":
    main()
