"""``fxplan launch plan.json --data …``: train a plan's model under torchrun.

    fxplan launch plan.json --data tokens.bin --steps 1000 --run-dir runs/a
    fxplan launch plan.json --data synthetic --steps 20          # smoke test: one batch, repeated
    fxplan launch plan.json --data ds_dir --steps 1000           # Dataset.save_to_disk, input_ids
    fxplan launch plan.json --data tokens.bin --dtype fp32       # mixed precision off
    fxplan launch plan.json --data tokens.bin --path graph       # the graph rewrite, not the module
    fxplan launch plan.json --config run.toml --lr 1e-4          # flags override the run config
    fxplan launch plan.json --data tokens.bin --print-command     # print exactly what would run
    fxplan launch plan.json --data tokens.bin --rdzv-endpoint node0:29500   # on every node
    fxplan launch plan.json --data tokens.bin --slurm train.sbatch          # write an sbatch script
    fxplan launch plan.json --data tokens.bin -- --max-restarts=0 --log-dir=logs  # torchrun flags
    fxplan launch plan.json --data tokens.bin --steps 1000 --run-dir runs/a --checkpoint-every 100
    fxplan launch plan.json --data tokens.bin --steps 1000 --run-dir runs/a --resume runs/a
    fxplan launch plan.json --data synthetic --steps 5 --run-dir runs/a --trace   # runs/a/trace/
    fxplan launch plan.json --data tokens.bin --run-dir runs/a --checkpoint-every 100 \\
        --max-restarts 3                                                 # restart on failure
    fxplan launch plan4.json --data tokens.bin --nproc-per-node 2 --resume runs/a  # replanned

Before any process starts the plan is checked against what it will run on: the model of the
plan (``--model`` to run another spec) captured as the search captured it, and the cluster
(``--cluster`` to name another), must have the plan's fingerprints; the node count and the
processes per node come from that cluster. ``--nnodes``/``--nproc-per-node`` other than the
cluster's make a world other than the plan's ``pp·dp·tp``: the job is replanned for it (same
model and global batch; ``fxplan.cli.elastic``, docs/elastic.md). ``--max-restarts N`` restarts
a failed job from its newest checkpoint; ``--elastic MIN:MAX`` lets the nodes that join decide
the world. A launch over more
than one node needs ``--rdzv-endpoint HOST:PORT`` (or ``--slurm``). Any refusal is one message
with exit code 2. So is a ``--resume`` directory that is not a complete fxplan checkpoint
(manifest and sha256 of every file, checked before anything is unpickled: checkpoints are
trusted input, docs/runtime.md "Checkpoints and the trust boundary").

The run directory is one run's (:mod:`fxplan.cli.run_dir`): it is locked for the launch's
lifetime, and a directory holding a previous run is refused unless ``--resume`` (no argument:
its own newest checkpoint) or ``--overwrite`` is given. Data that cannot feed the model (an
empty, odd-length or too short token file, ids beyond the vocabulary) and a checkpoint of
another model (the manifest's model fingerprint) are refused before any process starts. While
it runs, torchrun dies with the launcher and the workers with torchrun
(:mod:`fxplan.runtime.launch.parent_death`); a rank that finishes no step for ``--step-timeout``
seconds ends the attempt (:mod:`fxplan.runtime.launch.heartbeat`; restarted under
``--max-restarts``); an input error only a worker sees is printed once, exit code 2, no
restart spent (:mod:`fxplan.runtime.launch.rank_errors`). docs/elastic.md has the details.

Single-node runs rendezvous on ``127.0.0.1`` at a free port and nothing listens beyond loopback:
``python -m fxplan.runtime.launch.torchrun`` (torchrun with its store servers bound to loopback) and
``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` set to the loopback interface. The command is
printed before it runs (``--print-command``: printed, not run).

``--trace [DIR]`` writes ``DIR/predicted.json``, the plan's simulated step (:mod:`fxplan.report.trace`),
before the run, and has every rank record a few steps with :mod:`torch.profiler` into
``DIR/measured-rank<R>.json`` (:func:`fxplan.runtime.train.trainer.train`), in the same Chrome trace
format, for a side-by-side look (default ``DIR``: ``RUN_DIR/trace``).

Modules: the pre-flight checks are :mod:`fxplan.cli.launch_checks`, the torchrun and worker
command :mod:`fxplan.cli.torchrun_command`, the sbatch script :mod:`fxplan.cli.slurm`; their
public names stay importable from here.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from fxplan.cli.arguments import output_path
from fxplan.cli.child import run_foreground
from fxplan.cli.launch_checks import (check_checkpoints, check_data, check_plan,
                                      check_resume_model, set_aside, settings_for)
from fxplan.cli.run_config import LaunchError, RunSettings
from fxplan.cli.run_dir import claim_run_dir
from fxplan.cli.slurm import write_slurm
from fxplan.cli.torchrun_command import launch_command, shell_line, trace_dir
from fxplan.core.training import AFFINITY_MODES, APPLY_PATHS

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster
    from fxplan.core.plan import Plan

__all__ = ["register", "run", "write_predicted_trace"]


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "launch", help="train a plan's model under torchrun",
        description="Start the plan's model under torchrun on the plan's nodes and processes and "
        "train it on a token file (or synthetic data or a hook), logging loss, gradient norm, "
        "learning rate, throughput, MFU and memory; compare with the plan's estimate at the end.")
    parser.add_argument("plan", metavar="PLAN.json", help="plan file written by `fxplan plan -o`")
    train = parser.add_argument_group("training (flags override --config)")
    train.add_argument("--config", metavar="RUN.toml", help="run config (TOML); see docs/runtime.md")
    train.add_argument("--data", help="tokens.bin (flat uint16/uint32 token ids, memory-mapped), "
                       "a Hugging Face datasets directory (save_to_disk, an input_ids column), "
                       "'synthetic' (one random batch, repeated) or data.py:build (a hook)")
    train.add_argument("--dtype", choices=("plan", "bf16", "fp16", "fp32"),
                       help="compute dtype (default plan: the plan's training dtype, with fp32 "
                       "master weights, optimizer state and gradient reduction; fp32: mixed "
                       "precision off)")
    train.add_argument("--path", choices=APPLY_PATHS,
                       help="how the plan is applied, as fxplan.plan(path=...): module (the "
                       "user's own module with PyTorch's parallel pieces; refused with the reason "
                       "when the plan cannot run so), graph (the graph rewrite), or auto "
                       "(default: module where the plan allows it, else graph, the reason "
                       "printed as a fallback)")
    train.add_argument("--token-dtype", choices=("auto", "uint16", "uint32"),
                       help="token file element type (default auto: uint16 if the vocabulary fits)")
    train.add_argument("--steps", type=int, help="training steps (default 10)")
    train.add_argument("--seed", type=int, help="seed of the data order (default 0)")
    train.add_argument("--optimizer", choices=("adamw", "sgd"), help="default adamw")
    train.add_argument("--lr", type=float, help="peak learning rate (default 1e-3)")
    train.add_argument("--min-lr", type=float, help="end of the cosine decay (default lr/10)")
    train.add_argument("--warmup-steps", type=int, help="linear warm-up steps (default 0)")
    train.add_argument("--weight-decay", type=float, help="AdamW weight decay (default 0.1)")
    train.add_argument("--beta1", type=float, help="AdamW β1 (default 0.9)")
    train.add_argument("--beta2", type=float, help="AdamW β2 (default 0.95)")
    train.add_argument("--grad-clip", type=float,
                       help="max global gradient norm (default 1.0; 0: no clipping)")
    train.add_argument("--log-every", type=int, help="log every N steps (default 1)")
    train.add_argument("--run-dir", help="metrics.jsonl, summary.json, run_config.json, "
                       "checkpoints/ (default runs/PLAN-TIME)")
    train.add_argument("--checkpoint-every", type=int, metavar="K",
                       help="write RUN_DIR/checkpoints/step-N every K steps and at the end "
                       "(default 0: none)")
    parser.add_argument("--model", help="model spec to run (default: the plan's)")
    parser.add_argument("--resume", metavar="DIR", nargs="?", const="",
                        help="go on from a checkpoint (a run dir, its checkpoints/ or a step-N "
                        "dir; the latest complete one; without DIR: --run-dir's), saved under "
                        "any plan, at the next sample, up to --steps in all. Checkpoints are "
                        "trusted input: see docs/runtime.md")
    parser.add_argument("--overwrite", action="store_true",
                        help="start afresh in a --run-dir that holds a previous run: its "
                        "metrics, summary, events, plans and checkpoints are removed first "
                        "(without --resume or --overwrite such a directory is refused)")
    parser.add_argument("--step-timeout", type=float, default=None, metavar="SECONDS",
                        help="end the attempt (and restart it under --max-restarts) when a "
                        "rank finishes no step for this long after its first (default: 5 "
                        "predicted step times, at least 60 s; 0: no watchdog)")
    parser.add_argument("--save", metavar="CKPT",
                        help="write a training checkpoint (parameters, optimizer state, data "
                        "position) to a new directory CKPT at the end")
    parser.add_argument("--cluster", help="cluster spec to check against (default: the plan's)")
    parser.add_argument("--trace", nargs="?", const="", default=None, metavar="DIR",
                        help="record a few steps with torch.profiler: DIR/measured-rank<R>.json "
                        "per rank, beside DIR/predicted.json, the plan's predicted step (Chrome "
                        "trace format; default DIR: RUN_DIR/trace)")
    where = parser.add_argument_group("where it runs")
    where.add_argument("--print-command", "--dry-run", dest="print_command", action="store_true",
                       help="print exactly the command that would run, and stop")
    where.add_argument("--slurm", metavar="FILE", type=output_path(), help="write an sbatch script running the plan "
                       "on its nodes (one torchrun per node under srun), and stop")
    where.add_argument("--nnodes", type=int, default=None,
                       help="machines; must equal the plan's cluster (default: from the cluster)")
    where.add_argument("--nproc-per-node", type=int, default=None,
                       help="processes per machine (default: the cluster's devices per node)")
    where.add_argument("--node-rank", type=int, default=None, help="torchrun --node-rank")
    where.add_argument("--rdzv-endpoint", default=None,
                       help="HOST:PORT every node reaches (required for more than one node)")
    where.add_argument("--cpu-affinity", choices=AFFINITY_MODES, default=None,
                       help="CPU ranks: auto (default) pins each rank to a core, round robin, "
                       "where there are more ranks than cores; core pins every rank (a block of "
                       "cores each); none leaves placement to the scheduler "
                       "(fxplan.runtime.launch.affinity)")
    from fxplan.cli.elastic import add_elastic_arguments

    add_elastic_arguments(parser)
    parser.set_defaults(func=run, torchrun_args=[])
    parser.epilog = ("torchrun flags go after `--`: fxplan launch plan.json --data tokens.bin "
                     "-- --max-restarts=0 --log-dir=logs")
    return parser


def write_predicted_trace(plan: Plan, cluster: Cluster, model: str | None, directory: str) -> str:
    """``DIR/predicted.json``: the plan's simulated step (:mod:`fxplan.report.trace`)."""
    from fxplan.api import capture_for_search
    from fxplan.cluster_specs import training_dtype
    from fxplan.plan_context import simulate_plan
    from fxplan.report.plots import plan_title
    from fxplan.report.trace import predicted_trace, write_trace

    graph = capture_for_search(model or plan.model, seq=plan.seq, dtype=training_dtype(cluster))
    result = simulate_plan(plan, graph, cluster)
    return str(write_trace(predicted_trace(result, title=plan_title(plan)),
                           Path(directory) / "predicted.json"))


