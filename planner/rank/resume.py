"""A rank's run going on from a checkpoint: the position restored, what differs from the run
that saved it, what rank 0 logs of it, and the newest committed checkpoint of a run directory."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.rank.run import Run

__all__ = ["log_resume", "newest_checkpoint", "restore_position", "resume_notes"]


def restore_position(run: Run, args: argparse.Namespace) -> tuple[Any, list[str]]:
    """The position a ``--resume`` checkpoint holds (parameters, optimizer state, random
    generators and the data position restored — last before training), and what differs from
    the run that saved it; ``(None, [])`` for a fresh run."""
    if run.resume is None:
        return None, []
    from fxplan.runtime.checkpoint.training import load_training_checkpoint

    position, notes = load_training_checkpoint(run.sharded, run.optimizer, *run.resume)
    notes += resume_notes(position, args, run.plan)
    if hasattr(run.data, "skip"):
        run.data.skip(position.step)
    return position, notes


def resume_notes(position: Any, args: argparse.Namespace, plan: Any) -> list[str]:
    """What differs between the checkpoint's run and this one, as lines to print; refuses a
    checkpoint already at or past ``--steps``."""
    from fxplan.runtime.checkpoint.manifest import CheckpointError
    from fxplan.runtime.checkpoint.training import data_identity

    if position.step >= args.steps:
        raise CheckpointError(f"--resume: the checkpoint has done {position.step} steps and "
                              f"--steps is {args.steps} (the total): nothing to train; give "
                              f"--steps > {position.step}")
    notes = []
    if data_identity(args.data) != position.data:
        notes.append(f"the data source differs from the checkpoint's ({position.data} → "
                     f"{data_identity(args.data)}): its order continues at step "
                     f"{position.step + 1}, not at the saved position")
    if args.seed != position.seed:
        notes.append(f"--seed {args.seed} differs from the checkpoint's {position.seed}: the "
                     "data order is another one from here")
    if plan.batch != position.global_batch:
        notes.append(f"the global batch changed ({position.global_batch} → {plan.batch}): "
                     f"step {position.step + 1} reads samples from {position.step * plan.batch}, "
                     f"not from the saved next sample {position.next_sample}")
    if args.optimizer != position.optimizer:
        notes.append(f"--optimizer {args.optimizer} differs from the checkpoint's "
                     f"{position.optimizer}")
    return notes


def log_resume(log: Any, events: Any, position: Any, checkpoint: Any, plan: Any) -> None:
    """Rank 0: the checkpoint resumed from and the samples skipped or replayed, from the data
    position: the checkpoint's next sample against the first global sample this run's first
    step reads (``step · B`` of this plan; :mod:`fxplan.runtime.train.data`)."""
    first = position.step * plan.batch
    skipped, replayed = max(0, first - position.next_sample), max(0, position.next_sample - first)
    log.print(f"resume: checkpoint step {position.step}, next sample {position.next_sample}, "
              f"first sample read {first}: {skipped} skipped, {replayed} replayed")
    events.log("resume", checkpoint_step=position.step, checkpoint=str(checkpoint),
               next_sample=position.next_sample, first_sample=first,
               samples_skipped=skipped, samples_replayed=replayed)


def newest_checkpoint(run_dir: str) -> str | None:
    """``run_dir`` when it holds a committed checkpoint (``--resume`` finds the newest)."""
    from fxplan.runtime.checkpoint.manifest import newest_committed_step

    return run_dir if newest_committed_step(run_dir) is not None else None
