"""``fxplan graph``: JSON and table output, one-paragraph errors with exit code 2."""

from __future__ import annotations

import json

import pytest

from fxplan.cli.main import main


def test_graph_json(capsys):
    assert main(["graph", "gpt-tiny", "--batch", "2", "--seq", "32", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "gpt-tiny" and out["dtype"] == "bfloat16"
    assert out["inputs"]["tokens"] == {"shape": [2, 32], "dtype": "int64"}
    assert out["num_params"] == 136960
    assert out["tied_params"] == {"lm_head.weight": "wte.weight"}
    assert out["training_flops"]["recompute"] > out["training_flops"]["no_recompute"] > 0
    assert [b["layers"] for b in out["blocks"]] == [[0, 1]]
    assert [r["name"] for r in out["per_layer"]] == ["(before layers)", "h.0", "h.1",
                                                     "(after layers)"]
    assert out["saved_activation_bytes"]["total"] > 0
    assert len(out["fingerprint"]) == 64 and out["leaf_modules"] == {}
    rules = out["sharding_rules"]  # symbolic_trace of an example model: decorator rules only
    assert rules["rule"] and rules["dtensor"] == {} and rules["fallback"] == {}


def test_graph_names_the_ops_that_take_dtensor_strategies(capsys):
    pytest.importorskip("transformers")
    spec = ("hf:llama:num_hidden_layers=2,hidden_size=64,intermediate_size=128,num_attention_heads=4,"
            "num_key_value_heads=4,vocab_size=128")
    assert main(["graph", spec, "--batch", "2", "--seq", "16", "--json"]) == 0
    rules = json.loads(capsys.readouterr().out)["sharding_rules"]
    assert {"aten.eq.Tensor", "aten.cumsum.default", "aten.index.Tensor"} <= set(rules["dtensor"])
    assert set(rules["fallback"]) <= {"aten.arange.default", "wrap_with_set_grad_enabled"}


def test_graph_table(capsys):
    assert main(["graph", "llama-tiny", "--dtype", "fp32"]) == 0
    out = capsys.readouterr().out
    for text in ("parameters", "FLOPs per step", "activations", "repeated blocks",
                 "leaf modules    none", "layers.0 … layers.1"):
        assert text in out


def test_graph_errors_are_one_paragraph(capsys):
    assert main(["graph", "gpt-tiny:depth=2"]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'depth' for gpt; allowed keys: layers" in err
    assert "Traceback" not in err
    assert main(["graph", "gpt-tiny", "--leaf", "NoSuchBlock"]) == 2
    assert "matched no module" in capsys.readouterr().err
