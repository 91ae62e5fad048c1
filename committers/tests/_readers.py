"""Independent readers of Delta tables, for tests that check what other tools see."""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Iterator

import duckdb


@contextlib.contextmanager
def duckdb_with_delta() -> Iterator[duckdb.DuckDBPyConnection]:
    """A DuckDB connection with the delta extension loaded from its PyPI package (the
    extension repository is not needed)."""
    import duckdb_extension_delta

    base = os.path.dirname(duckdb_extension_delta.__file__)
    (extension,) = glob.glob(f"{base}/extensions/*/delta.duckdb_extension")
    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    try:
        con.execute(f"LOAD '{extension}'")
        yield con
    finally:
        con.close()


def duckdb_rows(uri: str) -> list[dict]:
    """Every row of the table at ``uri`` as DuckDB's delta_scan reads it."""
    with duckdb_with_delta() as con:
        return con.execute("SELECT * FROM delta_scan(?)", [uri]).to_arrow_table().to_pylist()
