"""Where a table's bytes live: the table location with its fsspec and S3 options, the
unsafe-store self-test (conditional PUT), uploads of staged files, staging manifests and their
clean-up, and the verdicts on S3 errors that the framework's retry toolkit (``framework.retry``)
acts on. The lowest layer of the Delta connector: it may import ``framework`` and
third-party clients, nothing of ``committers.delta`` outside ``storage``, and never pyspark."""
