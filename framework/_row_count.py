"""The row-count guard: what a commit would hold must be what the write job wrote.

Every write path counts the rows its job writes as it writes them (a Spark observation on the
written DataFrame, or the Python tasks' own count of the rows they consumed and wrote), apart
from the files it then collects, and compares that count with the sum of the record counts of
the files it is about to commit. A difference means a file was lost, counted twice or cut
short on the way (a listing that skipped a directory, a task result lost): the batch fails
before its commit instead of committing fewer rows than it was given.
"""

from __future__ import annotations

from framework.errors import RowCountMismatchError

__all__ = ["check_row_count"]


def check_row_count(what: str, *, written: int, committed: int) -> None:
    """Raise unless ``committed`` (rows in the files to commit) equals ``written`` (rows the
    write job wrote, counted independently of those files).

    Args:
        what: the batch or rewrite, for the message (e.g. ``"batch 3 of 'app' into <uri>"``).

    Raises:
        RowCountMismatchError: naming both numbers; the caller commits nothing.
    """
    if written == committed:
        return
    raise RowCountMismatchError(
        f"{what} would commit {committed} rows, but its write job wrote {written} rows: the "
        "staged files do not hold exactly the rows written (a file lost, counted twice or cut "
        "short on its way to the commit). Nothing was committed and the staged files are "
        "deleted; running it again writes it anew."
    )
