"""Unknown keyword arguments get a message that says what to write instead."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

from framework.errors import ConfigurationError

__all__ = ["refuse_unknown_options"]


def refuse_unknown_options(
    owner: str,
    given: Mapping[str, object],
    equivalents: Mapping[str, str],
    valid: Iterable[str],
) -> None:
    """Refuse keyword arguments ``owner`` does not have, saying what to use instead.

    Raises:
        ConfigurationError: a name another tool spells this way (delta-spark's ``mergeSchema``,
            ``mode``, ``options``...): the message names the equivalent here.
        TypeError: any other unknown name, with the closest valid ones.
    """
    for name in given:
        if name in equivalents:
            raise ConfigurationError(
                f"{owner} has no option {name!r} (a Spark or delta-spark writer option): "
                f"{equivalents[name]}"
            )
        close = difflib.get_close_matches(name, list(valid), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise TypeError(f"{owner} got an unexpected keyword argument {name!r}{hint}")
