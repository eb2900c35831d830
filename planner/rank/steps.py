"""A rank's training steps: the loop with the heartbeat, checkpoints, injected faults and the
``--save`` checkpoint, and every rank's fallbacks printed once after the first step."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch.distributed as dist

from fxplan.rank.faults import inject_fault
from fxplan.rank.run import Run

__all__ = ["print_fallbacks", "run_steps"]


def run_steps(run: Run, args: argparse.Namespace, log: Any, start_step: int) -> Any:
    """Steps ``start_step + 1 … --steps`` (:func:`fxplan.runtime.train.trainer.train`) with the
    heartbeat, checkpoints every ``--checkpoint-every`` and after the last, injected faults
    (tests), and the ``--save`` checkpoint at the end; the loop's result."""
    from fxplan.runtime.checkpoint.training import TrainPosition, data_identity, \
        save_training_checkpoint
    from fxplan.runtime.train.trainer import train

    plan, sharded = run.plan, run.sharded

    def here(step: int) -> TrainPosition:
        return TrainPosition(step=step, seed=args.seed, global_batch=plan.batch,
                             data=data_identity(args.data), optimizer=args.optimizer,
                             world_size=dist.get_world_size(sharded.group), plan=plan.summary)

    def on_step(step: int) -> None:
        if step == start_step + 1:
            print_fallbacks(sharded, run.rank, args.fallbacks)
        inject_fault(step, run.rank, run.events.attempt, "step")
        args.heartbeat.beat(step, "step")
        every = args.checkpoint_every
        if every and (step % every == 0 or step == args.steps):
            final = Path(args.run_dir) / "checkpoints" / f"step-{step}"
            args.heartbeat.beat(step, "save")
            inject_fault(step, run.rank, run.events.attempt, "save")
            save_training_checkpoint(sharded, run.optimizer, here(step), final,
                                     model=run.identity)
            args.heartbeat.beat(step, "step")
            if log is not None:
                log.print(f"checkpoint: step {step} saved to {final}")

    trace = None if args.trace is None else Path(args.trace) / f"measured-rank{run.rank}.json"
    result, run.optimizer = train(
        sharded, run.data, run.loss, run.config,
        tokens_per_step=plan.batch * (plan.seq or 1), optimizer=run.optimizer, flops=run.flops,
        capacity_gib=plan.estimate.get("capacity_gib"), log=log, on_step=on_step,
        start_step=start_step, trace=trace)
    if trace is not None and log is not None:
        log.print(f"measured trace of steps {start_step + 2}…: {trace.parent}/measured-rank*.json")
    args.heartbeat.beat(args.steps, "end")
    if args.save:
        save_training_checkpoint(sharded, run.optimizer, here(args.steps), args.save,
                                 latest=False, model=run.identity)
        if log is not None:
            log.print(f"saved parameters, optimizer state and data position to {args.save}")
    return result


def print_fallbacks(sharded: Any, rank: int, process: list[str]) -> None:
    """Rank 0 prints the union of every rank's fallbacks (collective), each line once: the
    program's (``sharded.fallbacks``) and the process's own (``process``: the heap's)."""
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, [*sharded.fallbacks, *process])
    if rank != 0:
        return
    lines = list(dict.fromkeys(line for part in gathered for line in part or ()))
    for line in lines:
        print(f"fallback: {line}", flush=True)
