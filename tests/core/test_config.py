"""ParallelConfig: parsing, the one-line summary, and validation errors with the arithmetic."""

from __future__ import annotations

import pytest

from fxplan.core.config import ParallelConfig
from fxplan.core.config_error import CostModelError
from fxplan.core.schedule import Schedule

TEXT = "dp=24,tp=8,pp=8,mb=1,schedule=interleaved:2,zero=0,recompute=full,sp=off"


def test_parse_reads_every_key() -> None:
    c = ParallelConfig.parse(TEXT)
    assert (c.dp, c.tp, c.pp, c.microbatch_size) == (24, 8, 8, 1)
    assert (str(c.schedule), c.schedule.kind, c.virtual_stages) == ("interleaved:2", "interleaved", 2)
    assert (c.zero_stage, c.recompute, c.sequence_parallel) == (0, "full", False)
    assert c.world_size == 1536


def test_round_trip_and_summary() -> None:
    c = ParallelConfig.parse(TEXT + ",m=96,stages=" + "/".join(["6"] * 16))
    assert ParallelConfig.parse(c.to_string()) == c
    assert c.summary() == ("pp=8 dp=24 tp=8 | zero=0 | interleaved:2 mb=1×96 | recompute=full "
                           "| sp=off")


def test_resolve_derives_microbatches() -> None:
    assert ParallelConfig.parse(TEXT).resolve(2304).num_microbatches == 96


@pytest.mark.parametrize("text,message", [
    ("dp=2,foo=3", "cannot read 'foo=3'"),
    ("dp=2,dp=3", "dp is given twice"),
    ("schedule=zigzag", "is not one of gpipe, 1f1b, interleaved:v"),
    ("schedule=interleaved:1", "interleaved:1 is 1f1b"),
    ("schedule=interleaved", "interleaved needs its chunk count"),
    ("schedule=1f1b:2", "only interleaved and zb take ':v'"),
    ("zero=4", "zero_stage must be 0, 1, 2 or 3"),
    ("recompute=some", "expected one of none, selective, full"),
    ("sp=maybe", "expected on or off"),
    ("tp=0", "tp must be a positive integer"),
    ("pp=2,stages=3/3/3", "lists 3 stages, expected pp·v = 2·1 = 2"),
])
def test_parse_errors(text: str, message: str) -> None:
    with pytest.raises(CostModelError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ParallelConfig.parse(text)


def _check(text: str, **kwargs: int) -> None:
    facts = dict(world_size=1536, layers=96, heads=96, seq=2048, batch=2304)
    facts.update(kwargs)
    ParallelConfig.parse(text).check(**facts)


@pytest.mark.parametrize("text,facts,message", [
    (TEXT, {"world_size": 3072}, "dp·tp·pp = 24·8·8 = 1536 ≠ 3072 devices"),
    (TEXT, {"heads": 12}, "tp=8 does not divide heads=12 (12 mod 8 = 4)"),
    ("dp=24,tp=8,pp=8", {"layers": 20},
     "pp=8 does not divide layers=20 (20 mod 8 = 4); or give stages=… (8 counts summing to 20)"),
    ("dp=24,tp=8,pp=8", {"layers": 6}, "8 stages for 6 layers: every stage needs at least one layer"),
    (TEXT, {"layers": 24}, "interleaved:2 needs layers divisible by pp·v = 8·2 = 16 (24 mod 16 = 8)"),
    (TEXT, {"batch": 500}, "batch=500 is not divisible by dp·mb = 24·1 = 24 (500 mod 24 = 20)"),
    (TEXT, {"batch": 24 * 12}, "m = batch / (dp·mb) = 288 / (24·1) = 12, 12 mod 8 = 4"),
    ("dp=24,tp=8,pp=8,sp=on", {"seq": 2044}, "splits seq=2044 over tp=8 (2044 mod 8 = 4)"),
    ("dp=24,tp=8,pp=8,stages=12/12/12/12/12/12/12/11", {}, "hold 95 layers, the model has 96"),
])
def test_check_errors_show_the_arithmetic(text: str, facts: dict, message: str) -> None:
    with pytest.raises(CostModelError) as err:
        _check(text, **facts)
    assert message in str(err.value)


def test_uneven_stages_are_allowed_when_given() -> None:
    config = ParallelConfig.parse("dp=24,tp=8,pp=8,stages=13/13/12/12/12/12/11/11")
    _check(config.to_string(), layers=96)
    assert config.layers_per_stage(96) == (13, 13, 12, 12, 12, 12, 11, 11)
    assert ParallelConfig.parse(TEXT).layers_per_stage(96) == (6,) * 16


def test_error_is_a_user_error_of_the_cli() -> None:
    from fxplan.core.errors import UserError

    assert issubclass(CostModelError, UserError)
    assert issubclass(CostModelError, ValueError)


@pytest.mark.parametrize("text,kind,chunks", [("zb", "zb", 1), ("zb:2", "zb", 2),
                                              ("ZBV", "zbv", 2), ("DualPipeV", "dualpipev", 2)])
def test_zero_bubble_schedules_parse_and_print(text: str, kind: str, chunks: int) -> None:
    schedule = Schedule.parse(text)
    assert (schedule.kind, schedule.chunks, schedule.split_backward) == (kind, chunks, True)
    assert Schedule.parse(str(schedule)) == schedule


def test_zbv_places_its_chunks_in_a_v() -> None:
    """Rank r holds virtual stages r and 2·pp − 1 − r; the loop placement j = c·pp + r
    otherwise."""
    zbv, loop = Schedule.parse("zbv"), Schedule.parse("zb:2")
    assert [zbv.placement(j, 4) for j in range(8)] == [
        (0, 0), (1, 0), (2, 0), (3, 0), (3, 1), (2, 1), (1, 1), (0, 1)]
    assert all(zbv.virtual_stage(*zbv.placement(j, 4), 4) == j for j in range(8))
    assert [loop.placement(j, 4) for j in range(8)] == [(j % 4, j // 4) for j in range(8)]
    dual = Schedule.parse("dualpipev")
    assert dual.v_shape and [dual.placement(j, 4) for j in range(8)] == [
        zbv.placement(j, 4) for j in range(8)]


def test_dualpipev_round_trips_and_needs_two_microbatches_per_stage() -> None:
    """``schedule=dualpipev`` prints as it parses; torch's ScheduleDualPipeV runs at least one
    microbatch per virtual stage, m ≥ 2·pp, which the check says with the arithmetic."""
    config = ParallelConfig.parse("dp=1,tp=1,pp=2,mb=1,schedule=dualpipev,zero=0,"
                                  "recompute=none,sp=off")
    assert ParallelConfig.parse(config.to_string()) == config
    assert config.virtual_stages == 2 and "dualpipev" in config.to_string()
    config.check(layers=4, heads=4, world_size=2, batch=4)
    with pytest.raises(CostModelError, match=r"at least 2·pp = 4 microbatches.* = 3"):
        config.check(layers=4, heads=4, world_size=2, batch=3)


@pytest.mark.parametrize("text,message", [("schedule=zbv:3", "zbv always runs 2 chunks"),
                                          ("schedule=dualpipev:2", "dualpipev always runs 2"),
                                          ("schedule=zb:x", "zb needs its chunk count")])
def test_zero_bubble_parse_errors(text: str, message: str) -> None:
    with pytest.raises(CostModelError, match=message):
        ParallelConfig.parse(text)
