"""The model spec string: presets, family and preset overrides, user files, errors."""

from __future__ import annotations

import textwrap

import pytest
import torch

from fxplan.examples.model_spec import InputSpec, ModelSpecError, resolve_model


def test_preset_family_and_overrides():
    bundle = resolve_model("gpt:layers=48,hidden=6144,heads=64,vocab=51200,seq=2048")
    assert bundle.family == "gpt"
    assert (bundle.config.layers, bundle.config.hidden, bundle.config.heads) == (48, 6144, 64)
    small = resolve_model("gpt-1.7b:layers=2,attention=sdpa,dropout=0")
    assert (small.config.layers, small.config.hidden, small.config.attention) == (2, 2304, "sdpa")
    assert small.config.dropout == 0.0
    llama = resolve_model("llama-tiny:kv_heads=none,tie_embeddings=true")
    assert llama.config.kv_heads == llama.config.heads and llama.config.tie_embeddings


def test_bundle_builds_on_meta_and_describes_inputs():
    bundle = resolve_model("gpt-1t")
    model = bundle.build()  # meta by default: a trillion parameters cost nothing
    assert next(model.parameters()).device.type == "meta"
    inputs = bundle.example_inputs(4, seq=1024)
    assert inputs == {"tokens": InputSpec((4, 1024), torch.int64),
                      "targets": InputSpec((4, 1024), torch.int64)}
    assert list(bundle.example_inputs(2, with_targets=False)) == ["tokens"]


@pytest.mark.parametrize("spec, expected", [
    ("gpt-9000b", "unknown model 'gpt-9000b'; known models: gpt-1.7b, "),
    ("gpt:depth=3", "unknown key 'depth' for gpt; allowed keys: layers, hidden, heads"),
    ("gpt:layers=two", "layers='two' is not valid: expected an integer"),
    ("gpt:dropout=high", "dropout='high' is not valid: expected a number"),
    ("llama:tie_embeddings=maybe", "expected true or false"),
    ("llama:kv_heads=x", "expected an integer or none"),
    ("gpt:layers", "override 'layers' is not key=value"),
    ("gpt:hidden=100,heads=3", "hidden=100 is not divisible by heads=3 (100 / 3 = 33.33)"),
    ("missing/model.py:build", "model file 'missing/model.py' does not exist"),
    ("", "non-empty"),
])
def test_spec_errors_say_what_is_allowed(spec, expected):
    with pytest.raises(ModelSpecError) as err:
        resolve_model(spec)
    assert expected in str(err.value)
    assert isinstance(err.value, ValueError)


def test_input_request_errors_are_model_spec_errors():
    with pytest.raises(ModelSpecError, match=r"seq=4096 must be an integer in \[1, 64\]"):
        resolve_model("gpt-tiny").example_inputs(1, seq=4096)
    with pytest.raises(ModelSpecError, match="no sequence axis"):
        resolve_model("convnet-small").example_inputs(1, seq=8)
    with pytest.raises(ModelSpecError, match="batch must be a positive integer"):
        resolve_model("mlp-small").example_inputs(0)


USER_FILE = '''
import torch, torch.nn as nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(16, 4)
    def forward(self, x, scale=None):
        return self.b(torch.relu(self.a(x)))

def build():
    return Net(), torch.randn(5, 8)

def broken():
    return Net()
'''


def test_user_file_spec(tmp_path):
    path = tmp_path / "my_model.py"
    path.write_text(textwrap.dedent(USER_FILE))
    bundle = resolve_model(f"{path}:build")
    assert bundle.family == "file" and bundle.config is None
    assert bundle.example_inputs(3, with_targets=False) == {"x": InputSpec((3, 8), torch.float32)}
    # no loss in the file, no targets named: class ids of the output (3, 4) less its last dim
    targets = bundle.example_inputs(3)["targets"]
    assert (targets.shape, targets.dtype, targets.high) == ((3,), torch.int64, 4)
    assert next(bundle.build().parameters()).device.type == "meta"
    assert resolve_model(str(path)).name.endswith(":build")  # :build is the default
    real = bundle.build(device="cpu")
    assert real(torch.randn(2, 8)).shape == (2, 4)


def test_user_file_errors(tmp_path):
    path = tmp_path / "my_model.py"
    path.write_text(textwrap.dedent(USER_FILE))
    with pytest.raises(ModelSpecError, match=r"has no function 'make'; functions defined "
                                             r"there: broken, build"):
        resolve_model(f"{path}:make")
    with pytest.raises(ModelSpecError, match=r"must return \(model, example_inputs\)"):
        resolve_model(f"{path}:broken").build()
    with pytest.raises(ModelSpecError, match="fixes its own input shapes"):
        resolve_model(f"{path}:build").example_inputs(2, seq=3)


def test_user_file_fingerprint_is_stable_across_processes(tmp_path):
    import os
    import subprocess
    import sys

    model = tmp_path / "user_net.py"
    model.write_text(textwrap.dedent("""
        import torch
        from torch import nn

        def scale(x):  # fx keeps it as one call: its target names the user module
            return x * 2

        torch.fx.wrap("scale")

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 4)

            def forward(self, x):
                return scale(torch.relu(self.fc(x)))

        def build():
            return Net(), torch.randn(2, 8)
    """))
    code = (f"from fxplan import capture; "
            f"print(capture({str(model) + ':build'!r}).fingerprint())")
    prints = set()
    for seed in ("1", "2"):  # str hashes differ between these processes
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True)
        prints.add(out.stdout.strip().splitlines()[-1])
    assert len(prints) == 1
