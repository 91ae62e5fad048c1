"""Where a table's bytes live: the table location with its fsspec and S3 options, the
unsafe-store self-test (conditional PUT), uploads of staged files, staging manifests and their
clean-up, and the backoff and error classification of storage calls. The lowest layer of the
Delta connector: it may import ``framework`` and third-party clients, nothing of
``committers.delta`` outside ``storage``, and never pyspark."""
