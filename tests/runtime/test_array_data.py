"""Arrays as training data (:mod:`fxplan.runtime.train.array_data`): an image classifier's
images and labels from an ``.npz``, a ``.pt`` dict or a directory of ``.npy`` / ``.pt`` files,
an encoder-decoder's token ids (``decoder_input_ids`` derived from the labels when absent), the
order of the token file's rule, a rank's slice its part of the global batch, and every bad file
refused in one paragraph — pickled objects never loaded."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from fxplan.examples.bundle import InputSpec
from fxplan.runtime.train.array_data import ArrayData, is_array_data
from fxplan.runtime.train.data import DataError

N, BATCH, CLASSES = 10, 4, 10
#: A timm-style classifier's inputs and targets at the plan's batch.
IMAGES = {"x": InputSpec((BATCH, 3, 16, 16), torch.float32),
          "targets": InputSpec((BATCH,), torch.int64, CLASSES)}
#: T5's (text to text) at seq 6, vocabulary 64.
T5 = {"input_ids": InputSpec((BATCH, 6), torch.int64, 64),
      "decoder_input_ids": InputSpec((BATCH, 6), torch.int64, 64),
      "targets": InputSpec((BATCH, 6), torch.int64, 64)}


def _images() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return (rng.standard_normal((N, 3, 16, 16)).astype(np.float32),
            rng.integers(0, CLASSES, N).astype(np.int64))


def _rows(step: int, seed: int = 3) -> list[int]:
    """The rows of step ``step``'s global batch by the module's rule, written out."""
    rows = []
    for g in range(step * BATCH, (step + 1) * BATCH):
        epoch, position = divmod(g, N)
        rows.append(int(np.random.default_rng([seed, epoch]).permutation(N)[position]))
    return rows


@pytest.mark.parametrize("form", ["npz", "pt", "npy-dir", "pt-dir"])
def test_images_and_labels_in_the_token_files_order(tmp_path, form):
    images, labels = _images()
    if form == "npz":
        path = tmp_path / "train.npz"
        np.savez(path, images=images, labels=labels)
    elif form == "pt":
        path = tmp_path / "train.pt"
        torch.save({"images": torch.from_numpy(images), "labels": torch.from_numpy(labels)}, path)
    else:
        path = tmp_path / "train"
        path.mkdir()
        for name, array in (("images", images), ("labels", labels)):
            if form == "npy-dir":
                np.save(path / f"{name}.npy", array)
            else:
                torch.save(torch.from_numpy(array), path / f"{name}.pt")
    assert is_array_data(str(path))
    data = ArrayData(str(path), IMAGES, global_batch=BATCH, seed=3)
    for step in (0, 1, 2, 3):   # steps 2 and 3 cross into the second epoch (10 rows)
        (x,), y = data.batch(step, 0, BATCH)
        rows = _rows(step)
        assert x.dtype == torch.float32 and y.dtype == torch.int64
        assert x.equal(torch.from_numpy(images[rows])) and y.equal(torch.from_numpy(labels[rows]))
        (half,), half_y = data.batch(step, 2, 4)   # a data-parallel rank's slice
        assert half.equal(x[2:4]) and half_y.equal(y[2:4])


def test_text_to_text_derives_the_decoder_inputs_from_the_labels(tmp_path):
    rng = np.random.default_rng(1)
    ids, labels = rng.integers(0, 64, (N, 6)), rng.integers(0, 64, (N, 6))
    labels[0, -2:] = -100   # ignored positions
    np.savez(tmp_path / "t5.npz", input_ids=ids, labels=labels)
    data = ArrayData(str(tmp_path / "t5.npz"), T5, global_batch=BATCH, decoder_start=0, pad=0)
    (src, decoder), y = data.batch(0, 0, BATCH)
    assert src.equal(torch.from_numpy(ids[_rows(0, 0)])) and y.equal(torch.from_numpy(
        labels[_rows(0, 0)]))
    assert decoder[:, 0].eq(0).all() and decoder[:, 1:].equal(y[:, :-1].clamp_min(0))
    given = rng.integers(0, 64, (N, 6))
    np.savez(tmp_path / "t5b.npz", input_ids=ids, decoder_input_ids=given, labels=labels)
    (_, decoder), _ = ArrayData(str(tmp_path / "t5b.npz"), T5, global_batch=BATCH,
                                decoder_start=0).batch(0, 0, BATCH)
    assert decoder.equal(torch.from_numpy(given[_rows(0, 0)]))


class _Payload:
    """Pickled, it would create a file when loaded."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (open, (self.marker, "w"))


def test_pickled_objects_are_refused_never_loaded(tmp_path):
    marker = tmp_path / "ran"
    np.save(tmp_path / "objects.npy", np.array([_Payload(str(marker))], dtype=object),
            allow_pickle=True)
    folder = tmp_path / "objects"
    folder.mkdir()
    os.replace(tmp_path / "objects.npy", folder / "images.npy")
    np.save(folder / "labels.npy", np.zeros(1, dtype=np.int64))
    with pytest.raises(DataError, match=r"cannot read it as arrays .*pickled objects are never "
                                        r"loaded"):
        ArrayData(str(folder), IMAGES, global_batch=BATCH)
    torch.save({"images": _Payload(str(marker))}, tmp_path / "evil.pt")
    with pytest.raises(DataError, match=r"evil.pt: cannot read it as arrays \(UnpicklingError"):
        ArrayData(str(tmp_path / "evil.pt"), IMAGES, global_batch=BATCH)
    assert not marker.exists()


