"""``fxplan diff A B``: identical plans say so; differing ones list degrees, schedule,
stages, placements by pattern and the prediction with ``b − a``."""

from __future__ import annotations

import json
import re

import pytest

import fxplan
from fxplan.cli.main import main
from fxplan.report.diff import layer_pattern


@pytest.fixture(scope="module")
def plans(tmp_path_factory):  # type: ignore[no-untyped-def]
    folder = tmp_path_factory.mktemp("diff")
    a = fxplan.search("gpt-1.7b", "dgx-a100-40g", batch=64, progress=False)
    b = fxplan.search("gpt-1.7b", "dgx-a100-40g", batch=64, progress=False,
                      constraints={"pp": 2, "tp": 2})
    a.save(folder / "a.json")
    b.save(folder / "b.json")
    return a, b, folder / "a.json", folder / "b.json"


def _diff(capsys, *argv: str) -> dict:  # type: ignore[no-untyped-def]
    assert main(["diff", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_identical_plans_say_so(capsys, plans) -> None:  # type: ignore[no-untyped-def]
    _, _, path_a, _ = plans
    assert _diff(capsys, str(path_a), str(path_a))["identical"] is True
    assert main(["diff", str(path_a), str(path_a)]) == 0
    assert "identical plans" in capsys.readouterr().out


def test_differences_are_listed_field_by_field(capsys, plans) -> None:  # type: ignore[no-untyped-def]
    a, b, path_a, path_b = plans
    data = _diff(capsys, str(path_a), str(path_b))
    assert not data["identical"]
    fields = {f["field"]: (f["a"], f["b"]) for f in data["fields"]}
    assert fields["pp"] == (a.pp, 2) and fields["tp"] == (a.tp, 2)
    assert "model" not in fields and "batch" not in fields
    assert data["stages"]["a"] == [list(s.layers) for s in a.stages]
    assert data["stages"]["b"] == [list(s.layers) for s in b.stages]
    step = next(p for p in data["predicted"] if p["key"] == "step_time_s")
    assert step["delta"] == pytest.approx(b.estimate["step_time_s"] - a.estimate["step_time_s"])


def test_placements_are_summarised_by_layer_pattern(capsys, plans) -> None:  # type: ignore[no-untyped-def]
    _, _, path_a, path_b = plans
    data = _diff(capsys, str(path_a), str(path_b))
    rows = data["placements"]["by_pattern"]
    differing = sum(v["count"] for v in data["placements"]["differing"].values())
    assert rows and sum(r["count"] for r in rows) == differing
    assert len(rows) < differing           # the 24 layers fold into one row per pattern
    assert all(not re.search(r"[._]\d+([._]|$)", r["pattern"]) for r in rows)


def test_layer_pattern_folds_layer_numbers_only() -> None:
    assert layer_pattern("layers.12.attention.wq.weight") == "layers.*.attention.wq.weight"
    assert layer_pattern("h_3_attn_qkv") == "h_*_attn_qkv"
    assert layer_pattern("fc1") == "fc1"


def test_text_output_is_formatted(capsys, plans) -> None:  # type: ignore[no-untyped-def]
    _, _, path_a, path_b = plans
    assert main(["diff", str(path_a), str(path_b)]) == 0
    out = capsys.readouterr().out
    assert "prediction" in out and "step time" in out and "GiB" in out
    assert not re.search(r"\d\.\d+e[-+]\d", out), out
