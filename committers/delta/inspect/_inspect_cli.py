"""``python -m committers.delta inspect|vacuum|remove-orphans TABLE_URI``: the command line.

``inspect`` prints one :class:`~committers.delta.inspect._inspect.InspectReport` as text or as
one JSON document (see ``docs/inspect.md`` for its keys). ``vacuum`` runs
:func:`~committers.delta.commit._vacuum.vacuum_table` and ``remove-orphans``
:func:`~committers.delta.table._table.remove_orphan_files`, each as a dry run unless told otherwise.

Exit codes: 0 done; 1 the path is no Delta table, the storage cannot be read, or the table is
one vacuum / remove-orphans refuses; 2 bad arguments, options the sink would refuse, or a
retention too short without its override.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping, Sequence

from committers.delta._sink import DEFAULT_ORPHAN_RETENTION
from committers.delta.commit._vacuum import vacuum_table
from committers.delta.inspect._inspect import (
    DEFAULT_APP_HISTORY,
    DEFAULT_RECENT_COMMITS,
    DEFAULT_SMALL_FILE_BYTES,
    gather,
    list_orphans,
)
from committers.delta.inspect._inspect_render import (
    render_json,
    render_orphans_text,
    render_text,
    render_vacuum_text,
)
from committers.delta.storage._storage import TableLocation
from committers.delta.table._table import MIN_ORPHAN_RETENTION_SECONDS
from framework.errors import ConfigurationError, SinkError

__all__ = ["build_parser", "main", "parse_retention", "parse_size"]

_SIZE_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3}
_SIZE_UNITS.update({"kib": 1024, "mib": 1024**2, "gib": 1024**3})
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_AMOUNT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """Bytes in ``"33554432"``, ``"32MiB"``, ``"1.5GB"`` (KiB/MiB/GiB binary, KB/MB/GB
    decimal)."""
    return int(_amount(text, _SIZE_UNITS, f"not a size: {text!r} (e.g. 32MiB, 1GB, 1048576)"))


def parse_retention(text: str) -> float:
    """Seconds in ``"7d"``, ``"36h"``, ``"90m"``, ``"3600s"``, ``"1w"`` or ``"3600"``."""
    return _amount(text, _DURATION_UNITS, f"not a duration: {text!r} (e.g. 7d, 36h, 3600s)")


def _amount(text: str, units: Mapping[str, int], error: str) -> float:
    """A number with an optional unit (case-insensitive), times that unit's factor."""
    match = _AMOUNT.match(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in units:
        raise argparse.ArgumentTypeError(error)
    return float(match.group(1)) * units[unit]


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"not a non-negative integer: {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m committers.delta",
        description="Inspect and clean Delta tables written by the sparksink DeltaSink. S3 "
        "settings come from the environment as for the sink (AWS_ENDPOINT_URL, AWS_REGION, "
        "AWS_ACCESS_KEY_ID, AWS_PROFILE, ...).",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    inspect = commands.add_parser(
        "inspect", help="writers, recent commits, staged leftovers, files, protocol"
    )
    inspect.add_argument("table_uri", metavar="TABLE_URI")
    inspect.add_argument(
        "--commits",
        type=_non_negative,
        default=DEFAULT_RECENT_COMMITS,
        metavar="N",
        help=f"recent commits to list (default {DEFAULT_RECENT_COMMITS})",
    )
    inspect.add_argument(
        "--small-file-size",
        type=parse_size,
        default=DEFAULT_SMALL_FILE_BYTES,
        metavar="SIZE",
        help="files below this size count as small (default 32MiB, a quarter of the sink's "
        "128MiB target file size)",
    )
    inspect.add_argument(
        "--app-history",
        type=_non_negative,
        default=DEFAULT_APP_HISTORY,
        metavar="N",
        help="newest commits searched for each app id's last commit "
        f"(default {DEFAULT_APP_HISTORY})",
    )
    inspect.add_argument("--json", action="store_true", help="print one JSON document")

    vacuum = commands.add_parser(
        "vacuum",
        help="delete files the table removed or never referenced, older than the retention "
        "(dry run unless --yes)",
    )
    _cleaning_arguments(
        vacuum,
        default=None,
        retention_help="only files removed (or written, if no version references them) longer "
        "ago than this (default: the table's delta.deletedFileRetentionDuration, 7d if not "
        "set; e.g. 36h, 3600s; a bare number is seconds; shorter than that or than 1h needs "
        "--unsafe-allow-short-retention)",
        override_help="allow a retention shorter than the table's, or than one hour (only "
        "when nothing reads older versions and no writer is running)",
    )
    clean = commands.add_parser(
        "remove-orphans",
        help="delete files no table version references, older than the retention (dry run "
        "unless --yes)",
    )
    _cleaning_arguments(
        clean,
        default=DEFAULT_ORPHAN_RETENTION.total_seconds(),
        retention_help="only files older than this (default 7d; e.g. 36h, 3600s; a bare "
        "number is seconds; below 1h needs --unsafe-allow-short-retention)",
        override_help="allow a retention below one hour (only when no writer is running)",
    )
    return parser


def _cleaning_arguments(
    command: argparse.ArgumentParser,
    *,
    default: float | None,
    retention_help: str,
    override_help: str,
) -> None:
    """The arguments ``vacuum`` and ``remove-orphans`` share."""
    command.add_argument("table_uri", metavar="TABLE_URI")
    command.add_argument(
        "--retention",
        type=parse_retention,
        default=default,
        metavar="DURATION",
        help=retention_help,
    )
    command.add_argument(
        "--yes",
        "--no-dry-run",
        dest="delete",
        action="store_true",
        help="really delete (the default is a dry run that only lists)",
    )
    command.add_argument("--unsafe-allow-short-retention", action="store_true", help=override_help)
    command.add_argument("--json", action="store_true", help="print one JSON document")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (argparse exits with 2 by itself)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        location = TableLocation.of(args.table_uri)
        if args.command == "inspect":
            report = gather(
                location,
                recent_commits=args.commits,
                small_file_bytes=args.small_file_size,
                app_history=args.app_history,
            )
            output = render_json(report) if args.json else render_text(report)
        else:
            output = _clean(args, location)
    except ConfigurationError as err:
        print(f"{parser.prog}: error: {err}{_cli_hint(args, err)}", file=sys.stderr)
        return 2
    except SinkError as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 1
    sys.stdout.write(output)
    return 0


def _clean(args: argparse.Namespace, location: TableLocation) -> str:
    """Run ``vacuum`` or ``remove-orphans``; their report as the output."""
    options = {
        "retention_seconds": args.retention,
        "dry_run": not args.delete,
        "unsafe_allow_short_retention": args.unsafe_allow_short_retention,
    }
    if args.command == "vacuum":
        vacuumed = vacuum_table(location, **options)
        return render_json(vacuumed) if args.json else render_vacuum_text(vacuumed)
    orphans = list_orphans(location, **options)
    return render_json(orphans) if args.json else render_orphans_text(orphans)


def _cli_hint(args: argparse.Namespace, err: ConfigurationError) -> str:
    """The command-line spelling of the override a too short retention asks for."""
    if args.command == "inspect" or args.unsafe_allow_short_retention:
        return ""
    if args.command == "vacuum" and "unsafe_allow_short_retention" in str(err):
        return " (on the command line: --unsafe-allow-short-retention)"
    if args.command == "remove-orphans" and args.retention < MIN_ORPHAN_RETENTION_SECONDS:
        return " (on the command line: --unsafe-allow-short-retention)"
    return ""
