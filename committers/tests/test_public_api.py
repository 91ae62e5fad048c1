"""The destinations' public surfaces are deliberate: pinned here."""

from __future__ import annotations

import committers.delta


def test_delta_public_surface_is_pinned():
    assert sorted(committers.delta.__all__) == [
        "CompactionConflictError",
        "CompactionResult",
        "DeltaCommittable",
        "DeltaGlobalCommitter",
        "DeltaSink",
        "SourceTableChangedError",
        "StagedFile",
        "StagedFileSerializer",
        "UnsupportedTableFeatureError",
        "UpsertConflictError",
        "WriterOptions",
        "read_table",
        "register",
    ]
