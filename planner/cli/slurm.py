"""``fxplan launch --slurm FILE``: an sbatch script that runs the plan on its nodes.

The script asks Slurm for the plan's nodes with one task per node; ``srun`` starts one torchrun
on each, all meeting at a c10d rendezvous on the allocation's first node (``scontrol show
hostnames``), run id the Slurm job id, so node ranks are assigned by the rendezvous. The worker
command is exactly the one ``fxplan launch --print-command`` shows, with the endpoint replaced.
The user submits it (``sbatch FILE``); nothing is submitted here. It assumes the same Python
environment and paths on every node (a shared file system), as torchrun does.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Sequence

__all__ = ["sbatch_script"]


def sbatch_script(*, job_name: str, nnodes: int, nproc_per_node: int, gpus: bool,
                  torchrun: Sequence[str], worker: Sequence[str], env: dict[str, str],
                  run_dir: str, port: int = 29500) -> str:
    """The script's text. ``torchrun``: the launcher's argv up to (not including) the
    rendezvous flags; ``worker``: ``-m fxplan.worker …``; ``env``: variables to export."""
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --nodes={nnodes}",
        "#SBATCH --ntasks-per-node=1",
    ]
    if gpus:
        lines.append(f"#SBATCH --gpus-per-node={nproc_per_node}")
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
    command = [
        f"srun --nodes={nnodes} --ntasks-per-node=1 --kill-on-bad-exit=1",
        shlex.join(torchrun),
        f"--nnodes={nnodes} --nproc-per-node={nproc_per_node} --rdzv-backend=c10d",
        '--rdzv-endpoint="${head_node}:${rdzv_port}" --rdzv-id="${SLURM_JOB_ID}"',
        *_flag_lines(worker),
    ]
    lines += ["", " \\\n    ".join(command), ""]
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
