"""``FrozenMap``: a read-only, hashable ``dict`` for the mappings inside frozen dataclasses.

A ``dict`` subclass (rather than ``types.MappingProxyType``) so that it pickles, deep-copies
and serialises to JSON like a plain dict — clusters travel to worker processes and into plans.
"""

from __future__ import annotations

from typing import Any, Mapping, NoReturn


class FrozenMap(dict):
    """A ``dict`` that refuses to change after construction and hashes by its items."""

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError(f"{type(self).__name__} is read-only")

    __setitem__ = __delitem__ = __ior__ = _refuse  # type: ignore[assignment]
    clear = pop = popitem = setdefault = update = _refuse  # type: ignore[assignment]

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items())))

    def __reduce__(self) -> tuple:
        return (type(self), (dict(self),))

    def __repr__(self) -> str:
        return f"FrozenMap({dict.__repr__(self)})"


def freeze(mapping: Mapping[str, float] | None) -> FrozenMap:
    """A read-only copy of ``mapping`` (empty for ``None``)."""
    return FrozenMap(mapping or {})
