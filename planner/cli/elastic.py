"""``fxplan launch … --elastic MIN:MAX --max-restarts N``: the launch flags of elastic training.

- ``--max-restarts N``: ``fxplan launch`` supervises torchrun itself
  (:mod:`fxplan.runtime.launch.supervisor`): torchrun runs with ``--max-restarts=0``; when it exits
  non-zero (a worker died), every process of that attempt is ended and a fresh torchrun starts —
  on one node a new free loopback port, on many a new rendezvous id
  ``fxplan-<run>-<attempt>`` (``<run>``: ``$FXPLAN_JOB_ID``, else ``$SLURM_JOB_ID``, else a
  hash of the run directory; the same on every node that runs the same command) — up to ``N``
  times. Each attempt's workers get ``FXPLAN_ATTEMPT=k`` and ``--auto-resume``: they go on from
  the newest committed checkpoint of the run directory and replan when the world they got is
  not the plan's.
- A world other than the plan's that is known at launch (``--nproc-per-node``/``--nnodes``
  other than the plan's cluster, without ``--elastic``): the launcher replans before any
  process starts (:func:`replan_before_start`; the model is captured already for the plan
  check, so this is the search alone) and the workers run the new plan. A replan that finds
  nothing (e.g. 3 ranks for a batch of 8) is refused here, exit code 2.
- ``--elastic MIN:MAX``: torchrun's ``--nnodes=MIN:MAX`` with the c10d rendezvous (needs
  ``--rdzv-endpoint``: nodes that join a loopback rendezvous are this machine alone, so on one
  node it is ``--nnodes=1``), and ``--auto-resume``. The workers replan for the nodes that
  joined (docs/elastic.md).
"""

from __future__ import annotations

import argparse
import hashlib
import os
from typing import TYPE_CHECKING, Callable

from fxplan.cli.run_config import LaunchError

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.plan import Plan
    from fxplan.runtime.launch.heartbeat import StepWatch

__all__ = ["add_elastic_arguments", "parse_elastic", "elastic_torchrun_flags", "rdzv_id",
           "run_supervised", "replan_before_start", "resume_newest"]


def add_elastic_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("elastic and fault-tolerant training (docs/elastic.md)")
    group.add_argument("--elastic", metavar="MIN:MAX", default=None,
                       help="nodes the job may run on (torchrun --nnodes MIN:MAX, c10d "
                       "rendezvous); the workers replan for the world they get and go on from "
                       "the newest checkpoint of --run-dir")
    group.add_argument("--max-restarts", type=int, default=0, metavar="N",
                       help="restart a failed job up to N times as a fresh torchrun (new port / "
                       "rendezvous id), resuming from the newest checkpoint (default 0)")


def parse_elastic(text: str) -> tuple[int, int]:
    """``"1:4"`` → ``(1, 4)``; ``"2"`` → ``(2, 2)``; refuses anything else."""
    low, _, high = text.partition(":")
    try:
        pair = int(low), int(high or low)
    except ValueError:
        pair = (0, 0)
    if not 1 <= pair[0] <= pair[1]:
        raise LaunchError(f"--elastic {text!r}: expected MIN:MAX node counts with "
                          "1 ≤ MIN ≤ MAX (e.g. 1:4)")
    return pair


def rdzv_id(run_dir: str, attempt: int) -> str:
    """``fxplan-<run>-<attempt>``: a rendezvous id the nodes of one attempt share (module
    docstring) and no other attempt uses."""
    run = os.environ.get("FXPLAN_JOB_ID") or os.environ.get("SLURM_JOB_ID") or \
        hashlib.sha1(os.path.abspath(run_dir).encode()).hexdigest()[:10]
    return f"fxplan-{run}-{attempt}"


def elastic_torchrun_flags(args: argparse.Namespace, nnodes: int, attempt: int, run_dir: str,
                           env: dict[str, str]) -> list[str]:
    """``[--nnodes=…, further flags]`` of torchrun for this launch; sets ``FXPLAN_ATTEMPT`` in
    ``env`` when supervised."""
    nodes = f"--nnodes={nnodes}"
    if args.elastic:
        low, high = parse_elastic(args.elastic)
        if args.rdzv_endpoint:
            nodes = f"--nnodes={low}:{high}"
        elif low > 1:
            raise LaunchError(f"--elastic {args.elastic}: at least {low} nodes, but without "
                              "--rdzv-endpoint HOST:PORT the rendezvous is on loopback, which "
                              "only this machine reaches; give --rdzv-endpoint")
    if args.max_restarts < 0:
        raise LaunchError(f"--max-restarts {args.max_restarts}: expected an integer ≥ 0")
    if not (args.max_restarts or args.elastic):
        return [nodes]
    if any(t.split("=", 1)[0].replace("_", "-") == "--max-restarts" for t in args.torchrun_args):
        raise LaunchError("torchrun's --max-restarts after `--`: with fxplan's --max-restarts "
                          "or --elastic, fxplan restarts a failed job as a fresh torchrun; use "
                          "fxplan's --max-restarts N")
    env["FXPLAN_ATTEMPT"] = str(attempt)
    return [nodes, "--max-restarts=0", f"--rdzv-id={rdzv_id(run_dir, attempt)}"]


def run_supervised(args: argparse.Namespace, run_dir: str,
                   make_attempt: Callable[[int], "tuple[dict[str, str], list[str]]"],
                   watch: "StepWatch | None" = None,
                   input_error: "Callable[[], str | None] | None" = None) -> int:
    """Run the launch under :func:`fxplan.runtime.launch.supervisor.supervise` (``watch``: the step
    watchdog; ``input_error``: the workers' input-error report, which ends it unrestarted)."""
    from fxplan.runtime.launch.supervisor import supervise

    def say(text: str) -> None:
        print(f"fxplan launch: {text}", flush=True)

    return supervise(make_attempt, max_restarts=args.max_restarts, run_dir=run_dir, say=say,
                     watch=watch, input_error=input_error)


def replan_before_start(args: argparse.Namespace, plan: "Plan", world: int, run_dir: str
                        ) -> "tuple[argparse.Namespace, Plan]":
    """Replan ``plan`` for ``world`` ranks (:func:`fxplan.replan.replan`), report it, write the
    new plan to ``RUN_DIR/plans/plan-world{N}.json`` and log the ``replan`` event; returns
    ``args`` with ``plan`` naming the new file, and the new plan. With ``--print-command``
    nothing is written and ``(args, plan)`` are returned as they are (the printed command's
    workers replan at start)."""
    from pathlib import Path

    from fxplan.replan import replan, report_replan
    from fxplan.runtime.train.events import EventLog

    found = replan(plan, world=world)

    def say(text: str) -> None:
        print(text, flush=True)

    if args.print_command:
        report_replan(found, say, None)
        return args, plan
    path = Path(run_dir) / "plans" / f"plan-world{world}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    found.new.save(path)
    report_replan(found, say, EventLog(run_dir))
    say(f"replan: new plan written to {path}")
    return argparse.Namespace(**{**vars(args), "plan": str(path)}), found.new


def resume_newest(args: argparse.Namespace, run_dir: str) -> None:
    """Under ``--max-restarts``/``--elastic`` without ``--resume``: a run directory that holds a
    committed checkpoint is resumed from it (a re-run or requeued job goes on), checked by the
    launch before any process starts like any ``--resume``."""
    from fxplan.runtime.checkpoint.manifest import newest_committed_step

    if (args.max_restarts or args.elastic) and not args.resume and \
            newest_committed_step(run_dir) is not None:
        args.resume = run_dir
