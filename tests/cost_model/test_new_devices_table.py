"""The B200 and GB200 specs against Megatron-Bridge's published Llama 3 8B FP8 rows, and the
MI300X and MI325X specs against AMD's expected Llama 3.1 70B FP8 rows (``--rows amd``).

``benchmarks/new_devices_table.py`` prices each published configuration with one rule (FP8 on,
the published degrees, microbatch and batch; the fastest recompute that fits); nothing is
tuned per row. ``docs/benchmarks.md`` reports predicted / published = 0.81 (DGX-B200) and 0.82
(DGX-GB200) for these rows; this keeps them there (±0.05), and both fit without recompute.
For the 70B rows of AMD's validation suite (tp 8 over one node, the published recompute,
none) it reports 0.89 (MI300X) and 0.88 (MI325X), kept the same way.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "new_devices_table.py"
_spec = importlib.util.spec_from_file_location("new_devices_table", SCRIPT)
new_devices_table = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
sys.modules.setdefault("new_devices_table", new_devices_table)
_spec.loader.exec_module(new_devices_table)  # type: ignore[union-attr]

DOCUMENTED = {"DGX-B200": 0.81, "DGX-GB200": 0.82}
AMD_DOCUMENTED = {"MI300X": 0.89, "MI325X": 0.88}
ROWS = [(r, DOCUMENTED[r.system]) for r in new_devices_table.load_rows()
        if r.system in DOCUMENTED and r.model == "llama3-8b"] + [
    (r, AMD_DOCUMENTED[r.system]) for r in new_devices_table.load_rows(new_devices_table.AMD_TABLE)
    if r.model == "llama3-70b"]


@pytest.mark.parametrize("row,documented", ROWS, ids=lambda x: getattr(x, "system", ""))
def test_documented_rows(row, documented) -> None:  # type: ignore[no-untyped-def]
    from fxplan.api import capture_for_search

    result, policy, fits = new_devices_table.predict(
        row, capture_for_search(row.spec, dtype="bfloat16"))
    ratio = result.tokens_per_s / row.gpus / row.tokens_per_s_per_gpu
    assert fits and policy == "none"
    assert ratio == pytest.approx(documented, abs=0.05), ratio


def test_rows_transcribed():
    rows = new_devices_table.load_rows()
    assert len(rows) == 5 and {r.cluster.split(":")[0] for r in rows} == {
        "dgx-h100", "dgx-b200", "gb200-nvl72"}
    for row in rows:
        assert row.gpus == row.tp * row.pp * row.dp


def test_amd_rows_transcribed():
    rows = new_devices_table.load_rows(new_devices_table.AMD_TABLE)
    assert len(rows) == 4 and {r.cluster for r in rows} == {"mi300x", "mi325x"}
    for row in rows:
        assert row.gpus == row.tp * row.pp * row.dp == 8 and row.recompute == "none"
