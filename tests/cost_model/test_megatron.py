"""Validation: the cost model predicts every row of Megatron-LM SC'21 Table 1 within ±10 %.

Each published configuration (t, p, d = n/(t·p), global batch, s = 2048, V = 51200, DGX A100
80GB, full recompute, interleaved schedule) is estimated with the rule of
``benchmarks/megatron_table.py`` (v: the largest ≤ 4 dividing l/p; microbatch: the fastest of
1–16 that fits) and compared with the step time implied by the measured TFLOP/s per GPU,
``F/(n·X)``. Nothing is tuned per row.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "megatron_table.py"
_spec = importlib.util.spec_from_file_location("megatron_table", SCRIPT)
megatron_table = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
sys.modules.setdefault("megatron_table", megatron_table)
_spec.loader.exec_module(megatron_table)  # type: ignore[union-attr]

ROWS = megatron_table.load_rows()
TOLERANCE = 0.10


@pytest.mark.parametrize("row", ROWS, ids=[r.preset for r in ROWS])
def test_published_step_time_within_ten_percent(row) -> None:  # type: ignore[no-untyped-def]
    prediction = megatron_table.predict(row, megatron_table.capture_row(row))
    assert prediction.estimate.fits
    assert abs(prediction.error) <= TOLERANCE, (
        f"{row.preset}: predicted {prediction.estimate.step_time_s:.2f} s vs published "
        f"{row.implied_step_time_s:.2f} s ({prediction.error * 100:+.1f} %)")


def test_implied_step_time_formula() -> None:
    row = megatron_table.Row(1.7, 24, 2304, 24, 1, 1, 32, 512, 137)
    f = 96 * 512 * 2048 * 24 * 2304**2 * (1 + 2048 / (6 * 2304) + 51200 / (16 * 24 * 2304))
    assert row.implied_step_time_s == pytest.approx(f / (32 * 137e12))
    assert megatron_table.chunk_choices(row, 16) == (1,)
    big = megatron_table.Row(529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163)
    assert megatron_table.chunk_choices(big, 280) == (1, 3)      # v ≤ 4 dividing l/p = 3
    assert megatron_table.chunk_choices(big, 281) == (1,)        # 281 microbatches: not a multiple of p


def test_script_writes_the_docs_only_when_asked(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    rows = megatron_table.load_rows()[:1]
    written: list[str] = []
    monkeypatch.setattr(megatron_table, "load_rows", lambda: rows)
    monkeypatch.setattr(megatron_table, "write_section", written.append)
    monkeypatch.setattr(sys, "argv", ["megatron_table.py"])
    assert megatron_table.main() == 0 and written == []
    monkeypatch.setattr(sys, "argv", ["megatron_table.py", "--write"])
    assert megatron_table.main() == 0 and len(written) == 1
    assert "(`--write` updates this section)" in written[0]
