"""Gloo's CPU per collective on loopback ranks, each kind at sizes from 4 B to 1 MiB (line 8.,
``--gloo-cpu``). The formulas are in ``local_cpu_calibration.py``'s docstring."""

from __future__ import annotations

import os
import statistics
import time
from typing import Any, Callable

import torch

from local_cpu_lines.ranks import gather_and_leave, join_gloo, spawn_json

__all__ = ["collective_call", "fit_line", "GLOO_CPU_BYTES", "GLOO_CPU_KINDS", "gloo_cpu_us",
           "print_gloo_cpu"]


#: Sizes (bytes) and kinds of the gloo CPU line (8.): the runtime's collectives at gpt-tiny's
#: scale span 4 B (the loss, the norm) to 0.55 MB (DDP's one bucket).
GLOO_CPU_BYTES = (4, 64 * 2**10, 256 * 2**10, 2**20)


GLOO_CPU_KINDS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "send_recv")


def collective_call(kind: str, nbytes: int, rank: int, world: int) -> Callable[[], object]:
    """One blocking ``kind`` collective of ``nbytes`` (nccl-tests sizes: the gathered output
    of an all-gather, the input of a reduce-scatter, the message of a send/recv — which
    sends one way and back, two messages, as a pipeline's forward and backward do)."""
    import torch.distributed as dist

    n = max(1, nbytes // 4)
    if kind == "all_reduce":
        x = torch.zeros(n)
        return lambda: dist.all_reduce(x)
    if kind == "broadcast":
        x = torch.zeros(n)
        return lambda: dist.broadcast(x, src=0)
    if kind == "all_gather":
        per = max(1, n // world)
        out, x = torch.zeros(per * world), torch.zeros(per)
        return lambda: dist.all_gather_into_tensor(out, x)
    if kind == "reduce_scatter":
        per = max(1, n // world)
        out, x = torch.zeros(per), torch.zeros(per * world)
        return lambda: dist.reduce_scatter_tensor(out, x)
    x = torch.zeros(n)
    peer = rank ^ 1

    def ping() -> None:
        if rank % 2 == 0:
            dist.send(x, peer)
            dist.recv(x, peer)
        else:
            dist.recv(x, peer)
            dist.send(x, peer)
    return ping


def _gloo_cpu_worker(rank: int, world: int, port: int, iterations: int, runs: int,
                     out: str) -> None:
    import torch.distributed as dist

    join_gloo(rank, world, port)
    a = torch.randn(128, 128)

    def loop(work: bool, call: Callable[[], object] | None) -> tuple[float, float, float]:
        """Per iteration: wall, main-thread CPU, other threads' CPU (s)."""
        dist.barrier()
        w, c, pc = time.perf_counter(), time.thread_time(), time.process_time()
        for _ in range(iterations):
            if work:
                for _ in range(4):
                    a @ a
            if call is not None:
                call()
        w, c, pc = time.perf_counter() - w, time.thread_time() - c, time.process_time() - pc
        dist.barrier()
        return w / iterations, c / iterations, (pc - c) / iterations

    rows: dict[str, Any] = {}
    for kind in GLOO_CPU_KINDS:
        if kind == "send_recv" and world % 2:
            continue
        for nbytes in GLOO_CPU_BYTES:
            call = collective_call(kind, nbytes, rank, world)
            for work in (True, False):
                loop(work, call)              # warm-up
                base, both = [], []
                for _ in range(runs):         # alternating: drift hits both alike
                    base.append(loop(work, None))
                    both.append(loop(work, call))
                added = [statistics.median(b[i] for b in both)
                         - statistics.median(x[i] for x in base) for i in range(3)]
                rows[f"{kind} {nbytes} {'work' if work else 'idle'}"] = [v * 1e6 for v in added]
    gather_and_leave(rows, world, rank, out)


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares ``y = c₀ + c₁·x`` through ``points``: ``(c₀, c₁)``."""
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    return my - slope * mx, slope


def gloo_cpu_us(world: int, iterations: int = 40, runs: int = 5) -> dict[str, Any]:
    """gloo's CPU per collective on ``world`` loopback ranks (module docstring, 8.): for each
    ``"kind bytes work|idle"`` the added wall, main-thread CPU and other threads' CPU (µs per
    collective, each rank's median over ``runs``; the mean and the max over ranks), and per
    kind and setting the line ``c₀ µs + c₁ µs/KiB`` of the whole CPU (main + other threads,
    the ranks' mean) against the size, and of the wall."""
    per_rank = spawn_json(_gloo_cpu_worker, world, iterations, runs)
    rows: dict[str, Any] = {}
    for key in per_rank[0]:
        values = [r[key] for r in per_rank]
        rows[key] = {"wall_us": statistics.mean(v[0] for v in values),
                     "wall_max_us": max(v[0] for v in values),
                     "main_cpu_us": statistics.mean(v[1] for v in values),
                     "other_cpu_us": statistics.mean(v[2] for v in values)}
    fits: dict[str, Any] = {}
    for kind in GLOO_CPU_KINDS:
        for setting in ("work", "idle"):
            keys = [(nbytes, f"{kind} {nbytes} {setting}") for nbytes in GLOO_CPU_BYTES]
            if keys[0][1] not in rows:
                continue
            cpu = fit_line([(b / 1024, rows[k]["main_cpu_us"] + rows[k]["other_cpu_us"])
                            for b, k in keys])
            wall = fit_line([(b / 1024, rows[k]["wall_us"]) for b, k in keys])
            fits[f"{kind} {setting}"] = {"cpu_us": cpu[0], "cpu_us_per_kib": cpu[1],
                                         "wall_us": wall[0], "wall_us_per_kib": wall[1]}
    return {"world": world, "load": os.getloadavg()[0], "rows": rows, "fits": fits}


def print_gloo_cpu(result: dict[str, Any]) -> None:
    """The table rows of :func:`gloo_cpu_us`."""
    world = result["world"]
    for key, fit in result["fits"].items():
        print(f"| gloo CPU per collective, {world} ranks, {key} (4 B … 1 MiB): CPU (main + "
              f"gloo threads) c₀ + c₁·S; wall | {fit['cpu_us']:.0f} µs + "
              f"{fit['cpu_us_per_kib']:.2f} µs/KiB; {fit['wall_us']:.0f} µs + "
              f"{fit['wall_us_per_kib']:.2f} µs/KiB |")
