"""A JSON object (a ``dict``) from text, or the caller's :class:`UserError` saying why not.

Plans, DeepSpeed configs, checkpoint state files and Hugging Face ``config.json`` files are all
one JSON object; text that does not parse, text nested too deeply for Python's recursive JSON
reader (``RecursionError``), and a document that is not an object (an array, a number) each get
one sentence naming the source, in the caller's error class.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from fxplan.core.errors import UserError

__all__ = ["parse_json_object"]


def parse_json_object(text: str, *, what: str, kind: str = "file",
                      error: Callable[[str], Exception] = UserError) -> dict[str, Any]:
    """``json.loads(text)`` when it is an object; otherwise ``error(message)``: ``"{what}: not
    a JSON {kind}: {why}"`` or ``"{what}: expected a JSON object, found {type}"``."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise error(f"{what}: not a JSON {kind}: {err}") from None
    except RecursionError:
        raise error(f"{what}: not a JSON {kind} fxplan reads: its arrays and objects are nested "
                    "deeper than Python's JSON reader follows (about a thousand levels; a "
                    "plan or config is nested a few levels deep)") from None
    if not isinstance(data, dict):
        raise error(f"{what}: expected a JSON object, found {type(data).__name__}")
    return data