@pytest.mark.parametrize("arrays, message", [
    (lambda i, l: {"images": i}, r"expected one targets array, named targets or labels; found "
                                 r"none among images"),
    (lambda i, l: {"images": i, "labels": l, "targets": l},
     r"found targets, labels among images, labels, targets"),
    (lambda i, l: {"images": i[:, :, :8], "labels": l},
     r"input 'x' have samples of shape \(3, 8, 16\); the plan's model takes \(3, 16, 16\)"),
    (lambda i, l: {"images": (i * 255).astype(np.uint8), "labels": l},
     r"input 'x' are uint8; the model takes float32 \(convert integer pixels to floating"),
    (lambda i, l: {"images": i, "labels": l.astype(np.float32)},
     r"the targets are float32; the model takes int64 \(integer ids\)"),
    (lambda i, l: {"images": i, "labels": l[:7]},
     r"the same number \(≥ 1\) of samples .* x: 10, targets: 7|targets: 7, x: 10"),
])
def test_files_that_do_not_fit_are_refused_in_one_paragraph(tmp_path, arrays, message):
    images, labels = _images()
    np.savez(tmp_path / "bad.npz", **arrays(images, labels))
    with pytest.raises(DataError, match=message) as refused:
        ArrayData(str(tmp_path / "bad.npz"), IMAGES, global_batch=BATCH)
    assert "\n" not in str(refused.value)


def test_names_must_be_the_models_inputs(tmp_path):
    ids = np.zeros((N, 6), dtype=np.int64)
    np.savez(tmp_path / "t5.npz", source=ids, labels=ids)
    with pytest.raises(DataError, match=r"the model takes input_ids, decoder_input_ids and the "
                                        r"targets; the arrays are named labels, source \(no "
                                        r"array for input_ids\) \(source is no input of the "
                                        r"model\)\. Name each array after"):
        ArrayData(str(tmp_path / "t5.npz"), T5, global_batch=BATCH, decoder_start=0)


def test_ids_outside_the_class_count_are_refused_as_read(tmp_path):
    images, labels = _images()
    labels[:] = CLASSES   # one past the last class
    np.savez(tmp_path / "c.npz", images=images, labels=labels)
    data = ArrayData(str(tmp_path / "c.npz"), IMAGES, global_batch=BATCH)
    with pytest.raises(DataError, match=r"the targets hold id 10 \(min 10\) at step 1, outside "
                                        r"the model's \[0, 10\)"):
        data.batch(0, 0, BATCH)


def test_what_is_array_data(tmp_path):
    (tmp_path / "tokens.bin").write_bytes(b"\0\0")
    (tmp_path / "empty").mkdir()
    assert not is_array_data(str(tmp_path / "tokens.bin"))
    assert not is_array_data(str(tmp_path / "empty"))
    assert not is_array_data(str(Path(tmp_path) / "missing.npz"))


def test_the_worker_feeds_t5_from_arrays(tmp_path):
    """``fxplan.rank.data_source.data_source``: an ``hf:t5`` plan's inputs in the forward's order, its
    ``labels`` as the targets, the decoder inputs shifted behind the config's start id."""
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    from fxplan.examples.model_spec import resolve_model
    from fxplan.rank.data_source import data_source

    spec = ("hf:t5:num_layers=2,num_decoder_layers=2,d_model=32,d_ff=64,num_heads=4,d_kv=8,"
            "vocab_size=64,dropout_rate=0.0")
    rng = np.random.default_rng(2)
    ids, labels = rng.integers(0, 64, (N, 6)), rng.integers(1, 64, (N, 6))
    np.savez(tmp_path / "t5.npz", input_ids=ids, labels=labels)
    bundle = resolve_model(spec)
    plan = SimpleNamespace(batch=BATCH, seq=6, model=spec)
    args = SimpleNamespace(data=str(tmp_path / "t5.npz"), seed=0, token_dtype="auto")
    data = data_source(args, bundle, plan, 0, BATCH)
    assert isinstance(data, ArrayData)
    (src, decoder), y = data.batch(0, 0, BATCH)
    start = bundle.config.pad_token_id   # T5's start id (its config names none here)
    assert src.shape == decoder.shape == y.shape == (BATCH, 6)
    assert src.equal(torch.from_numpy(ids[_rows(0, 0)])) and decoder[:, 0].eq(start).all()
    assert decoder[:, 1:].equal(y[:, :-1])


def test_a_pt_file_of_one_tensor_is_refused(tmp_path):
    torch.save(torch.zeros(N, 3, 16, 16), tmp_path / "one.pt")
    with pytest.raises(DataError, match=r"one.pt holds one tensor: a FILE.pt holds a dict of "
                                        r"tensors keyed by input name"):
        ArrayData(str(tmp_path / "one.pt"), IMAGES, global_batch=BATCH)
