"""``fxplan launch --data FILE.npz``: a timm-style image classifier trained from a file of
images and labels (:mod:`fxplan.runtime.train.array_data`). Two data-parallel ranks train to the
losses of one process, the first loss is the default cross-entropy of the model on the file's
first global batch, and a file that does not fit the model is refused before any process
starts, in one paragraph, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from launch_here import launch_here, one_rank

MODEL = str(Path(__file__).resolve().parents[1] / "runtime" / "models" / "timm_style.py") \
    + ":build"
BATCH, SAMPLES, TOL = 4, 12, 1e-5


def _file(tmp_path: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    images = rng.standard_normal((SAMPLES, 3, 16, 16)).astype(np.float32)
    labels = rng.integers(0, 10, SAMPLES)
    path = tmp_path / "train.npz"
    np.savez(path, images=images, labels=labels)
    return path, images, labels


def _plan(tmp_path: Path, devices: int, constraints: dict) -> str:
    from fxplan import search

    plan = search(MODEL, f"local-cpu:devices={devices}", batch=BATCH, constraints=constraints,
                  progress=False)
    assert plan.dp == devices, plan.summary
    return str(plan.save(tmp_path / f"plan{devices}.json"))


def _losses(capfd, plan: str, data: Path, run: Path,  # type: ignore[no-untyped-def]
            alone: bool = False) -> list[float]:
    """The logged losses of 3 SGD steps: ``fxplan launch``, or (``alone``, a one-device plan)
    the worker it would start, run alone (:func:`launch_here.one_rank`)."""
    flags = [plan, "--data", str(data), "--steps", "3", "--optimizer", "sgd", "--lr", "0.1",
             "--run-dir", str(run)]
    done = one_rank(flags) if alone else launch_here(capfd, *flags)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.multirank
def test_a_classifier_trains_from_a_file_of_images_and_labels(tmp_path, capfd):
    from fxplan.examples.model_spec import resolve_model

    data, images, labels = _file(tmp_path)
    two = _losses(capfd, _plan(tmp_path, 2, {"dp": 2, "tp": 1, "pp": 1}), data, tmp_path / "r2")
    one = _losses(capfd, _plan(tmp_path, 1, {}), data, tmp_path / "r1", alone=True)
    assert all(abs(a - b) <= TOL * abs(b) for a, b in zip(two, one)), (two, one)
    # step 1 reads global samples 0-3: rows π_0(0…3) of the file (seed 0)
    rows = np.random.default_rng([0, 0]).permutation(SAMPLES)[:BATCH]
    torch.manual_seed(0)   # the launch's seeded initialisation
    model = resolve_model(MODEL).build("cpu")
    with torch.no_grad():
        expected = torch.nn.functional.cross_entropy(model(torch.from_numpy(images[rows])),
                                                     torch.from_numpy(labels[rows]))
    assert abs(two[0] - float(expected)) <= TOL * float(expected), (two, float(expected))


def test_a_file_that_does_not_fit_is_refused_before_any_process(tmp_path, capfd):
    _, images, labels = _file(tmp_path)
    bad = tmp_path / "small.npz"
    np.savez(bad, images=images[:, :, :8, :8], labels=labels)
    plan = _plan(tmp_path, 1, {})
    done = launch_here(capfd, plan, "--data", str(bad), "--steps", "1", "--run-dir",
                       str(tmp_path / "run"))
    out = done.stdout + done.stderr
    assert done.returncode == 2, out[-3000:]
    assert "input 'x' have samples of shape (3, 8, 8); the plan's model takes (3, 16, 16)" in out
    assert "Traceback" not in out and "torchrun" not in out.lower(), out
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


T5 = ("hf:t5:num_layers=2,num_decoder_layers=2,d_model=32,d_ff=64,num_heads=4,d_kv=8,"
      "vocab_size=64,dropout_rate=0.0")


@pytest.mark.multirank
def test_text_to_text_trains_from_a_file_of_token_ids(tmp_path, capfd):
    """``hf:t5`` from ``input_ids`` and ``labels`` arrays (the decoder inputs derived from the
    labels): the first loss of two data-parallel ranks is the model's cross-entropy on the
    file's first global batch."""
    pytest.importorskip("transformers")
    from fxplan import search
    from fxplan.examples.model_spec import resolve_model

    rng = np.random.default_rng(6)
    ids, labels = rng.integers(0, 64, (SAMPLES, 8)), rng.integers(0, 64, (SAMPLES, 8))
    data = tmp_path / "t5.npz"
    np.savez(data, input_ids=ids, labels=labels)
    plan = search(T5, "local-cpu:devices=2", batch=BATCH, seq=8, progress=False,
                  constraints={"dp": 2, "tp": 1, "pp": 1})
    losses = _losses(capfd, str(plan.save(tmp_path / "t5.json")), data, tmp_path / "run")
    rows = np.random.default_rng([0, 0]).permutation(SAMPLES)[:BATCH]
    y = torch.from_numpy(labels[rows])
    decoder = torch.cat([torch.zeros(BATCH, 1, dtype=torch.long), y[:, :-1]], dim=1)
    torch.manual_seed(0)
    model = resolve_model(T5).build("cpu")
    with torch.no_grad():
        logits = model(input_ids=torch.from_numpy(ids[rows]), decoder_input_ids=decoder).logits
    expected = float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()))
    assert abs(losses[0] - expected) <= TOL * expected, (losses, expected)
