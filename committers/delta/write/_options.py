"""Validated, immutable options of the Delta sink."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from committers.delta.storage._upload import MAX_UPLOAD_PART_SIZE, MIN_UPLOAD_PART_SIZE
from framework.errors import ConfigurationError

__all__ = [
    "DEFAULT_COMPRESSION",
    "DEFAULT_MAX_OPEN_FILES",
    "DEFAULT_ROW_GROUP_BYTES",
    "DEFAULT_ROW_GROUP_ROWS",
    "DEFAULT_TARGET_FILE_SIZE",
    "DEFAULT_UPLOAD_CONCURRENCY",
    "DEFAULT_UPLOAD_PART_SIZE",
    "MAX_UPLOAD_PART_SIZE",
    "MIN_UPLOAD_PART_SIZE",
    "Staging",
    "WriterOptions",
    "check_staging",
]

#: Who writes the Parquet files: Spark's own writer, the sink's Python writers, or the faster
#: one that can.
Staging = Literal["auto", "spark", "arrow"]

DEFAULT_TARGET_FILE_SIZE = 128 * 1024 * 1024
DEFAULT_ROW_GROUP_BYTES = 64 * 1024 * 1024  # Arrow bytes buffered before a row group is written
DEFAULT_ROW_GROUP_ROWS = 1024 * 1024
DEFAULT_MAX_OPEN_FILES = 32
DEFAULT_COMPRESSION = "snappy"
DEFAULT_UPLOAD_PART_SIZE = 8 * 1024 * 1024
DEFAULT_UPLOAD_CONCURRENCY = 4
_COMPRESSIONS = ("snappy", "zstd", "gzip", "lz4", "brotli", "none")


@dataclass(frozen=True, kw_only=True)
class WriterOptions:
    """How staged Parquet files are shaped.

    Attributes:
        target_file_size: a file is closed once it reaches this many bytes.
        row_group_bytes: in-memory Arrow bytes buffered per file before a row group is written.
        row_group_rows: rows buffered per file before a row group is written.
        max_open_files: files open at once per task (one per partition seen); past it the
            fullest is finished, which bounds memory for high-cardinality partitioning.
        compression: Parquet codec.
        upload_part_size: S3 only (``staging="arrow"``): bytes per multipart-upload part.
        upload_concurrency: S3 only: most parts of one task in flight at once (the rate
            limiter lowers it while S3 throttles); as many more wait in memory.
    """

    target_file_size: int = DEFAULT_TARGET_FILE_SIZE
    row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES
    row_group_rows: int = DEFAULT_ROW_GROUP_ROWS
    max_open_files: int = DEFAULT_MAX_OPEN_FILES
    compression: str = DEFAULT_COMPRESSION
    upload_part_size: int = DEFAULT_UPLOAD_PART_SIZE
    upload_concurrency: int = DEFAULT_UPLOAD_CONCURRENCY

    def __post_init__(self) -> None:
        for name in (
            "target_file_size",
            "row_group_bytes",
            "row_group_rows",
            "max_open_files",
            "upload_part_size",
            "upload_concurrency",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigurationError(f"{name} must be a positive integer, got {value!r}")
        if not MIN_UPLOAD_PART_SIZE <= self.upload_part_size <= MAX_UPLOAD_PART_SIZE:
            raise ConfigurationError(
                f"upload_part_size must be between 5 MiB and 5 GiB (S3's limits for a "
                f"multipart-upload part), got {self.upload_part_size}"
            )
        if self.compression not in _COMPRESSIONS:
            raise ConfigurationError(
                f"compression must be one of {', '.join(_COMPRESSIONS)}, got {self.compression!r}"
            )


def check_staging(staging: object) -> None:
    """Raises:
    ConfigurationError: ``staging`` is not ``"auto"``, ``"spark"`` or ``"arrow"``."""
    if staging not in ("auto", "spark", "arrow"):
        raise ConfigurationError(f"staging must be 'auto', 'spark' or 'arrow', got {staging!r}")
