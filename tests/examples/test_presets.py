"""Presets: the Megatron-LM SC'21 Table 1 rows (checked against the reference CSV), GPT-3."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from fxplan.examples.model_spec import resolve_model
from fxplan.examples.presets import PRESETS

REPO = Path(__file__).resolve().parents[2]
TABLE1 = REPO / "benchmarks" / "data" / "megatron_sc21_table1.csv"


def _preset_name(params_billion: float) -> str:
    return "gpt-1t" if params_billion >= 1000 else f"gpt-{params_billion:g}b"


def _megatron_params(layers: int, hidden: int, vocab: int, seq: int) -> float:
    """P = 12·l·h²·(1 + 13/(12h) + (V+s)/(12·l·h))."""
    l, h = layers, hidden
    return 12 * l * h**2 * (1 + 13 / (12 * h) + (vocab + seq) / (12 * l * h))


def test_presets_match_megatron_table1_csv():
    rows = list(csv.DictReader(TABLE1.open()))
    assert len(rows) == 10
    for row in rows:
        name = _preset_name(float(row["params_billion"]))
        config = resolve_model(name).config
        assert (config.layers, config.hidden, config.heads) == (
            int(row["layers"]), int(row["hidden"]), int(row["heads"])), name
        assert (config.vocab, config.seq) == (51200, 2048)
        # The table's sizes are rounded; the smallest (1.65 B → "1.7") is 2.8 % off.
        size = _megatron_params(config.layers, config.hidden, config.vocab, config.seq) / 1e9
        assert size == pytest.approx(float(row["params_billion"]), rel=0.03), name


def test_all_required_presets_exist():
    required = ["gpt-1.7b", "gpt-3.6b", "gpt-7.5b", "gpt-18.4b", "gpt-39.1b", "gpt-76.1b",
                "gpt-145.6b", "gpt-310.1b", "gpt-529.6b", "gpt-1t", "gpt3-175b", "gpt-tiny",
                "llama-tiny", "llama-7b", "mlp-small", "convnet-small"]
    assert [n for n in required if n not in PRESETS] == []
    gpt3 = resolve_model("gpt3-175b").config
    assert (gpt3.layers, gpt3.hidden, gpt3.heads) == (96, 12288, 96)
    for name in PRESETS:
        assert resolve_model(name).family == PRESETS[name].family
