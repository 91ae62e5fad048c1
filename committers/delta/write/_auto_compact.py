"""Options of auto-compaction: when a writer compacts the small files it leaves behind."""

from __future__ import annotations

from dataclasses import dataclass

from framework.errors import ConfigurationError

__all__ = [
    "DEFAULT_MIN_NUM_FILES",
    "MIN_TARGET_FILE_SIZE",
    "AutoCompact",
    "check_auto_compact",
]

#: delta-spark's ``spark.databricks.delta.autoCompact.minNumFiles``.
DEFAULT_MIN_NUM_FILES = 50
#: Smallest target accepted (compaction's own floor): below it compaction only makes small files.
MIN_TARGET_FILE_SIZE = 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class AutoCompact:
    """When the sink compacts small files after a batch's commit (``DeltaSink(...,
    auto_compact=AutoCompact(...))``), with delta-spark's auto compact defaults.

    Attributes:
        enabled: ``None`` (default): streaming writes compact, bounded ``write(df)`` calls do
            not; ``True``: every write; ``False``: none.
        min_num_files: a compaction runs once a partition of the table (or the table, when
            unpartitioned) holds at least this many small files (delta-spark's
            ``autoCompact.minNumFiles``, 50).
        max_file_size: bytes per file the compaction writes (delta-spark's
            ``autoCompact.maxFileSize``); ``None``: the sink's ``target_file_size`` (128 MiB).
        min_file_size: files smaller than this many bytes are small: counted, and rewritten by
            the compaction (delta-spark's ``autoCompact.minFileSize``); ``None``: half of
            ``max_file_size``.
    """

    enabled: bool | None = None
    min_num_files: int = DEFAULT_MIN_NUM_FILES
    max_file_size: int | None = None
    min_file_size: int | None = None

    def __post_init__(self) -> None:
        if self.enabled not in (None, True, False):
            raise ConfigurationError(
                f"AutoCompact(enabled=...) must be True, False or None (streaming writes "
                f"only), got {self.enabled!r}"
            )
        if not _is_int(self.min_num_files) or self.min_num_files < 2:
            raise ConfigurationError(
                "AutoCompact(min_num_files=...) must be an integer of at least 2 (compaction "
                f"merges two or more files), got {self.min_num_files!r}; delta-spark's default "
                f"is {DEFAULT_MIN_NUM_FILES}"
            )
        if self.max_file_size is not None and (
            not _is_int(self.max_file_size) or self.max_file_size < MIN_TARGET_FILE_SIZE
        ):
            raise ConfigurationError(
                "AutoCompact(max_file_size=...) must be None (the sink's target_file_size) or "
                f"an integer of at least {MIN_TARGET_FILE_SIZE} bytes (1 MiB), got "
                f"{self.max_file_size!r}"
            )
        if self.min_file_size is not None and (
            not _is_int(self.min_file_size) or self.min_file_size < 1
        ):
            raise ConfigurationError(
                "AutoCompact(min_file_size=...) must be None (half of max_file_size) or a "
                f"positive integer of bytes, got {self.min_file_size!r}"
            )
        if (
            self.min_file_size is not None
            and self.max_file_size is not None
            and self.min_file_size > self.max_file_size
        ):
            raise ConfigurationError(
                f"AutoCompact(min_file_size={self.min_file_size}) is larger than max_file_size="
                f"{self.max_file_size}: files compaction writes would count as small again and "
                "be rewritten by every compaction. Keep min_file_size at most max_file_size."
            )

    def applies_to(self, *, bounded: bool) -> bool:
        """Whether a write of this kind compacts."""
        return not bounded if self.enabled is None else self.enabled

    def sizes(self, target_file_size: int) -> tuple[int, int]:
        """(small-file threshold, target) in bytes, given the sink's ``target_file_size``.

        Raises:
            ConfigurationError: ``min_file_size`` above the resolved target.
        """
        target = self.max_file_size if self.max_file_size is not None else target_file_size
        small = self.min_file_size if self.min_file_size is not None else target // 2
        if small > target:
            raise ConfigurationError(
                f"AutoCompact(min_file_size={small}) is larger than the compaction's target "
                f"file size ({target} bytes, the sink's target_file_size): files compaction "
                "writes would count as small again. Lower min_file_size or set max_file_size."
            )
        return small, target


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_auto_compact(value: object) -> AutoCompact:
    """``DeltaSink(auto_compact=...)`` as an :class:`AutoCompact`: ``None`` is the default
    (streaming writes compact), ``True``/``False`` turn it on for every write or off.

    Raises:
        ConfigurationError: anything else.
    """
    if value is None:
        return AutoCompact()
    if isinstance(value, bool):
        return AutoCompact(enabled=value)
    if isinstance(value, AutoCompact):
        return value
    raise ConfigurationError(
        "auto_compact must be None (streaming writes compact their small files), True, False "
        f"or an AutoCompact(...), got {value!r}"
    )
