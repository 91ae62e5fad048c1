"""Rendering an inspect, remove-orphans or vacuum report: as text for people, or as one JSON
document (keys as in the dataclasses of ``_inspect.py`` and ``_vacuum.py``; see
``docs/inspect.md``)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from committers.delta.commit._vacuum import VacuumReport
from committers.delta.inspect._inspect import (
    AppsSection,
    CommitEntry,
    FilesSection,
    InspectReport,
    LeftoversSection,
    OrphanReport,
    ProtocolSection,
    Settings,
)

__all__ = ["render_json", "render_orphans_text", "render_text", "render_vacuum_text"]

_TEXT_LEFTOVER_LINES = 20


def render_json(report: InspectReport | OrphanReport | VacuumReport) -> str:
    """The report as one JSON document (keys as in the dataclasses, see docs/inspect.md)."""
    return json.dumps(dataclasses.asdict(report), indent=2, ensure_ascii=False) + "\n"


def render_text(report: InspectReport) -> str:
    """The report for people: one block per section."""
    blocks = [
        _text_table(report),
        _text_apps(report.apps),
        _text_commits(report.commits, report.table.version),
        _text_leftovers(report.staged_leftovers),
        _text_files(report.files),
        _text_protocol(report.protocol),
        _text_settings(report.settings, report.configuration),
    ]
    return "\n\n".join(blocks) + "\n"


def _text_table(report: InspectReport) -> str:
    table = report.table
    columns = ", ".join(table.partition_columns)
    partitioning = f"partitioned by {columns}" if columns else "not partitioned"
    return (
        f"Delta table {table.uri}\n"
        f"  version {table.version}, {partitioning}, created {_when(table.created_time)}\n"
        f"  inspected {_when(report.generated_at)}"
    )


def _text_apps(apps: AppsSection) -> str:
    head = f"App ids ({len(apps.entries)}; last commits searched: {apps.history_searched})"
    if not apps.entries:
        return f"{head}\n  none: no txn actions, no sink commits"
    rows = []
    for app in apps.entries:
        commit = app.last_commit
        rows.append(
            [
                app.app_id,
                _or_dash(app.last_batch),
                _or_dash(commit and commit.writer_identity),
                _commit_time(commit.time) if commit else "not in history searched",
                _or_dash(commit and commit.version),
            ]
        )
    return head + "\n" + _columns(["APP ID", "LAST BATCH", "WRITER", "COMMITTED", "VERSION"], rows)


def _text_commits(commits: list[CommitEntry], version: int) -> str:
    head = f"Recent commits ({len(commits)} of {version + 1}, newest first)"
    if not commits:
        return head
    rows = [
        [
            str(c.version),
            _commit_time(c.time),
            c.operation or "-",
            f"{c.app_id}/{_or_dash(c.batch)}" if c.app_id else "-",
            _count(c.rows_added),
            _count(c.files_added),
            _size(c.bytes_added),
        ]
        for c in commits
    ]
    headers = ["VERSION", "TIME", "OPERATION", "APP/BATCH", "ROWS", "FILES", "BYTES"]
    return head + "\n" + _columns(headers, rows, right={0, 4, 5, 6})


def _text_leftovers(leftovers: LeftoversSection) -> str:
    if not leftovers.count:
        return "Staged leftovers: none"
    head = (
        f"Staged leftovers: {_files_count(leftovers.count)}, {_size(leftovers.bytes)}, "
        f"oldest {_age(leftovers.oldest_age_seconds)} old"
    )
    shown = leftovers.entries[:_TEXT_LEFTOVER_LINES]
    rows = [
        [
            _age(e.age_seconds),
            _size(e.bytes),
            e.kind,
            f"{e.app_id}/{_or_dash(e.writer_identity)}/{_or_dash(e.batch)}" if e.app_id else "-",
            e.path,
        ]
        for e in shown
    ]
    text = head + "\n" + _columns(["AGE", "SIZE", "KIND", "APP/WRITER/BATCH", "PATH"], rows)
    if leftovers.count > len(shown):
        text += f"\n  ... and {leftovers.count - len(shown)} more (--json lists all)"
    return text


def _text_files(files: FilesSection) -> str:
    ratio = "-" if files.small_file_ratio is None else f"{files.small_file_ratio:.1%}"
    text = (
        f"Files: {_files_count(files.count)}, {_size(files.bytes)}, {_count(files.rows)} rows\n"
        f"  small files (< {_size(files.small_file_threshold_bytes)}): "
        f"{_count(files.small_files)} ({ratio})"
    )
    if files.deletion_vectors:
        text += (
            f"\n  deletion vectors: {_count(files.deletion_vectors)} files, "
            f"{_count(files.deleted_rows)} rows deleted (compaction purges them)"
        )
    return text


def _text_protocol(protocol: ProtocolSection) -> str:
    def listed(explicit: list[str], effective: list[str]) -> str:
        if not effective:
            return "none"
        return ", ".join(effective) + ("" if explicit else " (implied by the legacy version)")

    sink = (
        "yes"
        if not protocol.unsupported_by_sink
        else f"no ({', '.join(protocol.unsupported_by_sink)})"
    )
    return (
        f"Protocol: reader version {protocol.min_reader_version}, "
        f"writer version {protocol.min_writer_version}\n"
        f"  reader features: "
        f"{listed(protocol.reader_features, protocol.effective_reader_features)}\n"
        f"  writer features: "
        f"{listed(protocol.writer_features, protocol.effective_writer_features)}\n"
        f"  the sink can append: {sink}"
    )


_SETTING_LABELS = (  # (attribute, table property, shown when not set)
    ("column_mapping_mode", "delta.columnMapping.mode", "none"),
    ("deletion_vectors", "delta.enableDeletionVectors", "false"),
    ("checkpoint_interval", "delta.checkpointInterval", "not set (delta-rs 100, delta-spark 10)"),
    (
        "set_transaction_retention_duration",
        "delta.setTransactionRetentionDuration",
        "not set (txns never expire)",
    ),
    ("log_retention_duration", "delta.logRetentionDuration", "not set (30 days)"),
    ("deleted_file_retention_duration", "delta.deletedFileRetentionDuration", "not set (7 days)"),
    ("append_only", "delta.appendOnly", "false"),
    ("change_data_feed", "delta.enableChangeDataFeed", "false"),
)


def _text_settings(settings: Settings, configuration: Mapping[str, str]) -> str:
    lines = ["Settings:"]
    width = max(len(prop) for _, prop, _ in _SETTING_LABELS)
    for attribute, prop, unset in _SETTING_LABELS:
        value = getattr(settings, attribute)
        shown = unset if prop not in configuration else str(value)
        lines.append(f"  {prop:<{width}}  {shown.lower() if isinstance(value, bool) else shown}")
    notable = {prop for _, prop, _ in _SETTING_LABELS}
    others = {k: v for k, v in configuration.items() if k not in notable}
    lines.extend(f"  {key:<{width}}  {value}" for key, value in others.items())
    return "\n".join(lines)


def render_vacuum_text(report: VacuumReport) -> str:
    """What vacuum would delete (dry run) or deleted, one file per line with its kind."""
    found = f"{_files_count(report.count)} ({_size(report.bytes)})"
    retention = _age(report.retention_seconds)
    if report.dry_run:
        head = (
            f"DRY RUN, nothing deleted. Would delete {found} from {report.table}: removed from "
            f"the table or referenced by no version, more than {retention} ago "
            f"(the table's delta.deletedFileRetentionDuration: "
            f"{_age(report.table_retention_seconds)})."
        )
    else:
        head = f"Deleted {found} from {report.table} (retention {retention})."
    rows = [f"  {_size(f.bytes):>10}  {f.kind:<12}  {f.path}" for f in report.files]
    if report.log_versions:
        shown = ", ".join(str(v) for v in report.log_versions)
        rows.append(f"Recorded in the log: VACUUM START / VACUUM END, versions {shown}.")
    return _deletion_text(head, rows, ask_for_yes=report.dry_run and report.count > 0)


def render_orphans_text(report: OrphanReport) -> str:
    """What remove-orphans would delete (dry run) or deleted, one file per line."""
    found = f"{_files_count(report.count)} ({_size(report.bytes)})"
    if report.dry_run:
        head = (
            f"DRY RUN, nothing deleted. Would delete {found} from {report.table}: older than "
            f"{_age(report.retention_seconds)} and referenced by no table version."
        )
    else:
        head = f"Deleted {found} from {report.table}."
    rows = [f"  {_size(f.bytes):>10}  {f.path}" for f in report.files]
    return _deletion_text(head, rows, ask_for_yes=report.dry_run and report.count > 0)


def _deletion_text(head: str, rows: list[str], *, ask_for_yes: bool) -> str:
    lines = [head, *rows]
    if ask_for_yes:
        lines.append("Run again with --yes to delete them.")
    return "\n".join(lines) + "\n"


def _columns(headers: list[str], rows: list[list[str]], right: Collection[int] = ()) -> str:
    """Rows as aligned columns, indented by two spaces (``right``: right-aligned columns)."""
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        padded = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(cells)
        ]
        return "  " + "  ".join(padded).rstrip()

    return "\n".join(line(r) for r in [headers, *rows])


# -- formatting helpers -----------------------------------------------------------------------


def _when(iso: str | None) -> str:
    """An ISO time for people: to the second, UTC."""
    return "-" if iso is None else iso[:19].replace("T", " ") + " UTC"


def _commit_time(iso: str | None) -> str:
    """A commit's time to the millisecond, as ``timestampAsOf`` / ``read_table(timestamp=)``
    take it: pasted there, it reads that commit's version."""
    return "-" if iso is None else iso.replace("T", " ")


def _or_dash(value: Any) -> str:
    return "-" if value is None else str(value)


def _count(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def _files_count(count: int) -> str:
    return f"{count:,} file" if count == 1 else f"{count:,} files"


def _size(value: int | None) -> str:
    if value is None:
        return "?"
    if value < 1024:
        return f"{value} B"
    amount = value / 1024
    for unit in ("KiB", "MiB", "GiB"):
        if amount < 1024:
            return f"{amount:.1f} {unit}"
        amount /= 1024
    return f"{amount:.1f} TiB"


def _age(seconds: float | None) -> str:
    """A duration for people, to two units: ``3d 4h``, ``5m 12s``, ``42s``."""
    if seconds is None:
        return "-"
    remaining = int(seconds)
    parts: list[str] = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if remaining >= size or (unit == "s" and not parts):
            parts.append(f"{remaining // size}{unit}")
            remaining %= size
    return " ".join(parts[:2])
