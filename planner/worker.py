"""The process ``fxplan launch`` starts on every rank (``torchrun -m fxplan.worker``).

Builds the plan's model on ``meta`` and materialises only this rank's stages and shards
(values from the seeded single-device initialisation, or from ``--resume CKPT``, a sharded
checkpoint saved under any plan — that is how training goes on after a re-plan for a changed
cluster), applies the plan, and trains with :func:`fxplan.runtime.train.trainer.train` on ``--data``
(a token file, a Hugging Face datasets directory, ``synthetic`` or a ``data.py:build`` hook;
:mod:`fxplan.runtime.train.data`) in the plan's dtype with fp32 master weights (``--dtype``;
:mod:`fxplan.runtime.apply.precision`): AdamW or SGD, warm-up + cosine learning rate, global-norm
clipping. ``--checkpoint-every K`` writes a
training checkpoint (parameters, optimizer state, step and data position, every rank's random
generators) to ``RUN_DIR/checkpoints/step-N/`` every K steps and after the last;
``--resume DIR`` (a run directory, its ``checkpoints/`` or one ``step-N``) verifies the
checkpoint's manifest before anything is unpickled and goes on at exactly the next sample, up to
``--steps`` in all (:mod:`fxplan.runtime.checkpoint.training`). ``--save CKPT`` writes the same
checkpoint at the end to a directory of the user's choosing.

Rank 0 logs every ``--log-every`` steps (:mod:`fxplan.runtime.train.metrics`: loss, grad norm, lr,
tokens/s, TFLOP/s and MFU per device, peak memory and its share of the device) to the terminal
and to ``RUN_DIR/metrics.jsonl``, prints every rank's runtime fallbacks once after the first
step, and at the end the plan's predicted step time, MFU and memory against the measured ones,
also written to ``RUN_DIR/summary.json`` (with the resolved settings in ``run_config.json``).

The parts of the run live in :mod:`fxplan.rank`; this module is the entry point
(:func:`main`, ``python -m fxplan.worker``).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from fxplan.core.errors import UserError
from fxplan.rank.args import parse_args
from fxplan.rank.prepare import prepare_run
from fxplan.rank.resume import restore_position
from fxplan.rank.run_report import announce, summarise
from fxplan.rank.steps import run_steps

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.plan import Plan

__all__ = ["main"]


def main(argv: list[str] | None = None, plan: "Plan | None" = None) -> int:
    """One rank: ``argv`` as the flags above; ``plan`` given (a program ``fxplan plan --emit``
    wrote, which embeds its plan) replaces the positional ``PLAN`` file, which is then left
    out of ``argv``."""
    if plan is not None:
        argv = [os.path.abspath(sys.argv[0]), *(sys.argv[1:] if argv is None else argv)]
    args = parse_args(argv)
    args.plan_object = plan
    args.fallbacks = []   # the process's own fallback lines (the program's: ShardedModule)
    if "TORCHELASTIC_RUN_ID" in os.environ:  # under torchrun: die with it, however it ends
        import signal

        from fxplan.runtime.launch.parent_death import die_with_parent

        die_with_parent(signal.SIGKILL)
    from fxplan.runtime.launch.heartbeat import Heartbeat

    rank = int(os.environ.get("RANK", "0"))
    args.heartbeat = Heartbeat(rank)
    quiet_runtime_log(rank)
    args.heartbeat.beat(0, "start")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    else:  # a CPU rank: its own core(s), and the heap's pages reused from step to step
        from fxplan.core.fallbacks import record_fallback
        from fxplan.runtime.launch.affinity import pin_rank
        from fxplan.runtime.train.heap import keep_heap

        args.affinity, affinity_fallback = pin_rank()   # before gloo starts its threads
        for note in (affinity_fallback, keep_heap()):
            if note:
                record_fallback(args.fallbacks, note)
    from fxplan.runtime.launch.process_group import init_process_group

    init_process_group(backend)  # a fresh store namespace per torchrun restart
    try:
        _train(args)
    except UserError as err:  # under fxplan launch: reported once by the launcher, exit 2
        from fxplan.runtime.launch.rank_errors import INPUT_ERROR_EXIT, report_error

        if not report_error(dist.get_rank(), err):
            raise
        _leave(INPUT_ERROR_EXIT)
    except Exception as err:  # under fxplan launch: one paragraph, the traceback in RUN_DIR
        from fxplan.runtime.launch.rank_errors import FAILURE_EXIT, report_failure

        if not report_failure(dist.get_rank(), err, args.run_dir):
            raise
        _leave(FAILURE_EXIT)
    finally:
        gc.collect()  # drop DTensor/FSDP state before the groups go (clean exit, no SIGABRT)
        dist.destroy_process_group()
    return 0


def _leave(code: int) -> None:
    """Leave a rank that stopped on an error, without the collective teardown (the other
    ranks may wait in one): stdout flushed, multiprocessing's exit finalizers run — they
    release the named semaphores this process made (``torch.fx.Interpreter`` makes a tqdm bar,
    whose class takes a multiprocessing lock), which the resource tracker would otherwise
    report as leaked, after the launcher's paragraph — then ``os._exit``."""
    from multiprocessing import util

    sys.stdout.flush()
    util._run_finalizers(0)   # what the interpreter's exit runs first: priority ≥ 0
    os._exit(code)


def quiet_runtime_log(rank: int) -> None:
    """On a rank other than 0 the ``fxplan.runtime`` logger's lines (each fallback as it is
    recorded) are not printed. Rank 0 prints every rank's fallbacks once after the first step
    (:func:`fxplan.rank.steps.print_fallbacks`) and its own log lines as they come, so the
    other ranks' copies only repeated them, once per rank."""
    import logging

    if rank == 0:
        return
    runtime = logging.getLogger("fxplan.runtime")
    runtime.addHandler(logging.NullHandler())   # handled: logging's last resort stays silent
    runtime.propagate = False


def _train(args: argparse.Namespace) -> None:
    """One rank's run: prepare the sharded model (:func:`fxplan.rank.prepare.prepare_run`),
    restore its position (:func:`fxplan.rank.resume.restore_position`), announce it on rank 0
    (:func:`fxplan.rank.run_report.announce`), run the steps (:func:`fxplan.rank.steps.
    run_steps`), then summarise (:func:`fxplan.rank.run_report.summarise`)."""
    run = prepare_run(args)
    position, notes = restore_position(run, args)
    start_step = 0 if position is None else position.step
    from fxplan.runtime.train.metrics import MetricsLog

    log = MetricsLog(args.run_dir, args.steps, resume_after=start_step if position else None
                     ) if run.rank == 0 else None
    if log is not None:
        announce(run, args, log, position, notes)
    result = run_steps(run, args, log, start_step)
    if log is not None:
        summarise(run, args, log, result)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
