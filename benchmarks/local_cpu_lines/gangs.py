"""Independent groups of ranks time-sharing the cores, and a pipeline of 2-rank stages (line 11.,
``--gangs``). The formulas are in ``local_cpu_calibration.py``'s docstring."""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from local_cpu_lines.ranks import gather_and_leave, join_gloo, spawn_json

__all__ = ["GANG_CONFIGS", "gangs_us", "print_gangs"]


def _gang_worker(rank: int, world: int, port: int, iterations: int, gang: int, mode: str,
                 matmuls: int, nbytes: int, out: str) -> None:
    """One rank of :func:`gangs_us`: ``world`` ranks in ``world // gang`` independent groups
    of ``gang`` consecutive ranks. ``mode == "loop"``: every rank loops ``4 × 128³ matmul;
    all_reduce(nbytes, its group)`` (``matmuls`` of them), against the same loop without the all-reduce. ``mode ==
    "pipeline"`` (two groups): a one-microbatch pipeline of two stages — group 0 computes, each
    of its ranks sends a 4-byte token to its partner in group 1, which computes and sends it
    back — so only one group is busy at a time; against the same without the token (the two
    groups then compute side by side)."""
    import torch.distributed as dist

    join_gloo(rank, world, port)
    groups = [dist.new_group(list(range(first, first + gang)))
              for first in range(0, world, gang)] if gang < world else [None]
    mine = groups[rank // gang]
    a = torch.randn(128, 128)
    token = torch.zeros(max(1, nbytes // 4))

    def work() -> None:
        for _ in range(matmuls):
            a @ a

    def loop(communicate: bool) -> float:
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iterations):
            if mode == "loop":
                work()
                if communicate:
                    dist.all_reduce(token, group=mine)
            elif rank < gang:                          # stage 0: compute, hand over, wait
                work()
                if communicate:
                    dist.send(token, rank + gang)
                    dist.recv(token, rank + gang)
            else:                                      # stage 1: wait, compute, hand back
                if communicate:
                    dist.recv(token, rank - gang)
                work()
                if communicate:
                    dist.send(token, rank - gang)
        elapsed = time.perf_counter() - start
        dist.barrier()
        return elapsed / iterations

    loop(True)
    samples = [(loop(False), loop(True)) for _ in range(5)]
    gather_and_leave(samples, world, rank, out)


#: Configurations of the gang line: (name, ranks, group size, mode, 128³ matmuls per burst,
#: bytes of the collective; 64 KiB: a tp all-reduce of gpt-tiny's activations, 4×64×64 fp32).
GANG_CONFIGS = (("1 group of 2", 2, 2, "loop", 4, 4), ("1 group of 4", 4, 4, "loop", 4, 4),
                ("2 groups of 2", 4, 2, "loop", 4, 4),
                ("1 group of 2, 64 KiB", 2, 2, "loop", 4, 2**16),
                ("1 group of 4, 64 KiB", 4, 4, "loop", 4, 2**16),
                ("2 groups of 2, 64 KiB", 4, 2, "loop", 4, 2**16),
                ("1 group of 2, 10x work", 2, 2, "loop", 40, 4),
                ("pipeline 2 stages x 2", 4, 2, "pipeline", 4, 4),
                ("pipeline 2 stages x 2, 10x work", 4, 2, "pipeline", 40, 4))


def gangs_us(iterations: int = 300) -> list[dict[str, Any]]:
    """Independent tp groups time-sharing the cores, and a pipeline that runs one stage at a
    time (µs per iteration, wall clock, the median over ranks of each rank's median of 5
    alternating runs). Per configuration of :data:`GANG_CONFIGS`: ``work_us`` (the loop
    without communication), ``both_us`` (with it) and ``extra_us = both − work``. For the
    loops ``extra_us`` is the wall one blocking 4-byte all-reduce adds; if independent groups
    pay an extra wait until the partner is scheduled, "2 groups of 2" shows more than "1 group
    of 4" (same ranks, same cores). For the pipeline, ``both_us`` is one microbatch through
    both stages (each stage's work once plus two token hand-overs), at 4 and 40 matmuls a
    burst; the hand-overs cancel in the difference, so the share of a core each busy rank got
    is ``busy_share = 2 · Δwork(1 group of 2) / Δboth(pipeline)`` (Δ: 40 − 4 matmuls; a rank
    of the lone 2-rank group has a core of its own): 1 if only the busy ranks share the cores,
    ``η · 2/4`` if all four ranks did."""
    rows = []
    for name, world, gang, mode, matmuls, nbytes in GANG_CONFIGS:
        per_rank = spawn_json(_gang_worker, world, iterations, gang, mode, matmuls, nbytes)
        work = statistics.median(statistics.median(w for w, _ in s) for s in per_rank)
        both = statistics.median(statistics.median(b for _, b in s) for s in per_rank)
        rows.append({"config": name, "ranks": world, "group": gang, "mode": mode,
                     "matmuls": matmuls, "bytes": nbytes,
                     "work_us": work * 1e6, "both_us": both * 1e6,
                     "extra_us": (both - work) * 1e6})
    by = {r["config"]: r for r in rows}
    alone = by["1 group of 2, 10x work"]["work_us"] - by["1 group of 2"]["work_us"]
    pipe = by["pipeline 2 stages x 2, 10x work"]
    pipe["busy_share"] = 2 * alone / (pipe["both_us"] - by["pipeline 2 stages x 2"]["both_us"])
    return rows


def print_gangs(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        share = f"; busy share {r['busy_share']:.3f}" if "busy_share" in r else ""
        print(f"| gang line, {r['config']} ({r['ranks']} ranks): work; work + collective "
              f"⇒ extra | {r['work_us']:.0f}; {r['both_us']:.0f} ⇒ {r['extra_us']:.0f} µs"
              f"{share} |")
