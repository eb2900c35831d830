"""A local Hugging Face ``datasets`` directory as training data (``--data DIR``).

``DIR`` is what ``datasets.Dataset.save_to_disk`` (or ``DatasetDict.save_to_disk``, whose
``train`` split is used) wrote: Arrow files plus ``dataset_info.json``/``state.json``. Its
``input_ids`` column — one list of token ids per row, already tokenised (a ``text`` column
alone is refused: tokenising needs a tokenizer download, which a launch does not do) — is read
through ``datasets.load_from_disk``, which memory-maps the Arrow files.

The rows, concatenated in row order, are one token stream ``t`` of ``N = Σ_r len(row_r)``
ids, and sampling is exactly the token file's (:class:`fxplan.runtime.train.data.TokenStream`): window
``w`` is ``t[w·s : w·s + s + 1]``, global sample ``g = step·B + b`` is window ``π_e(g mod W)``
of epoch ``e``. Arrow keeps a list column as one flat ``values`` array plus offsets, so the
stream is that array (zero copy) and a window is one slice of it: a rank reads only the
windows of its samples, and a resumed run reads from exactly the next sample (the order is a
function of ``(seed, step)``).

``datasets`` is an optional dependency (``pip install 'fxplan[data]'``); without it, or for a
directory that is not a saved dataset with an ``input_ids`` column, :class:`DataError` says
what to do before any step runs.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from fxplan.runtime.train.data import DataError, TokenStream

__all__ = ["ArrowTokens", "HFDataset", "is_dataset_dir", "load_token_column"]

#: Files ``save_to_disk`` writes next to the Arrow shards (a ``DatasetDict`` writes
#: ``dataset_dict.json`` and one such directory per split).
MARKERS = ("state.json", "dataset_info.json", "dataset_dict.json")


def is_dataset_dir(path: str) -> bool:
    """Whether ``path`` looks like a directory ``save_to_disk`` wrote (cheap; no import)."""
    return os.path.isdir(path) and any(os.path.isfile(os.path.join(path, m)) for m in MARKERS)


class ArrowTokens:
    """The flat ``values`` of an Arrow list column as a sliceable token array: ``len`` is the
    number of ids, ``tokens[a:b]`` a numpy array of ids ``a … b-1`` (one slice of the
    memory-mapped chunks, nothing else read)."""

    def __init__(self, column: Any) -> None:
        import pyarrow as pa

        chunks = column.chunks if hasattr(column, "chunks") else [column]
        self.values = pa.chunked_array([chunk.flatten() for chunk in chunks])

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, window: slice) -> np.ndarray:
        start, stop, _ = window.indices(len(self.values))
        return self.values.slice(start, stop - start).to_numpy()


def load_token_column(path: str) -> Any:
    """The ``input_ids`` column (an Arrow ``ChunkedArray`` of lists of integers) of the saved
    dataset at ``path``; :class:`DataError` for anything else."""
    try:
        import datasets
    except ImportError:
        raise DataError(f"--data {path}: reading a Hugging Face datasets directory needs the "
                        "`datasets` package: pip install 'fxplan[data]'") from None
    try:
        loaded = datasets.load_from_disk(path)
    except (FileNotFoundError, ValueError, OSError) as err:
        raise DataError(f"--data {path}: not a directory written by Dataset.save_to_disk "
                        f"({type(err).__name__}: {err})") from None
    if isinstance(loaded, datasets.DatasetDict):
        if "train" not in loaded:
            raise DataError(f"--data {path}: a DatasetDict without a 'train' split (splits: "
                            f"{', '.join(loaded) or 'none'}); save the split to train on")
        loaded = loaded["train"]
    if "input_ids" not in loaded.column_names:
        hint = (" (a 'text' column: tokenise it first, e.g. dataset.map(lambda r: "
                "tokenizer(r['text'])), and save that)" if "text" in loaded.column_names else "")
        raise DataError(f"--data {path}: no 'input_ids' column; columns: "
                        f"{', '.join(loaded.column_names)}{hint}")
    column = loaded.data.column("input_ids")
    import pyarrow as pa

    kind = column.type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or \
            not pa.types.is_integer(kind.value_type):
        raise DataError(f"--data {path}: column 'input_ids' holds {kind}, expected lists of "
                        "integer token ids (one list per row)")
    return column


class HFDataset(TokenStream):
    """The token stream of a saved dataset's ``input_ids`` rows (module docstring)."""

    def __init__(self, path: str, *, seq: int, global_batch: int, vocab: int | None = None,
                 seed: int = 0) -> None:
        tokens = ArrowTokens(load_token_column(path))
        super().__init__(tokens, f"datasets directory {path} (input_ids)", seq=seq,
                         global_batch=global_batch, vocab=vocab, seed=seed)
