"""Training data as arrays, one per model input (``--data FILE.npz``, ``--data FILE.pt`` or
``--data DIR``): for models that are not fed one token stream — an image classifier (images and
labels), an encoder-decoder (source and target token ids), any model whose inputs have a
fixed shape per sample.

**Files.** ``FILE.npz`` (``numpy.savez``), ``FILE.pt`` (``torch.save`` of a dict of tensors) or
a directory of ``NAME.npy`` / ``NAME.pt`` files (one array each). Each array holds ``N``
samples along its first dimension, all arrays the same ``N``:

* the targets are the array named ``targets`` or ``labels`` (class ids ``(N,)`` for a
  classifier, token ids ``(N, S)`` for text-to-text);
* every other array is the model input of its name (the forward's parameter: ``pixel_values``,
  ``input_ids``, ``src`` …); a model with one input takes the one other array whatever its name
  (``images``);
* an encoder-decoder's ``decoder_input_ids``, when no array holds them, are the targets shifted
  right by one behind the model's decoder start id (T5's rule: ``d_0 = start``,
  ``d_i = y_{i−1}``, an ignored label ``−100`` read as the pad id; :func:`model_array_data`).

Each array's sample shape and kind must be the model input's: floating-point for a
floating-point input (cast to its dtype), integers for an integer input (class and token ids are
checked against the class count or vocabulary as they are read). Nothing in these files is
executed: ``numpy.load(allow_pickle=False)`` and ``torch.load(weights_only=True)`` refuse
pickled objects, so an object array or a pickled class is a :class:`DataError`, as is every
other file that does not fit — one paragraph, before a step runs (``fxplan launch`` checks them
before any process starts).

**Order.** Global sample ``g = step·B + b`` is row ``π_e(g mod N)`` of epoch ``e = ⌊g / N⌋``,
``π_e`` the permutation of ``0 … N−1`` drawn by ``numpy.random.default_rng([seed, e])`` — the
token file's rule (:mod:`fxplan.runtime.train.data`) with rows for windows, so every plan trains
on the same global batches as one process and a resumed run reads exactly the next sample.
``.npy`` files are memory-mapped (a rank reads its rows only); an ``.npz`` member or a ``.pt``
file is read whole once (``mmap`` where torch can).
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import numpy as np
import torch

from fxplan.runtime.train.data import Batch, DataError, EpochOrder

__all__ = ["ArrayData", "is_array_data", "model_array_data", "TARGET_NAMES"]

#: The names the targets' array may have.
TARGET_NAMES = ("targets", "labels")
#: The array files a directory of arrays holds.
_SUFFIXES = (".npy", ".pt")


def is_array_data(path: str) -> bool:
    """Whether ``--data path`` names array data (module docstring): an ``.npz`` or ``.pt``
    file, or a directory holding ``.npy`` / ``.pt`` files (cheap; nothing read)."""
    if os.path.isfile(path):
        return path.endswith((".npz", ".pt"))
    return os.path.isdir(path) and any(name.endswith(_SUFFIXES) for name in os.listdir(path))


def _refused(path: str, err: Exception) -> DataError:
    text = (str(err).strip().splitlines() or [""])[0]
    return DataError(f"--data {path}: cannot read it as arrays ({type(err).__name__}: {text}); "
                     "expected numpy arrays (numpy.save / numpy.savez, no object arrays) or "
                     "tensors (torch.save of a tensor or a dict of tensors); pickled objects "
                     "are never loaded")


def _tensors_of(path: str, loaded: Any) -> dict[str, Any]:
    """A ``.pt`` file's tensors by name (a dict), or its one tensor (under the key ``""``)."""
    if isinstance(loaded, torch.Tensor):
        return {"": loaded}
    if isinstance(loaded, Mapping) and loaded and all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in loaded.items()):
        return dict(loaded)
    raise DataError(f"--data {path} holds {type(loaded).__name__}: expected a tensor, or a dict "
                    "of tensors keyed by input name")


def _load_pt(path: str) -> dict[str, Any]:
    try:
        try:
            loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as err:   # the legacy format cannot be memory-mapped
            if "mmap" not in str(err):
                raise
            loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise _refused(path, err) from None
    return _tensors_of(path, loaded)


