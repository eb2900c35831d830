"""The torchrun command ``fxplan launch`` starts on this node, and the worker command in it.

One node's command is ``torchrun --nnodes N --nproc-per-node P --rdzv-backend=c10d
--rdzv-endpoint E [flags after --] -m fxplan.worker PLAN --setting value …`` (every run setting
explicit, :func:`worker_command`). Multi-node runs meet at the user's ``--rdzv-endpoint
HOST:PORT``; a single-node run meets on ``127.0.0.1`` at a free port and binds nothing beyond
loopback: ``python -m fxplan.runtime.launch.torchrun`` (torchrun with its store servers bound to
loopback) and ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` set to the loopback interface. The
torchrun flags fxplan sets itself are refused after ``--`` (:data:`OWN_TORCHRUN_FLAGS`).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from fxplan.cli.run_config import LaunchError, RunSettings
from fxplan.core.loopback import loopback_torchrun
from fxplan.core.training import AFFINITY_ENV

__all__ = ["OWN_TORCHRUN_FLAGS", "check_endpoint", "launch_command", "needs_endpoint",
           "passthrough", "shell_line", "trace_dir", "worker_command"]

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


def needs_endpoint(args: argparse.Namespace, nnodes: int, nproc: int) -> str:
    """Why a multi-node launch without ``--rdzv-endpoint`` (or ``--slurm``) is refused."""
    given = f" (--nnodes {args.nnodes})" if args.nnodes is not None else ""
    return (f"{args.plan} runs on {nnodes} nodes × {nproc} processes{given}: a multi-node "
            "launch needs --rdzv-endpoint HOST:PORT, a host and port every node reaches (e.g. the "
            "first node), given the same on every node — or --slurm FILE to write an sbatch script")


def check_endpoint(endpoint: str) -> str:
    """``--rdzv-endpoint HOST:PORT`` as given, once its port is checked (1–65535)."""
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


def affinity_env(args: argparse.Namespace) -> dict[str, str]:
    """``FXPLAN_CPU_AFFINITY`` for the ranks where ``--cpu-affinity`` was given
    (:mod:`fxplan.runtime.launch.affinity`; unset, the worker's default, ``auto``)."""
    mode = getattr(args, "cpu_affinity", None)
    return {AFFINITY_ENV: mode} if mode else {}


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


def launch_command(args: argparse.Namespace, nnodes: int, nproc: int, settings: RunSettings,
                   attempt: int = 0) -> tuple[dict[str, str], list[str]]:
    """``(environment added, argv)`` of the torchrun that runs the plan on this node (its
    ``attempt``-th start under ``--max-restarts``: a fresh port and rendezvous id)."""
    env = {} if "OMP_NUM_THREADS" in os.environ else {"OMP_NUM_THREADS": "1"}
    env.update(affinity_env(args))
    extra = passthrough(args)
    if nnodes > 1 and not args.rdzv_endpoint:
        raise LaunchError(needs_endpoint(args, nnodes, nproc))
    from fxplan.cli.elastic import elastic_torchrun_flags

    nodes_flag, *elastic = elastic_torchrun_flags(args, nnodes, attempt, settings.run_dir, env)
    if args.rdzv_endpoint:
        cmd = [sys.executable, "-m", "torch.distributed.run", nodes_flag,
               f"--nproc-per-node={nproc}", "--rdzv-backend=c10d",
               f"--rdzv-endpoint={check_endpoint(args.rdzv_endpoint)}"]
        if args.node_rank is not None:
            cmd += [f"--node-rank={args.node_rank}"]
    else:
        sockets, cmd = loopback_torchrun(nproc, nodes_flag)
        env.update(sockets)
    return env, cmd + elastic + extra + worker_command(args, settings)


def shell_line(env: dict[str, str], cmd: list[str]) -> str:
    return shlex.join([f"{k}={v}" for k, v in env.items()] + cmd)
