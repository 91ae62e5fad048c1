"""A process that schedules a background checkpoint of a table and exits ``delay`` seconds
later, usually while delta-rs is still writing it.

Usage: python -m committers.tests._exit_during_checkpoint_driver URI OPTIONS_JSON DELAY
"""

from __future__ import annotations

import json
import sys
import time

from deltalake import DeltaTable

from committers.delta.commit._log_maintenance import LogMaintenance
from committers.delta.storage._storage import TableLocation


def main() -> None:
    uri, options, delay = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3])
    location = TableLocation.of(uri, options or None)
    version = DeltaTable(uri, storage_options=location.delta_storage_options()).version()
    LogMaintenance(location).committed(version, {"delta.checkpointInterval": "1"})
    time.sleep(delay)


if __name__ == "__main__":
    main()
