"""The one error type of :mod:`cluster_specs`: a cluster description that cannot be used.

Every message names where the description came from (a file, a built-in name, an override
string), the key path inside it (``levels[1].bandwidth_gb_per_s``), what was found there and
what was expected, so that a user can fix the file without reading code::

    bad.yaml: levels[1].bandwidth_gb_per_s: found -25, expected a number > 0 (GB/s per direction)
"""

from __future__ import annotations

from fxplan.core.errors import UserError

from typing import Any

_NOTHING = object()


def describe(value: Any) -> str:
    """A short, YAML-flavoured rendering of a found value for error messages."""
    if value is _NOTHING:
        return "nothing (the key is missing)"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, str):
        return f"{value!r} (a string)"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, dict):
        keys = ", ".join(map(str, list(value)[:6]))
        return f"a mapping with keys {keys}" if value else "an empty mapping"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)} item{'s' if len(value) != 1 else ''}"
    return f"{value!r} (a {type(value).__name__})"


class ClusterSpecError(UserError, ValueError):
    """A cluster description is malformed, contradictory or cannot be found.

    ``source`` is the file or spec string, ``path`` the key path inside it (``""`` for the
    whole document), ``found`` the offending value and ``expected`` what would be accepted.
    Built without ``path`` the error carries a free-form ``message`` instead.
    """

    def __init__(
        self,
        source: str,
        path: str = "",
        *,
        found: Any = _NOTHING,
        expected: str = "",
        message: str = "",
    ) -> None:
        self.source = source
        self.path = path
        self.found = None if found is _NOTHING else found
        self.expected = expected
        where = f"{source}: {path}: " if path else f"{source}: "
        if message:
            text = where + message
        else:
            text = f"{where}found {describe(found)}, expected {expected}"
        super().__init__(text)

    @classmethod
    def missing(cls, source: str, path: str, expected: str) -> "ClusterSpecError":
        """The key at ``path`` is required but absent."""
        return cls(source, path, found=_NOTHING, expected=expected)
