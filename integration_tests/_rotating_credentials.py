"""Short-lived S3 keys that rotate on a schedule, as an STS would issue them.

:class:`RotatingCredentials` writes an AWS config whose profile gets its keys from a
``credential_process`` (this file, run as a script): key ``i`` of the server's
``temporary_keys`` is handed out during ``[start + i * period, start + (i + 1) * period)`` and
expires one period after that, so like an STS session every key handed out has at least one
period to live. :attr:`RotatingCredentials.key_expiry` is what a
:class:`~integration_tests._fault_proxy.FaultProxy` needs to refuse each key once it expired,
so the pair behaves like S3 behind STS: a client holding yesterday's session gets
``400 ExpiredToken``. (No session token: SeaweedFS checks tokens against its own STS.)

Run as ``python _rotating_credentials.py SCHEDULE_JSON``: prints the current key in the
``credential_process`` format (version 1). Standard library only: botocore runs it often.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

PROFILE = "rotating"


class RotatingCredentials:
    """A schedule of ``keys`` (``(access key, secret key)`` pairs), one per ``period`` seconds
    from now, and the AWS config that hands them out."""

    def __init__(self, keys: tuple[tuple[str, str], ...], period: float, directory: Path) -> None:
        if not keys:
            raise ValueError("the S3 server has no temporary keys (SeaweedFS started here has)")
        self.start = time.time()
        self.period = period
        self.keys = keys
        self.schedule = directory / "schedule.json"
        self.schedule.write_text(json.dumps({"start": self.start, "period": period, "keys": keys}))
        self.config = directory / "aws-config"
        self.config.write_text(
            f"[profile {PROFILE}]\n"
            f"credential_process = {sys.executable} {Path(__file__).resolve()} {self.schedule}\n"
        )

    @property
    def key_expiry(self) -> dict[str, float]:
        return {key: self.start + (i + 2) * self.period for i, (key, _) in enumerate(self.keys)}

    def environment(self, base: dict[str, str], directory: Path) -> dict[str, str]:
        """``base`` with every other credential source removed and this profile selected."""
        env = {
            name: value
            for name, value in base.items()
            if name not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
        }
        env.update(
            AWS_CONFIG_FILE=str(self.config),
            AWS_SHARED_CREDENTIALS_FILE=str(directory / "no-credentials"),
            AWS_PROFILE=PROFILE,
            AWS_EC2_METADATA_DISABLED="true",
        )
        return env


def _current(schedule: dict[str, Any]) -> dict[str, Any]:
    index = int((time.time() - schedule["start"]) // schedule["period"])
    if not 0 <= index < len(schedule["keys"]):
        raise SystemExit(f"no temporary key scheduled for slot {index}")
    key, secret = schedule["keys"][index]
    expires = schedule["start"] + (index + 2) * schedule["period"]
    return {
        "Version": 1,
        "AccessKeyId": key,
        "SecretAccessKey": secret,
        "Expiration": datetime.fromtimestamp(expires, timezone.utc).isoformat(),
    }


if __name__ == "__main__":
    print(json.dumps(_current(json.loads(Path(sys.argv[1]).read_text()))))
