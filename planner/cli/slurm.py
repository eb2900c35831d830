"""``fxplan launch --slurm FILE``: an sbatch script that runs the plan on its nodes.

The script asks Slurm for the plan's nodes with one task per node; ``srun`` starts one torchrun
on each, all meeting at a c10d rendezvous on the allocation's first node (``scontrol show
hostnames``), run id the Slurm job id, so node ranks are assigned by the rendezvous. The worker
command is exactly the one ``fxplan launch --print-command`` shows, with the endpoint replaced.
The user submits it (``sbatch FILE``); nothing is submitted here. It assumes the same Python
environment and paths on every node (a shared file system), as torchrun does.

``requeue=N`` (``fxplan launch --slurm … --max-restarts N``): ``#SBATCH --requeue`` (Slurm
requeues the job when a node fails) and, when the job step ends non-zero,
``scontrol requeue`` while ``SLURM_RESTART_COUNT`` < N. Each run of the script is a fresh set of
torchrun agents with rendezvous id ``JOBID-RESTARTCOUNT``; the workers (``--auto-resume``) go on
from the newest checkpoint of the run directory and replan if the nodes they got differ.
``elastic=(MIN, MAX)`` (``--elastic MIN:MAX``): ``#SBATCH --nodes=MIN-MAX``, and srun and torchrun
use the ``$SLURM_JOB_NUM_NODES`` nodes Slurm granted (the workers replan for them).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from fxplan.cli.run_config import LaunchError, RunSettings
from fxplan.cli.torchrun_command import affinity_env, passthrough, worker_command

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster
    from fxplan.core.plan import Plan

__all__ = ["sbatch_script", "write_slurm"]


def sbatch_script(*, job_name: str, nnodes: int, nproc_per_node: int, gpus: bool,
                  torchrun: Sequence[str], worker: Sequence[str], env: dict[str, str],
                  run_dir: str, port: int = 29500, requeue: int = 0,
                  elastic: tuple[int, int] | None = None) -> str:
    """The script's text. ``torchrun``: the launcher's argv up to (not including) the
    rendezvous flags; ``worker``: ``-m fxplan.worker …``; ``env``: variables to export."""
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --nodes={nnodes if elastic is None else '{}-{}'.format(*elastic)}",
        "#SBATCH --ntasks-per-node=1",
    ]
    if gpus:
        lines.append(f"#SBATCH --gpus-per-node={nproc_per_node}")
    if requeue:
        lines += ["#SBATCH --requeue", "#SBATCH --open-mode=append"]
    lines += [
        f"#SBATCH --output={Path(run_dir) / 'slurm-%j.out'}",
        "# written by `fxplan launch --slurm`; submit with: sbatch THIS_FILE",
        "set -euo pipefail",
        "",
        'nodes=( $(scontrol show hostnames "$SLURM_JOB_NODELIST") )',
        'head_node="${nodes[0]}"',
        f'rdzv_port="${{FXPLAN_RDZV_PORT:-{port}}}"',
        f"mkdir -p {shlex.quote(run_dir)}",
    ]
    lines += [f"export {key}={shlex.quote(value)}" for key, value in env.items()]
    nodes = nnodes if elastic is None else '"${SLURM_JOB_NUM_NODES}"'
    command = [
        f"srun --nodes={nodes} --ntasks-per-node=1 --kill-on-bad-exit=1",
        shlex.join(torchrun),
        f"--nnodes={nodes} --nproc-per-node={nproc_per_node} --rdzv-backend=c10d",
        '--rdzv-endpoint="${head_node}:${rdzv_port}" --rdzv-id="${SLURM_JOB_ID}'
        + ('-${SLURM_RESTART_COUNT:-0}"' if requeue else '"'),
        *_flag_lines(worker),
    ]
    lines += ["", " \\\n    ".join(command)]
    if requeue:
        lines[-1] += (f' || {{ if [ "${{SLURM_RESTART_COUNT:-0}}" -lt {requeue} ]; then '
                      'scontrol requeue "$SLURM_JOB_ID"; fi; exit 1; }')
    lines.append("")
    return "\n".join(lines)


def _flag_lines(argv: Sequence[str]) -> list[str]:
    """``argv`` quoted, one ``--flag value`` pair (or lone word) per line."""
    out: list[str] = []
    for token in argv:
        if out and not token.startswith("-") and out[-1].startswith("-") and " " not in out[-1]:
            out[-1] += " " + shlex.quote(token)
        else:
            out.append(shlex.quote(token))
    return out


def write_slurm(args: argparse.Namespace, plan: Plan, cluster: Cluster, nnodes: int, nproc: int,
                settings: RunSettings) -> int:
    """Write the sbatch script of ``fxplan launch --slurm FILE`` (module docstring) to FILE;
    nothing is submitted."""
    from fxplan.cli.elastic import parse_elastic

    if args.rdzv_endpoint or args.node_rank is not None:
        raise LaunchError("--slurm puts the rendezvous on the allocation's first node and lets "
                          "it number the nodes: leave out --rdzv-endpoint and --node-rank")
    gpus = cluster.device(0).kind == "gpu"
    env = {"OMP_NUM_THREADS": "1", **affinity_env(args)} if not gpus else {}
    text = sbatch_script(
        job_name=f"fxplan-{Path(args.plan).stem}", nnodes=nnodes, nproc_per_node=nproc, gpus=gpus,
        torchrun=[sys.executable, "-m", "torch.distributed.run", *passthrough(args)],
        worker=worker_command(args, settings), env=env, run_dir=settings.run_dir,
        requeue=args.max_restarts, elastic=parse_elastic(args.elastic) if args.elastic else None)
    Path(args.slurm).write_text(text)
    print(f"wrote {args.slurm}: {nnodes} node(s) × {nproc} process(es) of {plan.summary}; "
          f"submit it with `sbatch {args.slurm}`")
    return 0
