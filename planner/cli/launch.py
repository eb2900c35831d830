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

Single-node runs rendezvous on ``127.0.0.1`` at a free port and nothing listens beyond loopback:
``python -m fxplan.runtime.torchrun`` (torchrun with its store servers bound to loopback) and
``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` set to the loopback interface. The command is
printed before it runs (``--print-command``: printed, not run).

``--trace [DIR]`` writes ``DIR/predicted.json``, the plan's simulated step (:mod:`fxplan.trace`),
before the run, and has every rank record a few steps with :mod:`torch.profiler` into
``DIR/measured-rank<R>.json`` (:func:`fxplan.runtime.trainer.train`), in the same Chrome trace
format, for a side-by-side look (default ``DIR``: ``RUN_DIR/trace``).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fxplan.cli.arguments import output_path
from fxplan.cli.child import run_foreground
from fxplan.core.training import APPLY_PATHS
from fxplan.cli.run_config import SETTINGS, LaunchError, RunSettings, resolve_settings

#: torchrun flags ``fxplan launch`` sets itself: refused after ``--`` (with the flag to use).
OWN_TORCHRUN_FLAGS = {
    "--nnodes": "the plan's cluster gives the node count (--nnodes to check it)",
    "--nproc-per-node": "the plan's cluster gives the processes per node",
    "--standalone": "single-node runs rendezvous on loopback by themselves",
    "--rdzv-backend": "fxplan uses the c10d rendezvous",
    "--rdzv-endpoint": "use fxplan's --rdzv-endpoint HOST:PORT",
    "--node-rank": "use fxplan's --node-rank",
    "--master-addr": "the rendezvous endpoint decides it",
    "--master-port": "the rendezvous endpoint decides it",
    "--local-addr": "fxplan sets it for single-node runs",
    "--module": "fxplan runs -m fxplan.worker",
    "-m": "fxplan runs -m fxplan.worker",
    "--no-python": "fxplan runs -m fxplan.worker",
    "--run-path": "fxplan runs -m fxplan.worker",
    "--rdzv-id": "fxplan gives every supervised attempt its own rendezvous id",
}

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster
    from fxplan.core.plan import Plan


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
    parser.add_argument("--resume", metavar="DIR",
                        help="go on from a checkpoint (a run dir, its checkpoints/ or a step-N "
                        "dir; the latest complete one), saved under any plan, at the next "
                        "sample, up to --steps in all. Checkpoints are trusted input: see "
                        "docs/runtime.md")
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
    from fxplan.cli.elastic import add_elastic_arguments

    add_elastic_arguments(parser)
    parser.set_defaults(func=run, torchrun_args=[])
    parser.epilog = ("torchrun flags go after `--`: fxplan launch plan.json --data tokens.bin "
                     "-- --max-restarts=0 --log-dir=logs")
    return parser


def check_plan(args: argparse.Namespace) -> tuple[Any, int, int, Any]:
    """Load the plan and refuse it for another model, cluster or world size (no process yet).
    Returns ``(plan, nnodes, nproc_per_node, cluster)``."""
    from fxplan.api import capture_for_search
    from fxplan.cluster_specs import Cluster
    from fxplan.core.plan import load_plan
    from fxplan.cost_model.plan_check import check_plan as check_plan_against
    from fxplan.cluster_specs import training_dtype

    plan = load_plan(args.plan)
    cluster = Cluster.load(args.cluster or plan.cluster)
    nnodes, nproc = node_layout(args, plan, cluster)
    plan.check_matches(cluster_fingerprint=cluster.fingerprint(), source=args.plan)
    graph = capture_for_search(args.model or plan.model, seq=plan.seq,
                               dtype=training_dtype(cluster))
    plan.check_matches(graph_fingerprint=graph.fingerprint(), source=args.plan)
    check_plan_against(plan, cluster, graph, source=args.plan)
    from fxplan.runtime.offload import check_runnable

    check_runnable(plan, cluster.device(0).kind)   # offload layout, fp8 on CPU
    from fxplan.runtime.expert_parallel import check_expert_parallel

    check_expert_parallel(plan)                     # ep > 1 with tp > 1: not in the runtime
    return plan, nnodes, nproc, cluster


def check_checkpoints(args: argparse.Namespace, settings: RunSettings) -> str | None:
    """Before any process starts: ``--resume`` names a complete, unaltered fxplan checkpoint
    (manifest and sha256 of every file, checked before anything is unpickled) that has done
    fewer than ``--steps`` steps, and ``--save`` names no existing directory. Returns the
    checkpoint directory ``--resume`` resolves to."""
    from fxplan.runtime.ckpt_manifest import CheckpointError, read_json_file, resolve_checkpoint

    if args.save and os.path.exists(args.save):
        raise LaunchError(f"--save {args.save} exists: a checkpoint is written to a new "
                          "directory and never over another; give a new path")
    if not args.resume:
        return None
    found, manifest = resolve_checkpoint(args.resume)
    step = read_json_file(found, "train_state.json").get("step", manifest.get("step"))
    if not isinstance(step, int) or step >= settings.steps:
        raise CheckpointError(f"--resume {found}: the checkpoint has done {step} steps and "
                              f"--steps is {settings.steps} (the total a resumed run trains "
                              f"to): nothing to train; give --steps > {step}")
    later = sorted(int(m.group(1)) for entry in Path(settings.run_dir, "checkpoints").glob("step-*")
                   if (m := re.fullmatch(r"step-(\d+)", entry.name)) and int(m.group(1)) > step)
    if settings.checkpoint_every and later:
        raise LaunchError(f"--run-dir {settings.run_dir} already holds checkpoints after step "
                          f"{step} (step-{later[0]} …), which this run would write again and a "
                          "committed checkpoint is never overwritten: resume from the latest, "
                          "or give another --run-dir")
    return str(found)


def node_layout(args: argparse.Namespace, plan: Plan, cluster: Cluster) -> tuple[int, int]:
    """Nodes and processes per node: the plan's cluster's, or the user's (the job is then
    replanned for them: docs/elastic.md)."""
    per_node = {cluster.devices_per_node(n) for n in range(cluster.num_nodes)}
    if len(per_node) > 1:
        raise LaunchError(f"cluster {cluster.name} has nodes with {sorted(per_node)} devices: "
                          "torchrun starts the same number of processes on every node, so it "
                          "cannot run this plan (re-plan on a cluster of equal nodes)")
    nnodes, nproc = cluster.num_nodes, per_node.pop()
    for flag, value in (("--nnodes", args.nnodes), ("--nproc-per-node", args.nproc_per_node),
                        ("--node-rank", args.node_rank)):
        if value is not None and value < (0 if flag == "--node-rank" else 1):
            raise LaunchError(f"{flag} {value}: expected an integer ≥ "
                              f"{0 if flag == '--node-rank' else 1}")
    user = (nnodes if args.nnodes is None else args.nnodes,
            nproc if args.nproc_per_node is None else args.nproc_per_node)
    resized = user != (nnodes, nproc)  # replanned by run() (or the workers, --elastic)
    planned = (nnodes, nproc)
    nnodes, nproc = user
    if args.node_rank is not None and args.node_rank >= nnodes:
        raise LaunchError(f"--node-rank {args.node_rank}: the plan runs on {nnodes} node(s), "
                          f"ranks 0–{nnodes - 1}")
    if nnodes > 1 and not args.rdzv_endpoint and not args.slurm:
        raise LaunchError(_needs_endpoint(args, nnodes, nproc))
    if resized:
        print(f"{nnodes} node(s) × {nproc} process(es) = {nnodes * nproc} ranks, the plan's "
              f"cluster {cluster.name} has {planned[0]} × {planned[1]}: replanning for "
              f"{nnodes * nproc} ranks (same model and global batch; docs/elastic.md)", flush=True)
    return nnodes, nproc


def _needs_endpoint(args: argparse.Namespace, nnodes: int, nproc: int) -> str:
    given = f" (--nnodes {args.nnodes})" if args.nnodes is not None else ""
    return (f"{args.plan} runs on {nnodes} nodes × {nproc} processes{given}: a multi-node "
            "launch needs --rdzv-endpoint HOST:PORT, a host and port every node reaches (e.g. the "
            "first node), given the same on every node — or --slurm FILE to write an sbatch script")


def check_endpoint(endpoint: str) -> str:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise LaunchError(f"--rdzv-endpoint {endpoint!r}: expected HOST:PORT with a port in "
                          "1–65535 (e.g. node0:29500)")
    return endpoint


def passthrough(args: argparse.Namespace) -> list[str]:
    """The torchrun flags given after ``--``, refusing those fxplan sets itself."""
    extra = list(args.torchrun_args)
    if extra and not extra[0].startswith("-"):
        raise LaunchError(f"after `--`: {extra[0]!r} is not a torchrun flag (expected e.g. "
                          "-- --max-restarts=0 --log-dir=logs)")
    for token in extra:
        if not token.startswith("-"):
            continue
        name = token.split("=", 1)[0].replace("_", "-")
        if name in OWN_TORCHRUN_FLAGS:
            raise LaunchError(f"torchrun flag {token} after `--`: {OWN_TORCHRUN_FLAGS[name]}")
    return extra


def loopback_interface() -> str:
    """The name of the loopback network interface (``lo`` on Linux, ``lo0`` on macOS)."""
    names = [name for _, name in socket.if_nameindex()]
    for name in ("lo", "lo0"):
        if name in names:
            return name
    raise LaunchError(f"no loopback interface among {names}: a single-node launch binds its "
                      "sockets to loopback; give --rdzv-endpoint HOST:PORT to use another")


def free_loopback_port() -> int:
    """A port free on 127.0.0.1 now (torchrun binds it a moment later)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def settings_for(args: argparse.Namespace) -> RunSettings:
    flags = {name: getattr(args, name, None) for name in SETTINGS}
    stem = Path(args.plan).stem
    default = os.path.join("runs", f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}")
    settings = resolve_settings(flags, args.config, default_run_dir=default)
    data = settings.data
    if data != "synthetic":
        path, sep, function = data.rpartition(":")
        if sep and path.endswith(".py"):
            if not os.path.isfile(path) or not function.isidentifier():
                raise LaunchError(f"--data {data}: expected FILE.py:FUNCTION with an existing "
                                  "file and a function name")
            data = f"{os.path.abspath(path)}:{function}"
        elif os.path.isdir(data):
            data = check_dataset_dir(data)
        elif not os.path.isfile(data):
            raise LaunchError(f"--data {data}: no such file (expected a token file, 'synthetic' "
                              "or FILE.py:FUNCTION)")
        else:
            data = os.path.abspath(data)
    return RunSettings(**{**settings.to_dict(), "data": data,
                          "run_dir": os.path.abspath(settings.run_dir)})


def check_dataset_dir(path: str) -> str:
    """A ``--data`` directory must be a saved Hugging Face dataset with an ``input_ids``
    column (:mod:`fxplan.runtime.hf_data`), checked before any process starts; its absolute
    path."""
    from fxplan.runtime.hf_data import is_dataset_dir, load_token_column

    if not is_dataset_dir(path):
        raise LaunchError(f"--data {path} is a directory without the files "
                          "Dataset.save_to_disk writes (state.json, dataset_info.json or "
                          "dataset_dict.json): expected a Hugging Face datasets directory, a "
                          "token file, 'synthetic' or FILE.py:FUNCTION")
    load_token_column(path)
    return os.path.abspath(path)


def worker_command(args: argparse.Namespace, settings: RunSettings) -> list[str]:
    """``-m fxplan.worker PLAN --flag value …``: every setting explicit."""
    cmd = ["-m", "fxplan.worker", os.path.abspath(args.plan)]
    for name, value in settings.to_dict().items():
        if value is not None:
            cmd += ["--" + name.replace("_", "-"), str(value)]
    for flag in ("model", "resume", "save"):
        value = getattr(args, flag)
        if value:
            cmd += [f"--{flag}", value if flag == "model" else os.path.abspath(value)]
    if getattr(args, "elastic", None) or getattr(args, "max_restarts", 0):
        cmd += ["--auto-resume"]  # a restarted or requeued attempt goes on from the newest
    if getattr(args, "trace", None) is not None:
        cmd += ["--trace", trace_dir(args, settings)]
    return cmd


def trace_dir(args: argparse.Namespace, settings: RunSettings) -> str:
    """Where ``--trace`` writes: its directory, or ``RUN_DIR/trace``."""
    return os.path.abspath(args.trace or os.path.join(settings.run_dir, "trace"))


def write_predicted_trace(plan: Plan, cluster: Cluster, model: str | None, directory: str) -> str:
    """``DIR/predicted.json``: the plan's simulated step (:mod:`fxplan.trace`)."""
    from fxplan.api import capture_for_search
    from fxplan.cluster_specs import training_dtype
    from fxplan.plots import plan_title, simulate_plan
    from fxplan.trace import predicted_trace, write_trace

    graph = capture_for_search(model or plan.model, seq=plan.seq, dtype=training_dtype(cluster))
    result = simulate_plan(plan, graph, cluster)
    return str(write_trace(predicted_trace(result, title=plan_title(plan)),
                           Path(directory) / "predicted.json"))


def launch_command(args: argparse.Namespace, nnodes: int, nproc: int, settings: RunSettings,
                   attempt: int = 0) -> tuple[dict[str, str], list[str]]:
    """``(environment added, argv)`` of the torchrun that runs the plan on this node (its
    ``attempt``-th start under ``--max-restarts``: a fresh port and rendezvous id)."""
    env = {} if "OMP_NUM_THREADS" in os.environ else {"OMP_NUM_THREADS": "1"}
    extra = passthrough(args)
    if nnodes > 1 and not args.rdzv_endpoint:
        raise LaunchError(_needs_endpoint(args, nnodes, nproc))
    from fxplan.cli.elastic import elastic_torchrun_flags

    nodes_flag, *elastic = elastic_torchrun_flags(args, nnodes, attempt, settings.run_dir, env)
    cmd = [sys.executable, "-m"]
    if args.rdzv_endpoint:
        cmd += ["torch.distributed.run", nodes_flag, f"--nproc-per-node={nproc}",
                "--rdzv-backend=c10d", f"--rdzv-endpoint={check_endpoint(args.rdzv_endpoint)}"]
        if args.node_rank is not None:
            cmd += [f"--node-rank={args.node_rank}"]
    else:
        loopback = loopback_interface()
        for key in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            if key not in os.environ:
                env[key] = loopback
        cmd += ["fxplan.runtime.torchrun", nodes_flag, f"--nproc-per-node={nproc}",
                "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_loopback_port()}",
                "--local-addr=127.0.0.1"]
    return env, cmd + elastic + extra + worker_command(args, settings)


def shell_line(env: dict[str, str], cmd: list[str]) -> str:
    return shlex.join([f"{k}={v}" for k, v in env.items()] + cmd)


def write_slurm(args: argparse.Namespace, plan: Plan, cluster: Cluster, nnodes: int, nproc: int,
                settings: RunSettings) -> int:
    from fxplan.cli.elastic import parse_elastic
    from fxplan.cli.slurm import sbatch_script

    if args.rdzv_endpoint or args.node_rank is not None:
        raise LaunchError("--slurm puts the rendezvous on the allocation's first node and lets "
                          "it number the nodes: leave out --rdzv-endpoint and --node-rank")
    gpus = cluster.device(0).kind == "gpu"
    env = {"OMP_NUM_THREADS": "1"} if not gpus else {}
    text = sbatch_script(
        job_name=f"fxplan-{Path(args.plan).stem}", nnodes=nnodes, nproc_per_node=nproc, gpus=gpus,
        torchrun=[sys.executable, "-m", "torch.distributed.run", *passthrough(args)],
        worker=worker_command(args, settings), env=env, run_dir=settings.run_dir,
        requeue=args.max_restarts, elastic=parse_elastic(args.elastic) if args.elastic else None)
    Path(args.slurm).write_text(text)
    print(f"wrote {args.slurm}: {nnodes} node(s) × {nproc} process(es) of {plan.summary}; "
          f"submit it with `sbatch {args.slurm}`")
    return 0


def run(args: argparse.Namespace) -> int:
    from fxplan.cli.elastic import resume_newest

    settings = settings_for(args)
    resume_newest(args, settings.run_dir)
    resume = check_checkpoints(args, settings)
    if resume is not None:
        print(f"resume: {resume} (manifest and file hashes verified)", flush=True)
    plan, nnodes, nproc, cluster = check_plan(args)
    if args.slurm:
        return write_slurm(args, plan, cluster, nnodes, nproc, settings)
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
    if args.max_restarts or args.elastic:
        from fxplan.cli.elastic import run_supervised

        return run_supervised(args, settings.run_dir, lambda attempt: (
            (env, cmd) if attempt == 0 else launch_command(args, nnodes, nproc, settings, attempt)))
    return run_foreground(cmd, {**os.environ, **env})
