"""Reading ``key=value`` override values of model specs (``gpt:layers=48``, ``hf:llama:…``)."""

from __future__ import annotations

from typing import Any

from fxplan.examples.bundle import ModelSpecError

__all__ = ["parse_value"]

_TRUE, _FALSE = {"true", "yes", "1", "on"}, {"false", "no", "0", "off"}
_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "text"}


def _read(kind: type, text: str) -> Any:
    if kind is bool:
        if text.lower() not in _TRUE | _FALSE:
            raise ValueError(text)
        return text.lower() in _TRUE
    if kind is int:
        return int(text.replace("_", ""))
    return kind(text)


def parse_value(raw: str, kinds: tuple[type, ...], where: str, *, nullable: bool = False) -> Any:
    """``raw`` as the first of ``kinds`` it reads as: ``bool`` from true/yes/1/on or
    false/no/0/off, ``int`` with optional ``_`` separators, ``float``, ``str`` (anything);
    ``none`` is ``None`` when ``nullable``. Raises :class:`ModelSpecError` naming ``where`` and
    what was expected."""
    text = raw.strip()
    if nullable and text.lower() == "none":
        return None
    for kind in kinds:
        try:
            return _read(kind, text)
        except ValueError:
            continue
    expected = " or ".join(_NAMES.get(kind, kind.__name__) for kind in kinds)
    raise ModelSpecError(f"{where}={raw!r} is not valid: expected {expected}"
                         + (" or none" if nullable else ""))
