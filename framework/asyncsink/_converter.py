"""ElementConverter: how one input element becomes one request entry (FLIP-171)."""

from __future__ import annotations

from typing import Protocol, TypeVar

from framework.sink import WriterContext

__all__ = ["ElementConverter"]

InputT_contra = TypeVar("InputT_contra", contravariant=True)
RequestEntryT_co = TypeVar("RequestEntryT_co", covariant=True)


class ElementConverter(Protocol[InputT_contra, RequestEntryT_co]):
    """Maps an input element to the request entry a destination accepts.

    Supplied by the destination (e.g. a row to a JSON document, or to a Kinesis record with its
    partition key), so that users never build request payloads themselves. It must pickle, since
    it travels with the sink to every task, and must be safe to call from any thread.

    Errors it raises (for instance :class:`~framework.errors.UnsupportedTypeError` for a value it
    cannot encode) fail the ``write`` call that passed the element; nothing is buffered for it.
    """

    def apply(self, element: InputT_contra, context: WriterContext | None) -> RequestEntryT_co:
        """Convert one element. ``context`` says which task writes it (``None`` outside one)."""
        ...
