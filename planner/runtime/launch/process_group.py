"""The workers' process group, on a store namespace of its own per torchrun restart.

Why: with torchrun's c10d rendezvous the workers' store is the agent's
(``TORCHELASTIC_USE_AGENT_STORE=True``), and torch 2.13 gives the workers that store as it is
(``torch.distributed.rendezvous._create_c10d_store``: "We create a new TCPStore for every retry
so no need to add prefix for each attempt"). But the c10d rendezvous keeps one store across
restarts, so after ``--max-restarts`` restarts a group the new workers read the *dead* workers'
gloo addresses, still in the store: every worker fails in ``connectFullMesh`` (connection
refused) and the next restart hangs (reproduced with a plain 2-rank gloo script and
``python -m torch.distributed.run --max-restarts=2``, fixed by this prefix).

:func:`init_process_group` connects to the same store and prefixes every key with
``fxplan/restart-<TORCHELASTIC_RESTART_COUNT>``, so each restart's group meets in a fresh
namespace. Outside torchrun's agent store it is ``torch.distributed.init_process_group(backend)``.
``fxplan launch --max-restarts`` does not depend on it (each attempt is a fresh torchrun, whose
store is new); it makes torchrun's own restarts (``-- --max-restarts=N``) work too.
"""

from __future__ import annotations

import os
import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

__all__ = ["init_process_group", "restart_count"]


def restart_count() -> int:
    """How many times torchrun restarted this worker group (0 outside torchrun)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def init_process_group(backend: str) -> None:
    """``init_process_group(backend)`` on a per-restart prefix of torchrun's agent store."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group(backend)
        return
    timeout = default_pg_timeout  # what init_process_group(backend) would use
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, timeout=timeout)
    dist.init_process_group(backend, store=dist.PrefixStore(f"fxplan/restart-{restart_count()}",
                                                            store),
                            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                            timeout=timeout)
