"""Training data for ``fxplan launch``: a token file, a Hugging Face ``datasets`` directory,
synthetic batches, or a user hook.

Every source answers ``batch(step, start, stop)``: the samples ``start … stop-1`` of the global
batch of ``step`` (0-based), as ``(inputs, targets)``. A rank asks only for its data-parallel
replica's slice ``[d·B/dp, (d+1)·B/dp)`` and only when it runs the first or the last pipeline
stage (which consume inputs and targets); the other ranks read nothing. With context
parallelism the ``cp`` ranks of a CP group read their group's slice ``[g·B/R, (g+1)·B/R)``
(``R = dp/cp``) and keep their chunks of the sequence (:mod:`fxplan.runtime.styles.context_parallel`).

**Token file** (nanoGPT's / Megatron's flat ``.bin``: token ids as ``uint16`` or ``uint32``,
memory-mapped, never read whole). It is cut into ``W = ⌊(N − 1) / s⌋`` windows of ``s + 1``
tokens starting at multiples of ``s`` (input ``t[0:s]``, target ``t[1:s+1]``). Global sample
``g = step·B + b`` is window ``π_e(g mod W)`` of epoch ``e = ⌊g / W⌋``, where ``π_e`` is the
permutation of ``0 … W-1`` drawn by ``numpy.random.default_rng([seed, e])``. The order depends
only on ``(seed, step, g)``, so every plan — any dp, tp, pp, microbatching — trains on the same
global batches in the same order as one process, and each epoch sees every window once.

**Hugging Face datasets directory** (``--data DIR``, written by ``Dataset.save_to_disk``;
:mod:`fxplan.runtime.train.hf_data`, the ``data`` extra): the rows of its ``input_ids`` column, in
row order, are one token stream, windowed and ordered exactly as a token file (Arrow's
memory-mapped files, sliced per sample: a rank reads only its windows).

**Synthetic** (``--data synthetic``): one random global batch (seeded), the same every step —
a smoke test whose loss must fall by memorisation, not a training run.

**Hook** (``--data data.py:build``): ``build(**context)`` returns an iterable; each ``next()``
is this rank's ``(inputs, targets)`` slice for the next step. ``context``: ``seq``,
``global_batch``, ``start``, ``stop`` (this rank's sample range), ``seed``, ``dp_rank``,
``dp_size``: the coordinates of this rank's *data replica* (:func:`replica_coordinates`), so
that ranks given the same ``(dp_rank, dp_size)`` must yield the same samples. Without context
parallelism that is the dp rank ``d`` of ``dp``; with ``cp > 1`` the ``cp`` ranks of a CP group
read the same samples, so ``dp_rank`` is the group's index ``g = ⌊d/cp⌋`` and ``dp_size`` is
``R = dp/cp``. The hook owns its order; the shapes are checked against the slice.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any, Iterator, Mapping, Protocol

import numpy as np
import torch

from fxplan.core.errors import UserError

__all__ = ["DataError", "DataSource", "EpochOrder", "TokenStream", "TokenFile", "SyntheticData", "HookData",
           "SCAN_BYTES", "check_token_file", "replica_coordinates", "token_dtype"]

Batch = tuple[tuple[torch.Tensor, ...], torch.Tensor]


class DataError(UserError):
    """Training data that does not fit the model or the plan."""


class DataSource(Protocol):
    def batch(self, step: int, start: int, stop: int) -> Batch:
        """Samples ``start … stop-1`` of the global batch of ``step`` (0-based)."""


def token_dtype(name: str, vocab: int | None) -> np.dtype:
    """``uint16``/``uint32``; ``auto``: ``uint16`` when every id of the vocabulary fits."""
    if name == "auto":
        name = "uint16" if vocab is not None and vocab <= 2**16 else "uint32"
    if name not in ("uint16", "uint32"):
        raise DataError(f"token dtype {name!r}: expected uint16, uint32 or auto")
    return np.dtype(name)


class EpochOrder:
    """The order of ``count`` items over epochs: global sample ``g`` is item ``π_e(g mod
    count)`` of epoch ``e = ⌊g / count⌋``, ``π_e`` the permutation of ``0 … count−1`` drawn by
    ``numpy.random.default_rng([seed, e])`` (module docstring; the last epoch's kept)."""

    def __init__(self, count: int, seed: int) -> None:
        self.count, self.seed = count, seed
        self._permutation: tuple[int, np.ndarray] | None = None

    def __call__(self, g: int) -> int:
        epoch, position = divmod(g, self.count)
        if self._permutation is None or self._permutation[0] != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._permutation = (epoch, rng.permutation(self.count))
        return int(self._permutation[1][position])


class TokenStream:
    """Windows of a flat stream of token ids in a seeded, plan-independent order (module
    docstring). ``tokens``: anything with ``len`` whose slices ``tokens[a:b]`` are integer
    arrays (a memory map, :class:`fxplan.runtime.train.hf_data.ArrowTokens`); ``name`` says where
    they come from in messages."""

    def __init__(self, tokens: Any, name: str, *, seq: int, global_batch: int,
                 vocab: int | None = None, seed: int = 0) -> None:
        self.tokens, self.path, self.seq, self.global_batch = tokens, name, seq, global_batch
        self.vocab, self.seed = vocab, seed
        self.windows = (len(self.tokens) - 1) // seq
        if self.windows < 1:
            raise DataError(f"{name}: {len(self.tokens)} tokens, fewer than one "
                            f"sample of seq + 1 = {seq + 1}")
        self._order = EpochOrder(self.windows, seed)

    def window(self, g: int) -> int:
        """The window of global sample ``g``."""
        return self._order(g)

    def batch(self, step: int, start: int, stop: int) -> Batch:
        first = step * self.global_batch
        rows = [self.tokens[w * self.seq: w * self.seq + self.seq + 1]
                for w in (self.window(first + b) for b in range(start, stop))]
        block = torch.from_numpy(np.stack(rows).astype(np.int64))
        if self.vocab is not None and block.numel() and int(block.max()) >= self.vocab:
            raise DataError(f"{self.path}: id {int(block.max())} at step {step} is not "
                            f"below the model's vocabulary {self.vocab} (wrong --token-dtype, or "
                            "data tokenised for another model?)")
        return (block[:, :-1].contiguous(),), block[:, 1:].contiguous()


#: How much of a token file :func:`check_token_file` scans for ids beyond the vocabulary before
#: the workers start (at memory bandwidth, well under a second); ids past it are checked by the
#: ranks as they read them (:meth:`TokenStream.batch`).
SCAN_BYTES = 256 * 2**20


def check_token_file(path: str, *, seq: int, dtype: np.dtype, vocab: int | None,
                     scan_bytes: int = 0) -> None:
    """Refuse a token file that cannot feed one sample: empty, not a whole number of ``dtype``
    ids, fewer than ``seq + 1`` tokens, or (its first ``scan_bytes`` bytes) an id at or above
    ``vocab``. :class:`TokenFile` checks the first three; ``fxplan launch`` all four, before
    any process starts."""
    size = os.path.getsize(path)
    if size == 0:
        raise DataError(f"token file {path} is empty: expected flat {dtype.name} token ids "
                        "(at least seq + 1 of them)")
    if size % dtype.itemsize:
        raise DataError(f"token file {path}: {size} bytes is not a whole number of "
                        f"{dtype.name} ids ({dtype.itemsize} bytes each); wrong --token-dtype, "
                        "or a file cut short?")
    count = size // dtype.itemsize
    if count < seq + 1:
        raise DataError(f"token file {path}: {count} tokens, fewer than one sample of seq + 1 "
                        f"= {seq + 1}")
    if vocab is None or scan_bytes <= 0:
        return
    tokens = np.memmap(path, dtype=dtype, mode="r")
    chunk = 1 << 22
    for first in range(0, min(count, scan_bytes // dtype.itemsize), chunk):
        part = np.asarray(tokens[first:first + chunk])
        if part.size and int(part.max()) >= vocab:
            where = first + int(np.argmax(part >= vocab))
            raise DataError(f"token file {path}: id {int(tokens[where])} at token {where} is "
                            f"not below the model's vocabulary {vocab} (wrong --token-dtype, or "
                            "data tokenised for another model?)")


class TokenFile(TokenStream):
    """A flat token file (``uint16``/``uint32`` ids), memory-mapped (module docstring)."""

    def __init__(self, path: str, *, seq: int, global_batch: int, dtype: np.dtype,
                 vocab: int | None = None, seed: int = 0) -> None:
        check_token_file(path, seq=seq, dtype=dtype, vocab=vocab)
        super().__init__(np.memmap(path, dtype=dtype, mode="r"), f"token file {path}", seq=seq,
                         global_batch=global_batch, vocab=vocab, seed=seed)


class SyntheticData:
    """One seeded random global batch, repeated every step (a memorisation smoke test).
    Integer tensors draw from ``[0, spec.high)`` where the spec knows its bound (a user file's
    token ids and class ids: :mod:`fxplan.examples.user_loss`), else from ``[0, high)``."""

    def __init__(self, specs: Mapping[str, Any], *, high: int, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        made: dict[str, torch.Tensor] = {}
        for name, spec in specs.items():
            if spec.dtype.is_floating_point:
                made[name] = torch.randn(spec.shape, generator=generator, dtype=spec.dtype)
            else:
                made[name] = torch.randint(0, getattr(spec, "high", None) or high, spec.shape,
                                           generator=generator, dtype=spec.dtype)
        self.targets = made.pop("targets")
        self.inputs = tuple(made.values())

    def batch(self, step: int, start: int, stop: int) -> Batch:
        return tuple(x[start:stop] for x in self.inputs), self.targets[start:stop]


def replica_coordinates(global_batch: int, start: int, stop: int) -> tuple[int, int]:
    """``(index, count)`` of the data replica that reads samples ``[start, stop)`` of a global
    batch of ``global_batch``: the replicas read equal consecutive slices of ``n = stop − start``
    samples, so there are ``count = B/n`` of them and this one is ``index = start/n``. A rank's
    slice is ``[g·B/R, (g+1)·B/R)`` (``R = dp/cp`` replicas, ``g = ⌊d/cp⌋``:
    :meth:`fxplan.runtime.apply.sharded_module.ShardedModule.replica_slice`), so this gives
    ``(g, R)`` — the CP group, not the dp rank, when ``cp > 1``."""
    size = stop - start
    if size <= 0 or start % size or global_batch % size or stop > global_batch:
        raise ValueError(f"samples [{start}, {stop}) are not one of equal consecutive slices of "
                         f"a global batch of {global_batch}")
    return start // size, global_batch // size


class HookData:
    """This rank's batches from a user's ``build(**context)`` (module docstring)."""

    def __init__(self, spec: str, **context: Any) -> None:
        path, _, function = spec.rpartition(":")
        module_spec = importlib.util.spec_from_file_location("fxplan_user_data", path)
        if module_spec is None or module_spec.loader is None:
            raise DataError(f"--data {spec}: cannot import {path}")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        build = getattr(module, function, None)
        if not callable(build):
            raise DataError(f"--data {spec}: {path} has no function {function!r}")
        self.spec, self.rows = spec, context["stop"] - context["start"]
        made = build(**context)
        try:
            self._iterator: Iterator[Any] = iter(made)
        except TypeError:
            raise DataError(f"--data {spec}: {function}(**context) returned "
                            f"{type(made).__name__}; expected an iterable of (inputs, targets) "
                            "per step (a generator, a DataLoader, a list)") from None

    def skip(self, steps: int) -> None:
        """Draw and drop the items of the first ``steps`` steps (a resumed run: the hook owns
        its order, so its position is reached by replaying it)."""
        for step in range(steps):
            try:
                next(self._iterator)
            except StopIteration:
                raise DataError(f"--data {self.spec}: the iterable ended at step {step + 1} "
                                f"while skipping the {steps} steps a resumed run has done") from None

    def batch(self, step: int, start: int, stop: int) -> Batch:
        try:
            item = next(self._iterator)
        except StopIteration:
            raise DataError(f"--data {self.spec}: the iterable ended before step {step + 1}") from None
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise DataError(f"--data {self.spec}: expected (inputs, targets) per step, got "
                            f"{type(item).__name__}")
        inputs, targets = item
        inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
        for tensor in (*inputs, targets):
            if not isinstance(tensor, torch.Tensor) or tensor.shape[:1] != (stop - start,):
                shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor)
                raise DataError(f"--data {self.spec}: step {step + 1} gave {shape}; expected "
                                f"tensors of {stop - start} rows (this rank's samples "
                                f"{start}–{stop - 1} of the global batch)")
        return inputs, targets
