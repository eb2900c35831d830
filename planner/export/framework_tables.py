"""The frameworks' own rules, as data: flags, keys, defaults and cross-checks of Megatron-LM
and torchtitan, read from a named commit (``data/megatron.json``, ``data/torchtitan.json``:
``repository``, ``commit``, ``date`` and the files they were read from; torchtitan's per
version). :mod:`fxplan.export.framework_checks` checks exports against them.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

__all__ = ["load_table"]

_DATA = Path(__file__).with_name("data")


@cache
def load_table(name: str) -> dict[str, Any]:
    """The table ``data/NAME.json`` (``megatron`` or ``torchtitan``)."""
    return json.loads((_DATA / f"{name}.json").read_text())