def run(args: argparse.Namespace) -> int:
    from fxplan.cli.elastic import resume_newest

    settings = settings_for(args)
    if args.resume == "":  # a bare --resume: the run directory's own checkpoints
        args.resume = settings.run_dir
    if args.resume and args.overwrite:
        raise LaunchError("--resume and --overwrite: one goes on with the run directory, the "
                          "other starts it afresh; give one")
    if args.step_timeout is not None and not (args.step_timeout >= 0 and
                                              math.isfinite(args.step_timeout)):
        raise LaunchError(f"--step-timeout {args.step_timeout}: expected a finite number of "
                          "seconds ≥ 0 (0: no watchdog)")
    if not args.overwrite:
        resume_newest(args, settings.run_dir)
    refused: list[Path] = []
    resume = check_checkpoints(args, settings, refused)
    if resume is not None:
        print(f"resume: {resume} (manifest and file hashes verified)", flush=True)
    plan, nnodes, nproc, cluster = check_plan(args)
    check_data(settings, plan, args.model or plan.model)
    if resume is not None:
        check_resume_model(resume, args.model or plan.model)
    if args.slurm:
        return write_slurm(args, plan, cluster, nnodes, nproc, settings)
    if args.print_command:
        return _start(args, plan, cluster, nnodes, nproc, settings)
    with claim_run_dir(settings.run_dir, resume=bool(args.resume), overwrite=args.overwrite,
                       per_host=nnodes > 1):
        set_aside(refused)
        return _start(args, plan, cluster, nnodes, nproc, settings)


