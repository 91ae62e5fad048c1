"""Retries, backoff and commit reconciliation: one toolkit for every sink.

* :class:`Backoff` (seconds): capped exponential delays with a jitter fraction (``1.0``, full
  jitter, by default), a total attempt count, an optional deadline, and a cap on how long a
  destination's ``Retry-After`` is honoured.
* Verdicts on a failed call: :class:`Verdict` (``RETRY``, ``UNKNOWN``: the call may have taken
  effect, ``FAIL``) for calls retried in a loop, and :class:`ErrorClassification` (retryable,
  throttled, ``Retry-After``, caused by the entries) for the async writer's requests
  (:mod:`framework.asyncsink`).
* :func:`retry_call`: call until success under a :class:`Backoff`, retrying what the classifier
  marks ``RETRY``; :func:`commit_with_reconciliation`: the same loop for a commit, where an
  ``UNKNOWN`` outcome is settled by asking the destination whether it landed (a transaction id,
  a run id in the log) before anything is repeated, so a commit is applied at most once.

The async writer's public :class:`~framework.asyncsink.RetryPolicy` (milliseconds) is a value
that turns into a :class:`Backoff` (:meth:`~framework.asyncsink.RetryPolicy.backoff`). Imports
neither pyspark nor any destination's client; destinations bring their own classifiers.
"""

from framework.retry._backoff import Backoff, Classifier, ErrorClassification, Verdict
from framework.retry._loop import CommitResult, commit_with_reconciliation, retry_call

__all__ = [
    "Backoff",
    "Classifier",
    "CommitResult",
    "ErrorClassification",
    "Verdict",
    "commit_with_reconciliation",
    "retry_call",
]
