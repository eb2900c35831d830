"""Pin each CPU rank to a core of its own where ranks outnumber cores, as the cost model assumes.

``fxplan launch`` runs every CPU rank on one thread (``OMP_NUM_THREADS=1``). Left to the
kernel's scheduler, a rank's threads — the main thread and gloo's worker and transport
threads — wander between the machine's cores: a wake-up places a thread where the waker ran,
the load balancer moves it back later, and each move starts the thread on a cold cache.
Launched on 2 cores with 4 ranks (``fxplan launch PLAN --cpu-affinity core|none``,
gpt-tiny at batch 16, two launches each, alternating; 2026-11-25 (`e1334ce`),
``benchmarks/data/affinity_launch_2026-11-25_e1334ce.json``), pinned against unpinned, ms a step: tp=4 sp
138–146 against 179–190, dp=4 ZeRO-3 72–74 / 91–94, dp=2 tp=2 sp 150–151 / 171–180, dp=4
34–37 / 42–44, pp=2 tp=2 81–93 / 97–101, pp=2 dp=2 44–46 / 49. In
``benchmarks/step_phases.py`` (``benchmarks/data/affinity_2026-11-25_e1334ce.json``) the CPU of gloo's
threads falls most (tp=4: 11.6–12.8 ms a step against 23.9–32.7).

:func:`rank_cores` gives local rank ``r`` of ``R`` ranks on a node whose process may run on
the ``C`` cores ``A = (a_0, …, a_{C−1})`` (``sched_getaffinity``, so ``taskset`` and cgroup
limits are respected)::

    R ≤ C:  a block of k = ⌊C / R⌋ cores,   {a_{r·k}, …, a_{r·k + k − 1}}
    R > C:  one core, round robin,          {a_{r mod C}}

so with more ranks than cores each core time-shares ``⌈R/C⌉`` or ``⌊R/C⌋`` ranks and
consecutive ranks — a tensor-parallel group, which takes consecutive ranks
(:mod:`fxplan.cost_model.step.stage_costs`) — sit on different cores, each able to run while its
partner does. :func:`pin_rank` applies it to the calling thread before the process group is
created, so that every thread the rank starts afterwards (gloo's) inherits the mask. Which
ranks it pins is the mode (``fxplan launch --cpu-affinity``, environment ``FXPLAN_CPU_AFFINITY``):

    auto   (default) pin only where the ranks outnumber the cores
    core   pin every rank (with R ≤ C each to its block of cores)
    none   leave placement to the scheduler

``auto`` because pinning pays only where ranks time-share cores: launched with a core per rank
(2 ranks on 2 cores) dp=2 stepped 23.2–24.0 ms pinned against 21.5–22.3 unpinned, tp=2 sp
64.9–73.3 against 72.3–76.5 (``benchmarks/data/affinity_launch_2026-11-25_e1334ce.json``): a rank's gloo
threads may then use an idle core. ``taskset`` and cgroup limits are respected (the cores are
those the process may run on); where ``sched_setaffinity`` does not exist (macOS) the ranks are
not pinned and the fallback line says so.
"""

from __future__ import annotations

import os
from typing import Sequence

from fxplan.core.training import AFFINITY_ENV, AFFINITY_MODES

__all__ = ["AFFINITY_ENV", "AFFINITY_MODES", "allowed_cores", "pin_rank", "rank_cores"]


def allowed_cores() -> list[int]:
    """The cores this process may run on, in order (empty where the OS cannot say)."""
    if not hasattr(os, "sched_getaffinity"):
        return []
    return sorted(os.sched_getaffinity(0))


def rank_cores(local_rank: int, local_world: int, cores: Sequence[int]) -> list[int]:
    """The cores of local rank ``local_rank`` of ``local_world`` on ``cores`` (module
    docstring): a block of ``⌊C/R⌋`` cores when every rank can have one, else core
    ``r mod C``."""
    if not cores:
        raise ValueError("no cores to pin to")
    if not 0 <= local_rank < local_world:
        raise ValueError(f"local rank {local_rank} is not in 0..{local_world - 1}")
    count = len(cores)
    if local_world > count:
        return [cores[local_rank % count]]
    per_rank = count // local_world
    return list(cores[local_rank * per_rank:(local_rank + 1) * per_rank])


def pin_rank(local_rank: int | None = None, local_world: int | None = None) -> tuple[str | None,
                                                                                     str | None]:
    """Pin this process as local rank ``local_rank`` of ``local_world`` (default: torchrun's
    ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``): ``(note, fallback)`` — the line saying where it
    runs, or the fallback line saying why it was not pinned (``None`` for the other)."""
    mode = os.environ.get(AFFINITY_ENV, "auto")
    if mode not in AFFINITY_MODES:
        return None, (f"[affinity] {AFFINITY_ENV}={mode!r} is not one of "
                      f"{', '.join(AFFINITY_MODES)}: the rank is not pinned")
    if mode == "none":
        return f"[affinity] {AFFINITY_ENV}=none: the scheduler places the ranks", None
    rank = int(os.environ.get("LOCAL_RANK", 0)) if local_rank is None else local_rank
    world = int(os.environ.get("LOCAL_WORLD_SIZE", 1)) if local_world is None else local_world
    cores = allowed_cores()
    if not cores or not hasattr(os, "sched_setaffinity"):
        return None, ("[affinity] this OS has no sched_setaffinity: the CPU ranks are not "
                      "pinned and the scheduler moves their threads between cores")
    if mode == "auto" and world <= len(cores):
        return (f"[affinity] {world} local ranks on {len(cores)} cores, a core each: not pinned "
                "(the scheduler places them; --cpu-affinity core pins)"), None
    mine = rank_cores(rank, world, cores)
    os.sched_setaffinity(0, mine)
    rule = (f"{world} local ranks on {len(cores)} cores, "
            + ("round robin" if world > len(cores) else f"{len(mine)} each"))
    where = f"core {mine[0]}" if len(mine) == 1 else f"cores {mine[0]}-{mine[-1]}"
    return f"[affinity] CPU ranks pinned ({rule}): local rank {rank} on {where}", None
