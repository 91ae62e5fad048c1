"""framework.source, file side: sizing options, bin-packing, lazy listing, serializers."""

from __future__ import annotations

import itertools
import pickle
import random
from functools import partial

import pytest

from framework.errors import ConfigurationError, SinkError
from framework.sink import deserialize_versioned, serialize_versioned
from framework.source import (
    DEFAULT_MAX_SPLIT_BYTES,
    DEFAULT_MAX_SPLITS,
    MIN_MAX_SPLIT_BYTES,
    BinPackingSplitAssigner,
    BinPackingState,
    BinPackingStateSerializer,
    FileGroupSource,
    FileGroupSplit,
    FileGroupSplitSerializer,
    FileSourceConfig,
    FileSplit,
    LazyEnumeratorState,
    LazyEnumeratorStateSerializer,
    LocalEnumeratorContext,
)

MiB = 1024 * 1024


def _files(sizes, prefix="f"):
    return [FileSplit(path=f"{prefix}{i}", size_bytes=size) for i, size in enumerate(sizes)]


def _drain(assigner):
    splits = []
    while (split := assigner.next_split()) is not None:
        splits.append(split)
    return splits


class _CountingListing:
    """A listing that counts the calls and the files pulled from it."""

    def __init__(self, files):
        self.files = files
        self.calls = 0
        self.pulled = 0

    def __call__(self):
        self.calls += 1
        for file in self.files:
            self.pulled += 1
            yield file


# -- configuration ------------------------------------------------------------------------------


def test_defaults_are_named_constants():
    config = FileSourceConfig()
    assert config.max_split_bytes == DEFAULT_MAX_SPLIT_BYTES == 128 * MiB
    assert config.max_splits == DEFAULT_MAX_SPLITS
    assert MiB == MIN_MAX_SPLIT_BYTES


def test_max_split_bytes_below_the_floor_is_refused_with_the_fix():
    with pytest.raises(ConfigurationError) as info:
        FileSourceConfig(max_split_bytes=64 * 1024)
    message = str(info.value)
    assert "max_split_bytes=65536 is below the floor of 1 MiB (1048576 bytes)" in message
    assert "set max_split_bytes to at least 1048576" in message
    FileSourceConfig(max_split_bytes=MIN_MAX_SPLIT_BYTES)  # the floor itself is allowed


@pytest.mark.parametrize(
    "options",
    [
        {"max_split_bytes": True},
        {"max_split_bytes": 2.5 * MiB},
        {"max_splits": 0},
        {"fetch_size": 0},
    ],
)
def test_invalid_options_are_configuration_errors(options):
    with pytest.raises(ConfigurationError):
        FileSourceConfig(**options)


def test_target_split_size_grows_with_the_data_only_past_max_splits():
    config = FileSourceConfig(max_split_bytes=MiB, max_splits=100)
    assert config.target_split_bytes(0) == MiB
    assert config.target_split_bytes(50 * MiB) == MiB  # 2 * 50 / 100 = 1 MiB: configured wins
    assert config.target_split_bytes(1000 * MiB) == 20 * MiB
    assert config.target_split_bytes(1000 * MiB + 1) == 20 * MiB + 1  # rounded up


# -- bin-packing --------------------------------------------------------------------------------


def test_small_files_are_packed_together_and_never_exceed_the_target():
    rng = random.Random(7)
    sizes = [rng.choice([1, 10, 300, 900]) * 1024 for _ in range(400)] + [5 * MiB, 3 * MiB]
    rng.shuffle(sizes)
    files = _files(sizes)
    config = FileSourceConfig(max_split_bytes=2 * MiB)
    splits = _drain(BinPackingSplitAssigner(lambda: files, config=config))

    assert [f for split in splits for f in split.files] == files  # each file once, in order
    for split in splits:
        assert split.size_bytes <= 2 * MiB or len(split.files) == 1
    assert [s.split_id for s in splits] == [f"files-{n}" for n in range(len(splits))]
    # next-fit: two neighbouring groups never fit into one
    for left, right in itertools.pairwise(splits):
        assert left.size_bytes + right.files[0].read_bytes > 2 * MiB
    assert len(splits) < len(files) / 4


