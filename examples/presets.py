"""Named model configurations.

The ``gpt-*`` presets are the rows of Table 1 of Narayanan et al., "Efficient Large-Scale
Language Model Training on GPU Clusters Using Megatron-LM" (SC'21), with the paper's
vocabulary 51,200 and sequence length 2,048; ``gpt3-175b`` is GPT-3 (Brown et al., 2020).
They are written out here (not read from the CSV); ``tests/examples/test_presets.py`` checks
them against ``benchmarks/data/megatron_sc21_table1.csv``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Preset:
    """A family name and the config values that differ from the family's defaults."""

    family: str
    values: dict[str, Any] = field(default_factory=dict)
    description: str = ""


def _megatron_gpt(layers: int, hidden: int, heads: int, source: str) -> Preset:
    return Preset("gpt", dict(layers=layers, hidden=hidden, heads=heads, vocab=51200, seq=2048),
                  source)


_TABLE1 = "Megatron-LM SC'21 Table 1"

#: ``name → Preset``; the order is the order ``fxplan`` lists them.
PRESETS: dict[str, Preset] = {
    "gpt-1.7b": _megatron_gpt(24, 2304, 24, _TABLE1),
    "gpt-3.6b": _megatron_gpt(30, 3072, 32, _TABLE1),
    "gpt-7.5b": _megatron_gpt(36, 4096, 32, _TABLE1),
    "gpt-18.4b": _megatron_gpt(40, 6144, 48, _TABLE1),
    "gpt-39.1b": _megatron_gpt(48, 8192, 64, _TABLE1),
    "gpt-76.1b": _megatron_gpt(60, 10240, 80, _TABLE1),
    "gpt-145.6b": _megatron_gpt(80, 12288, 96, _TABLE1),
    "gpt-310.1b": _megatron_gpt(96, 16384, 128, _TABLE1),
    "gpt-529.6b": _megatron_gpt(105, 20480, 128, _TABLE1),
    "gpt-1t": _megatron_gpt(128, 25600, 160, _TABLE1),
    "gpt3-175b": _megatron_gpt(96, 12288, 96, "GPT-3 175B (Brown et al., 2020)"),
    "gpt-tiny": Preset("gpt", dict(layers=2, hidden=64, heads=4, vocab=512, seq=64),
                       "tiny GPT for tests"),
    # Alpa (Zheng et al., OSDI'22) Table 4's GShard MoE 27B, as its benchmark builds it
    # (alpa-projects/alpa benchmark/alpa/paper_manual_moe_suite.py moe_specs["27B"]: S=1024,
    # H=2048, L=16, 16 heads, V=32000, E=48; MoE every other layer, top-2, C = 2·S/E, FFN 8H)
    "moe-27b": Preset("moe", dict(layers=16, hidden=2048, heads=16, vocab=32000, seq=1024,
                                  experts=48, top_k=2, capacity_factor=1.0, moe_every=2,
                                  ffn_mult=8), "GShard-style MoE 27B of Alpa's evaluation"),
    "moe-tiny": Preset("moe", dict(layers=2, hidden=64, heads=4, vocab=512, seq=64, experts=4,
                                   top_k=2), "tiny mixture-of-experts GPT for tests"),
    "llama-7b": Preset("llama", {}, "Llama-2 7B"),
    "llama-tiny": Preset("llama", dict(layers=2, hidden=64, heads=4, kv_heads=2, vocab=512,
                                       seq=64, multiple_of=32),
                         "tiny Llama with grouped-query attention, for tests"),
    "mlp-small": Preset("mlp", dict(in_features=256, hidden=256, layers=3, classes=10),
                        "small residual MLP"),
    "convnet-small": Preset("convnet", dict(width=16, stages=3, blocks_per_stage=2,
                                            image_size=32, classes=10),
                            "small ResNet-style conv net on 32×32 images"),
}
