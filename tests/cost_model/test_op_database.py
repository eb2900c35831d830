"""The op database: format, lookup and interpolation on synthetic records with known laws."""

from __future__ import annotations

import json
import math

import pytest

from fxplan.cost_model.compute.op_database import OPS, OpDatabase, Record, find_database


def linear_record(m: int, k: int, n: int, family: str, seconds: float) -> Record:
    shapes = ((m, k), (n, k))
    return Record("linear", family, "fp32", shapes, OPS["linear"].flops(shapes),
                  OPS["linear"].bytes(shapes, 4), seconds)


def fixed_plus_rate(flops: float) -> float:
    """t = 2 µs + F / 100 GFLOP/s: the law the interpolation reproduces exactly."""
    return 2e-6 + flops / 1e11


@pytest.fixture
def db() -> OpDatabase:
    square = [linear_record(s, s, s, "square", fixed_plus_rate(2.0 * s**3)) for s in (64, 256, 1024)]
    # MLP-like shapes run at half the rate, so the family choice is visible
    mlp = [linear_record(8 * s, s, 4 * s, "mlp-up", 2 * fixed_plus_rate(64.0 * s**3)) for s in (32, 128)]
    return OpDatabase("NVIDIA A100-SXM4-80GB", "cuda", {"torch_version": "x"}, square + mlp)


def test_exact_match_returns_the_measurement(db: OpDatabase) -> None:
    assert db.estimate("linear", "fp32", shapes=[(256, 256), (256, 256)]) == db.records[1].time_s
    assert db.estimate("matmul", "float32", shapes=[(256, 256), (256, 256)]) == db.records[1].time_s


def test_interpolation_follows_fixed_cost_plus_rate(db: OpDatabase) -> None:
    for s in (128, 512, 96):
        estimate = db.estimate("linear", "fp32", shapes=[(s, s), (s, s)])
        assert estimate == pytest.approx(fixed_plus_rate(2.0 * s**3), rel=1e-9)


def test_concave_segment_is_log_log(db: OpDatabase) -> None:
    # t grows faster than the work between two points (a cache cliff): geometric interpolation
    cliff = OpDatabase("cpu", "cpu", {}, [
        Record("add", "flat", "fp32", ((1024, s),) * 2, s * 1024.0, 12.0 * 1024 * s, t)
        for s, t in ((64, 1e-5), (256, 1e-3))])
    estimate = cliff.estimate("add", "fp32", shapes=[(1024, 128)] * 2)
    assert estimate == pytest.approx(math.sqrt(1e-5 * 1e-3))


def test_extrapolation(db: OpDatabase) -> None:
    top = db.records[2]
    above = db.estimate("linear", "fp32", shapes=[(2048, 2048), (2048, 2048)])
    assert above == pytest.approx(top.time_s * 8)  # time ∝ work beyond the grid
    below = db.estimate("linear", "fp32", shapes=[(32, 32), (32, 32)])
    assert 0 < below < db.records[0].time_s


def test_nearest_family_by_aspect(db: OpDatabase) -> None:
    shapes = [(8 * 64, 64), (4 * 64, 64)]  # mlp-up aspect, between its two records
    estimate = db.estimate("linear", "fp32", shapes=shapes)
    assert estimate == pytest.approx(2 * fixed_plus_rate(OPS["linear"].flops(shapes)), rel=1e-9)
    # leading batch dims fold into M
    assert db.estimate("linear", "fp32", shapes=[(2, 4 * 64, 64), (4 * 64, 64)]) == pytest.approx(estimate)


def test_work_only_uses_the_first_family(db: OpDatabase) -> None:
    flops = 2.0 * 128**3
    assert db.estimate("linear", "fp32", flops=flops) == pytest.approx(fixed_plus_rate(flops))
    assert db.estimate("linear", "fp32") is None


def test_unknown_op_or_dtype(db: OpDatabase) -> None:
    assert db.estimate("softmax", "fp32", shapes=[(4, 4)]) is None
    assert db.estimate("linear", "bf16", shapes=[(4, 4), (4, 4)]) is None


def test_round_trip_and_version(db: OpDatabase, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = db.save(tmp_path / "db.json")
    raw = json.loads(path.read_text())
    assert raw["format"] == "fxplan-op-database" and raw["format_version"] == 1
    assert raw["records"][0]["shapes"] == [[64, 64], [64, 64]]
    assert OpDatabase.load(path) == db
    raw["format_version"] = 99
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="version"):
        OpDatabase.load(path)


def test_device_model_matching(db: OpDatabase, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    assert db.matches("A100-SXM4-80GB")
    assert not db.matches("H100-SXM5-80GB")
    db.save(tmp_path / "a100.json")
    (tmp_path / "junk.json").write_text("{}")
    monkeypatch.setenv("FXPLAN_OP_DB_PATH", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty-cache"))
    found = find_database("A100-SXM4-80GB")
    assert found is not None and found.records == db.records
    assert find_database("V100-SXM2-32GB") is None


def test_op_formulas() -> None:
    assert OPS["linear"].flops(((2, 3, 5), (7, 5))) == 2 * 6 * 5 * 7
    assert OPS["bmm"].flops(((4, 2, 3), (4, 3, 5))) == 2 * 4 * 2 * 3 * 5
    assert OPS["conv2d"].flops(((1, 3, 8, 8), (16, 3, 3, 3))) == 2 * 64 * 16 * 27
    assert OPS["sdpa"].flops(((1, 2, 8, 4),) * 3) == 4 * 2 * 64 * 4
    assert OPS["add"].bytes(((10, 10), (10, 10)), 2) == 600
    assert OPS["embedding"].features(((4, 8), (100, 16))) == (32, 16)


def test_frozen_databases_read_the_search_path_once(db: OpDatabase, tmp_path,
                                                    monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Inside :func:`frozen_databases` a database written after entry is not seen (the
    search path is listed once per search); after the block it is."""
    from fxplan.cost_model.compute.op_database import database_files, frozen_databases

    monkeypatch.setenv("FXPLAN_OP_DB_PATH", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty-cache"))
    with frozen_databases():
        assert find_database("A100-SXM4-80GB") is None
        db.save(tmp_path / "a100.json")
        with frozen_databases():          # nested: the outer snapshot still holds
            assert find_database("A100-SXM4-80GB") is None
        assert database_files() == ()
    assert [p for p, _ in database_files()] == [str(tmp_path / "a100.json")]
    assert find_database("A100-SXM4-80GB") is not None
