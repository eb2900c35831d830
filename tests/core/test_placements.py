"""Compact placement strings and local shapes."""

from __future__ import annotations

import pytest

from fxplan.core.placements import (
    Partial, Replicate, Shard, format_placements, local_shape, parse_placements, shard_factor,
)


@pytest.mark.parametrize("text", ["S(0)R", "RS(1)", "P", "S(0)S(1)P", "S(-1)"])
def test_round_trip(text):
    assert format_placements(parse_placements(text)) == text


def test_parse_gives_torch_types():
    assert parse_placements("S(2)RP") == (Shard(2), Replicate(), Partial())


def test_bad_string_says_where_and_what_is_expected():
    with pytest.raises(ValueError, match=r"'S\(0\)X' at position 4: expected one token per mesh axis"):
        parse_placements("S(0)X")


def test_local_shape_divides_sharded_dims_by_axis_sizes():
    # (batch 8, seq 6, hidden 12) on a 2×3 mesh: batch over axis 0, hidden over axis 1
    assert local_shape((8, 6, 12), parse_placements("S(0)S(2)"), (2, 3)) == (4, 6, 4)
    # both axes shard the same dim: 8 / 2 / 3 → ceil twice
    assert local_shape((8, 6), parse_placements("S(0)S(0)"), (2, 3)) == (2, 6)
    assert shard_factor(parse_placements("S(0)P"), (2, 3)) == 2
