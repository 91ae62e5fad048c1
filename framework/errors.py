"""One exception tree for the whole framework.

::

    SinkError                          root: catch this to catch everything we raise
    ├── ConfigurationError             an option is invalid; raised at construction, nothing written
    ├── InputError                     the data cannot be written as it is; nothing committed
    │   ├── SchemaMismatchError        batch schema differs from the table schema
    │   ├── InvalidSchemaError         the input's schema can be no table's (duplicate names, ...)
    │   ├── ConstraintViolationError   a row breaks a rule of the table (CHECK, invariant,
    │   │   │                          generated column, unstorable value)
    │   │   └── NullConstraintError    null in a non-nullable column
    │   ├── UnsupportedTypeError       a column type the destination cannot store
    │   └── RecordTooLargeError        one record exceeds max_record_size_in_bytes
    ├── DestinationError               the destination is unusable as configured
    │   ├── NotATableError             location holds data that is not a table of this format
    │   ├── LocationNotWritableError   cannot create or write the location
    │   └── UnsafeStorageError         storage does not honour conditional writes
    ├── CommitError                    a commit did not happen
    │   ├── CommitConflictError        lost a race with another writer; safe to retry on a fresh
    │   │   │                          snapshot (the framework does so before raising)
    │   │   └── StaleStagingError      the destination's rules changed after the epoch was staged:
    │   │                              nothing committed; the framework stages the epoch again
    │   ├── ConcurrentWriterError      another instance of the SAME app id is writing; never retried
    │   ├── EpochRegressionError       an epoch id below the app id's recorded one, never committed:
    │   │                              neither a replay nor committable (Delta's txnVersion rule)
    │   └── CommitStateUnknownError    the request may or may not have landed: reconcile by
    │                                  reading the destination, never retry blindly
    ├── CheckpointResetError           a fresh checkpoint reuses an app id the table already knows
    ├── StagingError                   writing staged data failed (task side)
    │   └── RowCountMismatchError      the rows a batch would commit differ from the rows its
    │                                  write job wrote; raised before the commit, nothing committed
    └── DeliveryError                  delivery to an at-least-once destination failed; raised to
        │                              the job for a fatal rejection or an exhausted retry budget
        ├── RetryableDeliveryError     raised by a destination writer: the request may succeed if
        │   │                          sent again (optionally after ``retry_after_s``)
        │   └── ThrottledError         the destination is over capacity (HTTP 429/503,
        │                              ProvisionedThroughputExceeded, ...)
        ├── FatalDeliveryError         raised by a destination writer: these entries will never be
        │                              accepted as they are (HTTP 400, validation errors, ...)
        └── RetriesExhaustedError      entries still failed after their whole retry budget

Backend errors are wrapped with ``raise ... from err`` so the cause stays attached.
"""

from __future__ import annotations

__all__ = [
    "CheckpointResetError",
    "CommitConflictError",
    "CommitError",
    "CommitStateUnknownError",
    "ConcurrentWriterError",
    "ConfigurationError",
    "ConstraintViolationError",
    "DeliveryError",
    "DestinationError",
    "EpochRegressionError",
    "FatalDeliveryError",
    "InputError",
    "InvalidSchemaError",
    "LocationNotWritableError",
    "NotATableError",
    "NullConstraintError",
    "RecordTooLargeError",
    "RetriesExhaustedError",
    "RetryableDeliveryError",
    "RowCountMismatchError",
    "SchemaMismatchError",
    "SinkError",
    "StagingError",
    "StaleStagingError",
    "ThrottledError",
    "UnsafeStorageError",
    "UnsupportedTypeError",
]


class SinkError(Exception):
    """Root of every error the framework and its destinations raise."""


class ConfigurationError(SinkError, ValueError):
    """An option is invalid. Raised at construction time, before anything is written."""


class InputError(SinkError, ValueError):
    """The input cannot be written as it is. Nothing of the batch is committed."""


class SchemaMismatchError(InputError):
    """The batch schema differs from the destination schema."""


class InvalidSchemaError(InputError):
    """The input's schema cannot be a table's: duplicate or case-colliding column names, or no
    column left besides the partition columns."""


