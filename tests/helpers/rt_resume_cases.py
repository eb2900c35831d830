"""Jobs the rank pool runs: periodic training checkpoints, an interrupted run resumed from one
against the run that was not interrupted, and a save that crashes half-way."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

from fxplan.examples.model_spec import resolve_model
from fxplan.examples.models.lm import lm_loss
from fxplan.runtime.checkpoint import training as train_checkpoint
from fxplan.runtime.apply.graph import apply_plan
from fxplan.runtime.apply.build import meta_parameters
from fxplan.runtime.checkpoint.manifest import resolve_checkpoint
from fxplan.runtime.train.data import TokenFile
from fxplan.runtime.train.optim import build_optimizer
from fxplan.runtime.checkpoint.training import (TrainPosition, load_training_checkpoint,
                                             locate_checkpoint, save_training_checkpoint)
from fxplan.core.training import TrainConfig
from fxplan.runtime.train.trainer import train
from rt_plans import SEQ, VOCAB, fixed_batch, make_plan

DATA_SEED = 3


class Interrupted(Exception):
    """Raised by a test's ``on_step`` to stop a run as a crash would."""


def _model(layers: int, dropout: float, meta: bool, kind: str | None = None) -> torch.nn.Module:
    """The tiny GPT (``kind`` None) or the tiny ``hf:llama`` of :mod:`rt_trainer_cases`."""
    from rt_trainer_cases import LLAMA

    torch.manual_seed(0)
    spec = LLAMA if kind == "llama" else \
        f"gpt-tiny:dropout={dropout},seq={SEQ},layers={layers},attention=math"
    with meta_parameters() if meta else contextlib.nullcontext():
        return resolve_model(spec).build("cpu")


def _run(plan: Any, token_file: str, config: TrainConfig, run_dir: Path, *, every: int,
         dropout: float, rng_seed: int, resume: Path | None = None,
         stop_after: int | None = None, kind: str | None = None) -> list[float] | None:
    """One run as the launch worker does it: build (seeded or from ``resume``), train with a
    checkpoint every ``every`` steps, optionally stop right after step ``stop_after``'s
    checkpoint. ``rng_seed`` seeds every rank's generators differently per run, so only a
    restored RNG can reproduce the dropout masks. Returns the losses of the steps run."""
    layers = 2
    example = fixed_batch(plan)[0]
    found = locate_checkpoint(resume) if resume is not None else None
    if found is None:
        sharded = apply_plan(_model(layers, dropout, True, kind), plan, example,
                             init=lambda: _model(layers, dropout, False, kind))
    else:
        sharded = apply_plan(_model(layers, dropout, True, kind), plan, example,
                             checkpoint=str(found[0]))
    if sharded is None:
        return None
    torch.manual_seed(rng_seed + dist.get_rank())
    optimizer = build_optimizer(sharded, config.optimizer, lr=config.lr,
                                weight_decay=config.weight_decay, betas=(config.beta1, config.beta2))
    start = 0
    if found is not None:
        position, _ = load_training_checkpoint(sharded, optimizer, *found)
        start = position.step
    data = TokenFile(token_file, seq=SEQ, global_batch=plan.batch, dtype=np.dtype("uint16"),
                     vocab=VOCAB, seed=DATA_SEED)

    def on_step(step: int) -> None:
        if step % every == 0 or step == config.steps:
            position = TrainPosition(step=step, seed=DATA_SEED, global_batch=plan.batch,
                                     data={"spec": token_file}, optimizer=config.optimizer,
                                     world_size=plan.world_size, plan=plan.summary)
            save_training_checkpoint(sharded, optimizer, position,
                                     run_dir / "checkpoints" / f"step-{step}")
        if step == stop_after:
            raise Interrupted(step)

    losses: list[float] = []
    try:
        result, _ = train(sharded, data, lm_loss, config, tokens_per_step=plan.batch * SEQ,
                          optimizer=optimizer, on_step=on_step, start_step=start)
        losses = result.losses
    except Interrupted:
        pass
    return losses


def resume_matches_uninterrupted(plan_kwargs: dict[str, Any], token_file: str,
                                 config: dict[str, Any], tmp: str, dropout: float = 0.0,
                                 every: int = 10, model: str | None = None
                                 ) -> dict[str, Any] | None:
    """The uninterrupted run; the same run stopped after step ``every``'s checkpoint; a
    resumed run from that checkpoint (other RNG seeds, fresh model and optimizer) to the end.
    Rank 0 reports both loss curves. ``model``: ``"llama"`` for the tiny ``hf:llama``."""
    from rt_trainer_cases import llama_plan

    plan = make_plan(**plan_kwargs) if model is None else llama_plan(**plan_kwargs)
    cfg = TrainConfig(**config)
    root = Path(tmp)
    whole = _run(plan, token_file, cfg, root / "whole", every=every, dropout=dropout,
                 rng_seed=100, kind=model)
    _run(plan, token_file, cfg, root / "cut", every=every, dropout=dropout, rng_seed=100,
         stop_after=every, kind=model)
    resumed = _run(plan, token_file, cfg, root / "cut2", every=every, dropout=dropout,
                   rng_seed=555, resume=root / "cut", kind=model)
    if whole is None or dist.get_rank() != 0:
        return None
    tail = whole[every:]
    return dict(whole=whole, resumed=resumed, max_abs_diff=max(
        abs(a - b) for a, b in zip(tail, resumed)) if len(resumed) == len(tail) else None,
        committed=sorted(p.name for p in (root / "cut" / "checkpoints").iterdir()))


def crash_during_save(plan_kwargs: dict[str, Any], token_file: str, config: dict[str, Any],
                      tmp: str) -> dict[str, Any] | None:
    """Checkpoint every 2 steps; the save of step 4 fails on every rank after DCP wrote its
    files (before the RNG files and the manifest). Reports what the directory holds and the
    step a resume finds."""
    plan = make_plan(**plan_kwargs)
    cfg = TrainConfig(**config)
    run_dir = Path(tmp) / "run"
    real: Callable[..., Any] = train_checkpoint.capture_rng
    calls = {"n": 0}

    def failing(device: torch.device) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:  # the second checkpoint (step 4)
            raise OSError("disk full (simulated)")
        return real(device)

    train_checkpoint.capture_rng = failing
    error = None
    try:
        _run(plan, token_file, cfg, run_dir, every=2, dropout=0.0, rng_seed=1)
    except OSError as err:
        error = str(err)
    finally:
        train_checkpoint.capture_rng = real
    if dist.get_rank() != 0:
        return None
    found, manifest = resolve_checkpoint(run_dir)
    checkpoints = run_dir / "checkpoints"
    staging = [p for p in checkpoints.iterdir() if ".tmp-" in p.name]
    return dict(error=error, entries=sorted(p.name for p in checkpoints.iterdir()),
                latest=(checkpoints / "latest").read_text().strip(), resumes_from=found.name,
                manifest_step=manifest["step"],
                staging_files=sorted(f.name for f in staging[0].iterdir()) if staging else [])


def refused_by_workers(path: str) -> str:
    """``locate_checkpoint`` on every rank: the message each rank raises, or ``""``."""
    from fxplan.runtime.checkpoint.manifest import CheckpointError

    try:
        locate_checkpoint(path)
    except CheckpointError as err:
        return str(err)
    return ""
