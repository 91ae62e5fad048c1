"""Independent readers of Delta tables, for tests that check what other tools see."""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Iterator

import duckdb


def _extension(module: object, name: str) -> str:
    base = os.path.dirname(module.__file__)  # type: ignore[attr-defined]
    (extension,) = glob.glob(f"{base}/extensions/*/{name}.duckdb_extension")
    return extension


@contextlib.contextmanager
def duckdb_with_delta(s3: dict[str, str] | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
    """A DuckDB connection with the delta extension loaded from its PyPI package (the
    extension repository is not needed); with ``s3`` (the sink's storage options), also httpfs
    and a secret reaching that S3 endpoint."""
    import duckdb_extension_delta

    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    try:
        if s3 is not None:
            import duckdb_extension_httpfs

            con.execute(f"LOAD '{_extension(duckdb_extension_httpfs, 'httpfs')}'")
            endpoint = s3["AWS_ENDPOINT_URL"]
            con.execute(
                "CREATE SECRET (TYPE s3, KEY_ID ?, SECRET ?, REGION ?, ENDPOINT ?, "
                "URL_STYLE 'path', USE_SSL ?)",
                [
                    s3["AWS_ACCESS_KEY_ID"],
                    s3["AWS_SECRET_ACCESS_KEY"],
                    s3.get("AWS_REGION", "us-east-1"),
                    endpoint.split("://", 1)[1],
                    endpoint.startswith("https://"),
                ],
            )
        con.execute(f"LOAD '{_extension(duckdb_extension_delta, 'delta')}'")
        yield con
    finally:
        con.close()


def duckdb_rows(uri: str, s3: dict[str, str] | None = None) -> list[dict]:
    """Every row of the table at ``uri`` as DuckDB's delta_scan reads it (``s3``: the storage
    options of a table on S3)."""
    with duckdb_with_delta(s3) as con:
        return con.execute("SELECT * FROM delta_scan(?)", [uri]).to_arrow_table().to_pylist()
