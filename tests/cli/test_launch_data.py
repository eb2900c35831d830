"""``fxplan launch --data DIR`` on a local Hugging Face ``datasets`` directory with ``--dtype
bf16``: a real torchrun on 2 CPU ranks trains from the directory in bf16 mixed precision, says
so in the log and in ``summary.json``, and a run resumed from its step-2 checkpoint repeats its
losses of steps 3–4 exactly (the data position is exact). Refusals before any process starts."""

from __future__ import annotations

import json

import numpy as np
import pytest

from launch_here import launch_here

MODEL = "gpt-tiny:dropout=0,seq=16"
LINE = "mixed precision: bf16 params/compute, fp32 master+reduce (--dtype bf16)"


@pytest.mark.multirank
def test_launch_from_a_datasets_directory_in_bf16_resumes_exactly(tmp_path, capfd):
    datasets = pytest.importorskip("datasets")
    from fxplan import search

    rng = np.random.default_rng(0)
    rows = [rng.integers(0, 512, int(n)).tolist() for n in rng.integers(5, 80, 100)]
    data = tmp_path / "ds"
    datasets.Dataset.from_dict({"input_ids": rows}).save_to_disk(str(data))
    plan = search(MODEL, "local-cpu:devices=2", batch=4, seq=16, progress=False)
    plan_file = plan.save(tmp_path / "plan.json")
    common = (str(plan_file), "--data", str(data), "--dtype", "bf16", "--steps", "4",
              "--checkpoint-every", "2")
    first = launch_here(capfd, *common, "--run-dir", str(tmp_path / "run1"))
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert LINE in first.stdout, first.stdout
    assert "the plan was priced in float32, this run computes in bf16" in first.stdout
    summary = json.loads((tmp_path / "run1" / "summary.json").read_text())
    assert summary["mixed_precision"] == "bf16 params/compute, fp32 master+reduce"
    assert summary["compute_dtype"] == "bf16"
    second = launch_here(capfd, *common, "--run-dir", str(tmp_path / "run2"),
                         "--resume", str(tmp_path / "run1" / "checkpoints" / "step-2"))
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]

    def losses(run: str) -> dict[int, float]:
        lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        return {row["step"]: row["loss"] for row in map(json.loads, lines)}

    whole, resumed = losses("run1"), losses("run2")
    assert sorted(resumed) == [3, 4] and [resumed[3], resumed[4]] == [whole[3], whole[4]]


def test_a_directory_that_is_no_dataset_is_refused(tmp_path, capfd):
    pytest.importorskip("datasets")
    from fxplan import search

    plan_file = search(MODEL, "local-cpu:devices=2", batch=4, seq=16,
                       progress=False).save(tmp_path / "plan.json")
    done = launch_here(capfd, str(plan_file), "--data", str(tmp_path), "--print-command")
    assert done.returncode == 2
    assert "without the files Dataset.save_to_disk writes" in done.stderr
    done = launch_here(capfd, str(plan_file), "--data", "synthetic", "--dtype", "bf8",
                       "--print-command")
    assert done.returncode == 2 and "--dtype" in done.stderr
