"""``fxplan graph`` / ``fxplan plan`` on real-model specs: ``hf:`` configs, an
``nn.TransformerEncoder`` and a torchtitan-style Llama from user files; ``--leaf``,
``--constrain`` and the model reference a plan stores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fxplan import load_plan
from fxplan.cli.constraint_text import parse_constraints
from fxplan.cli.main import main
from fxplan.inter_op import ConstraintError

MODELS = Path(__file__).parents[1] / "passes" / "models"
LLAMA = ("hf:llama:num_hidden_layers=2,hidden_size=64,intermediate_size=128,"
         "num_attention_heads=4,num_key_value_heads=2,vocab_size=256")
CLUSTER = ["--cluster", "local-cpu:devices=4", "--batch", "8"]


def test_constraint_text():
    assert parse_constraints("tp=8, pp=2|4 ,zero=1,sp=true,mb=2,schedule=interleaved:2") == {
        "tp": 8, "pp": [2, 4], "zero_stage": 1, "sequence_parallel": True,
        "microbatch_size": 2, "schedule": "interleaved:2"}
    assert parse_constraints(None) == {} == parse_constraints("")
    for text, message in (("tq=2", "unknown key 'tq'; keys: tp, pp"), ("tp", "not key=value"),
                          ("tp=two", "tp takes integers"), ("sp=maybe", "true or false"),
                          ("tp=2,tp=4", "gives tp twice")):
        with pytest.raises(ConstraintError, match=message):
            parse_constraints(text)


def test_graph_and_plan_an_hf_model(capsys, tmp_path):
    pytest.importorskip("transformers")
    assert main(["graph", LLAMA, "--seq", "16", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["method"] == "export" and summary["blocks"][0]["layers"] == [0, 1]
    out = tmp_path / "plan.json"
    assert main(["plan", LLAMA, "--seq", "16", *CLUSTER, "--constrain", "tp=2,zero=1",
                 "--json", "-o", str(out)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["degrees"]["tp"] == 2 and data["zero_stage"] == 1
    in_layers = [f for f in data["fallbacks"] if "linear" in f or "scaled_dot" in f]
    assert not in_layers  # ATen ops of the layers have sharding rules
    plan = load_plan(out)
    assert plan.model == LLAMA and len(plan.graph_fingerprint) == 64


@pytest.mark.parametrize("name", ["encoder_stack.py", "torchtitan_llama.py"])
def test_user_file_models_plan_with_an_absolute_reference(name, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(MODELS)
    assert main(["graph", f"{name}:build", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["method"] == "export" and summary["blocks"][0]["layers"] == [0, 1]
    out = tmp_path / "plan.json"
    assert main(["plan", f"{name}:build", *CLUSTER, "--json", "-o", str(out)]) == 0
    capsys.readouterr()
    assert load_plan(out).model == f"{MODELS / name}:build"


def test_plan_accepts_leaf(capsys, tmp_path):
    assert main(["plan", "gpt-tiny", *CLUSTER, "--leaf", "CausalSelfAttention", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fits"]
    assert main(["plan", "gpt-tiny", *CLUSTER, "--leaf", "NoSuchModule"]) == 2
    assert "matched no module" in capsys.readouterr().err
