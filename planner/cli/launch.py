"""``fxplan launch plan.json [--steps N] [--dry-run]``: train a plan's model under torchrun.

    fxplan launch plan.json --steps 20
    fxplan launch plan.json --nnodes 2 --node-rank 0 --rdzv-endpoint host0:29500
    fxplan launch plan.json --dry-run          # print the torchrun command only
    fxplan launch plan.json --steps 20 --save ckpt/
    fxplan launch new-plan.json --resume ckpt/  # after a re-plan: reshard and go on

Before any process starts the plan is checked against what it will run on: the model of the
plan (``--model`` to run another spec) captured as the search captured it, and the cluster
(``--cluster`` to name another), must have the plan's fingerprints, and ``nnodes ×
nproc-per-node`` must be the plan's world size ``pp·dp·tp`` — otherwise the command ends with a
message saying which and exit code 2. Then ``torchrun -m fxplan.worker`` runs on every
rank (gloo on CPUs, nccl on GPUs); rank 0 prints the per-step loss, step time, tokens/s and peak
memory, then predicted against measured step time and memory.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "launch", help="train a plan's model under torchrun",
        description="Start the plan's model under torchrun with the plan's world size and train "
        "it for a few steps on synthetic data, printing loss, speed, memory and the estimate.")
    parser.add_argument("plan", metavar="PLAN.json", help="plan file written by `fxplan plan -o`")
    parser.add_argument("--steps", type=int, default=10, help="training steps (default 10)")
    parser.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")
    parser.add_argument("--dry-run", action="store_true", help="print the torchrun command only")
    parser.add_argument("--model", help="model spec to run (default: the plan's)")
    parser.add_argument("--resume", metavar="CKPT",
                        help="start from a sharded checkpoint saved under any plan (resharded)")
    parser.add_argument("--save", metavar="CKPT",
                        help="write parameters and optimizer state as a sharded checkpoint at the end")
    parser.add_argument("--cluster", help="cluster spec to check against (default: the plan's)")
    parser.add_argument("--nnodes", type=int, default=1, help="machines (torchrun --nnodes)")
    parser.add_argument("--node-rank", type=int, default=None, help="torchrun --node-rank")
    parser.add_argument("--rdzv-endpoint", default=None, help="torchrun --rdzv-endpoint HOST:PORT")
    parser.add_argument("--nproc-per-node", type=int, default=None,
                        help="processes per machine (default: world size / nnodes)")
    parser.set_defaults(func=run)
    return parser


def check_plan(args: argparse.Namespace):
    """Load the plan and refuse it for another model, cluster or world size (no process yet)."""
    from fxplan.cluster_specs import Cluster
    from fxplan.core.plan import PlanError, load_plan
    from fxplan.api import capture_for_search
    from fxplan.inter_op import training_dtype

    plan = load_plan(args.plan)
    if args.resume and not os.path.isdir(args.resume):
        raise PlanError(f"--resume {args.resume}: no such checkpoint directory (expected one "
                        "written by `fxplan launch … --save DIR`)")
    nproc = args.nproc_per_node
    if nproc is None:
        if plan.world_size % args.nnodes:
            raise PlanError(f"{args.plan} needs world size {plan.world_size}, which {args.nnodes} "
                            "nodes cannot split evenly; give --nproc-per-node")
        nproc = plan.world_size // args.nnodes
    plan.check_matches(world_size=args.nnodes * nproc, source=args.plan)
    cluster = Cluster.load(args.cluster or plan.cluster)
    plan.check_matches(cluster_fingerprint=cluster.fingerprint(), source=args.plan)
    graph = capture_for_search(args.model or plan.model, seq=plan.seq,
                               dtype=training_dtype(cluster))
    plan.check_matches(graph_fingerprint=graph.fingerprint(), source=args.plan)
    return plan, nproc


def torchrun_command(args: argparse.Namespace, nproc: int) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={args.nnodes}",
           f"--nproc-per-node={nproc}"]
    if args.rdzv_endpoint:
        cmd += ["--rdzv-backend=c10d", f"--rdzv-endpoint={args.rdzv_endpoint}"]
    elif args.nnodes == 1:
        cmd += ["--standalone"]
    if args.node_rank is not None:
        cmd += [f"--node-rank={args.node_rank}"]
    cmd += ["-m", "fxplan.worker", os.path.abspath(args.plan),
            "--steps", str(args.steps), "--lr", str(args.lr)]
    for flag in ("model", "resume", "save"):
        value = getattr(args, flag)
        if value:
            cmd += [f"--{flag}", value if flag == "model" else os.path.abspath(value)]
    return cmd


def run(args: argparse.Namespace) -> int:
    plan, nproc = check_plan(args)
    cmd = torchrun_command(args, nproc)
    if args.dry_run:
        print(shlex.join(cmd))
        return 0
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.call(cmd, env=env)
