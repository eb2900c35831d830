"""``fxplan launch`` of a model that is not a language model, and of a run that fails.

A timm-style image classifier from a user file (image in, class scores out; the file names no
labels and no loss) trains on 2 CPU ranks on synthetic data of its kind: images, and class ids
below its class count derived from its output. The same plan fed images of the wrong size by a
data hook fails inside every rank: the launch prints fxplan's one paragraph once (the first
failure, where it happened, where the tracebacks are), not every rank's traceback and torchrun's
error box, and the tracebacks stay in the run directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launch_here import launch_here

MODEL = str(Path(__file__).resolve().parents[1] / "runtime" / "models" / "timm_style.py") + ":build"
BAD_HOOK = '''
import torch

def build(seq, global_batch, start, stop, seed, dp_rank, dp_size):
    while True:  # 8 x 8 images where the model takes 16 x 16: 4 patches + 1, not 5
        yield torch.randn(stop - start, 3, 8, 8), torch.zeros(stop - start, dtype=torch.long)
'''


def test_a_failure_is_summarized_once_first_in_time(tmp_path):
    """Unit: the paragraph names the first failure, the ranks that hit the same one and the
    folder of the tracebacks; a later failure of another kind is counted, not repeated."""
    from fxplan.runtime.launch.rank_errors import read_failures, report_failure, summarize_failures

    status = tmp_path / "status"
    status.mkdir()
    for rank, err in ((1, RuntimeError("shapes differ\nsize 2 vs 5")), (0, RuntimeError(
            "shapes differ\nsize 2 vs 5")), (2, ConnectionError("peer closed"))):
        try:
            raise err
        except Exception as raised:
            assert report_failure(rank, raised, str(tmp_path / "run"), str(status))
    text = summarize_failures(read_failures(status))
    assert text.startswith("the run failed: ranks 0, 1: RuntimeError: size 2 vs 5 at ")
    assert "1 other rank(s) stopped after it" in text and "peer closed" not in text
    assert f"{tmp_path / 'run' / 'failures'}/" in text
    assert "Traceback" in (tmp_path / "run" / "failures" / "rank-2.txt").read_text()
    assert not report_failure(0, RuntimeError("x"), str(tmp_path / "run"), "")  # not launched


@pytest.mark.multirank
def test_a_classifier_trains_and_a_failing_run_says_why_once(tmp_path, capfd):
    from fxplan import search

    plan = search(MODEL, "local-cpu:devices=2", batch=4, progress=False)
    plan_file = str(plan.save(tmp_path / "plan.json"))
    run = tmp_path / "run"
    done = launch_here(capfd, plan_file, "--data", "synthetic", "--steps", "2", "--optimizer",
                       "sgd", "--lr", "0.1", "--run-dir", str(run))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    losses = [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 2 and all(loss > 0 for loss in losses)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["seq"] is None and summary["applied"] == "module"

    hook = tmp_path / "hook.py"
    hook.write_text(BAD_HOOK)
    failed = tmp_path / "failed"
    done = launch_here(capfd, plan_file, "--data", f"{hook}:build", "--steps", "2",
                       "--run-dir", str(failed))
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    assert out.count("fxplan launch: the run failed: rank") == 1, out[-3000:]
    assert "RuntimeError: The size of tensor a (2) must match the size of tensor b (5)" in out
    assert "timm_style.py:" in out and f"{failed / 'failures'}/" in out
    assert "Traceback" not in out and "ChildFailedError" not in out, out[-3000:]
    assert len(out.splitlines()) < 12, out
    logs = sorted((failed / "failures").glob("rank-*.txt"))
    assert logs and all("Traceback" in log.read_text() for log in logs)
