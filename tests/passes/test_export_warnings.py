"""Exporting a Hugging Face model prints nothing of torch's own deprecations (every ``hf:``
command printed ``FutureWarning: isinstance(treespec, LeafSpec) is deprecated`` from
``copyreg.py``). Run in a fresh interpreter: the warning is shown once per process."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = ("from fxplan.api import capture; capture('hf:llama:num_hidden_layers=2,hidden_size=32,"
          "intermediate_size=64,num_attention_heads=4,num_key_value_heads=2,vocab_size=64', "
          "seq=8); print('captured')")


def test_hf_capture_prints_no_torch_deprecation():
    pytest.importorskip("transformers")
    done = subprocess.run([sys.executable, "-W", "default", "-c", SCRIPT], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and "captured" in done.stdout, done.stderr[-2000:]
    assert "LeafSpec" not in done.stderr, done.stderr[-2000:]
