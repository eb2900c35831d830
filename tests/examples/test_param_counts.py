"""Parameter counts from configs against built models and published sizes."""

from __future__ import annotations

import pytest
import torch

from fxplan.examples.families import FAMILIES
from fxplan.examples.hf_presets import HF_PRESETS
from fxplan.examples.param_counts import family_params, hf_params
from fxplan.examples.presets import PRESETS


def _built(family: str, values: dict) -> tuple[int, int]:
    config = FAMILIES[family].config_cls(**values)
    with torch.device("meta"):
        model = FAMILIES[family].model_cls(config)
    return family_params(family, config), sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny", "mlp-small", "convnet-small"])
def test_presets_match_the_built_model(name):
    formula, built = _built(PRESETS[name].family, PRESETS[name].values)
    assert formula == built


@pytest.mark.parametrize("family, values", [
    ("gpt", dict(layers=3, hidden=96, heads=4, vocab=300, seq=40)),
    ("llama", dict(layers=2, hidden=96, heads=6, kv_heads=3, vocab=300, seq=32, ffn_hidden=200)),
    ("llama", dict(layers=1, hidden=64, heads=4, vocab=128, seq=16, tie_embeddings=True)),
    ("mlp", dict(in_features=20, hidden=48, layers=2, expansion=3, classes=7)),
    ("convnet", dict(in_channels=1, width=8, stages=2, blocks_per_stage=3, image_size=8)),
])
def test_families_match_the_built_model(family, values):
    formula, built = _built(family, values)
    assert formula == built


def test_megatron_presets_are_their_names_size():
    for name, preset in PRESETS.items():
        if not name.startswith("gpt-") or name == "gpt-tiny":
            continue
        config = FAMILIES["gpt"].config_cls(**preset.values)
        billions = 1000.0 if name == "gpt-1t" else float(name.removeprefix("gpt-").removesuffix("b"))
        assert family_params("gpt", config) == pytest.approx(billions * 1e9, rel=0.03), name


@pytest.mark.parametrize("name, published", [
    ("llama-2-7b", 6_738_415_616), ("llama-2-13b", 13_015_864_320),
    ("llama-2-70b", 68_976_648_192), ("llama-3-8b", 8_030_261_248),
    ("gpt2-small", 124_439_808), ("gpt2-xl", 1_557_611_200),
    ("bert-base", 109_514_298),  # BertForMaskedLM
])
def test_hf_presets_match_transformers(name, published):
    assert hf_params(HF_PRESETS[name]) == published


def test_unknown_family_or_model_type_is_none():
    assert family_params("nope", object()) is None
    from fxplan.examples.hf_presets import HFPreset
    assert hf_params(HFPreset("mistral", {})) is None
