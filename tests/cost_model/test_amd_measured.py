"""The MI300X and MI325X specs against AMD's measured Llama 3.1 8B FSDP runs
(``benchmarks/new_devices_table.py --rows amd-measured``, :mod:`benchmarks.amd_measured`).

The CSV must agree with itself (microbatch × accumulation × GPUs is the global batch, the
degrees multiply to the GPUs), the benchmark's FLOP count must give the hand-computed value,
each row must be priced with its published configuration (ZeRO-3 over 8 GPUs, 8 microbatches,
no recompute, FP8 only on the FP8 rows), and the table in ``docs/benchmarks.md`` must be the
script's output: the published columns exactly, the predicted throughput within 2 % (the cost
model may move a little between regenerations of the docs, not more).
"""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
DOC = BENCHMARKS.parent / "docs" / "benchmarks.md"


def _load(name: str):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return sys.modules[name]


new_devices_table = _load("new_devices_table")
amd_measured = _load("amd_measured")
ROWS = amd_measured.load_rows()


def test_rows_transcribed() -> None:
    with amd_measured.TABLE.open() as handle:
        raw = list(csv.DictReader(handle))
    assert len(raw) == len(ROWS) == 8
    assert {r["cluster"] for r in raw} == {"mi300x", "mi325x"}
    assert {r["precision"] for r in raw} == {"BF16", "FP8"}
    for r in raw:
        gpus = int(r["gpus"])
        assert int(r["micro_batch"]) * int(r["grad_accum"]) * gpus == int(r["global_batch"]), r
        assert int(r["tp"]) * int(r["pp"]) * int(r["dp"]) * int(r["cp"]) == gpus == 8, r
        assert (r["fsdp"], r["recompute"], r["grad_accum"]) == ("1", "0", "8"), r


def test_flops_per_token_by_hand() -> None:
    """``llama.py``'s count at Llama 3 8B, s = 8192: per layer 6·h·f = 352,321,536,
    2·h·(a+2g)·d = 50,331,648, 2·h² = 33,554,432; ×32 layers, + 2·h·V = 1,050,673,152;
    ×3; + 12·l·s·a·d = 12,884,901,888."""
    assert amd_measured.flops_per_token("llama3-8b", 8192) == 57_912_852_480
    row = next(r for r in ROWS if r.system == "MI300X" and not r.fp8 and r.seq == 8192)
    assert row.tokens_per_s_per_gpu == pytest.approx(542.94e12 / 57_912_852_480)


@pytest.fixture(scope="module")
def priced():  # type: ignore[no-untyped-def]
    from fxplan.api import capture_for_search

    graphs = {row.spec: None for row in ROWS}   # one capture per shape and sequence length
    for spec in graphs:
        graphs[spec] = capture_for_search(spec, dtype="bfloat16")
    return [new_devices_table.predict(row, graphs[row.spec]) for row in ROWS]


def test_each_row_priced_as_published(priced) -> None:  # type: ignore[no-untyped-def]
    for row, (result, policy, _fits) in zip(ROWS, priced):
        config = result.config
        assert (config.dp, config.tp, config.pp, config.zero_stage) == (8, 1, 1, 3)
        assert config.microbatch_size == row.microbatch
        assert result.batch == row.batch and result.seq == row.seq
        assert row.batch // (config.dp * config.microbatch_size) == 8
        assert config.fp8 is row.fp8 and policy == config.recompute == "none"


def _doc_rows() -> list[list[str]]:
    text = DOC.read_text(encoding="utf-8")
    section = text.split(amd_measured.START)[1].split(amd_measured.END)[0]
    lines = [line for line in section.strip().splitlines() if line.startswith("| MI3")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def test_docs_table_is_the_scripts_output(priced) -> None:  # type: ignore[no-untyped-def]
    doc = _doc_rows()
    assert len(doc) == len(ROWS)
    for row, (result, policy, fits), cells in zip(ROWS, priced, doc):
        tokens = result.tokens_per_s / row.gpus
        published_tf = row.tokens_per_s_per_gpu * amd_measured.flops_per_token(
            row.model, row.seq) / 1e12
        assert cells[:6] == [row.system, "FP8" if row.fp8 else "BF16", str(row.seq),
                             f"{row.microbatch} × 8", f"{published_tf:.2f}",
                             f"{row.tokens_per_s_per_gpu:,.0f}"], cells
        assert float(cells[6].replace(",", "")) == pytest.approx(tokens, rel=0.02), cells
        assert float(cells[7]) == pytest.approx(tokens / row.tokens_per_s_per_gpu, abs=0.02)
        assert cells[8] == policy
