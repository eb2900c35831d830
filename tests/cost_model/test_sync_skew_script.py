"""``benchmarks/sync_skew.py``: the expected maximum of normals it compares against, and a
short real run on 2 gloo ranks (the structure of its rows, not their timings)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def sync_skew():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(BENCHMARKS))     # the script imports local_cpu_lines
    try:
        spec = importlib.util.spec_from_file_location("sync_skew", BENCHMARKS / "sync_skew.py")
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules["sync_skew"] = module      # spawned ranks unpickle its worker by name
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        yield module
    finally:
        sys.modules.pop("sync_skew", None)
        sys.path.remove(str(BENCHMARKS))


def test_expected_max_of_normals(sync_skew) -> None:  # type: ignore[no-untyped-def]
    e = sync_skew.expected_max_normal
    assert e(1) == 0.0
    assert e(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-6)
    # E[max of 3] = 3/(2√π); of 4 = 1.029375 (tables of normal order statistics)
    assert e(3) == pytest.approx(3 / (2 * math.sqrt(math.pi)), abs=1e-6)
    assert e(4) == pytest.approx(1.029375, abs=1e-5)
    assert e(8) > e(4) > e(2)


@pytest.mark.multirank
def test_two_ranks_measure_every_gap(sync_skew) -> None:  # type: ignore[no-untyped-def]
    result = sync_skew.sync_skew(2, [0.05, 0.5], iterations=4, rounds=1)
    assert result["ranks"] == 2 and result["e_n"] == pytest.approx(0.5642, abs=1e-4)
    assert [r["gap_ms"] for r in result["rows"]] == [0.05, 0.5]
    for row in result["rows"]:
        assert row["work_ms"] > 0 and row["sync_ms"] > 0 and row["block_cv"] >= 0
        assert row["skew_us"] == pytest.approx(
            result["e_n"] * row["block_cv"] * row["work_ms"] * 1e3)
