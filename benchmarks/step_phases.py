"""Where a launched training step's time goes, per rank and per phase: CPU or waiting.

    python benchmarks/step_phases.py PLAN.json [--steps 20] [--autogroup-nice -19]
    flock bench.lock python benchmarks/step_phases.py PLAN.json     # timing: under the lock

Runs the phases of :func:`fxplan.runtime.train.trainer.train` on a plan's ranks (``torch.
multiprocessing``, gloo over loopback, one thread per rank placed as ``fxplan launch`` places
it — :mod:`fxplan.runtime.launch.affinity`, ``FXPLAN_CPU_AFFINITY`` —, the plan's own model at its
global batch, random tokens), in the trainer's order:

1. ``train_step`` — the schedule: forward, loss, backward and the data-parallel reduction
   (DDP / FSDP2 hooks, pipeline sends and receives);
2. ``partial`` — :func:`fxplan.runtime.apply.partial_grads.reduce_partial_grads`;
3. ``clip`` — :func:`fxplan.runtime.train.optim.clip_grad_norm` (its norm's all-reduce);
4. ``opt`` — ``set_lr`` and the optimizer's ``step``;
5. ``zero`` — ``zero_grad``.

For each rank and phase it prints the median over steps (the first 3 dropped: warm-up) of
the **wall** time (``perf_counter``), the rank's main-thread **CPU** time (``thread_time``)
and the CPU time of the rank's **other threads** (``process_time − thread_time``: gloo's
worker and transport threads, which run the collectives' copies, reductions and loopback
TCP): ``wall − CPU`` is time the rank's main thread did not run — waiting in a blocking
collective, for a pipeline peer, or for a core (more ranks than cores, other jobs) — and
the other threads' CPU is core time the collectives took from the machine's cores. The
main thread's **run-queue wait** (``/proc/thread-self/schedstat``, second field: time it was
runnable but another thread had its core) splits ``wall − CPU`` into waiting for a core and
sleeping (``wall − CPU − queue``: blocked in a collective or a pipeline receive). Last, the median minor page faults of the main thread per phase
(``getrusage(RUSAGE_THREAD)``): pages the allocator had given back to the kernel and the
phase touched again (``cost_model/host/host_overhead.py``, first touch); and the main thread's
context switches per step, voluntary (it blocked: a collective, a receive) and involuntary
(preempted: another thread took its core). The model's
counterparts: ``compute`` and the communication rows for ``train_step``, the
``optimizer`` row for the rest.
"""

from __future__ import annotations

import argparse
import resource
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Iterator

from fxplan.core.loopback import free_loopback_port

sys.path.insert(0, str(Path(__file__).resolve().parent))
from launched_rank import (add_measurement_arguments, apply_autogroup_nice,  # noqa: E402
                           launched_rank)  # (benchmarks/, a script)

PHASES = ("train_step", "partial", "clip", "opt", "zero")
WARMUP = 3


def _worker(rank: int, world: int, plan_file: str, port: int, steps: int) -> None:
    import torch.distributed as dist

    from fxplan.runtime.train.optim import build_optimizer, clip_grad_norm, set_lr
    from fxplan.runtime.apply.partial_grads import reduce_partial_grads
    from fxplan.rank.loss import loss_fn

    launched = launched_rank(rank, world, plan_file, port)
    sharded, batch = launched.sharded, launched.batch
    optimizer = build_optimizer(sharded, "adamw", lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95))
    wall: dict[str, list[float]] = {k: [] for k in PHASES}
    faults: dict[str, list[int]] = {k: [] for k in PHASES}
    cpu: dict[str, list[float]] = {k: [] for k in PHASES}
    other: dict[str, list[float]] = {k: [] for k in PHASES}
    queue: dict[str, list[float]] = {k: [] for k in PHASES}
    schedstat = Path("/proc/thread-self/schedstat")

    def queued() -> float:
        """Seconds this thread has waited on a run queue (0 where schedstat is missing)."""
        return int(schedstat.read_text().split()[1]) * 1e-9 if schedstat.exists() else 0.0

    def phases() -> Iterator[None]:
        float(sharded.train_step(batch, loss_fn, local=True))
        yield
        reduce_partial_grads(sharded)
        yield
        clip_grad_norm(sharded, 1.0)
        yield
        set_lr(optimizer, 1e-3)
        optimizer.step()
        yield
        optimizer.zero_grad()
        yield

    voluntary: list[int] = []
    involuntary: list[int] = []
    for step in range(steps):
        switched = resource.getrusage(resource.RUSAGE_THREAD)
        w, c, pc, q, f = (time.perf_counter(), time.thread_time(), time.process_time(), queued(),
                          _minor_faults())
        for name, _ in zip(PHASES, phases()):
            w2, c2, pc2, q2, f2 = (time.perf_counter(), time.thread_time(), time.process_time(),
                                   queued(), _minor_faults())
            if step >= WARMUP:
                wall[name].append(w2 - w)
                cpu[name].append(c2 - c)
                other[name].append((pc2 - pc) - (c2 - c))
                queue[name].append(q2 - q)
                faults[name].append(f2 - f)
            w, c, pc, q, f = w2, c2, pc2, q2, f2
        if step >= WARMUP:
            now = resource.getrusage(resource.RUSAGE_THREAD)
            voluntary.append(now.ru_nvcsw - switched.ru_nvcsw)
            involuntary.append(now.ru_nivcsw - switched.ru_nivcsw)
    med = {k: tuple(statistics.median(series[k]) * 1e3 for series in (wall, cpu, other, queue))
           for k in PHASES}
    total = tuple(sum(row[i] for row in med.values()) for i in range(4))
    switches = (statistics.median(voluntary), statistics.median(involuntary))
    print(f"rank {rank}: step " + " / ".join(f"{x:.2f}" for x in total) + " | "
          + " | ".join(f"{k} " + " / ".join(f"{x:.2f}" for x in row) for k, row in med.items())
          + " | page faults " + ", ".join(f"{k} {statistics.median(v):.0f}"
                                          for k, v in faults.items())
          + f" | context switches a step: {switches[0]:.0f} voluntary, {switches[1]:.0f} "
            "involuntary", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def _minor_faults() -> int:
    """The calling thread's minor page faults so far (``getrusage(RUSAGE_THREAD)``)."""
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("plan", help="a plan file (fxplan plan --out)")
    parser.add_argument("--steps", type=int, default=20, help="steps (the first 3 dropped)")
    add_measurement_arguments(parser, out=False)
    args = parser.parse_args()
    apply_autogroup_nice(args)
    import torch.multiprocessing as mp

    from fxplan.core.plan import Plan

    plan = Plan.from_dict(json.loads(Path(args.plan).read_text()))
    world = plan.pp * plan.dp * plan.tp * getattr(plan, "cp", 1)
    print(f"{plan.summary}: {world} ranks, load average {os.getloadavg()[0]:.1f}; per phase "
          f"wall / main-thread CPU / other threads' CPU / main-thread run-queue wait ms (median of {args.steps - WARMUP} "
          "steps)", flush=True)
    mp.spawn(_worker, args=(world, args.plan, free_loopback_port(), args.steps), nprocs=world)


if __name__ == "__main__":
    main()
