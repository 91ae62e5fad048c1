"""The destinations' public surfaces are deliberate: pinned here."""

from __future__ import annotations

import committers.delta


def test_delta_public_surface_is_pinned():
    assert sorted(committers.delta.__all__) == [
        "CompactionConflictError",
        "CompactionResult",
        "DeletionVectorError",
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


def test_each_public_name_resolves_to_its_definition_on_first_use():
    """committers.delta imports its names lazily: each one resolves, to the object its
    defining module holds, and an unknown name is an AttributeError."""
    import importlib

    import pytest

    for name in committers.delta.__all__:
        value = getattr(committers.delta, name)
        defining = importlib.import_module(committers.delta._EXPORTS[name])
        assert value is getattr(defining, name)
    assert set(committers.delta._EXPORTS) == set(committers.delta.__all__)
    assert set(committers.delta.__all__) <= set(dir(committers.delta))
    with pytest.raises(AttributeError, match="no attribute 'DeltaSinc'"):
        _ = committers.delta.DeltaSinc
