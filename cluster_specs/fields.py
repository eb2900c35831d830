"""Field checkers for the YAML schema: each turns a found value into its canonical form or
raises :class:`ClusterSpecError` naming the key path, what was found and what was expected.

A :class:`Field` is one key of a mapping: its checker, whether it is required, and its
default. :func:`check_mapping` applies a table of fields to one mapping (unknown keys, missing
keys, each value) and returns the canonical mapping in table order.
"""

from __future__ import annotations

import copy
import difflib
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from fxplan.cluster_specs.errors import ClusterSpecError

#: Marks an optional key that is left out of the canonical form when absent.
OMIT = object()

Checker = Callable[[Any, str, str], Any]
"""``check(value, source, path) -> canonical value``; raises ``ClusterSpecError``."""

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


@dataclass(frozen=True)
class Field:
    """One key of a mapping: how to check it, what it means, and its default if optional."""

    check: Checker
    expected: str
    required: bool = True
    default: Any = OMIT


def _is_number(value: Any) -> bool:
    """An int or a finite float; booleans (YAML ``yes``/``true``) are not numbers."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _yaml_hint(value: Any) -> str:
    """PyYAML (YAML 1.1) reads ``1e3`` as a string; say so when that is what happened."""
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return ""
        return " (write numbers unquoted, with a dot in exponent form: 1.0e3, not 1e3)"
    return ""


def number(*, low: float, low_open: bool, high: float | None = None, unit: str) -> Field:
    """A number in ``(low, high]`` (``low_open``) or ``[low, high]``; canonical ``float``."""
    low_text = f"> {low:g}" if low_open else f"≥ {low:g}"
    high_text = "" if high is None else (f"{high:,.0f}" if high >= 1000 and high == int(high)
                                         else f"{high:g}")
    expected = f"a number {low_text}" + (f" and ≤ {high_text}" if high is not None else "")
    expected += f" ({unit})" if unit else ""

    def check(value: Any, source: str, path: str) -> float:
        ok = _is_number(value) and (value > low if low_open else value >= low)
        if ok and high is not None:
            ok = value <= high
        if not ok:
            raise ClusterSpecError(source, path, found=value, expected=expected + _yaml_hint(value))
        return float(value)

    return Field(check, expected)


def integer(*, low: int, unit: str, high: int | None = None) -> Field:
    """An integer ``≥ low`` (and ``≤ high``; floats such as ``8.0`` are refused); canonical
    ``int``."""
    expected = (f"an integer ≥ {low}" if high is None else f"an integer in {low} … {high:,}"
                ) + f" ({unit})"

    def check(value: Any, source: str, path: str) -> int:
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= low
                and (high is None or value <= high)):
            raise ClusterSpecError(source, path, found=value, expected=expected + _yaml_hint(value))
        return value

    return Field(check, expected)


def text(*, what: str, name: bool = False, empty_ok: bool = False) -> Field:
    """A non-empty string (``empty_ok``: or empty); ``name=True``: letters, digits, ``_``, ``-``."""
    expected = f"a name of letters, digits, '_' and '-' ({what})" if name else f"a string ({what})"

    def check(value: Any, source: str, path: str) -> str:
        ok = isinstance(value, str) and (empty_ok or value.strip() != "")
        if ok and name:
            ok = bool(_NAME.match(value))
        if not ok:
            raise ClusterSpecError(source, path, found=value, expected=expected)
        return value

    return Field(check, expected)


def boolean(*, what: str) -> Field:
    """``true`` or ``false`` (YAML booleans only: ``0``/``"no"`` are refused)."""
    expected = f"true or false ({what})"

    def check(value: Any, source: str, path: str) -> bool:
        if not isinstance(value, bool):
            raise ClusterSpecError(source, path, found=value, expected=expected)
        return value

    return Field(check, expected)


def choice(options: tuple[str, ...], *, what: str) -> Field:
    """One of ``options``."""
    expected = f"one of {', '.join(options)} ({what})"

    def check(value: Any, source: str, path: str) -> str:
        if not isinstance(value, str) or value not in options:
            raise ClusterSpecError(source, path, found=value, expected=expected)
        return value

    return Field(check, expected)


def number_map(keys: tuple[str, ...], value_field: Field, *, what: str, nonempty: bool) -> Field:
    """A mapping from some of ``keys`` to numbers checked by ``value_field``."""
    expected = f"a mapping from {', '.join(keys)} to {value_field.expected} ({what})"

    def check(value: Any, source: str, path: str) -> dict[str, float]:
        if not isinstance(value, dict) or (nonempty and not value):
            raise ClusterSpecError(source, path, found=value, expected=expected)
        out: dict[str, float] = {}
        for key in keys:  # canonical order
            if key in value:
                out[key] = value_field.check(value[key], source, f"{path}.{key}")
        for key in value:
            if key not in keys:
                raise unknown_key(source, f"{path}.{key}", key, keys)
        return out

    return Field(check, expected)


def optional(field: Field, default: Any = OMIT) -> Field:
    """``field`` made optional; absent, it takes ``default`` (or is left out)."""
    return Field(field.check, field.expected, required=False, default=default)


def unknown_key(source: str, path: str, key: Any, known: tuple[str, ...] | list[str]) -> ClusterSpecError:
    """The error for a key the schema does not know, with a spelling suggestion."""
    close = difflib.get_close_matches(str(key), list(known), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ClusterSpecError(
        source, path, message=f"found unknown key {key!r}, expected one of {', '.join(known)}{hint}"
    )


def check_mapping(
    value: Any, table: Mapping[str, Field], source: str, path: str, *, what: str
) -> dict[str, Any]:
    """Check a mapping against ``table``; return its canonical form in table order."""
    if not isinstance(value, dict):
        raise ClusterSpecError(source, path or "(top level)", found=value, expected=f"a mapping ({what})")
    prefix = f"{path}." if path else ""
    for key in value:
        if key not in table:
            raise unknown_key(source, f"{prefix}{key}", key, list(table))
    out: dict[str, Any] = {}
    for key, field in table.items():
        if key in value:
            out[key] = field.check(value[key], source, f"{prefix}{key}")
        elif field.required:
            raise ClusterSpecError.missing(source, f"{prefix}{key}", field.expected)
        elif field.default is not OMIT:
            out[key] = copy.copy(field.default)
    return out
