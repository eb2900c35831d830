"""``fxplan models``: every preset, family and form listed, with human-readable sizes."""

from __future__ import annotations

import json

from fxplan.cli.main import main
from fxplan.examples.families import FAMILIES
from fxplan.examples.hf_presets import HF_PRESETS
from fxplan.examples.presets import PRESETS


def test_table_lists_every_preset_family_and_form(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for name in [*PRESETS, *FAMILIES, *(f"hf:{n}" for n in HF_PRESETS)]:
        assert name in out, name
    assert "path/to/model.py:build" in out and "hf:path/to/config.json" in out
    # sizes in people's units, three significant digits
    assert "175 B" in out and "1.01 T" in out and "124 M" in out and "6.74 B" in out
    assert "137 K" in out  # gpt-tiny


def test_json(capsys):
    assert main(["models", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    presets = {row["name"]: row for row in listing["presets"]}
    assert list(presets) == list(PRESETS)
    assert presets["gpt3-175b"]["params"] == 174_615_846_912
    assert presets["llama-tiny"]["family"] == "llama"
    hf = {row["name"]: row for row in listing["hf_presets"]}
    assert hf["hf:gpt2-small"]["params"] == 124_439_808
    families = {row["name"]: row for row in listing["families"]}
    assert families["gpt"]["keys"]["layers"] == 12 and families["gpt"]["keys"]["attention"] == "math"
    assert set(families["convnet"]["keys"]) >= {"width", "stages", "image_size"}
    assert listing["user_file"]["spec"] == "path/to/model.py:build"
