"""What one repeated block holds for its backward at module level, measured by
``benchmarks/activation_bytes.py`` (live op-output storages after a forward), against the cost
model's saved bytes: full recompute holds exactly its priced input; selective recompute holds
no more than no recompute; without dropout every policy holds what is priced, the attention's
output kept where the out-projection keeps it too; a written-out attention is not recomputed
selectively at module level. With dropout the CPU runs its own kernels (the attention's
composite, masks in the input's dtype) where capture prices the GPU's."""

from __future__ import annotations

import os
import sys

import pytest

BENCHMARKS = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")
if BENCHMARKS not in sys.path:
    sys.path.append(BENCHMARKS)

from activation_bytes import measure  # noqa: E402

LLAMA = "llama-tiny:layers=2"
GPT_SDPA = "gpt-tiny:layers=2,attention=sdpa"
GPT_MATH = "gpt-tiny:layers=2,attention=math"
GPT_SDPA_NO_DROPOUT = "gpt-tiny:layers=2,attention=sdpa,dropout=0"
GPT_MATH_NO_DROPOUT = "gpt-tiny:layers=2,attention=math,dropout=0"
MODELS = [LLAMA, GPT_SDPA, GPT_MATH, GPT_SDPA_NO_DROPOUT, GPT_MATH_NO_DROPOUT]


@pytest.fixture(scope="module")
def rows() -> dict[str, dict[str, dict[str, float]]]:
    return {model: measure(model, 4, 64 if model == LLAMA else 16) for model in MODELS}


@pytest.mark.parametrize("model", MODELS)
def test_full_recompute_holds_its_priced_input(rows, model) -> None:  # type: ignore[no-untyped-def]
    full = rows[model]["full"]
    assert full["held"] == full["priced"], full


@pytest.mark.parametrize("model", [LLAMA, GPT_SDPA_NO_DROPOUT, GPT_MATH_NO_DROPOUT])
def test_without_dropout_a_block_holds_what_is_priced(rows, model) -> None:  # type: ignore[no-untyped-def]
    """Every byte the price counts, and none more, is held by the block (the position tables
    handed to the Llama's blocks need no gradient, as in the model), under every policy the
    module level runs. With dropout the CPU keeps each mask in the input's dtype where the
    GPU's fused kernel, which capture prices, keeps one byte."""
    for policy, got in rows[model].items():
        assert got["held"] == got["priced"], (policy, rows[model])


@pytest.mark.parametrize("model", [LLAMA, GPT_SDPA, GPT_SDPA_NO_DROPOUT])
def test_selective_holds_no_more_than_none(rows, model) -> None:  # type: ignore[no-untyped-def]
    """Each fused attention call checkpointed alone holds no cache (torch's selective
    checkpoint over a whole block cached every other op's output: on the tiny Llama's block
    half as much again as no recompute, 2036 against 1350 KiB by this count, 2026-11-29)."""
    assert rows[model]["selective"]["held"] <= rows[model]["none"]["held"], rows[model]


@pytest.mark.parametrize("model", [GPT_MATH, GPT_MATH_NO_DROPOUT])
def test_a_written_out_attention_is_not_recomputed_selectively_at_module_level(rows, model) -> None:  # type: ignore[no-untyped-def]
    assert set(rows[model]) == {"none", "full"}, rows[model]


def test_selective_frees_the_priced_bytes_where_the_output_is_shared(rows) -> None:  # type: ignore[no-untyped-def]
    """The Llama's attention output is a view its out-projection saves too: checkpointing the
    attention frees only its statistics (4 KiB on this block), and the model credits only
    those (``NodeInfo.saved_shared``)."""
    got = rows[LLAMA]
    assert got["none"]["held"] - got["selective"]["held"] == \
        got["none"]["priced"] - got["selective"]["priced"], got