def load_arrays(path: str) -> dict[str, Any]:
    """The arrays of ``path`` by name (module docstring), nothing unpickled."""
    try:
        if path.endswith(".npz"):
            with np.load(path, allow_pickle=False) as archive:
                return {name: archive[name] for name in archive.files}
        if path.endswith(".pt"):
            tensors = _load_pt(path)
            if list(tensors) == [""]:
                raise DataError(f"--data {path} holds one tensor: a FILE.pt holds a dict of "
                                "tensors keyed by input name and 'targets' or 'labels' (one "
                                "tensor per file is a directory of NAME.pt files)")
            return tensors
        arrays: dict[str, Any] = {}
        for name in sorted(os.listdir(path)):
            stem, suffix = os.path.splitext(name)
            file = os.path.join(path, name)
            if suffix == ".npy":
                arrays[stem] = np.load(file, mmap_mode="r", allow_pickle=False)
            elif suffix == ".pt":
                arrays[stem] = _single(file)
        return arrays
    except DataError:
        raise
    except Exception as err:
        raise _refused(path, err) from None


def _single(file: str) -> Any:
    """A directory's ``NAME.pt``: one tensor."""
    tensors = _load_pt(file)
    if list(tensors) != [""]:
        raise DataError(f"--data {file} holds a dict of tensors: in a directory of arrays each "
                        "NAME.pt holds one tensor (the input NAME)")
    return tensors[""]


def model_array_data(path: str, specs: Mapping[str, Any], config: Any, *, global_batch: int,
                     seed: int = 0) -> "ArrayData":
    """:class:`ArrayData` for a model of ``config``: an encoder-decoder's decoder start id is
    its config's ``decoder_start_token_id``, else its pad id (T5's convention, the start id
    ``transformers`` documents for it); ``None`` for any other model."""
    pad = getattr(config, "pad_token_id", None)
    start = getattr(config, "decoder_start_token_id", None)
    if start is None and getattr(config, "is_encoder_decoder", False):
        start = pad
    return ArrayData(path, specs, global_batch=global_batch, seed=seed, decoder_start=start,
                     pad=pad or 0)