def test_a_file_larger_than_the_target_is_a_split_of_its_own_and_never_cut():
    files = _files([MiB // 2, 10 * MiB, MiB // 2])
    splits = _drain(
        BinPackingSplitAssigner(lambda: files, config=FileSourceConfig(max_split_bytes=MiB))
    )
    assert [[f.path for f in s.files] for s in splits] == [["f0"], ["f1"], ["f2"]]
    assert splits[1].files[0] == files[1]


def test_ranges_weigh_what_they_cover():
    ranged = FileSplit(path="big", size_bytes=10 * MiB, start=8 * MiB, length=MiB)
    files = [ranged, *_files([MiB // 2])]
    splits = _drain(
        BinPackingSplitAssigner(lambda: files, config=FileSourceConfig(max_split_bytes=2 * MiB))
    )
    assert len(splits) == 1 and splits[0].size_bytes == MiB + MiB // 2


def test_a_tiny_but_allowed_split_size_on_many_files_gives_a_bounded_split_count():
    files = _files([MiB] * 10_000)
    config = FileSourceConfig(max_split_bytes=MIN_MAX_SPLIT_BYTES, max_splits=100)
    splits = _drain(BinPackingSplitAssigner(lambda: files, config=config))
    # 1 MiB splits would be 10,000; the cap makes them 200 MiB: 50 splits of 200 files each.
    assert len(splits) == 50
    assert {len(s.files) for s in splits} == {200}


@pytest.mark.parametrize("file_count", [10, 1_000, 20_000])
def test_the_split_cap_holds_as_the_input_grows_without_failing(file_count):
    rng = random.Random(file_count)
    files = _files([rng.randint(1, 8 * MiB) for _ in range(file_count)])
    config = FileSourceConfig(max_split_bytes=MIN_MAX_SPLIT_BYTES, max_splits=64)
    splits = _drain(BinPackingSplitAssigner(lambda: files, config=config))
    assert len(splits) <= 64
    assert sum(len(s.files) for s in splits) == file_count


def test_splits_are_generated_lazily_one_file_ahead():
    listing = _CountingListing(_files([MiB] * 10))
    context = LocalEnumeratorContext(1)
    source = FileGroupSource(
        listing,
        _never_read,
        config=FileSourceConfig(max_split_bytes=3 * MiB),
        total_bytes=10 * MiB,
    )
    enumerator = source.create_enumerator(context)
    enumerator.start()
    assert (listing.calls, listing.pulled) == (0, 0)

    pulled_after_each_request = []
    sizes = []
    while not context.has_no_more_splits(0):
        enumerator.handle_split_request(0)
        pulled_after_each_request.append(listing.pulled)
        sizes += [len(s.files) for s in context.take_assignments(0)]
    # groups of 3 files close when full, so the 4th file is not pulled before the 2nd request
    assert pulled_after_each_request == [3, 6, 9, 10, 10]
    assert sizes == [3, 3, 3, 1]
    assert listing.calls == 1


def test_without_an_estimate_one_sizing_pass_reads_sizes_but_no_file():
    listing = _CountingListing(_files([MiB] * 8))
    assigner = BinPackingSplitAssigner(
        listing, config=FileSourceConfig(max_split_bytes=MiB, max_splits=4)
    )
    first = assigner.next_split()
    assert listing.calls == 2  # one sizing pass, then the lazy one
    assert listing.pulled == 8 + 4  # the whole sizing pass + the first group (4 x 1 MiB files)
    assert len(first.files) == 4  # target = max(1 MiB, 2 * 8 MiB / 4)


def test_a_restored_assigner_continues_with_the_next_files_and_numbers():
    files = _files([MiB] * 7)
    config = FileSourceConfig(max_split_bytes=2 * MiB)
    first = BinPackingSplitAssigner(lambda: files, config=config)
    taken = [first.next_split(), first.next_split()]
    state = first.snapshot_state()
    assert state == BinPackingState(
        files_consumed=4, splits_created=2, target_split_bytes=2 * MiB, last_path="f3"
    )
    rest = _drain(BinPackingSplitAssigner(lambda: files, config=config, state=state))
    assert [s.split_id for s in taken + rest] == [f"files-{n}" for n in range(4)]
    assert [f for s in taken + rest for f in s.files] == files


def test_a_listing_that_changed_since_the_state_is_refused():
    files = _files([MiB] * 4)
    config = FileSourceConfig(max_split_bytes=2 * MiB)
    assigner = BinPackingSplitAssigner(lambda: files, config=config)
    assigner.next_split()
    state = assigner.snapshot_state()
    renamed = _files([MiB] * 4, prefix="g")
    with pytest.raises(SinkError, match="listing changed"):
        BinPackingSplitAssigner(lambda: renamed, config=config, state=state).next_split()
    with pytest.raises(SinkError, match="listing changed"):
        BinPackingSplitAssigner(lambda: files[:1], config=config, state=state).next_split()


# -- splits -------------------------------------------------------------------------------------


def test_split_values_are_validated_and_immutable():
    with pytest.raises(ConfigurationError):
        FileGroupSplit(split_id="", files=tuple(_files([1])))
    with pytest.raises(ConfigurationError, match="no files"):
        FileGroupSplit(split_id="s", files=())
    with pytest.raises(ConfigurationError, match="file_index"):
        FileGroupSplit(split_id="s", files=tuple(_files([1])), file_index=2)
    with pytest.raises(ConfigurationError, match="outside the file"):
        FileSplit(path="p", size_bytes=10, start=8, length=5)
    values = {"day": "1"}
    file = FileSplit(path="p", size_bytes=1, partition_values=values)
    values["day"] = "2"
    assert file.partition_values == {"day": "1"}
    with pytest.raises(AttributeError):
        file.path = "q"  # type: ignore[misc]


# -- serializers --------------------------------------------------------------------------------


def _rich_split():
    return FileGroupSplit(
        split_id="files-3",
        files=(
            FileSplit(
                path="day=1/part-0.parquet",
                size_bytes=1000,
                partition_values={"day": "1", "region": None},
                metadata={"stats": '{"numRecords":5}'},
            ),
            FileSplit(path="day=2/part-1.parquet", size_bytes=4000, start=100, length=200),
        ),
        file_index=1,
        records_emitted=17,
    )


def test_split_round_trip_keeps_files_partition_values_metadata_and_progress():
    serializer = FileGroupSplitSerializer()
    split = _rich_split()
    data = serialize_versioned(serializer, split)
    assert deserialize_versioned(serializer, data) == split


def test_enumerator_state_round_trip():
    serializer = LazyEnumeratorStateSerializer(
        FileGroupSplitSerializer(), BinPackingStateSerializer()
    )
    state = LazyEnumeratorState(
        pending=(_rich_split(), FileGroupSplit(split_id="files-0", files=tuple(_files([5])))),
        assigner=BinPackingState(
            files_consumed=9, splits_created=4, target_split_bytes=MiB, last_path="f8"
        ),
    )
    assert deserialize_versioned(serializer, serialize_versioned(serializer, state)) == state
    empty = LazyEnumeratorState(pending=(), assigner=BinPackingState())
    assert deserialize_versioned(serializer, serialize_versioned(serializer, empty)) == empty


@pytest.mark.parametrize(
    "serializer",
    [
        FileGroupSplitSerializer(),
        BinPackingStateSerializer(),
        LazyEnumeratorStateSerializer(FileGroupSplitSerializer(), BinPackingStateSerializer()),
    ],
    ids=lambda s: type(s).__name__,
)
def test_an_unknown_version_names_the_versions_supported(serializer):
    with pytest.raises(SinkError, match=r"unknown .* format version 0; this release reads version"):
        serializer.deserialize(0, b"{}")
    with pytest.raises(SinkError, match=r"format version 7; this release reads version\(s\) 1"):
        serializer.deserialize(7, b"{}")
    newer = (99).to_bytes(4, "big") + (2).to_bytes(4, "big") + b"{}"
    with pytest.raises(SinkError, match=r"version 99, newer than this release reads \(up to 1\)"):
        deserialize_versioned(serializer, newer)


def test_an_unknown_version_of_a_nested_split_is_refused_too():
    serializer = LazyEnumeratorStateSerializer(
        FileGroupSplitSerializer(), BinPackingStateSerializer()
    )
    data = serializer.serialize(
        LazyEnumeratorState(pending=(_rich_split(),), assigner=BinPackingState())
    )
    tampered = data[:8] + (5).to_bytes(4, "big") + data[12:]  # the split's version header
    with pytest.raises(SinkError, match="newer than this release reads"):
        serializer.deserialize(1, tampered)


def test_corrupt_or_truncated_state_is_a_clear_error():
    with pytest.raises(SinkError, match="corrupt FileGroupSplit data"):
        FileGroupSplitSerializer().deserialize(1, b'{"splitId": "x"}')
    serializer = LazyEnumeratorStateSerializer(
        FileGroupSplitSerializer(), BinPackingStateSerializer()
    )
    data = serializer.serialize(
        LazyEnumeratorState(pending=(_rich_split(),), assigner=BinPackingState())
    )
    for cut in (2, 10, len(data) - 3):
        with pytest.raises(SinkError, match="truncated"):
            serializer.deserialize(1, data[:cut])
    with pytest.raises(SinkError, match="trailing bytes"):
        serializer.deserialize(1, data + b"x")


# -- the source as a value ----------------------------------------------------------------------


def _list(files):
    return iter(files)


def _never_read(file):
    raise AssertionError(f"{file.path} was read while only splits were generated")


def test_the_source_validates_its_options_and_pickles():
    with pytest.raises(ConfigurationError, match="read_file must be callable"):
        FileGroupSource(partial(_list, []), None)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="total_bytes"):
        FileGroupSource(partial(_list, []), _never_read, total_bytes=-1)
    with pytest.raises(ConfigurationError, match="below the floor"):
        FileGroupSource(partial(_list, []), _never_read, config=FileSourceConfig(max_split_bytes=1))
    source = FileGroupSource(partial(_list, _files([MiB])), _never_read)
    clone = pickle.loads(pickle.dumps(source))
    context = LocalEnumeratorContext(1)
    clone.create_enumerator(context).handle_split_request(0)
    assert [s.split_id for s in context.take_assignments(0)] == ["files-0"]
