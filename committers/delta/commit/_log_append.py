"""Blind appends written straight into the Delta log, at a cost that does not grow with history.

delta-rs 1.6 lists the whole ``_delta_log`` directory (several times) and rebuilds the table's
live-file list on every commit, so a long stream's commits get slower with every version. A
blind append (adds and a txn, no removes, nothing read) needs neither:

* :class:`LogView` is the committer's own incremental view of the table: the version it last
  saw, the protocol and metadata, every app id's txn version. A cold start reads the checkpoint
  ``_last_checkpoint`` names (only its ``protocol``, ``metaData`` and ``txn`` columns), then the
  commits after it; after that the view advances by *probing* for ``<version + 1>.json`` (one
  read that finds nothing when the view is current), never by listing the directory.
* :func:`append` writes the next version with put-if-absent semantics (:class:`LogStore`): an
  atomic create-exclusive (a hard link of a complete temporary file) on a local file system, a
  PUT with ``If-None-Match: *`` on S3 (the self-test in ``_s3safety`` verifies the server
  honours it). Losing the race reads the commits that won and applies Delta's conflict rules
  for a blind append (:func:`conflict_of`): a protocol or metadata change, a txn of our app id,
  or a commit of another writer of our app id is a conflict (:class:`AppendConflict`: the caller
  then takes its general path, which raises today's errors); anything else (other writers'
  appends, removes, compactions) is not, and the commit is retried at the next version.

The commit file holds what delta-rs writes for the same commit (:func:`commit_lines`): the
``add`` actions, the ``txn`` with ``lastUpdated``, then the ``commitInfo`` with delta-rs's
``WRITE`` operation and our keys. Tables whose writer features need more than adds and a txn
(in-commit timestamps, row tracking, domain metadata, ...) are never given to this path
(:func:`unsupported_by_append`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import deltalake
import pyarrow as pa

from committers.delta.commit._log_store import (
    LAST_CHECKPOINT,
    LOG_DIR,
    LogStore,
    LogViewUnavailable,
    json_line,
)
from committers.delta.storage._storage import TableLocation
from committers.delta.table._delta_schema import parse_schema
from committers.delta.table._protocol import TableFeatures, uses_in_commit_timestamps
from committers.delta.table._rules import TableShape
from committers.delta.table._schema import OptionSpelling, SchemaMode, merge_schemas
from committers.delta.table._table import delta_rs_path

__all__ = [
    "AppendConflict",
    "AppendIdentity",
    "AppendOutcome",
    "LogAppender",
    "LogCommit",
    "LogView",
    "LogViewUnavailable",
    "adds_columns",
    "append",
    "commit_lines",
    "conflict_of",
    "shape_of",
    "unsupported_by_append",
]

log = logging.getLogger("committers.delta")

#: How long a view may go unconfirmed before its next commit first re-reads
#: ``_last_checkpoint``: expired-log clean-up (of another writer) may have deleted the commit
#: after the view's version only once it is older than the log retention, so a view advanced
#: within this age cannot miss a version by probing.
RECHECK_AFTER_SECONDS = 600.0
#: Commits read at once (concurrent GETs on S3) when a view catches up with a backlog.
MAX_READ_AHEAD = 64
#: Lost races tolerated by one append before it gives up (each costs one version's read).
MAX_RACES = 64

# Writer features whose commits need more than adds and a txn (or a reader this view is not).
_APPEND_UNSUPPORTED = frozenset(
    {
        "inCommitTimestamp",  # commitInfo.inCommitTimestamp first, monotonic
        "rowTracking",  # baseRowId / defaultRowCommitVersion and the high-water mark
        "domainMetadata",
        "clustering",
        "identityColumns",
        "icebergCompatV1",
        "icebergCompatV2",
        "v2Checkpoint",  # checkpoints with sidecars (the cold start reads classic ones only)
        "vacuumProtocolCheck",
    }
)

ENGINE_INFO = f"delta-rs:py-{deltalake.__version__}"
CLIENT_VERSION = f"delta-rs.py-{deltalake.__version__}"


class AppendConflict(Exception):
    """A commit that won the race (or came in since the view's version) conflicts with a blind
    append of this app id; nothing was written. The caller decides with a full snapshot."""

    def __init__(self, version: int, reason: str) -> None:
        super().__init__(f"version {version}: {reason}")
        self.version = version
        self.reason = reason


@dataclass(frozen=True)
class LogCommit:
    """What one commit changes that a blind append cares about."""

    version: int
    protocol: dict[str, Any] | None
    metadata: dict[str, Any] | None
    txns: dict[str, int]
    info: dict[str, Any]
    domains: dict[str, dict[str, Any]] = field(default_factory=dict)  # domain -> its action


@dataclass
class LogView:
    """The table as of :attr:`version`, as far as appending to it needs.

    Attributes:
        version: the newest version seen.
        protocol, metadata: the ``protocol`` and ``metaData`` actions in force (as JSON).
        txns: app id -> newest txn version.
        domains: domain -> its newest ``domainMetadata`` action (a removed one included).
        confirmed_at: when probing last found :attr:`version` to be the newest (``time.time()``).
    """

    version: int
    protocol: dict[str, Any]
    metadata: dict[str, Any]
    txns: dict[str, int] = field(default_factory=dict)
    domains: dict[str, dict[str, Any]] = field(default_factory=dict)
    confirmed_at: float = 0.0

    @classmethod
    def load(cls, store: LogStore) -> LogView:
        """The view at the latest version: the checkpoint ``_last_checkpoint`` names (or
        version 0), then the commits after it, found by probing.

        Raises:
            LogViewUnavailable: see that class.
        """
        view = cls._from_checkpoint(store) or cls._from_first_commit(store)
        view.advance(store)
        return view

    @classmethod
    def _from_checkpoint(cls, store: LogStore) -> LogView | None:
        raw = store.read(LAST_CHECKPOINT)
        if raw is None:
            return None
        try:
            pointer = json.loads(raw)
            version = int(pointer["version"])
        except (ValueError, KeyError, TypeError):  # a torn or foreign pointer: start at 0
            log.info("unreadable %s/%s; reading the log from version 0", LOG_DIR, LAST_CHECKPOINT)
            return None
        parts = pointer.get("parts")
        v2 = pointer.get("v2Checkpoint")
        if isinstance(v2, dict) and v2.get("path"):  # delta-spark's v2 checkpoint, UUID-named
            names = [str(v2["path"])]
        elif parts:
            names = [
                f"{version:020d}.checkpoint.{i:010d}.{parts:010d}.parquet"
                for i in range(1, parts + 1)
            ]
        else:
            names = [f"{version:020d}.checkpoint.parquet"]
        protocol = metadata = None
        txns: dict[str, int] = {}
        domains: dict[str, dict[str, Any]] = {}
        for name in names:
            part = store.read_checkpoint(name)
            protocol = part.get("protocol") or protocol
            metadata = part.get("metaData") or metadata
            txns.update(part.get("txn") or {})
            domains.update(part.get("domainMetadata") or {})
        if protocol is None or metadata is None:
            raise LogViewUnavailable(f"checkpoint {version} holds no protocol or metadata")
        return cls(version, protocol, metadata, txns, domains)

    @classmethod
    def _from_first_commit(cls, store: LogStore) -> LogView:
        raw = store.read(f"{0:020d}.json")
        if raw is None:
            raise LogViewUnavailable("no checkpoint and no version 0 in the log")
        commit = parse_commit(0, raw)
        if commit.protocol is None or commit.metadata is None:
            raise LogViewUnavailable("version 0 holds no protocol or metadata")
        return cls(0, commit.protocol, commit.metadata, dict(commit.txns), dict(commit.domains))

    def apply(self, commit: LogCommit) -> None:
        """Advance the view by ``commit`` (the next version)."""
        assert commit.version == self.version + 1, (commit.version, self.version)
        self.version = commit.version
        self.protocol = commit.protocol or self.protocol
        self.metadata = commit.metadata or self.metadata
        for app_id, txn_version in commit.txns.items():
            self.txns[app_id] = txn_version
        self.domains.update(commit.domains)

    def advance(self, store: LogStore) -> list[LogCommit]:
        """Read the commits after :attr:`version`, probing for the next one (a backlog is read
        ahead, see :meth:`LogStore.read_commits`), and apply them; returns them, oldest
        first."""
        if self.confirmed_at and time.time() - self.confirmed_at > RECHECK_AFTER_SECONDS:
            self._catch_up_with_checkpoint(store)
        new = []
        window = 1  # the usual probe: nothing new, or one commit
        while True:
            found = store.read_commits(self.version + 1, window)
            for raw in found:
                commit = parse_commit(self.version + 1, raw)
                self.apply(commit)
                new.append(commit)
            if len(found) < window:
                break
            window = min(window * 8, MAX_READ_AHEAD)  # a backlog (a load): read ahead
        self.confirmed_at = time.time()
        return new

    def _catch_up_with_checkpoint(self, store: LogStore) -> None:
        """A view left unconfirmed for long restarts from a newer checkpoint, if there is one
        (the commits between may have expired)."""
        fresh = LogView._from_checkpoint(store)
        if fresh is not None and fresh.version > self.version:
            log.info("log view at %d restarts from checkpoint %d", self.version, fresh.version)
            self.version, self.protocol, self.metadata = (
                fresh.version,
                fresh.protocol,
                fresh.metadata,
            )
            self.txns = fresh.txns
            self.domains = fresh.domains

    @property
    def writer_features(self) -> frozenset[str]:
        return frozenset(self.protocol.get("writerFeatures") or ())

    @property
    def configuration(self) -> dict[str, str]:
        return dict(self.metadata.get("configuration") or {})


def parse_commit(version: int, raw: bytes) -> LogCommit:
    """The actions of commit ``version`` (newline-delimited JSON) an append cares about."""
    protocol = metadata = None
    txns: dict[str, int] = {}
    info: dict[str, Any] = {}
    domains: dict[str, dict[str, Any]] = {}
    for line in raw.splitlines():
        if not line.strip():
            continue
        action = json.loads(line)
        if "protocol" in action:
            protocol = action["protocol"]
        elif "metaData" in action:
            metadata = action["metaData"]
        elif "txn" in action:
            txns[action["txn"]["appId"]] = int(action["txn"]["version"])
        elif "commitInfo" in action:
            info = action["commitInfo"]
        elif "domainMetadata" in action:
            domains[action["domainMetadata"]["domain"]] = action["domainMetadata"]
    return LogCommit(version, protocol, metadata, txns, info, domains)


def unsupported_by_append(view: LogView, *, honoured: frozenset[str] = frozenset()) -> str | None:
    """Why ``view``'s table needs more than :func:`append` writes, or ``None``; the writer
    features in ``honoured`` are the caller's to honour (identity columns: the caller brings
    the metaData action that advances their marks)."""
    needed = sorted(view.writer_features & (_APPEND_UNSUPPORTED - honoured))
    if needed:
        return f"writer features {', '.join(needed)}"
    if uses_in_commit_timestamps(view.configuration):
        return "in-commit timestamps"
    return None


@dataclass(frozen=True)
class AppendIdentity:
    """Whose append this is: the conflict rules and the recognition of our own commit."""

    app_id: str
    epoch_id: int
    run_id: str
    writer_identity: str
    #: commitInfo keys naming the app id, the epoch and the run (``epoch_key`` ``None``: a
    #: one-off write, whose commitInfo names its run only; its run id is its own)
    app_key: str
    epoch_key: str | None
    run_key: str


def conflict_of(commit: LogCommit, me: AppendIdentity) -> str | None:
    """Delta's conflict rules for a blind append against ``commit`` (a concurrent winner):
    why it conflicts, or ``None`` (then the append may land on the next version)."""
    if commit.protocol is not None:
        return "the protocol changed"
    if commit.metadata is not None:
        return "the metadata (schema, partitioning or properties) changed"
    if me.app_id in commit.txns:
        return f"a txn of app id {me.app_id!r} (version {commit.txns[me.app_id]})"
    if commit.info.get(me.app_key) == me.app_id:
        return f"a commit of another writer of app id {me.app_id!r}"
    return None


def is_our_commit(commit: LogCommit, me: AppendIdentity) -> bool:
    """``commit`` is this very append (a PUT that landed although its answer was lost)."""
    info = commit.info
    if info.get(me.run_key) != me.run_id:
        return False
    return me.epoch_key is None or info.get(me.epoch_key) == str(me.epoch_id)


def commit_lines(
    adds: Sequence[Mapping[str, Any]],
    *,
    txn: tuple[str, int] | None,
    custom_metadata: Mapping[str, Any],
    partition_by: Sequence[str],
    now_ms: int,
    metadata_action: Mapping[str, Any] | None = None,
    protocol_action: Mapping[str, Any] | None = None,
    tags: Mapping[str, str] | None = None,
    removes: Sequence[Mapping[str, Any]] = (),
    mode: str = "Append",
    in_commit_timestamp: int | None = None,
    domains: Sequence[Mapping[str, Any]] = (),
) -> bytes:
    """The commit file delta-rs 1.6 writes for ``create_write_transaction(adds, mode="append",
    partition_by=..., commit_properties=CommitProperties(app_transactions=[txn],
    custom_metadata=...))``: its ``commitInfo`` (a ``WRITE``, our ``operationParameters``
    with delta-rs's ``mode`` and ``partitionBy``, its engine and client version, our keys),
    the ``add`` actions in the order given (paths spelled as delta-rs spells them), then the
    ``txn``, which delta-rs writes without ``lastUpdated``. delta-rs orders the keys of the
    commitInfo by hash; here they come in a fixed order.

    ``metadata_action``: a ``metaData`` action to commit too (written after the commitInfo, as
    delta-spark does), e.g. one advancing identity high-water marks; ``protocol_action``: a
    ``protocol`` action, written before it (a table's first commit); ``tags``: the
    commitInfo's ``tags`` (delta-spark's, such as ``delta.identity.schemaUpdate``);
    ``removes``: ``remove`` actions, written as given before the adds (for the rewrites
    delta-rs cannot spell, see :mod:`._log_rewrite`); ``mode``: the WRITE's mode as the
    history shows it (``Overwrite`` for a commit replacing the table's schema);
    ``in_commit_timestamp``: the commit's ``inCommitTimestamp`` (a table with in-commit
    timestamps; the commitInfo then comes first, as it always does here, and its ``timestamp``
    is the same instant, as delta-spark writes it); ``domains``: ``domainMetadata`` actions
    (after the ``metaData``)."""
    metadata = dict(custom_metadata)
    parameters = {
        **(metadata.pop("operationParameters", None) or {}),
        "mode": mode,
        "partitionBy": json.dumps(list(partition_by), separators=(",", ":")),
    }
    head: dict[str, Any] = {
        key: metadata.pop(key) for key in ("readVersion", "isBlindAppend") if key in metadata
    }
    info: dict[str, Any] = {
        **({} if in_commit_timestamp is None else {"inCommitTimestamp": in_commit_timestamp}),
        "timestamp": now_ms if in_commit_timestamp is None else in_commit_timestamp,
        "operation": "WRITE",
        "operationParameters": parameters,
        **head,
        "engineInfo": ENGINE_INFO,
        "clientVersion": CLIENT_VERSION,
        **dict(sorted(metadata.items())),
    }
    if tags:
        info["tags"] = dict(tags)
    lines: list[dict[str, Any]] = [{"commitInfo": info}]
    if protocol_action is not None:
        lines.append({"protocol": dict(protocol_action)})
    if metadata_action is not None:
        lines.append({"metaData": dict(metadata_action)})
    lines += [{"domainMetadata": dict(domain)} for domain in domains]
    lines += [{"remove": dict(remove)} for remove in removes]
    lines += [{"add": _add_entry(add)} for add in adds]
    if txn is not None:
        lines.append({"txn": {"appId": txn[0], "version": txn[1]}})
    return "".join(json_line(line) for line in lines).encode()


def _add_entry(add: Mapping[str, Any]) -> dict[str, Any]:
    """An add action as delta-rs writes one given ``AddAction(path, size, partition_values,
    modification_time, data_change, stats)`` (``path`` decoded, relative to the root)."""
    entry = {
        "path": delta_rs_path(add["path"]),
        "partitionValues": dict(add["partitionValues"]),
        "size": add["size"],
        "modificationTime": add["modificationTime"],
        "dataChange": add["dataChange"],
        "stats": add.get("stats"),
        "tags": None,
        "baseRowId": add.get("baseRowId"),  # (row tracking: see _row_tracking)
        "defaultRowCommitVersion": add.get("defaultRowCommitVersion"),
        "clusteringProvider": None,
    }
    if add.get("deletionVector") is not None:  # a file re-added with a (new) vector
        entry["deletionVector"] = dict(add["deletionVector"])
    return entry


@dataclass(frozen=True)
class AppendOutcome:
    """Where :func:`append` landed and what it read on the way."""

    version: int
    races_lost: int


def append(
    store: LogStore,
    view: LogView,
    me: AppendIdentity,
    commit_for: Callable[[int], bytes],
    *,
    max_races: int = MAX_RACES,
    metadata: dict[str, Any] | None = None,
) -> AppendOutcome:
    """Commit a blind append at the version after ``view``'s (its read version: the caller has
    checked the replay and the table's rules on it), advancing ``view`` past every commit that
    wins a race meanwhile; the view then holds our commit too.

    ``commit_for(now_ms)`` returns the commit file's bytes; ``metadata``: the ``metaData``
    action they carry, if any (the view takes it on once the commit lands).

    Raises:
        AppendConflict: a commit after the read version conflicts (:func:`conflict_of`);
            nothing was written.
        OSError and storage client errors: the outcome of the last write is unknown; the
            caller reconciles (and should load its view afresh).
    """
    races = 0
    while True:
        version = view.version + 1
        if store.put_if_absent(f"{version:020d}.json", commit_for(int(time.time() * 1000))):
            txns = {} if me.epoch_key is None else {me.app_id: me.epoch_id}  # one-off: no txn
            view.apply(LogCommit(version, None, metadata, txns, {}))
            return AppendOutcome(version, races)
        races += 1
        winners = view.advance(store)
        if not winners:  # existed, then vanished (a cleaned-up log?): let the caller decide
            raise AppendConflict(version, "the version existed but cannot be read")
        for commit in winners:
            if is_our_commit(commit, me):  # our PUT landed (a retried request answered 412)
                return AppendOutcome(commit.version, races)
            reason = conflict_of(commit, me)
            if reason is not None:
                raise AppendConflict(commit.version, reason)
        if races >= max_races:
            raise AppendConflict(version, f"{races} commit races lost in a row")


def shape_of(view: LogView) -> TableShape:
    """The table's shape (schema, partitioning, features, properties) at ``view``'s version, as
    :meth:`TableShape.of_table` makes it of a delta-rs snapshot."""
    protocol, metadata = view.protocol, view.metadata
    return TableShape(
        schema=parse_schema(metadata["schemaString"]),
        partition_by=tuple(metadata.get("partitionColumns") or ()),
        features=TableFeatures.of(
            int(protocol["minWriterVersion"]), protocol.get("writerFeatures")
        ),
        configuration=tuple(sorted((k, str(v)) for k, v in view.configuration.items())),
    )


class LogAppender:
    """A committer's blind-append path into one table: the view is loaded once (a cold start)
    and then only advanced by probing. Not thread-safe (one committer drives it).

    After an error of unknown outcome the view is dropped and loaded afresh next time.
    """

    def __init__(self, location: TableLocation) -> None:
        self._store = LogStore(location)
        self._view: LogView | None = None
        self._rules_checked_on: tuple[object, object] | None = None

    @property
    def store(self) -> LogStore:
        return self._store

    def current(self, *, probe: bool = True) -> LogView | None:
        """The view at the newest version, or ``None`` when the log cannot be followed by
        probing (no table yet, or see :class:`LogViewUnavailable`). ``probe=False``: a view
        already loaded is returned as it is (the caller probed moments ago; an append on it
        that loses its race reads the commits it missed then)."""
        try:
            if self._view is None:
                self._view = LogView.load(self._store)
            elif probe:
                self._view.advance(self._store)
        except LogViewUnavailable as err:
            log.info("appending through delta-rs: the log cannot be followed (%s)", err)
            self._view = None
        return self._view

    def rules_checked(self, view: LogView) -> bool:
        """Whether the caller checked its plan on ``view``'s very protocol and metadata."""
        checked = self._rules_checked_on
        return checked is not None and checked[0] is view.protocol and checked[1] is view.metadata

    def mark_rules_checked(self, view: LogView) -> None:
        self._rules_checked_on = (view.protocol, view.metadata)

    def append(
        self,
        me: AppendIdentity,
        commit_for: Callable[[int], bytes],
        metadata: dict[str, Any] | None = None,
    ) -> AppendOutcome:
        """:func:`append` on the current view (advanced by :meth:`current` first).

        Raises:
            AppendConflict: as :func:`append`.
            Exception: any other failure, whose outcome is unknown: the view is dropped.
        """
        assert self._view is not None, "current() first"
        try:
            return append(self._store, self._view, me, commit_for, metadata=metadata)
        except AppendConflict:
            raise
        except BaseException:
            self._view = None
            raise

    def forget(self) -> None:
        """Drop the view (after a commit made elsewhere with an unknown outcome)."""
        self._view = None


def adds_columns(
    shape: TableShape,
    input_schema: pa.Schema,
    mode: SchemaMode,
    spelling: OptionSpelling,
) -> bool:
    """Whether the input brings columns the table (``shape``) lacks and ``mode`` adds them (or
    types it widens): a schema change, which a blind append cannot carry.

    Raises:
        SchemaMismatchError: the input cannot be written to the table at all (as when
            staging).
    """
    current = shape.arrow_schema()
    merged = merge_schemas(
        current, input_schema, mode, shape.computed_columns, spelling, shape.widens_types
    )
    return not merged.equals(current)
