"""framework.source: the FLIP-27 API driven in-process, reading exactly once through failures.

An in-process engine (:class:`_Job`) runs one enumerator and N readers, takes checkpoints
through the serializers, fails readers and restores whole jobs; every test checks that the
records emitted (committed ones for failed attempts) are exactly the input, none twice.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, replace

import pytest

import framework.source
from framework.errors import SinkError
from framework.sink import deserialize_versioned, serialize_versioned
from framework.source import (
    Boundedness,
    FileGroupSource,
    FileGroupSplit,
    FileGroupSplitReader,
    FileGroupSplitState,
    FileRecord,
    FileRecordEmitter,
    FileSourceConfig,
    FileSplit,
    InputStatus,
    LocalEnumeratorContext,
    MultiplexSourceReader,
    RecordEmitter,
    RecordsBySplits,
    Split,
    SplitReader,
    SplitState,
)

MiB = 1024 * 1024


class _Output:
    def __init__(self):
        self.records = []

    def collect(self, record):
        self.records.append(record)


class _ReaderContext:
    def __init__(self, subtask_id, requests):
        self._subtask_id = subtask_id
        self._requests = requests

    @property
    def subtask_id(self):
        return self._subtask_id

    def send_split_request(self):
        self._requests.append(self._subtask_id)


@dataclass
class _Checkpoint:
    enumerator: bytes
    readers: dict[int, list[bytes]]
    committed: dict[int, list]


class _Job:
    """An in-process engine: one enumerator, ``parallelism`` readers, checkpoints and failures.

    A reader's output counts once a checkpoint commits it; a failed reader loses what it
    emitted since, and the splits it held then, or was assigned since, go back to the enumerator.
    """

    def __init__(self, source, parallelism, checkpoint=None):
        self.source = source
        self.context = LocalEnumeratorContext(parallelism)
        self.requests = []
        self.split_serializer = source.split_serializer()
        self.state_serializer = source.enumerator_state_serializer()
        if checkpoint is None:
            self.enumerator = source.create_enumerator(self.context)
        else:
            state = deserialize_versioned(self.state_serializer, checkpoint.enumerator)
            self.enumerator = source.restore_enumerator(self.context, state)
        self.enumerator.start()
        self.readers, self.outputs, self.assigned = {}, {}, {}
        self.added_back = []
        self.committed = {i: [] for i in range(parallelism)}
        self.last_checkpoint = {i: [] for i in range(parallelism)}
        for i in range(parallelism):
            restored = [] if checkpoint is None else checkpoint.readers.get(i, [])
            splits = [deserialize_versioned(self.split_serializer, d) for d in restored]
            self.last_checkpoint[i] = splits
            self._start_reader(i, splits)

    def _start_reader(self, i, splits):
        reader = self.source.create_reader(_ReaderContext(i, self.requests))
        if splits:
            reader.add_splits(splits)
        reader.start()
        self.readers[i], self.outputs[i], self.assigned[i] = reader, _Output(), []

    def deliver(self):
        while self.requests:
            self.enumerator.handle_split_request(self.requests.pop(0))
        for i, reader in self.readers.items():
            splits = self.context.take_assignments(i)
            if splits:
                self.assigned[i] += splits
                reader.add_splits(splits)
            if self.context.has_no_more_splits(i):
                reader.notify_no_more_splits()

    def poll(self, i):
        self.deliver()
        status = self.readers[i].poll_next(self.outputs[i])
        self.deliver()
        return status

    def run(self, max_polls=100_000):
        done = set()
        for _ in range(max_polls):
            for i in self.readers:
                if i not in done and self.poll(i) is InputStatus.END_OF_INPUT:
                    done.add(i)
            if len(done) == len(self.readers):
                return
        raise AssertionError("the job did not finish")

    def checkpoint(self, checkpoint_id):
        readers = {}
        for i, reader in self.readers.items():
            splits = reader.snapshot_state(checkpoint_id)
            readers[i] = [serialize_versioned(self.split_serializer, s) for s in splits]
            self.last_checkpoint[i] = splits
            self.committed[i] += self.outputs[i].records
            self.outputs[i].records, self.assigned[i] = [], []
        state = self.enumerator.snapshot_state(checkpoint_id)
        committed = {i: list(records) for i, records in self.committed.items()}
        return _Checkpoint(serialize_versioned(self.state_serializer, state), readers, committed)

    def fail_reader(self, i):
        """Reader ``i`` dies: its uncommitted output is lost, its splits go back."""
        self.readers.pop(i).close()
        held = {s.split_id: s for s in self.last_checkpoint[i]}
        for split in self.assigned[i] + self.context.reset_reader(i):
            held.setdefault(split.split_id, split)
        self.added_back += held.values()
        self.enumerator.add_splits_back(list(held.values()), i)
        self.last_checkpoint[i] = []
        self._start_reader(i, [])

    def all_records(self):
        return [r for i in self.committed for r in self.committed[i] + self.outputs[i].records]


# -- a file-group source over in-memory "files" -------------------------------------------------


def _dataset(file_count=12, seed=3):
    """path -> records; sizes declared proportional to the record count."""
    data = {}
    for n in range(file_count):
        count = (n * 7 + seed) % 11  # 0..10 records, some files empty
        data[f"day={n % 3}/part-{n}.parquet"] = [f"r{n}.{k}" for k in range(count)]
    return data


class _Files:
    """Lists and reads the dataset; counts the files opened."""

    def __init__(self, data, record_bytes=MiB // 4):
        self.data = data
        self.record_bytes = record_bytes
        self.opened = []

    def list_files(self):
        for path, records in self.data.items():
            size = max(1, len(records)) * self.record_bytes
            day = path.split("/")[0][4:] if "/" in path else None
            yield FileSplit(path=path, size_bytes=size, partition_values={"day": day})

    def read_file(self, file):
        self.opened.append(file.path)
        yield from self.data[file.path]


def _file_source(files, *, max_split_bytes=MiB, fetch_size=3):
    config = FileSourceConfig(max_split_bytes=max_split_bytes, fetch_size=fetch_size)
    return FileGroupSource(files.list_files, files.read_file, convert=str.upper, config=config)


def _expected(data):
    return Counter(r.upper() for records in data.values() for r in records)


def _assert_exactly_once(records, data):
    assert Counter(records) == _expected(data)
    assert len(records) == len(set(records))


def test_a_bounded_file_source_reads_every_record_once_across_readers():
    data = _dataset()
    files = _Files(data)
    source = _file_source(files)
    assert source.boundedness is Boundedness.BOUNDED
    job = _Job(source, parallelism=3)
    job.run()
    _assert_exactly_once(job.all_records(), data)
    assert sorted(files.opened) == sorted(data)  # each file opened once


def test_the_splits_of_a_failed_reader_are_reassigned_and_read_once_across_two_readers():
    data = {"a": [f"a{k}" for k in range(10)], "b": [f"b{k}" for k in range(10)]}
    source = _file_source(_Files(data, record_bytes=MiB // 10), fetch_size=2)
    context = LocalEnumeratorContext(2)
    enumerator = source.create_enumerator(context)
    requests = []

    first = source.create_reader(_ReaderContext(0, requests))
    first.start()
    enumerator.handle_split_request(requests.pop())
    first.add_splits(context.take_assignments(0))
    first_out = _Output()
    first.poll_next(first_out)
    first.poll_next(first_out)
    snapshot = first.snapshot_state(checkpoint_id=1)  # 4 records of "a" committed
    committed = list(first_out.records)
    first.poll_next(first_out)  # 2 more, never committed: lost with the reader
    assert committed == ["A0", "A1", "A2", "A3"] and len(first_out.records) == 6
    first.close()

    enumerator.add_splits_back(snapshot, subtask_id=0)
    second = source.create_reader(_ReaderContext(1, requests))
    second.start()
    second_out = _Output()
    splits_seen = []
    while True:
        while requests:
            enumerator.handle_split_request(requests.pop(0))
        assigned = context.take_assignments(1)
        splits_seen += [(s.split_id, s.file_index, s.records_emitted) for s in assigned]
        second.add_splits(assigned)
        if context.has_no_more_splits(1):
            second.notify_no_more_splits()
        if second.poll_next(second_out) is InputStatus.END_OF_INPUT:
            break
    # the split added back comes first, with its progress, before the new split
    assert splits_seen == [("files-0", 0, 4), ("files-1", 0, 0)]
    assert second_out.records[:6] == ["A4", "A5", "A6", "A7", "A8", "A9"]
    _assert_exactly_once(committed + second_out.records, data)


def test_reader_failures_in_a_running_job_lose_and_duplicate_nothing():
    data = _dataset(file_count=40)
    source = _file_source(_Files(data), max_split_bytes=2 * MiB, fetch_size=2)
    job = _Job(source, parallelism=3)
    for step in range(1, 1000):
        statuses = [job.poll(i) for i in list(job.readers)]
        if set(statuses) == {InputStatus.END_OF_INPUT}:
            break
        if step % 4 == 0:
            job.checkpoint(step)
        if step % 7 == 0:
            job.fail_reader(step % 3)
    assert step > 20  # several failures happened while reading
    # some splits went back with progress made before the reader failed
    assert any(s.file_index or s.records_emitted for s in job.added_back)
    job.run()
    _assert_exactly_once(job.all_records(), data)


def test_a_job_restored_from_a_checkpoint_emits_exactly_what_was_not_committed():
    data = _dataset(file_count=15)
    source = _file_source(_Files(data))
    job = _Job(source, parallelism=2)
    for _ in range(4):
        for i in job.readers:
            job.poll(i)
    checkpoint = job.checkpoint(1)
    assert 0 < sum(map(len, checkpoint.committed.values())) < len(_expected(data))
    for _ in range(3):  # progress after the checkpoint is lost with the job
        for i in job.readers:
            job.poll(i)

    restored = _Job(source, parallelism=2, checkpoint=checkpoint)
    restored.run()
    committed = [r for records in checkpoint.committed.values() for r in records]
    _assert_exactly_once(committed + restored.all_records(), data)


def test_an_enumerator_restored_from_a_snapshot_hands_out_the_rest_and_the_splits_added_back():
    data = _dataset(file_count=12)
    source = _file_source(_Files(data))
    context = LocalEnumeratorContext(1)
    enumerator = source.create_enumerator(context)
    for _ in range(3):
        enumerator.handle_split_request(0)
    first, second, third = context.take_assignments(0)
    enumerator.add_splits_back([replace(second, records_emitted=1)], subtask_id=0)
    data_bytes = serialize_versioned(
        source.enumerator_state_serializer(), enumerator.snapshot_state(5)
    )

    restored_context = LocalEnumeratorContext(1)
    restored = source.restore_enumerator(
        restored_context, deserialize_versioned(source.enumerator_state_serializer(), data_bytes)
    )
    while not restored_context.has_no_more_splits(0):
        restored.handle_split_request(0)
    rest = restored_context.take_assignments(0)
    assert rest[0] == replace(second, records_emitted=1)  # added back: first, with its progress
    ids = [s.split_id for s in [first, third, *rest]]
    assert len(ids) == len(set(ids))
    paths = [f.path for s in [first, third, *rest] for f in s.files]
    assert sorted(paths) == sorted(data)


def test_a_reader_recreated_from_its_snapshot_resumes_exactly_and_skips_finished_files():
    data = {"a": ["a0", "a1", "a2"], "b": ["b0", "b1", "b2", "b3", "b4"], "c": ["c0"]}
    files = _Files(data, record_bytes=1)
    source = _file_source(files, max_split_bytes=MiB, fetch_size=2)
    context = LocalEnumeratorContext(1)
    source.create_enumerator(context).handle_split_request(0)
    (split,) = context.take_assignments(0)
    assert [f.path for f in split.files] == ["a", "b", "c"]

    requests = []
    reader = source.create_reader(_ReaderContext(0, requests))
    reader.add_splits([split])
    reader.start()
    assert requests == []  # a reader with restored or given splits asks for nothing yet
    out = _Output()
    for _ in range(3):
        reader.poll_next(out)
    assert out.records == ["A0", "A1", "A2", "B0", "B1", "B2"]
    (progress,) = reader.snapshot_state(7)
    assert (progress.file_index, progress.records_emitted) == (1, 3)
    serializer = source.split_serializer()
    restored_split = deserialize_versioned(serializer, serialize_versioned(serializer, progress))
    reader.close()
    # the split reader itself starts after the emitted elements (not relying on the emitter)
    split_reader = FileGroupSplitReader(files.read_file, fetch_size=1)
    split_reader.handle_splits_changes([restored_split])
    assert split_reader.fetch().records == {"files-0": [FileRecord("b3", 1, 3)]}

    files.opened.clear()
    resumed = source.create_reader(_ReaderContext(0, requests))
    resumed.add_splits([restored_split])
    resumed.start()
    resumed.notify_no_more_splits()
    rest = _Output()
    while resumed.poll_next(rest) is not InputStatus.END_OF_INPUT:
        pass
    assert rest.records == ["B3", "B4", "C0"]
    assert files.opened == ["b", "c"]  # "a" is finished: never opened again
    assert requests == [0]  # one request, after the split finished


# -- wake-up and failures inside a fetch --------------------------------------------------------


class _Gate:
    """A file whose every element waits for a token: a slow, blocking read."""

    def __init__(self, records):
        self.records = records
        self.tokens = threading.Semaphore(0)
        self.waiting_for = -1

    def read_file(self, file):
        for index, record in enumerate(self.records):
            self.waiting_for = index
            assert self.tokens.acquire(timeout=5), "the test never released the element"
            yield record


def _one_file_split(count):
    return FileGroupSplit(
        split_id="s", files=(FileSplit(path="slow", size_bytes=count),), file_index=0
    )


def _emit_all(fetched, state, output, emitter=None):
    emitter = emitter or FileRecordEmitter()
    for elements in fetched.records.values():
        for element in elements:
            emitter.emit_record(element, output, state)


def test_wake_up_from_another_thread_interrupts_a_blocking_fetch_which_resumes_exactly():
    records = [f"r{k}" for k in range(20)]
    gate = _Gate(records)
    reader = FileGroupSplitReader(gate.read_file, fetch_size=1000)
    split = _one_file_split(len(records))
    reader.handle_splits_changes([split])
    state = FileGroupSplitState.of(split)
    out = _Output()

    result = {}
    fetching = threading.Thread(target=lambda: result.setdefault("r", reader.fetch()))
    fetching.start()
    for _ in range(3):
        gate.tokens.release()
    deadline = time.monotonic() + 5
    while gate.waiting_for < 3 and time.monotonic() < deadline:
        time.sleep(0.001)
    reader.wake_up()  # the fetch is blocked in read_file, waiting for element 4
    gate.tokens.release()
    fetching.join(timeout=5)
    assert not fetching.is_alive()
    interrupted = result["r"]
    assert [e.record for e in interrupted.records["s"]] == ["r0", "r1", "r2", "r3"]
    assert interrupted.finished_splits == frozenset()
    _emit_all(interrupted, state, out)

    for _ in range(len(records)):
        gate.tokens.release()
    while "s" not in (fetched := reader.fetch()).finished_splits:
        _emit_all(fetched, state, out)
    _emit_all(fetched, state, out)
    assert out.records == records


def test_a_wake_up_while_no_fetch_runs_makes_the_next_fetch_return_at_once():
    reader = FileGroupSplitReader(lambda file: iter(["x", "y"]))
    reader.handle_splits_changes([_one_file_split(2)])
    reader.wake_up()
    assert len(reader.fetch()) == 0
    assert [e.record for e in reader.fetch().records["s"]] == ["x", "y"]


class _Flaky:
    """Reads "a" and "b"; the first open of "b" fails after two elements."""

    def __init__(self):
        self.failed = False

    def read_file(self, file):
        for k in range(5):
            if file.path == "b" and k == 2 and not self.failed:
                self.failed = True
                raise OSError("connection reset")
            yield f"{file.path}{k}"


def test_a_fetch_that_raises_midway_is_read_again_by_the_next_fetch():
    flaky = _Flaky()
    reader = FileGroupSplitReader(flaky.read_file, fetch_size=4)
    split = FileGroupSplit(
        split_id="s", files=(FileSplit(path="a", size_bytes=5), FileSplit(path="b", size_bytes=5))
    )
    reader.handle_splits_changes([split])
    state, out = FileGroupSplitState.of(split), _Output()
    _emit_all(reader.fetch(), state, out)  # a0..a3
    with pytest.raises(OSError):
        reader.fetch()  # read a4, b0, b1, then failed: none of them counts
    while "s" not in (fetched := reader.fetch()).finished_splits:
        _emit_all(fetched, state, out)
    _emit_all(fetched, state, out)
    assert out.records == [f"a{k}" for k in range(5)] + [f"b{k}" for k in range(5)]


def test_a_source_reader_survives_a_failing_output_without_loss_or_repeat():
    data = {"a": ["a0", "a1", "a2", "a3"]}
    source = _file_source(_Files(data, record_bytes=1), fetch_size=10)

    class _FailOnce(_Output):
        failed = False

        def collect(self, record):
            if record == "A2" and not self.failed:
                self.failed = True
                raise RuntimeError("downstream hiccup")
            super().collect(record)

    job = _Job(source, parallelism=1)
    job.outputs[0] = _FailOnce()
    with pytest.raises(RuntimeError):
        job.run()
    assert job.readers[0].snapshot_state(1)[0].records_emitted == 2
    job.run()
    _assert_exactly_once(job.all_records(), data)


def test_a_file_shorter_than_the_progress_says_is_a_clear_error():
    reader = FileGroupSplitReader(lambda file: iter(["x"]))
    reader.handle_splits_changes([replace(_one_file_split(3), records_emitted=2)])
    with pytest.raises(SinkError, match="yields 1 elements, but 2 were already read"):
        reader.fetch()


# -- the record emitter -------------------------------------------------------------------------


def test_the_record_emitter_is_idempotent_and_refuses_gaps():
    split = FileGroupSplit(
        split_id="s", files=(FileSplit(path="a", size_bytes=1), FileSplit(path="b", size_bytes=1))
    )
    state, out = FileGroupSplitState.of(split), _Output()
    emitter = FileRecordEmitter(str.upper)
    for element in [FileRecord("x", 0, 0), FileRecord("y", 0, 1)] * 2:
        emitter.emit_record(element, out, state)
    assert out.records == ["X", "Y"]
    assert (state.file_index, state.records_emitted) == (0, 2)
    emitter.emit_record(FileRecord("z", 1, 0), out, state)  # next file
    emitter.emit_record(FileRecord("y", 0, 1), out, state)  # a replay of the previous file
    assert out.records == ["X", "Y", "Z"]
    assert state.to_split() == replace(split, file_index=1, records_emitted=1)
    with pytest.raises(SinkError, match="elements were skipped"):
        emitter.emit_record(FileRecord("w", 1, 3), out, state)

    class _Refusing:
        def collect(self, record):
            raise RuntimeError("full")

    with pytest.raises(RuntimeError):
        emitter.emit_record(FileRecord("v", 1, 1), _Refusing(), state)
    assert (state.file_index, state.records_emitted) == (1, 1)  # not advanced


# -- the API with a non-file split: an unbounded feed whose fetch blocks for data ---------------


@dataclass(frozen=True, kw_only=True)
class _FeedSplit(Split):
    position: int = 0


class _FeedState(SplitState[_FeedSplit]):
    def __init__(self, split):
        self.split, self.position = split, split.position

    @property
    def split_id(self):
        return self.split.split_id

    def to_split(self):
        return replace(self.split, position=self.position)


class _FeedReader(SplitReader[tuple[int, str], _FeedSplit]):
    """Reads a growing list; fetch waits for new records until they come or wake_up."""

    def __init__(self, feed, condition):
        self._feed, self._condition = feed, condition
        self._positions = {}
        self._woken = False

    def handle_splits_changes(self, splits):
        self._positions.update({s.split_id: s.position for s in splits})

    def fetch(self):
        with self._condition:
            while not self._woken and all(p >= len(self._feed) for p in self._positions.values()):
                self._condition.wait(timeout=5)
            self._woken = False
            records = {}
            for split_id, position in self._positions.items():
                records[split_id] = list(enumerate(self._feed))[position:]
                self._positions[split_id] = len(self._feed)
            return RecordsBySplits(records)

    def wake_up(self):
        with self._condition:
            self._woken = True
            self._condition.notify_all()


class _FeedEmitter(RecordEmitter[tuple[int, str], str, _FeedState]):
    def emit_record(self, element, output, split_state):
        position, record = element
        if position >= split_state.position:
            output.collect(record)
            split_state.position = position + 1


def test_a_fetch_blocked_waiting_for_data_returns_early_on_wake_up_and_resumes():
    feed, condition = [], threading.Condition()
    reader = MultiplexSourceReader(
        _FeedReader(feed, condition),
        _FeedEmitter(),
        _ReaderContext(0, []),
        initial_state=_FeedState,
    )
    reader.add_splits([_FeedSplit(split_id="feed")])
    out = _Output()
    statuses = []
    polling = threading.Thread(target=lambda: statuses.append(reader.poll_next(out)))
    polling.start()
    time.sleep(0.05)
    assert polling.is_alive()  # blocked: nothing to read
    reader.wake_up()
    polling.join(timeout=5)
    assert statuses == [InputStatus.MORE_AVAILABLE] and out.records == []

    with condition:
        feed += ["e0", "e1"]
        condition.notify_all()
    reader.poll_next(out)
    (snapshot,) = reader.snapshot_state(1)
    assert snapshot == _FeedSplit(split_id="feed", position=2)

    with condition:
        feed += ["e2"]
    resumed = MultiplexSourceReader(
        _FeedReader(feed, condition),
        _FeedEmitter(),
        _ReaderContext(0, []),
        initial_state=_FeedState,
    )
    resumed.add_splits([snapshot])
    resumed.poll_next(out)
    assert out.records == ["e0", "e1", "e2"]


def test_a_reader_without_splits_waits_and_ends_only_after_no_more_splits():
    requests = []
    reader = _file_source(_Files({})).create_reader(_ReaderContext(0, requests))
    reader.start()
    assert requests == [0]
    assert reader.poll_next(_Output()) is InputStatus.NOTHING_AVAILABLE
    reader.notify_no_more_splits()
    assert reader.poll_next(_Output()) is InputStatus.END_OF_INPUT
    with pytest.raises(SinkError, match="assigned twice"):
        reader.add_splits([_one_file_split(1), _one_file_split(1)])


# -- surface ------------------------------------------------------------------------------------


def test_public_surface_is_pinned():
    assert sorted(framework.source.__all__) == [
        "BinPackingSplitAssigner",
        "BinPackingState",
        "BinPackingStateSerializer",
        "Boundedness",
        "DEFAULT_FETCH_SIZE",
        "DEFAULT_MAX_SPLITS",
        "DEFAULT_MAX_SPLIT_BYTES",
        "FileEnumeratorState",
        "FileGroupSource",
        "FileGroupSplit",
        "FileGroupSplitReader",
        "FileGroupSplitSerializer",
        "FileGroupSplitState",
        "FileRecord",
        "FileRecordEmitter",
        "FileSourceConfig",
        "FileSplit",
        "InputStatus",
        "LazyEnumeratorState",
        "LazyEnumeratorStateSerializer",
        "LazySplitEnumerator",
        "LocalEnumeratorContext",
        "MIN_MAX_SPLIT_BYTES",
        "MultiplexSourceReader",
        "RecordEmitter",
        "RecordsBySplits",
        "Source",
        "SourceOutput",
        "SourceReader",
        "SourceReaderContext",
        "Split",
        "SplitAssigner",
        "SplitEnumerator",
        "SplitEnumeratorContext",
        "SplitReader",
        "SplitState",
    ]


def test_the_source_package_imports_without_pyspark_or_deltalake():
    code = (
        "import sys\n"
        "sys.modules['pyspark'] = None\n"
        "sys.modules['deltalake'] = None\n"
        "import framework.source\n"
        "assert 'pyspark' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"
