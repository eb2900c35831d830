"""``--memory-headroom`` values: fractions, percentages and GiB; bad values are user errors."""

from __future__ import annotations

import pytest

from fxplan.core.errors import UserError
from fxplan.cost_model.memory.headroom import (DEFAULT_HEADROOM, MemoryHeadroom,
                                               parse_headroom)

GIB = 2 ** 30


@pytest.mark.parametrize("value,fraction,gib", [
    (None, 0.05, None), (0.1, 0.1, None), ("0.1", 0.1, None), ("10%", 0.1, None),
    (" 7.5 % ", 0.075, None), (0, 0.0, None), ("4GiB", None, 4.0), ("0.5 gib", None, 0.5),
    ("4G", None, 4.0),
])
def test_parses(value, fraction, gib) -> None:  # type: ignore[no-untyped-def]
    h = parse_headroom(value)
    assert (h.fraction, h.gib) == (pytest.approx(fraction) if fraction is not None else None, gib)
    assert parse_headroom(h.to_json()) == h


def test_bytes_and_default() -> None:
    assert parse_headroom("10%").bytes(80 * GIB) == pytest.approx(8 * GIB)
    assert parse_headroom("4GiB").bytes(80 * GIB) == 4 * GIB
    assert DEFAULT_HEADROOM == MemoryHeadroom(fraction=0.05)
    assert DEFAULT_HEADROOM.describe() == "5 %"


@pytest.mark.parametrize("value", ["-1", "1", "100%", "150%", "abc", "4 TB", "", "nan", True,
                                   [0.1], float("inf")])
def test_bad_values_are_user_errors(value) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UserError, match="memory headroom"):
        parse_headroom(value)