class ArrayData:
    """Batches of named arrays for a model's inputs and targets (module docstring).

    ``specs``: the model's inputs and ``targets`` at the plan's batch (shape and dtype, and
    ``high`` where ids are bounded), in the forward's order; ``decoder_start``: the decoder
    start id of an encoder-decoder (``decoder_input_ids`` derived from the targets when the
    files hold none)."""

    def __init__(self, path: str, specs: Mapping[str, Any], *, global_batch: int,
                 seed: int = 0, decoder_start: int | None = None, pad: int = 0) -> None:
        self.path, self.global_batch, self.seed = path, global_batch, seed
        self.decoder_start, self.pad = decoder_start, pad
        arrays = load_arrays(path)
        if not arrays:
            raise DataError(f"--data {path} holds no arrays: expected one per model input "
                            f"({', '.join(k for k in specs if k != 'targets')}) and the "
                            f"targets ({' or '.join(TARGET_NAMES)})")
        self.specs = dict(specs)
        self.columns, self.derived = self._match(arrays)
        sizes = {name: int(a.shape[0]) if a.ndim else 0 for name, a in self.columns.items()}
        if len(set(sizes.values())) != 1 or min(sizes.values()) < 1:
            raise DataError(f"--data {path}: the arrays must hold the same number (≥ 1) of "
                            f"samples along their first dimension; they hold "
                            f"{', '.join(f'{k}: {v}' for k, v in sizes.items())}")
        self.rows = next(iter(sizes.values()))
        for name, array in self.columns.items():
            self._check(name, array)
        self.window = EpochOrder(self.rows, seed)   # the row of global sample g

    def _match(self, arrays: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        """``{model name: array}`` for every input and ``targets``, and the input derived from
        the targets (``decoder_input_ids``) if any; :class:`DataError` naming what is missing
        or left over."""
        found = [n for n in TARGET_NAMES if n in arrays]
        inputs = [k for k in self.specs if k != "targets"]
        if len(found) != 1:
            raise DataError(f"--data {self.path}: expected one targets array, named "
                            f"{' or '.join(TARGET_NAMES)}; found "
                            f"{', '.join(found) if found else 'none'} among "
                            f"{', '.join(sorted(arrays)) or 'no arrays'}")
        columns = {"targets": arrays[found[0]]}
        rest = {k: v for k, v in arrays.items() if k != found[0]}
        if len(inputs) == 1 and len(rest) == 1:
            columns[inputs[0]] = next(iter(rest.values()))
            return columns, None
        derived = None
        if "decoder_input_ids" in inputs and "decoder_input_ids" not in rest \
                and self.decoder_start is not None:
            derived = "decoder_input_ids"
        missing = [k for k in inputs if k not in rest and k != derived]
        extra = sorted(k for k in rest if k not in inputs)
        if missing or extra:
            raise DataError(f"--data {self.path}: the model takes {', '.join(inputs)} and the "
                            f"targets; the arrays are named {', '.join(sorted(arrays))}"
                            + (f" (no array for {', '.join(missing)})" if missing else "")
                            + (f" ({', '.join(extra)} is no input of the model)" if extra else "")
                            + ". Name each array after the forward parameter it feeds.")
        columns.update({k: rest[k] for k in inputs if k != derived})
        return columns, derived

    def _check(self, name: str, array: Any) -> None:
        """The array's sample shape and kind are the input's (module docstring)."""
        spec = self.specs[name]
        what = "the targets" if name == "targets" else f"input {name!r}"
        try:
            shape, dtype = tuple(array.shape[1:]), _dtype(array)
        except TypeError:
            raise DataError(f"--data {self.path}: {what} are numpy {array.dtype} values, not "
                            "numbers torch can take (integers or floating point)") from None
        if shape != tuple(spec.shape[1:]):
            raise DataError(f"--data {self.path}: {what} have samples of shape {shape}; the "
                            f"plan's model takes {tuple(spec.shape[1:])} per sample (its "
                            f"batch {tuple(spec.shape)})")
        floating = spec.dtype.is_floating_point
        if dtype.is_floating_point != floating or dtype == torch.bool:
            raise DataError(f"--data {self.path}: {what} are {str(dtype).removeprefix('torch.')}"
                            f"; the model takes {str(spec.dtype).removeprefix('torch.')} "
                            + ("(convert integer pixels to floating point, scaled as the model "
                               "expects)" if floating else "(integer ids)"))

    def batch(self, step: int, start: int, stop: int) -> Batch:
        first = step * self.global_batch
        rows = [self.window(first + b) for b in range(start, stop)]
        made = {name: self._rows(name, array, rows, step) for name, array in
                self.columns.items()}
        if self.derived is not None:
            made[self.derived] = self._shifted(made["targets"])
        inputs = tuple(made[k] for k in self.specs if k != "targets")
        return inputs, made["targets"]

    def _rows(self, name: str, array: Any, rows: list[int], step: int) -> torch.Tensor:
        spec = self.specs[name]
        picked = array[rows] if isinstance(array, torch.Tensor) else \
            torch.from_numpy(np.ascontiguousarray(array[rows]))
        picked = picked.to(spec.dtype)
        high = getattr(spec, "high", None)
        if high is not None and picked.numel():
            valid = picked[picked != -100] if name == "targets" else picked
            if valid.numel() and (int(valid.max()) >= high or int(valid.min()) < 0):
                what = "the targets" if name == "targets" else f"input {name!r}"
                raise DataError(f"--data {self.path}: {what} hold id {int(valid.max())} "
                                f"(min {int(valid.min())}) at step {step + 1}, outside the "
                                f"model's [0, {high}) (its class count or vocabulary)")
        return picked

    def _shifted(self, targets: torch.Tensor) -> torch.Tensor:
        """``decoder_input_ids`` from the targets (module docstring)."""
        shifted = torch.full_like(targets, int(self.decoder_start or 0))
        shifted[:, 1:] = targets[:, :-1]
        return shifted.masked_fill(shifted == -100, self.pad)


def _dtype(array: Any) -> torch.dtype:
    if isinstance(array, torch.Tensor):
        return array.dtype
    return torch.from_numpy(np.empty(0, dtype=array.dtype)).dtype
