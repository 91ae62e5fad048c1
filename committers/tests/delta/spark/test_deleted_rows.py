"""Matching Spark's files to their deletion vectors (no Spark needed): the path component of a
log path, and the check that Spark lists every file with a vector (one it spells otherwise
would keep its deleted rows, so read_table falls back to the Python reader)."""

from __future__ import annotations

import numpy as np

from committers.delta.spark._deleted_rows import path_component, unmatched

NONE = np.empty(0, dtype=np.uint64)


def test_the_path_component_of_a_decoded_log_path_keeps_its_characters():
    assert path_component("/t/s=a b/x#1?.parquet") == "/t/s=a b/x#1?.parquet"
    assert path_component("s3a://bucket/t/s=100%/x.parquet") == "/t/s=100%/x.parquet"
    assert path_component("file:///t/x.parquet") == "/t/x.parquet"
    assert path_component("s3://bucket") == "/"


def test_files_with_vectors_spark_does_not_list_are_named():
    listed = [
        "file:/t/s=a%20b%2525/part-0.parquet",  # Spark's escaping of "s=a b%25"
        "file:///t/s=k/part-1+2.parquet",
        "s3a://bucket/t/s=%F0%A0%AE%B7/part-3.parquet",
    ]
    vectors = [
        ("/t/s=a b%25/part-0.parquet", NONE),
        ("/t/s=k/part-1+2.parquet", NONE),
        ("/t/s=𠮷/part-3.parquet", NONE),
    ]
    assert unmatched(listed, vectors) == []
    assert unmatched(listed[1:], vectors) == ["/t/s=a b%25/part-0.parquet"]
    assert unmatched(listed, [("/t/s=a b%2525/part-0.parquet", NONE)]) == [
        "/t/s=a b%2525/part-0.parquet"
    ]
