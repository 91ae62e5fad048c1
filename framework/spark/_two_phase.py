"""TwoPhaseSink: runs any framework Sink on Spark, streaming (foreachBatch) or bounded."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from framework._crash import crash_point
from framework._foreign_options import refuse_unknown_options
from framework._logging import install_fallback_handlers
from framework.errors import (
    CheckpointResetError,
    CommitStateUnknownError,
    ConfigurationError,
    SinkError,
    StaleStagingError,
    UnsupportedTypeError,
)
from framework.sink import Epoch, GlobalCommitter, OutputMode, Sink, deserialize_versioned
from framework.spark._checkpoint import read_checkpoint, save_epoch_offset
from framework.spark._commit import commit_epoch
from framework.spark._errors import (
    install_py4j_log_filter,
    mark_reported,
    sink_error_in_text,
    translate_task_error,
)
from framework.spark._metrics import BatchMetrics
from framework.spark._native import PlansEachBatch, StagesWithSpark, is_connect_dataframe
from framework.spark._plan import apply_input_plan
from framework.spark._quiesce import staging_job_group, wait_for_tasks_to_end
from framework.spark._tasks import TASK_RESULT_SCHEMA, make_task_function, positional_names

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.types import StructType

__all__ = ["TwoPhaseSink"]

log = logging.getLogger("framework.spark")
install_fallback_handlers()  # WARNINGs visible, INFO one setLevel away, never printed twice
DERIVED_APP_ID_PREFIX = "query-"  # app ids derived from the streaming query id
#: How often one epoch is staged again because the destination's rules changed before its
#: commit (another writer's ALTER TABLE); a table changed that often fails the batch.
MAX_RESTAGES = 3

OnCheckpointReset = Literal["error", "continue"]
_BOUNDED_SUFFIX = ":write"
_DEFAULT_BOUNDED_APP = "bounded"
# Set by Spark on the thread that runs a micro-batch (classic Spark only).
_QUERY_ID_PROPERTY = "sql.streaming.queryId"
#: Name of the observation that puts each batch's input rows into ``query.lastProgress``.
OBSERVATION_NAME = "sparksink"


#: DataFrameWriter / DataStreamWriter spellings and what they are here.
_SPARK_WRITER_SPELLINGS = {
    "mode": "how rows are written is one of the sink's own options (e.g. DeltaSink(..., "
    "mode='overwrite')); write(df) runs a bounded DataFrame, write_stream(df, ...) a stream",
    "outputMode": "use output_mode='append' or 'complete' (write_stream only)",
    "output_mode": "a bounded write appends; output_mode is an option of write_stream",
    "userMetadata": "use user_metadata='...'",
    "options": "destination options belong to the sink (e.g. DeltaSink(..., storage_options=...))",
    "mergeSchema": "schema evolution is an option of the sink: DeltaSink(..., schema_mode='merge')",
    "checkpointLocation": "use checkpoint_location=...",
    "queryName": "use query_name=...",
}
_SPARK_ONLY_TYPES = ("VariantType", "CalendarIntervalType", "ObjectType", "NullType")


def _reject_spark_only_types(data_type: Any, path: str) -> None:
    """Types with no faithful Arrow/Parquet counterpart would be written as something else."""
    from pyspark.sql import types as T

    name = type(data_type).__name__
    if name in _SPARK_ONLY_TYPES:
        raise UnsupportedTypeError(
            f"column {path!r} has Spark type {data_type.simpleString()}, which sinks cannot "
            "store faithfully. Cast it first (e.g. to_json() for variant, a string or number "
            "for intervals, a typed null via cast(null as <type>))."
        )
    if isinstance(data_type, T.StructType):
        for field in data_type.fields:
            _reject_spark_only_types(field.dataType, f"{path}.{field.name}")
    elif isinstance(data_type, T.ArrayType):
        _reject_spark_only_types(data_type.elementType, f"{path}[]")
    elif isinstance(data_type, T.MapType):
        _reject_spark_only_types(data_type.keyType, f"{path}{{key}}")
        _reject_spark_only_types(data_type.valueType, f"{path}{{value}}")


def _arrow_schema(df: DataFrame) -> Any:
    return arrow_schema_of(df.schema)


def arrow_schema_of(schema: StructType) -> Any:
    """The Arrow schema a sink is prepared with for rows of Spark ``schema``.

    Raises:
        UnsupportedTypeError: a type sinks cannot store faithfully, or Arrow cannot hold.
    """
    from pyspark.sql.pandas.types import to_arrow_schema

    for field in schema.fields:
        _reject_spark_only_types(field.dataType, field.name)

    try:
        # Instants are UTC whatever the session time zone; the sink stores UTC timestamps.
        return to_arrow_schema(schema, timezone="UTC", prefers_large_types=False)
    except Exception as err:  # pyspark raises TypeError / its own errors for unsupported types
        raise UnsupportedTypeError(
            f"the DataFrame has a column type that cannot be written through Arrow: {err}. "
            "Cast it to a supported type first."
        ) from err


def _check_epoch_id(epoch_id: object) -> None:
    if epoch_id is None:
        return
    if not isinstance(epoch_id, int) or isinstance(epoch_id, bool) or epoch_id < 0:
        raise ConfigurationError(f"epoch_id must be a non-negative integer, got {epoch_id!r}")


class TwoPhaseSink:
    """Runs a framework :class:`~framework.sink.Sink` on Spark.

    * ``write_stream(df, ...)``: a streaming query whose every micro-batch is staged by the
      sink's writers in Spark tasks and committed by its global committer on the driver as one
      transaction keyed by ``(app_id, batch_id)``. A replayed batch that the destination already
      holds is skipped before any data is staged.
    * ``write(df)``: the same for a bounded DataFrame, committed once at the end.

    For sinks without a global committer (at-least-once async sinks) each task flushes every
    request before it ends, so a batch is delivered before Spark records it as done.

    Args:
        sink: the sink to run; it must pickle (it is shipped to every task).
        on_checkpoint_reset: what to do when a fresh checkpoint writes with a configured app id
            the destination already holds commits for. ``"error"`` (default) raises
            ``CheckpointResetError``, since Spark restarts batch ids at 0 and every batch up to
            the recorded one would be skipped as a replay. ``"continue"`` numbers this
            checkpoint's batches after the recorded one (kept in the checkpoint).
        commit_attempts: how often a global committer may ask for a retry of a commit.
        metrics_history: how many :class:`BatchMetrics` to keep in :attr:`batches`.
        on_batch: called with the :class:`BatchMetrics` of every batch and bounded write
            (committed, skipped replay or delivered), on the driver, right after the batch
            ended, e.g. to export them to Prometheus or StatsD. It cannot fail a batch: an
            exception it raises is logged as a warning and the query goes on. It may hold
            locks and clients; only under Spark Connect must it pickle (the server runs it).

    Spark Connect: both methods accept DataFrames of a Connect session. A streaming query's
    batches then run in a Python process of the Connect server (one per query run), which gets
    a pickled copy of this object: the sink must pickle (``write_stream`` checks it and names
    what does not), and that copy, not this one, records the batches' metrics (see
    :attr:`batches`). :meth:`failure` gets the sink's own exception out of a failed query in
    either mode.
    """

    def __init__(
        self,
        sink: Sink[Any, Any, Any],
        *,
        on_checkpoint_reset: OnCheckpointReset = "error",
        commit_attempts: int = 3,
        metrics_history: int = 1000,
        on_batch: Callable[[BatchMetrics], object] | None = None,
    ) -> None:
        if not isinstance(sink, Sink):
            raise ConfigurationError(
                f"TwoPhaseSink needs a framework Sink, got {type(sink).__name__}"
            )
        if on_checkpoint_reset not in ("error", "continue"):
            raise ConfigurationError(
                f"on_checkpoint_reset must be 'error' or 'continue', got {on_checkpoint_reset!r}"
            )
        if commit_attempts < 1:
            raise ConfigurationError(f"commit_attempts must be >= 1, got {commit_attempts}")
        if on_batch is not None and not callable(on_batch):
            raise ConfigurationError(f"on_batch must be callable, got {on_batch!r}")
        self.on_batch = on_batch
        self.sink = sink
        self.on_checkpoint_reset = on_checkpoint_reset
        self.commit_attempts = commit_attempts
        self._batches: deque[BatchMetrics] = deque(maxlen=metrics_history)
        # The foreachBatch functions of the queries write_stream started, by query run id.
        self._runs: dict[str, _StreamingBatchRunner] = {}

    def __getstate__(self) -> dict[str, Any]:
        """Configuration only: what the process running a Connect query's batches needs (no
        metrics history, nothing about other queries)."""
        state = self.__dict__.copy()
        state["_batches"] = deque(maxlen=self._batches.maxlen)
        state["_runs"] = {}
        return state

    # -- public ---------------------------------------------------------------------------

    @property
    def batches(self) -> list[BatchMetrics]:
        """Metrics of the most recent batches written in this process, oldest first.

        Classic Spark runs a streaming query's batches in the driver's Python process, so they
        appear here. Under Spark Connect they run in a Python process of the Connect server,
        which records them in its own copy of this object: here you only see bounded
        ``write()`` calls. The per-batch log line (logger ``framework.spark``) is written in
        either case; under Connect it goes to that process's stderr, which Spark copies into
        the Connect server's (driver's) log, at the level the ``framework.spark`` logger had
        in this process when ``write_stream`` was called.
        """
        return list(self._batches)

    @property
    def last_batch(self) -> BatchMetrics | None:
        """The newest of :attr:`batches` (same caveat under Spark Connect)."""
        return self._batches[-1] if self._batches else None

    def failure(self, query: StreamingQuery) -> SinkError | None:
        """The sink's own exception that ended ``query``, or ``None``.

        ``query.awaitTermination()`` raises Spark's ``StreamingQueryException``, whatever the
        foreachBatch function raised; this returns the framework error behind it (e.g. a
        ``NullConstraintError`` or ``ConcurrentWriterError``), so it can be handled by class::

            try:
                query.awaitTermination()
            except Exception:
                error = sink.failure(query)
                if isinstance(error, NullConstraintError):
                    ...
                raise

        When the failed batch ran in this process (classic Spark, a query started by this
        object's ``write_stream``) it is the very exception that was raised, traceback
        included. Otherwise (Spark Connect, or a query started elsewhere) it is rebuilt from
        the text of ``query.exception()``: the innermost framework error named in it, same
        class and message, with that exception as ``__cause__``.

        Returns ``None`` while the query runs, after a clean stop, or when it failed with an
        error that is not a :class:`~framework.errors.SinkError`.
        """
        exception = query.exception()
        if exception is None:
            return None
        runner = self._runs.get(str(query.runId))
        if runner is not None and runner.failure is not None:
            return runner.failure
        found = sink_error_in_text(str(exception), origin=f"streaming query {query.id}")
        if found is not None:
            found.__cause__ = exception
        return found

    def write_stream(
        self,
        df: DataFrame,
        *,
        checkpoint_location: str,
        output_mode: str = "append",
        trigger: dict[str, Any] | None = None,
        query_name: str | None = None,
        user_metadata: str | None = None,
        **unknown: object,
    ) -> StreamingQuery:
        """Start a streaming query that writes ``df`` exactly once; returns the query.

        Args:
            df: a streaming DataFrame.
            checkpoint_location: Spark checkpoint directory of this query (required: it is what
                makes batch ids, and therefore the sink's replay detection, stable).
            output_mode: ``"append"`` (default): each micro-batch's rows are added.
                ``"complete"``: each micro-batch holds the query's whole result (an
                aggregation) and replaces the destination's contents, in the same one
                transaction that records the batch, so a replay is still skipped. Needs a sink
                that supports it (``DeltaSink`` does). ``"update"`` is refused: rows would
                have to be changed in place.
            trigger: keyword arguments for ``DataStreamWriter.trigger``, e.g.
                ``{"processingTime": "10 seconds"}`` or ``{"availableNow": True}``.
            query_name: optional query name.
            user_metadata: text recorded with every commit of this query (Delta's
                ``userMetadata``), overriding the sink's own.

        Each batch's input rows also appear in ``query.lastProgress["observedMetrics"]
        ["sparksink"]``; everything else a batch did is in its :class:`BatchMetrics`.

        A batch that fails ends the query: ``query.awaitTermination()`` raises Spark's
        ``StreamingQueryException``; :meth:`failure` returns the sink's own exception.

        Raises:
            CheckpointResetError: fresh checkpoint, app id already in the table (see class doc).
            InputError, DestinationError: the input or the destination is unusable; raised here,
                before the query starts.
            ConfigurationError: also when this object (its sink) does not pickle; the message
                names the attribute.
        """
        refuse_unknown_options(
            "write_stream",
            unknown,
            _SPARK_WRITER_SPELLINGS,
            ("checkpoint_location", "output_mode", "trigger", "query_name", "user_metadata"),
        )
        if not getattr(df, "isStreaming", False):
            raise ConfigurationError("write_stream needs a streaming DataFrame; use write(df)")
        if not checkpoint_location:
            raise ConfigurationError("checkpoint_location is required for exactly-once streaming")
        mode = self._check_output_mode(output_mode)
        _check_user_metadata(user_metadata)
        committer = self._prepare(df)
        offset = self._epoch_offset(committer, checkpoint_location)
        runner = _StreamingBatchRunner(
            self, committer, offset, checkpoint_location, mode, user_metadata
        )
        runner.check_picklable(connect=is_connect_dataframe(df))
        install_py4j_log_filter()
        writer = (
            _observe_input_rows(df)
            .writeStream.foreachBatch(runner)
            .outputMode(mode)
            .option("checkpointLocation", checkpoint_location)
        )
        if trigger:
            writer = writer.trigger(**trigger)
        if query_name:
            writer = writer.queryName(query_name)
        query = writer.start()
        self._runs[str(query.runId)] = runner
        return query

    def write(
        self,
        df: DataFrame,
        *,
        epoch_id: int | None = None,
        user_metadata: str | None = None,
        **unknown: object,
    ) -> BatchMetrics:
        """Write a bounded DataFrame as one commit; returns its metrics.

        Args:
            df: a batch DataFrame.
            epoch_id: optional id that makes the write idempotent: a second ``write`` with the
                same ``epoch_id`` (and app id) is skipped if the first one committed. Needs an
                explicit ``app_id`` on the sink. Without it, each call is a new epoch after the
                last one recorded for the app id; without an ``app_id`` either, each call is a
                one-off job (:attr:`Epoch.one_off`): nothing can replay it, so the destination
                records no replay marker for it (a Delta commit without ``txn``, as a plain
                ``df.write`` of delta-spark).
            user_metadata: text recorded with the commit (Delta's ``userMetadata``),
                overriding the sink's own.

        Raises:
            ConfigurationError: ``epoch_id`` without an ``app_id``, or not a non-negative int.
            EpochRegressionError: ``epoch_id`` is below the newest epoch recorded for the app id
                and was never committed (use a new app id for a new job, e.g. a backfill).
            InputError, DestinationError, CommitError: nothing is committed and every staged
                file is removed, except for ``CommitStateUnknownError`` (the commit may have
                landed; re-running with the same ``epoch_id`` reconciles it; a write without an
                app id cannot be recognised when run again: the message says how to check).
        """
        refuse_unknown_options(
            "write", unknown, _SPARK_WRITER_SPELLINGS, ("epoch_id", "user_metadata")
        )
        if getattr(df, "isStreaming", False):
            raise ConfigurationError("write needs a bounded DataFrame; use write_stream(df, ...)")
        _check_epoch_id(epoch_id)
        _check_user_metadata(user_metadata)
        if epoch_id is not None and self.sink.app_id is None:
            raise ConfigurationError(
                f"write(df, epoch_id={epoch_id}) needs an app_id on the sink: the epoch id makes "
                "a re-run idempotent only within one job's identity, and jobs without app_id "
                "would share one and skip each other's epochs. Pass app_id='<this job>' to "
                f"{type(self.sink).__name__}(...)."
            )
        committer = self._prepare(df)
        one_off = self.sink.app_id is None
        if self.sink.app_id is None:
            # An identity of its own (it names the staging), so it can never be taken for a
            # replay; the destination does not record it.
            app_id, epoch_id = f"{_DEFAULT_BOUNDED_APP}-{uuid.uuid4()}{_BOUNDED_SUFFIX}", 0
            identity = f"write-{app_id}"
        else:
            app_id = self.sink.app_id + _BOUNDED_SUFFIX
            identity = f"write-{app_id}"  # stable, so a re-run of an epoch is a replay
            if epoch_id is None:
                last = committer.last_committed_epoch(app_id) if committer else None
                epoch_id = 0 if last is None else last + 1
                identity = f"write-{uuid.uuid4()}"  # two such runs at once are two writers
        epoch = Epoch(
            app_id=app_id,
            epoch_id=epoch_id,
            writer_identity=identity,
            run_id=str(uuid.uuid4()),
            bounded=True,
            user_metadata=user_metadata,
            one_off=one_off,
        )
        try:
            metrics = self._run_epoch(df, epoch, committer, batch_id=epoch_id)
        except CommitStateUnknownError as err:
            if one_off:
                raise CommitStateUnknownError(
                    f"{err} A write without an app_id cannot be recognised when run again, so "
                    "check that it did not land before writing it again; an app_id on the sink "
                    "and write(df, epoch_id=...) make a re-run safe."
                ) from err
            raise CommitStateUnknownError(
                f"{err} For this bounded write: it is epoch {epoch_id} of app id {app_id!r}; "
                f"DeltaTable(...).transaction_version({app_id!r}) >= {epoch_id} means it landed. "
                f"Re-running with write(df, epoch_id={epoch_id}) commits it only if it did not."
            ) from err
        if committer is not None:
            committer.end_of_input()
            committer.close()
        return metrics

    # -- driver-side protocol -------------------------------------------------------------

    def _check_output_mode(self, output_mode: object) -> OutputMode:
        if output_mode == "update":
            raise ConfigurationError(
                "output_mode='update' is not supported: it emits changed rows that would have "
                "to replace earlier versions of the same rows in place, which an append-only "
                "transaction cannot do. Use output_mode='complete' (the whole result replaces "
                "the table each batch), or 'append' with a watermark so each result row is "
                "emitted once, final."
            )
        if output_mode not in ("append", "complete"):
            raise ConfigurationError(
                f"output_mode must be 'append' or 'complete', got {output_mode!r}"
            )
        if not self.sink.output_modes:
            raise ConfigurationError(
                f"{self.sink!r} writes bounded DataFrames only, with write(df); it cannot be "
                "the sink of a streaming query (to replace a table with each micro-batch, "
                "append with output_mode='complete')."
            )
        if output_mode not in self.sink.output_modes:
            raise ConfigurationError(
                f"{type(self.sink).__name__} supports output modes "
                f"{sorted(self.sink.output_modes)}, not {output_mode!r}: it cannot replace "
                "what it already wrote."
            )
        return output_mode

    def _prepare(self, df: DataFrame) -> GlobalCommitter[Any, Any] | None:
        self.sink.prepare(_arrow_schema(df))
        committer = self.sink.create_global_committer()
        if committer is not None and self.sink.committable_serializer() is None:
            raise ConfigurationError(
                f"{type(self.sink).__name__} has a global committer but no committable serializer"
            )
        return committer

    def _epoch_offset(
        self, committer: GlobalCommitter[Any, Any] | None, checkpoint_location: str
    ) -> int:
        checkpoint = read_checkpoint(checkpoint_location)
        if checkpoint.epoch_offset is not None:
            return checkpoint.epoch_offset
        app_id = self.sink.app_id
        if checkpoint.fresh and app_id is None and committer is not None:
            _warn_about_other_derived_app_ids(committer, checkpoint_location)
        if not checkpoint.fresh or app_id is None or committer is None:
            return 0
        last = committer.last_committed_epoch(app_id)
        if last is None:
            return 0
        if self.on_checkpoint_reset == "error":
            raise CheckpointResetError(
                f"the checkpoint {checkpoint_location} is new, but the destination already holds "
                f"batches up to {last} from app id {app_id!r}. Spark numbers batches of a new "
                f"checkpoint from 0, so batches 0..{last} would all be skipped as replays and "
                "their rows lost. Restore the original checkpoint, use a new app_id, or pass "
                "on_checkpoint_reset='continue' to number this checkpoint's batches after "
                f"{last}."
            )
        save_epoch_offset(checkpoint_location, app_id, last + 1)
        log.warning("checkpoint reset for app id %r: batch ids continue at %d", app_id, last + 1)
        return last + 1

    def _stage(self, df: DataFrame, epoch: Epoch) -> tuple[list[Any], int, dict[str, int]]:
        """Run the writers; return the committables of successful attempts, the rows they
        wrote and their writers' counters, summed."""
        serializer = self.sink.committable_serializer()
        if isinstance(self.sink, PlansEachBatch):
            plan = self.sink.batch_input_plan(df)
        else:
            plan = self.sink.input_plan()
        if plan is not None:
            df = apply_input_plan(df, plan)
        stager = self.sink.spark_stager(df) if isinstance(self.sink, StagesWithSpark) else None
        if stager is not None:
            committables, rows = stager.stage(df, epoch)
            return committables, rows, {}
        names = df.columns
        task = make_task_function(self.sink, epoch, names)
        staged = df.toDF(*positional_names(len(names))).mapInArrow(task, TASK_RESULT_SCHEMA)
        results = staged.collect()
        rows = sum(r.rows for r in results)
        counters: dict[str, int] = {}
        for result in results:
            for name, value in (result.metrics or {}).items():
                counters[name] = counters.get(name, 0) + value
        if serializer is None:
            return [], rows, counters
        return (
            [deserialize_versioned(serializer, bytes(c)) for r in results for c in r.committables],
            rows,
            counters,
        )

    def _stage_translated(
        self, df: DataFrame, epoch: Epoch
    ) -> tuple[list[Any], int, dict[str, int]]:
        """:meth:`_stage`, with a task's failure raised as the sink's own error once every
        task of the job has ended (no late file may follow the clean-up)."""
        group: str | None = None
        try:
            with staging_job_group(df) as group:
                return self._stage(df, epoch)
        except Exception as err:
            wait_for_tasks_to_end(df, group)
            translated = translate_task_error(err)
            if translated is err:
                raise
            raise translated from err  # keeps the worker's traceback attached

    def _run_epoch(
        self,
        df: DataFrame,
        epoch: Epoch,
        committer: GlobalCommitter[Any, Any] | None,
        *,
        batch_id: int,
    ) -> BatchMetrics:
        """Skip a replay, or stage and commit one epoch; clean up in every outcome.

        When the global committer finds that the destination's rules changed after staging
        (:class:`StaleStagingError`: another writer added a column or a constraint), the staged
        output is discarded, the sink prepared again and the epoch staged anew, at most
        :data:`MAX_RESTAGES` times; its metrics count the ``restaged`` times. Input the new rules
        reject fails with the rule's own error, nothing committed."""
        if committer is not None and committer.is_committed(epoch):
            if not epoch.bounded:
                _run_without_output(df)
            started = time.perf_counter()
            committer.clean_up(epoch)
            _after_epoch(committer, epoch)
            upkeep = time.perf_counter() - started
            return self._record(batch_id, epoch, "skipped", committer, upkeep_seconds=upkeep)
        started = time.perf_counter()
        try:
            committables, rows, counters = self._stage_translated(df, epoch)
            staged = time.perf_counter()
            crash_point("before_commit", epoch.epoch_id)
            if committer is None:
                return self._record(
                    batch_id,
                    epoch,
                    "delivered",
                    None,
                    stage_seconds=staged - started,
                    rows=rows,
                    counters=counters,
                )
            restaged = 0
            while True:
                try:
                    commit_epoch(
                        self.sink,
                        committer,
                        epoch,
                        committables,
                        attempts=self.commit_attempts,
                        written_rows=rows,
                    )
                    break
                except StaleStagingError as stale:
                    if restaged == MAX_RESTAGES:
                        raise
                    restaged += 1
                    log.warning("%s Staging batch %s again.", stale, epoch.epoch_id)
                    committer.abort(epoch)  # the stale output; nothing of it was committed
                    self.sink.prepare(_arrow_schema(df))  # plans against the table as it is
                    committables, rows, counters = self._stage_translated(df, epoch)
                    staged = time.perf_counter()
            crash_point("after_commit", epoch.epoch_id)
        except CommitStateUnknownError:
            raise  # leave staged files: the replay of this batch reconciles and cleans up
        except BaseException:
            if committer is not None:
                try:
                    committer.abort(epoch)
                except Exception as cleanup_error:
                    log.warning(
                        "cleanup after failed batch %s failed: %s", epoch.epoch_id, cleanup_error
                    )
            raise
        committed = time.perf_counter()
        committer.clean_up(epoch)
        _after_epoch(committer, epoch)
        return self._record(
            batch_id,
            epoch,
            "committed",
            committer,
            committables=committables,
            stage_seconds=staged - started,
            commit_seconds=committed - staged,
            upkeep_seconds=time.perf_counter() - committed,
            rows=rows,
            counters=counters,
            restaged=restaged,
        )

    def _record(
        self,
        batch_id: int,
        epoch: Epoch,
        status: Literal["committed", "skipped", "delivered"],
        committer: GlobalCommitter[Any, Any] | None,
        *,
        committables: list[Any] | None = None,
        stage_seconds: float = 0.0,
        commit_seconds: float = 0.0,
        upkeep_seconds: float = 0.0,
        rows: int = 0,
        counters: dict[str, int] | None = None,
        restaged: int = 0,
    ) -> BatchMetrics:
        """Keep, log and hand out the batch's metrics (after its commit or skip, its clean-up
        and the committer's upkeep)."""
        committables = committables or []
        metrics = BatchMetrics(
            batch_id=batch_id,
            epoch_id=epoch.epoch_id,
            app_id=epoch.app_id,
            status=status,
            files=len(committables),
            rows=rows,
            bytes=sum(getattr(c, "size", 0) for c in committables),
            stage_ms=stage_seconds * 1000,
            commit_ms=commit_seconds * 1000,
            upkeep_ms=upkeep_seconds * 1000,
            destination=self.sink.destination,
            version=None if committer is None else committer.committed_version(epoch),
            output_mode=epoch.output_mode,
            writer_metrics=counters or {},
            restaged=restaged,
        )
        self._batches.append(metrics)
        log.info(metrics.log_line())
        if self.on_batch is not None:
            try:
                self.on_batch(metrics)
            except Exception as err:  # the batch is done: a broken exporter must not undo it
                log.warning("on_batch callback failed for batch %s: %r", batch_id, err)
        return metrics


def _after_epoch(committer: GlobalCommitter[Any, Any], epoch: Epoch) -> None:
    """The committer's upkeep after a finished epoch (see ``GlobalCommitter.after_epoch``),
    run before this micro-batch's function returns, so before Spark starts the next batch:
    it never overlaps the query's own commits. The epoch is committed: a failure here is
    logged, never raised (raising would fail a committed batch, and the query's restart would
    only replay it as a skip)."""
    try:
        committer.after_epoch(epoch)
    except Exception as err:
        log.warning(
            "upkeep after batch %s of %r failed (the batch is committed): %r",
            epoch.epoch_id,
            epoch.app_id,
            err,
        )


def _warn_about_other_derived_app_ids(
    committer: GlobalCommitter[Any, Any], checkpoint_location: str
) -> None:
    """A new checkpoint gets a new derived app id: if others already wrote, this may be a
    replaced checkpoint whose source is read again, and nothing would stop the duplicates."""
    others = committer.recent_app_ids(DERIVED_APP_ID_PREFIX)
    if others:
        log.warning(
            "the checkpoint %s is new and the sink has no app_id, so this query writes under a "
            "new derived app id, while %s already wrote to the destination. If this checkpoint "
            "replaces one of theirs, every batch the source replays is written again "
            "(duplicates). Set app_id on the sink to have a replaced checkpoint caught.",
            checkpoint_location,
            ", ".join(others),
        )


class _StreamingBatchRunner:
    """The foreachBatch function: maps Spark batch ids to epochs of a stable writer identity.

    The writer identity is the streaming query's id, which Spark keeps in the checkpoint and
    which therefore survives restarts from it. The function finds it itself, in the process
    that runs it: classic Spark sets it as a local property of the thread running the batch;
    under Spark Connect it is read from the checkpoint's ``metadata``.

    It must pickle: Spark Connect cloudpickles it at ``foreachBatch()`` and runs it in a Python
    process of the Connect server, one per query run. It therefore carries configuration only
    (the sink, the epoch offset, the checkpoint location); the global committer and the query
    id are built in the process that runs it, on its first batch, and never pickled.
    """

    def __init__(
        self,
        owner: TwoPhaseSink,
        committer: GlobalCommitter[Any, Any] | None,
        epoch_offset: int,
        checkpoint_location: str,
        output_mode: OutputMode = "append",
        user_metadata: str | None = None,
    ) -> None:
        self._owner = owner
        self._epoch_offset = epoch_offset
        self._checkpoint_location = checkpoint_location
        self._output_mode: OutputMode = output_mode
        self._user_metadata = user_metadata
        self._log_level = log.getEffectiveLevel()
        self._reset_process_state(committer, ready=True)

    def _reset_process_state(
        self, committer: GlobalCommitter[Any, Any] | None, *, ready: bool
    ) -> None:
        # Valid in one process only: dropped by __getstate__, rebuilt by __setstate__.
        self._committer = committer
        self._ready = ready  # False in a process that got a pickled copy, until its 1st batch
        self._query_id: str | None = None
        self.failure: SinkError | None = None  # what this function raised, in this process

    def __getstate__(self) -> dict[str, Any]:
        return {
            "_owner": self._owner,
            "_epoch_offset": self._epoch_offset,
            "_checkpoint_location": self._checkpoint_location,
            "_output_mode": self._output_mode,
            "_user_metadata": self._user_metadata,
            "_log_level": self._log_level,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset_process_state(None, ready=False)

    def check_picklable(self, *, connect: bool) -> None:
        """Raise ``ConfigurationError`` naming the attribute that does not pickle: of the sink,
        which every task gets; under Spark Connect, of this whole function (``on_batch``
        included), which the server runs. Classic Spark calls it in this process, unpickled."""
        from pyspark import cloudpickle

        dumps: Callable[[Any], bytes] = cloudpickle.dumps
        try:
            dumps(self if connect else self._owner.sink)
        except Exception as err:
            if not connect:
                where = _unpicklable_part(self._owner.sink, "TwoPhaseSink.sink", dumps)
            else:
                try:
                    dumps(self._owner)
                except Exception:
                    where = _unpicklable_part(self._owner, "TwoPhaseSink", dumps)
                else:
                    where = _unpicklable_part(self, "foreachBatch function", dumps)
            raise ConfigurationError(
                f"the sink must pickle, but {where} does not ({type(err).__name__}: {err}). "
                "Spark Connect ships the streaming query's foreachBatch function to the Connect "
                "server with cloudpickle (and every Spark task gets the sink the same way). Keep "
                "clients, connections and table handles out of the sink's pickled state: "
                "create them when first used, and drop them in __getstate__."
            ) from err

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        try:
            if not self._ready:
                self._set_up_this_process()
            query_id = self._query_id_of(df)
            app_id = self._owner.sink.app_id or f"{DERIVED_APP_ID_PREFIX}{query_id}"
            epoch = Epoch(
                app_id=app_id,
                epoch_id=self._epoch_offset + batch_id,
                writer_identity=f"{DERIVED_APP_ID_PREFIX}{query_id}",
                run_id=str(uuid.uuid4()),
                output_mode=self._output_mode,
                query_id=query_id,
                user_metadata=self._user_metadata,
            )
            self._owner._run_epoch(df, epoch, self._committer, batch_id=batch_id)
        except SinkError as err:
            self.failure = err
            mark_reported(err)
            raise

    def _set_up_this_process(self) -> None:
        """First batch in a process that received a pickled copy (Spark Connect)."""
        _show_log_lines(self._log_level)
        self._committer = self._owner.sink.create_global_committer()
        self._ready = True

    def _query_id_of(self, df: DataFrame) -> str:
        if self._query_id is None:
            self._query_id = _query_id_of_batch(df) or _query_id_from_checkpoint(
                self._checkpoint_location, df
            )
        return self._query_id


def _query_id_of_batch(df: DataFrame) -> str | None:
    """The query id classic Spark sets on the thread running the batch; ``None`` under Connect
    (no SparkContext) or when the property is not visible (Py4J without pinned threads)."""
    try:
        context = df.sparkSession.sparkContext
    except Exception:  # PySparkAttributeError: Spark Connect has no SparkContext
        return None
    query_id = context.getLocalProperty(_QUERY_ID_PROPERTY)
    return str(query_id) if query_id else None


def _query_id_from_checkpoint(checkpoint_location: str, df: DataFrame) -> str:
    """The query id Spark keeps in ``<checkpoint>/metadata`` (written before the first batch):
    through fsspec, or, if this process cannot read the location, through Spark itself."""
    import fsspec

    path = checkpoint_location.rstrip("/") + "/metadata"
    try:
        fs, local_path = fsspec.core.url_to_fs(path.replace("s3a://", "s3://", 1))
        with fs.open(local_path, "rb") as src:
            first_line = src.readline().decode("utf-8")
    except Exception as fs_error:
        try:
            row = df.sparkSession.read.text(path).first()
        except Exception as spark_error:
            raise ConfigurationError(
                f"cannot read the streaming query's id from {path} (fsspec: {fs_error}; "
                f"Spark: {spark_error})"
            ) from spark_error
        first_line = row[0] if row is not None else ""
    try:
        return str(json.loads(first_line)["id"])
    except (ValueError, KeyError, TypeError) as err:
        raise SinkError(f"{path} holds no streaming query id: {first_line[:200]!r}") from err


def _show_log_lines(level: int) -> None:
    """Nothing configures logging in a process Spark starts for a Connect query's batches, so
    the fallback handler writes the sink's log lines to its stderr (copied into the server's
    log): at the level the ``framework.spark`` logger had on the client, unless logging is
    configured there."""
    if not logging.getLogger().handlers:
        log.setLevel(level)


def _run_without_output(df: DataFrame) -> None:
    """Execute a skipped micro-batch's plan, writing nothing.

    A stateful query (aggregation, deduplication, ...) commits its state stores only while its
    batch's plan runs; Spark fails a batch whose foreachBatch function did not run every
    partition (STATE_STORE_COMMIT_VALIDATION_FAILED), and the next batch would otherwise lack
    the replayed batch's state. Replays are rare (after a crash), so the cost of recomputing
    one batch is paid only then.
    """
    df.write.format("noop").mode("overwrite").save()


def _check_user_metadata(user_metadata: object) -> None:
    if user_metadata is not None and not isinstance(user_metadata, str):
        raise ConfigurationError(f"user_metadata must be a string, got {user_metadata!r}")


def _observe_input_rows(df: DataFrame) -> DataFrame:
    """``df`` counting each micro-batch's rows into ``lastProgress["observedMetrics"]``.

    Only aggregates over the streaming plan itself reach Spark's progress (ones computed inside
    the foreachBatch function do not), so files, bytes and commit times, known only after
    Spark's batch, are reported through :class:`BatchMetrics` instead.
    """
    if is_connect_dataframe(df):
        from pyspark.sql.connect import functions as F
    else:
        from pyspark.sql import functions as F  # type: ignore[no-redef]
    return df.observe(OBSERVATION_NAME, F.count(F.lit(1)).alias("rows"))


def _state_items(value: Any) -> list[tuple[str, Any]]:
    """The named parts ``pickle`` would save of ``value`` (as far as they can be told)."""
    if isinstance(value, dict):
        return [(f"[{key!r}]", item) for key, item in value.items()]
    if isinstance(value, (list, tuple, set, frozenset, deque)):
        return [(f"[{index}]", item) for index, item in enumerate(value)]
    getstate = getattr(value, "__getstate__", None)
    try:
        state = getstate() if getstate is not None else getattr(value, "__dict__", None)
    except Exception:
        state = getattr(value, "__dict__", None)
    if isinstance(state, tuple) and len(state) == 2:  # (__dict__, __slots__ values)
        state = {**(state[0] or {}), **(state[1] or {})}
    if isinstance(state, dict):
        return [(f".{name}", item) for name, item in state.items()]
    return []


def _unpicklable_part(value: Any, path: str, dumps: Callable[[Any], bytes], depth: int = 0) -> str:
    """The deepest attribute path under ``value`` (which does not pickle) that does not."""
    if depth < 10:
        for name, item in _state_items(value):
            try:
                dumps(item)
            except Exception:
                return _unpicklable_part(item, path + name, dumps, depth + 1)
    kind = type(value)
    return f"{path} ({kind.__module__}.{kind.__qualname__})"
