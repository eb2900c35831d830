"""``fxplan launch`` of real models against one process: a user file with an
``nn.TransformerEncoder`` (``path.py:build_wide``, head-parallel attention under the search's
``tp=2,dp=2`` plan) and a tiny ``hf:llama`` under a ``pp=2,dp=2`` plan, each launched on 4 CPU
ranks by ``fxplan launch`` and, with the same data and seed, under a one-device plan on one
process (the worker ``fxplan launch`` would start, with the worker arguments the launch verb
builds, run directly as a one-rank group: no launcher and torchrun agent processes to start for
the reference); the losses of every step agree within the tolerance of the numerics tests (fp32
SGD, relative 1e-5)."""

from __future__ import annotations

import json
import os

import pytest

from launch_here import launch_here, one_rank

LLAMA = ("hf:llama:num_hidden_layers=2,hidden_size=32,intermediate_size=64,num_attention_heads=4,"
         "num_key_value_heads=2,vocab_size=64,max_position_embeddings=16")
ENCODER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runtime",
                       "models", "encoder_lm.py:build_wide")
TOL = 1e-5


def _losses(tmp_path, capfd, name: str, model: str, devices: int, constrain: str) -> list[float]:
    """Plan ``model`` on ``local-cpu:devices=N`` under ``constrain`` (the ``--constrain`` text,
    planned in this process: the CLI's plan verb has its own tests), train 4 SGD steps on
    synthetic data (``fxplan launch``; one device: its worker alone, :func:`one_rank`), return
    the logged losses."""
    from fxplan import search
    from fxplan.cli.constraint_text import parse_constraints

    plan = tmp_path / f"{name}.json"
    seq = 8 if model.startswith("hf:") else None  # a user file fixes its own
    search(model, f"local-cpu:devices={devices}", batch=4, seq=seq,
           constraints=parse_constraints(constrain), progress=False).save(plan)
    run = tmp_path / name
    flags = [str(plan), "--data", "synthetic", "--steps", "4", "--log-every", "1",
             "--optimizer", "sgd", "--lr", "0.1", "--grad-clip", "0", "--run-dir", str(run)]
    done = one_rank(flags) if devices == 1 else launch_here(capfd, *flags)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "applied: module level" in done.stdout, done.stdout
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def _agree(losses: list[float], reference: list[float]) -> None:
    assert len(losses) == len(reference) == 4
    assert max(abs(a - b) / abs(b) for a, b in zip(losses, reference)) <= TOL, (losses, reference)
    assert losses[-1] < losses[0], losses


@pytest.mark.multirank
def test_launch_encoder_user_file_tp_dp_like_one_process(tmp_path, capfd):
    one = _losses(tmp_path, capfd, "one", ENCODER, 1, "tp=1,dp=1,pp=1")
    four = _losses(tmp_path, capfd, "four", ENCODER, 4, "tp=2,dp=2,sp=false,zero=0")
    _agree(four, one)


@pytest.mark.multirank
def test_launch_hf_llama_pipeline_like_one_process(tmp_path, capfd):
    pytest.importorskip("transformers")
    one = _losses(tmp_path, capfd, "one", LLAMA, 1, "tp=1,dp=1,pp=1")
    four = _losses(tmp_path, capfd, "four", LLAMA, 4, "pp=2,dp=2,zero=1")
    _agree(four, one)
