"""The data a rank reads (``--data``: a token file, a Hugging Face datasets directory, arrays
named after the model's inputs, ``synthetic`` or a ``FILE.py:FUNCTION`` hook), and the model's
inputs at the plan's batch."""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch

__all__ = ["data_source", "example_batch", "input_specs"]


def data_source(args: argparse.Namespace, bundle: Any, plan: Any, start: int, stop: int) -> Any:
    """The ``--data`` source for this rank (:mod:`fxplan.runtime.train.data`)."""
    from fxplan.runtime.train.data import (DataError, HookData, SyntheticData, TokenFile,
                                     replica_coordinates, token_dtype)
    from fxplan.runtime.train.array_data import is_array_data, model_array_data
    from fxplan.runtime.train.hf_data import HFDataset, is_dataset_dir

    specs = input_specs(bundle, plan)
    vocab = (getattr(bundle.config, "vocab", None) or getattr(bundle.config, "vocab_size", None)
             or getattr(specs.get("targets"), "high", None))   # a user file's: its output's
    if args.data == "synthetic":
        return SyntheticData(specs, high=vocab or 2, seed=args.seed)
    path, sep, function = args.data.rpartition(":")
    if sep and path.endswith(".py"):
        replica, replicas = replica_coordinates(plan.batch, start, stop)   # (d/cp, dp/cp)
        return HookData(args.data, seq=plan.seq, global_batch=plan.batch, start=start, stop=stop,
                        seed=args.seed, dp_rank=replica, dp_size=replicas)
    if is_array_data(args.data) and not is_dataset_dir(args.data):
        return model_array_data(args.data, specs, bundle.config, global_batch=plan.batch,
                                seed=args.seed)
    inputs = {k: v for k, v in specs.items() if k != "targets"}
    shapes = [(tuple(v.shape), v.dtype) for v in inputs.values()]
    if len(inputs) != 1 or shapes[0][1].is_floating_point or len(shapes[0][0]) != 2:
        raise DataError(f"--data {args.data}: token data feeds a language model (one integer "
                        f"input of shape (batch, seq)); {plan.model} takes {shapes}. Give it "
                        f"arrays named after its inputs and the targets instead (FILE.npz, "
                        f"FILE.pt or a directory of NAME.npy files; docs/runtime.md), or "
                        f"FILE.py:FUNCTION")
    if os.path.isdir(args.data):
        return HFDataset(args.data, seq=plan.seq, global_batch=plan.batch, vocab=vocab,
                         seed=args.seed)
    return TokenFile(args.data, seq=plan.seq, global_batch=plan.batch,
                     dtype=token_dtype(args.token_dtype, vocab), vocab=vocab, seed=args.seed)


def input_specs(bundle: Any, plan: Any) -> dict[str, Any]:
    """The bundle's inputs at the plan's batch, with the targets of the loss; an ``hf:``
    model's ``labels`` become the ``targets`` of the worker's loss (the model is run without
    them: logits out). A user file's bundle names its targets itself (given by ``build()`` or
    derived from the output: :mod:`fxplan.examples.user_loss`)."""
    specs = dict(bundle.example_inputs(plan.batch, plan.seq))
    if "labels" in specs and "targets" not in specs:
        specs["targets"] = specs.pop("labels")
    return specs


def example_batch(bundle: Any, plan: Any) -> dict[str, torch.Tensor]:
    """Zero tensors of the plan's global batch: shapes for tracing and stage metadata."""
    return {name: torch.zeros(spec.shape, dtype=spec.dtype)
            for name, spec in input_specs(bundle, plan).items()}