class ConstraintViolationError(InputError):
    """A row breaks a rule the table defines (a CHECK constraint, an invariant, a generated
    column's expression) or holds a value the table cannot store. Nothing is committed."""


class NullConstraintError(ConstraintViolationError):
    """A null value arrived in a column declared non-nullable."""


class UnsupportedTypeError(InputError):
    """A column has a type the destination cannot store."""


class RecordTooLargeError(InputError):
    """A single record is larger than the configured maximum record size."""


class DestinationError(SinkError):
    """The destination is unusable as configured."""


class NotATableError(DestinationError):
    """The location holds data but is not a table of the expected format."""


class LocationNotWritableError(DestinationError):
    """The location cannot be created or written."""


class UnsafeStorageError(DestinationError):
    """The storage does not provide the atomic conditional writes that commits rely on."""


class CommitError(SinkError):
    """A commit did not happen."""


class CommitConflictError(CommitError):
    """Another writer committed first; retrying on a fresh snapshot is safe."""


class StaleStagingError(CommitConflictError):
    """The destination's rules (schema, constraints, features) changed between an epoch's
    staging and its commit, so its staged output was checked against rules that no longer
    hold. Nothing was committed. The engine discards the staged output, prepares the sink
    again (:meth:`~framework.sink.Sink.prepare`) and stages the epoch anew under the current
    rules; input those rules reject then fails with the rule's own error."""


class ConcurrentWriterError(CommitError):
    """Another instance with the same app id committed this batch; retrying would be wrong."""


class EpochRegressionError(CommitError):
    """The epoch id is lower than the newest one the destination records for the app id, and
    that epoch was never committed: it is not a replay, and committing it would break the
    increasing ids per app id that exactly-once relies on. Nothing is committed."""


class CommitStateUnknownError(CommitError):
    """The commit may or may not have landed. Reconcile by reading the destination."""


class CheckpointResetError(SinkError):
    """A fresh checkpoint writes with an app id the destination already holds commits for."""


class StagingError(SinkError):
    """Staging data on a task failed."""


class RowCountMismatchError(StagingError):
    """The rows a batch (or a rewrite) would commit, summed over the record counts of its
    files, differ from the rows its write job wrote, counted as the job wrote them: a staged
    file was lost, counted twice or cut short between the write and the commit. Raised before
    the commit: nothing is committed and the batch's staged files are deleted."""


class DeliveryError(SinkError):
    """An at-least-once destination rejected entries fatally or they exhausted their retries."""


class RetryableDeliveryError(DeliveryError):
    """A destination writer's signal that a request failed but may succeed if sent again.

    Raised from ``AsyncSinkWriter.submit_request_entries``; the writer's error classifier turns it
    into a retry of every entry of the request. It reaches the job only wrapped in a
    :class:`RetriesExhaustedError`.

    Attributes:
        retry_after_s: how long the destination asked the client to wait, in seconds, or
            ``None`` when it did not say.
    """

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ThrottledError(RetryableDeliveryError):
    """The destination is over capacity and refused the request (HTTP 429/503, ...).

    Besides retrying, the writer reports it to its rate limiting strategy as congestion.
    """


class FatalDeliveryError(DeliveryError):
    """A destination writer's signal that the entries of a request will never be accepted.

    Raised from ``AsyncSinkWriter.submit_request_entries``. With a dead-letter queue the writer
    splits the request to isolate the offending entries (when ``caused_by_entries``); without
    one, or when the request as a whole is refused, the job fails with a ``FatalDeliveryError``
    whose cause is the error the destination raised.

    Attributes:
        caused_by_entries: the rejection is about the content of some entries (HTTP 400/413/422,
            a validation error), so splitting the request isolates them. ``False`` for refusals
            of any request (HTTP 401/403/404): dead-lettering every entry would only hide a
            misconfiguration.
    """

    def __init__(self, message: str, *, caused_by_entries: bool = True) -> None:
        super().__init__(message)
        self.caused_by_entries = caused_by_entries


class RetriesExhaustedError(DeliveryError):
    """Entries still failed after their whole retry budget and no dead-letter queue took them."""
