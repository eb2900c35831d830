"""The trainer's single-process parts: the token order, the lr schedule, the metrics log."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch

from fxplan.runtime.train.data import DataError, TokenFile
from fxplan.runtime.train.metrics import FlopCounts, MetricsLog, StepMetrics
from fxplan.core.training import lr_at


@pytest.fixture
def token_path(tmp_path):
    path = tmp_path / "tokens.bin"
    np.arange(1001, dtype=np.uint16).tofile(path)  # 1000 // 10 = 100 windows of seq 10
    return str(path)


def test_slices_of_any_plan_make_the_same_global_batch(token_path):
    data = TokenFile(token_path, seq=10, global_batch=8, dtype=np.dtype("uint16"), seed=1)
    for step in (0, 3, 12):  # step 12 is in the second epoch (samples 96…103)
        (whole,), targets = data.batch(step, 0, 8)
        parts = [data.batch(step, a, a + 2)[0][0] for a in range(0, 8, 2)]
        assert torch.equal(torch.cat(parts), whole)
        assert torch.equal(targets, whole + 1)  # next-token targets of the window
    epoch = torch.cat([data.batch(s, 0, 8)[0][0][:, 0] for s in range(13)])[:100]
    assert sorted(epoch.tolist()) == list(range(0, 1000, 10))  # each window once per epoch
    other_seed = TokenFile(token_path, seq=10, global_batch=8, dtype=np.dtype("uint16"), seed=2)
    assert not torch.equal(other_seed.batch(0, 0, 8)[0][0], data.batch(0, 0, 8)[0][0])


def test_token_file_errors(tmp_path, token_path):
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x00" * 7)
    with pytest.raises(DataError, match="not a whole number of uint16 ids"):
        TokenFile(str(odd), seq=2, global_batch=1, dtype=np.dtype("uint16"))
    data = TokenFile(token_path, seq=10, global_batch=2, dtype=np.dtype("uint16"), vocab=512)
    with pytest.raises(DataError, match="is not below the model's vocabulary 512"):
        for step in range(60):
            data.batch(step, 0, 2)


def test_warmup_then_cosine_to_min_lr():
    lrs = [lr_at(t, lr=1.0, steps=10, warmup=4, min_lr=0.1) for t in range(1, 11)]
    assert lrs[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert lrs[4] == pytest.approx(1.0) and lrs[-1] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(lrs[4:], lrs[5:]))
    assert lr_at(1, lr=2.0, steps=1) == pytest.approx(2.0)


def _metrics(step: int) -> StepMetrics:
    flops = FlopCounts(model_flops=3e12, hardware_flops=4e12, peak_flops_per_device=1e12,
                       devices=4)
    return StepMetrics.make(step=step, loss=2.0, grad_norm=float("nan"), lr=1e-3,
                            step_time_s=0.5, tokens=1000, devices=4, flops=flops,
                            peak_memory_gib=2.0, capacity_gib=8.0)


def test_metrics_definitions_and_files(tmp_path):
    m = _metrics(1)
    assert m.tokens_per_s_per_device == pytest.approx(500.0)  # 1000 / (4 · 0.5)
    assert m.tflops_per_device == pytest.approx(2.0)          # 4e12 / (4 · 0.5) / 1e12
    assert m.mfu == pytest.approx(1.5)                        # 3e12 / (4 · 0.5 · 1e12)
    assert m.memory_pct == pytest.approx(25.0)
    stream = io.StringIO()
    log = MetricsLog(tmp_path, total_steps=2, stream=stream)
    log.progress(1, 2.0, 0.5)                                 # not a terminal: nothing
    log.log(m)
    row = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert row["grad_norm"] is None and row["mfu"] == pytest.approx(1.5)
    assert stream.getvalue().startswith("step     1  loss 2.0000  grad_norm nan")
    assert "\r" not in stream.getvalue()


def test_progress_bar_on_a_terminal(tmp_path):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    log = MetricsLog(tmp_path, total_steps=4, stream=stream)
    log.progress(1, 2.5, 0.1)
    log.log(_metrics(2))
    log.progress(3, 2.0, 0.1)
    log.close()
    text = stream.getvalue()
    assert "\r[#######.......................] 1/4" in text
    assert "\r\033[Kstep     2" in text and text.endswith("\n")
