"""A local Hugging Face ``datasets`` directory as training data (:mod:`fxplan.runtime.train.hf_data`):
the same samples in the same order as a token file holding the rows' ids back to back, a rank's
slice equal to its part of the global batch, and clear refusals of directories that are not
a saved dataset with token ids."""

from __future__ import annotations

import numpy as np
import pytest

from fxplan.runtime.train.data import DataError, TokenFile

datasets = pytest.importorskip("datasets")

SEQ, BATCH, VOCAB = 8, 4, 100


@pytest.fixture(scope="module")
def rows():
    """Rows of uneven length (a tokenised corpus, one document per row)."""
    rng = np.random.default_rng(0)
    return [rng.integers(0, VOCAB, int(n)).tolist() for n in rng.integers(1, 40, 60)]


@pytest.fixture(scope="module")
def saved(rows, tmp_path_factory):
    path = tmp_path_factory.mktemp("ds") / "train"
    datasets.Dataset.from_dict({"input_ids": rows, "n": [len(r) for r in rows]}).save_to_disk(
        str(path))
    return str(path)


def test_same_samples_as_the_token_file_of_its_rows(rows, saved, tmp_path):
    from fxplan.runtime.train.hf_data import HFDataset

    flat = tmp_path / "tokens.bin"
    np.concatenate([np.asarray(r, dtype=np.uint16) for r in rows]).tofile(flat)
    reference = TokenFile(str(flat), seq=SEQ, global_batch=BATCH, dtype=np.dtype("uint16"),
                          vocab=VOCAB, seed=7)
    data = HFDataset(saved, seq=SEQ, global_batch=BATCH, vocab=VOCAB, seed=7)
    assert data.windows == reference.windows
    for step in (0, 1, 5, data.windows // BATCH + 3):  # the last one in the second epoch
        (inputs,), targets = data.batch(step, 0, BATCH)
        (ref_inputs,), ref_targets = reference.batch(step, 0, BATCH)
        assert inputs.equal(ref_inputs) and targets.equal(ref_targets)
        # a data-parallel rank's slice is its part of the global batch
        (half,), half_targets = data.batch(step, 2, 4)
        assert half.equal(inputs[2:4]) and half_targets.equal(targets[2:4])


def test_dataset_dict_uses_its_train_split(rows, tmp_path):
    from fxplan.runtime.train.hf_data import HFDataset

    path = str(tmp_path / "dict")
    split = datasets.Dataset.from_dict({"input_ids": rows})
    datasets.DatasetDict({"train": split}).save_to_disk(path)
    assert HFDataset(path, seq=SEQ, global_batch=BATCH).windows == \
        (sum(map(len, rows)) - 1) // SEQ


def test_refusals(tmp_path):
    from fxplan.cli.launch_checks import check_dataset_dir
    from fxplan.cli.run_config import LaunchError
    from fxplan.runtime.train.hf_data import HFDataset

    with pytest.raises(LaunchError, match="without the files Dataset.save_to_disk writes"):
        check_dataset_dir(str(tmp_path))
    text = str(tmp_path / "text")
    datasets.Dataset.from_dict({"text": ["a b", "c"]}).save_to_disk(text)
    with pytest.raises(DataError, match="no 'input_ids' column.*tokenise it first"):
        check_dataset_dir(text)
    floats = str(tmp_path / "floats")
    datasets.Dataset.from_dict({"input_ids": [[0.5, 1.5]]}).save_to_disk(floats)
    with pytest.raises(DataError, match="expected lists of integer token ids"):
        HFDataset(floats, seq=SEQ, global_batch=BATCH)
    other = str(tmp_path / "nosplit")
    datasets.DatasetDict({"test": datasets.Dataset.from_dict({"input_ids": [[1, 2]]})}
                         ).save_to_disk(other)
    with pytest.raises(DataError, match="without a 'train' split"):
        HFDataset(other, seq=SEQ, global_batch=BATCH)
    short = str(tmp_path / "short")
    datasets.Dataset.from_dict({"input_ids": [[1, 2, 3]]}).save_to_disk(short)
    with pytest.raises(DataError, match="fewer than one sample"):
        HFDataset(short, seq=SEQ, global_batch=BATCH)
    big = str(tmp_path / "big")
    datasets.Dataset.from_dict({"input_ids": [list(range(10, 30))]}).save_to_disk(big)
    with pytest.raises(DataError, match="not below the model's vocabulary 10"):
        HFDataset(big, seq=SEQ, global_batch=1, vocab=10).batch(0, 0, 1)