def _start(args: argparse.Namespace, plan: "Plan", cluster: "Cluster", nnodes: int, nproc: int,
           settings: RunSettings) -> int:
    """Replan when the world is known to differ, then print (``--print-command``) or run the
    torchrun command, watched (module docstring)."""
    if nnodes * nproc != plan.world_size and not args.elastic:  # known now: replan here
        from fxplan.cli.elastic import replan_before_start

        args, plan = replan_before_start(args, plan, nnodes * nproc, settings.run_dir)
    env, cmd = launch_command(args, nnodes, nproc, settings)
    line = shell_line(env, cmd)
    if args.print_command:
        print(line)
        return 0
    if args.trace is not None:
        written = write_predicted_trace(plan, cluster, args.model, trace_dir(args, settings))
        print(f"predicted trace written to {written}", flush=True)
    print(f"running: {line}", flush=True)
    from fxplan.runtime.launch.heartbeat import STATUS_DIR_ENV, StepWatch, default_step_timeout
    from fxplan.runtime.launch.rank_errors import (read_failures, read_reports, summarize,
                                            summarize_failures)

    status = tempfile.mkdtemp(prefix="fxplan-status-")
    try:
        timeout = args.step_timeout if args.step_timeout is not None else \
            default_step_timeout(_largest(plan.estimate.get("step_time_s")))
        watch = StepWatch(status, timeout) if timeout else None
        watched = {STATUS_DIR_ENV: status}

        def input_error() -> str | None:
            reports = read_reports(status)
            return summarize(reports) if reports else None

        if args.max_restarts or args.elastic:
            from fxplan.cli.elastic import run_supervised

            def attempt_command(attempt: int) -> tuple[dict[str, str], list[str]]:
                made = (env, cmd) if attempt == 0 else \
                    launch_command(args, nnodes, nproc, settings, attempt)
                return {**made[0], **watched}, made[1]

            code = run_supervised(args, settings.run_dir, attempt_command, watch, input_error)
        else:
            code = run_foreground(cmd, {**os.environ, **env, **watched}, watch=watch,
                                  say=lambda text: print(f"fxplan launch: {text}", flush=True))
        refusal = input_error() if code else None
        if refusal:
            raise WorkerInputError(refusal)
        failures = read_failures(status) if code else []
        if failures:   # once, not every rank's traceback: those are in the run directory
            print(f"fxplan launch: {summarize_failures(failures)}", file=sys.stderr, flush=True)
        return code
    finally:
        shutil.rmtree(status, ignore_errors=True)


class WorkerInputError(LaunchError):
    """An input error a worker reported (:mod:`fxplan.runtime.launch.rank_errors`): exit code 2."""


def _largest(value: object) -> float | None:
    """A scalar estimate, or the largest of a per-stage list (``None`` when absent)."""
    if isinstance(value, (list, tuple)):
        return max(value) if value else None
    return float(value) if isinstance(value, (int, float)) else None
