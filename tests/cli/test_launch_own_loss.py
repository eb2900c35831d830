"""``fxplan launch`` of nanoGPT's own ``forward(idx, targets)``: the forward is fed the targets
and trained on the loss it returns, the loss capture priced. The test model's loss is
label-smoothed cross-entropy, not the trainer's default, so a run on the default loss is told
apart: the first loss equals the model's own on the launch's synthetic batch and not the
default's, and two data-parallel ranks train to the losses of one process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from launch_here import launch_here, one_rank

MODEL = str(Path(__file__).resolve().parents[1] / "runtime" / "models" / "nanogpt_style.py") \
    + ":build_smoothed"
BATCH = 4
TOL = 1e-5


def _first_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """The launch's synthetic batch (``--data synthetic``, seed 0): token ids and targets."""
    from fxplan.examples.model_spec import resolve_model
    from fxplan.runtime.train.data import SyntheticData

    specs = resolve_model(MODEL).example_inputs(BATCH)
    data = SyntheticData(specs, high=specs["targets"].high, seed=0)
    (idx,), targets = data.batch(0, 0, BATCH)
    return idx, targets


def _launch(capfd, tmp_path: Path, devices: int, constraints: dict) -> list[float]:  # type: ignore[no-untyped-def]
    from fxplan import search

    plan = search(MODEL, f"local-cpu:devices={devices}", batch=BATCH, constraints=constraints,
                  progress=False)
    assert plan.dp == devices and plan.pp == 1, plan.summary
    run = tmp_path / f"run{devices}"
    flags = [str(plan.save(tmp_path / f"plan{devices}.json")), "--data", "synthetic", "--steps",
             "2", "--optimizer", "sgd", "--lr", "0.1", "--run-dir", str(run)]
    # one device: the worker fxplan launch would start, alone (launch_here.one_rank)
    done = one_rank(flags) if devices == 1 else launch_here(capfd, *flags)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.multirank
def test_a_forward_that_takes_targets_trains_on_its_own_loss(tmp_path, capfd):
    from fxplan.examples.model_spec import resolve_model

    idx, targets = _first_batch()
    torch.manual_seed(0)   # the launch's seeded initialisation
    model = resolve_model(MODEL).build("cpu")
    with torch.no_grad():
        logits, own = model(idx, targets)
    default = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
    assert abs(float(own) - float(default)) > 100 * TOL * float(default)   # told apart

    two = _launch(capfd, tmp_path, 2, {"dp": 2, "tp": 1, "pp": 1})
    one = _launch(capfd, tmp_path, 1, {})
    assert abs(two[0] - float(own)) <= TOL * float(own), (two, float(own), float(default))
    assert all(abs(a - b) <= TOL * abs(b) for a, b in zip(two, one)), (two, one)
    assert len(two) == 2 and two[1] < two[0]
