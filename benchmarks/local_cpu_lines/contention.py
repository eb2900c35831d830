"""Gloo collectives between bursts of compute: a blocking all-reduce, and each further broadcast of
an async batch. The formulas are in ``local_cpu_calibration.py``'s docstring."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

from local_cpu_lines.ranks import join_gloo, spawn_json

__all__ = ["contended_collective_us", "queued_collective_us"]


def _contended_worker(rank: int, world: int, port: int, iterations: int, batch: int,
                      out: str) -> None:
    import torch.distributed as dist

    join_gloo(rank, world, port)
    a = torch.randn(128, 128)
    flag = torch.zeros(1)
    flags = [torch.zeros(1) for _ in range(batch)]

    def communicate() -> None:
        if not batch:
            dist.all_reduce(flag)
            return
        # as ZeroRedundancyOptimizer._sync_params: every broadcast issued async, then waited
        handles = [dist.broadcast(f, src=i % world, async_op=True) for i, f in enumerate(flags)]
        for handle in handles:
            handle.wait()

    def loop(collective: bool) -> float:
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iterations):
            for _ in range(4):
                a @ a
            if collective:
                communicate()
        elapsed = time.perf_counter() - start
        dist.barrier()
        return elapsed / iterations

    loop(True)
    samples = [(loop(False), loop(True)) for _ in range(5)]
    if rank == 0:
        Path(out).write_text(json.dumps(samples))
    dist.destroy_process_group()


def contended_collective_us(world: int, iterations: int = 300,
                            batch: int = 0) -> dict[str, float]:
    """A 4-byte gloo all-reduce between bursts of compute (µs): every rank loops ``4 × (128³
    matmul); all_reduce`` and the same without the all-reduce, wall clock; the collective's
    cost is the difference per iteration (medians of 5 alternating runs). With more ranks
    than cores a rank waiting in a collective must be scheduled again while another rank
    computes on its core, which the idle ranks of :func:`allreduce` do not see.

    ``batch = k > 0``: instead of the all-reduce, ``k`` 4-byte broadcasts issued
    asynchronously and then waited (sources round-robin), as ``ZeroRedundancyOptimizer``
    syncs its parameters; ``(t_k − t_1)/(k − 1)`` is what each further collective of such a
    batch costs once the ranks have met (:func:`queued_collective_us`)."""
    samples = spawn_json(_contended_worker, world, iterations, batch)
    work = statistics.median(w for w, _ in samples)
    both = statistics.median(b for _, b in samples)
    return {"work_us": work * 1e6, "work_collective_us": both * 1e6,
            "collective_us": (both - work) * 1e6}


def queued_collective_us(world: int, batch: int = 28, iterations: int = 100) -> dict[str, float]:
    """Cost of each further 4-byte broadcast of an async batch of ``batch`` between bursts of
    compute: ``(t_batch − t_1)/(batch − 1)`` from :func:`contended_collective_us` (µs). 28 is
    gpt-tiny's parameter tensor count (ZeRO-1 broadcasts each)."""
    one = contended_collective_us(world, iterations, batch=1)["collective_us"]
    many = contended_collective_us(world, iterations, batch=batch)["collective_us"]
    return {"one_us": one, "batch_us": many, "batch": batch,
            "queued_us": (many - one) / (batch - 1)}
