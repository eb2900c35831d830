"""Spawned calibration ranks: a free loopback port, a one-rank gloo group, ranks placed and joined
as ``fxplan launch`` places its ranks, and their JSON result gathered back. The formulas are in
``local_cpu_calibration.py``'s docstring."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import torch

from fxplan.core.loopback import free_loopback_port

__all__ = ["gather_and_leave", "join_gloo", "single_rank_group", "spawn_json"]


def single_rank_group() -> None:
    """A one-rank gloo group on a free loopback port (DTensor needs a device mesh)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_loopback_port()}", rank=0,
                                world_size=1)


def join_gloo(rank: int, world: int, port: int) -> None:
    """A spawned calibration rank: one thread, placed as ``fxplan launch`` would place it
    (:func:`fxplan.runtime.launch.affinity.pin_rank`), the gloo group of ``world`` ranks on
    loopback."""
    import torch.distributed as dist

    from fxplan.runtime.launch.affinity import pin_rank

    pin_rank(rank, world)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)


def gather_and_leave(result: Any, world: int, rank: int, out: str) -> None:
    """A spawned rank's last act: every rank's ``result`` gathered, rank 0 writes the list as
    JSON to ``out`` (what :func:`spawn_json` returns), and the gloo group is closed."""
    import torch.distributed as dist

    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, result)
    if rank == 0:
        Path(out).write_text(json.dumps(gathered))
    dist.barrier()
    dist.destroy_process_group()


def spawn_json(worker: Callable[..., None], world: int, *args: Any) -> Any:
    """Run ``worker(rank, world, port, *args, out)`` on ``world`` spawned ranks (``port``: a
    free loopback port) and return the JSON the worker wrote to the file ``out``."""
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        mp.spawn(worker, args=(world, free_loopback_port(), *args, out), nprocs=world)
        return json.loads(Path(out).read_text())
