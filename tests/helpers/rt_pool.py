"""A pool of gloo worker processes kept alive for a whole test session.

``RankPool(world=4)`` starts ``world`` processes once (forked from a server that imported torch,
:func:`_context`); each joins one gloo process group and then
runs jobs: ``pool.run("rt_cases:dp_case", plan=…)`` calls that function on every rank and returns
the per-rank results (a 2-rank case runs on all four: the other two take part in creating process
groups and return ``None``). A torchrun per test costs 4–6 s here; a job on the pool costs the
job. A job that raises or hangs fails the test with every rank's traceback, and the pool is torn
down so the next test starts fresh. Workers exit through ``gc.collect()`` then
``destroy_process_group()``, which avoids the SIGABRT seen at interpreter exit after DTensor work.
A worker collects after every job (a job's DTensors and groups go with it); what it imported
before its first job is frozen (:func:`gc.freeze`), so that those collections, and the
interpreter's own, walk only what jobs made (a full collection over what a rank imports,
about 300 000 objects, took 0.16 s on the 2-core machine, 2026-11-28).

Each job's process groups (every mesh, every stage) stay alive in the workers, and gloo keeps
threads per group and connection: over a session a worker grew past a thousand threads, many of
them runnable, and every later test ran several times slower. :meth:`RankPool.threads` counts
them, and the ``rank_pool`` fixture starts a fresh pool once it passes
:data:`THREAD_LIMIT` (destroying a job's groups after it instead breaks jobs whose DTensors
resolve a group by name later).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import sys
import traceback
from typing import Any

from fxplan.core.loopback import free_loopback_port

WORKER_TIMEOUT_S = 30

#: Threads per worker beyond which the ``rank_pool`` fixture starts a fresh pool.
THREAD_LIMIT = 300


def _worker(rank: int, world: int, port: int, jobs: Any, results: Any, path: list[str]) -> None:
    import datetime
    import gc
    import importlib

    from fxplan.runtime.launch.parent_death import die_with_parent

    die_with_parent(signal.SIGKILL)  # a test run killed outright takes its pool along
    sys.path[:0] = [p for p in path if p not in sys.path]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=WORKER_TIMEOUT_S))
    gc.freeze()   # what is imported lives as long as the worker: no collection walks it again
    while True:
        job = jobs.get()
        if job is None:
            break
        target, kwargs = job
        module_name, function_name = target.split(":")
        try:
            function = getattr(importlib.import_module(module_name), function_name)
            results.put((rank, True, function(**kwargs)))
        except BaseException:  # noqa: BLE001 - reported to the test
            results.put((rank, False, traceback.format_exc()))
        gc.collect()
    gc.collect()
    dist.destroy_process_group()


def _context() -> Any:
    """The processes' start method: forks of one server that imported what a rank imports
    (``forked_workers.PRELOAD``, as ``fxplan launch`` starts CPU ranks), so that a pool started
    again — a fresh one after a broken test or past the thread limit, or an 8-rank one — costs
    no interpreter start per rank; the server lives as long as the test run. ``spawn`` where
    there is no forkserver."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    from fxplan.runtime.launch.forked_workers import PRELOAD

    mp.set_forkserver_preload(PRELOAD)
    return mp.get_context("forkserver")


class RankPool:
    """See the module docstring."""

    def __init__(self, world: int = 4) -> None:
        self.world = world
        ctx = _context()
        port = free_loopback_port()
        self.jobs = [ctx.Queue() for _ in range(world)]
        self.results = ctx.Queue()
        self.procs = [
            ctx.Process(target=_worker, args=(r, world, port, self.jobs[r], self.results,
                                              list(sys.path)), daemon=True)
            for r in range(world)
        ]
        for proc in self.procs:
            proc.start()
        self.broken = False

    def run(self, target: str, timeout: float = 120, **kwargs: Any) -> list[Any]:
        """Run ``module:function(**kwargs)`` on every rank; the list of per-rank results."""
        if self.broken:
            raise RuntimeError("the rank pool broke in an earlier test")
        for q in self.jobs:
            q.put((target, kwargs))
        results: dict[int, Any] = {}
        errors: list[str] = []
        for _ in range(self.world):
            try:
                rank, ok, value = self.results.get(timeout=timeout)
            except queue.Empty:
                self.broken = True
                self.close(force=True)
                raise TimeoutError(f"{target}: ranks {sorted(set(range(self.world)) - set(results))}"
                                   f" gave no answer in {timeout} s\n" + "\n".join(errors))
            results[rank] = value
            if not ok:
                errors.append(f"--- rank {rank} ---\n{value}")
                timeout = min(timeout, WORKER_TIMEOUT_S + 15)
        if errors:
            raise AssertionError(f"{target} failed:\n" + "\n".join(errors))
        return [results[r] for r in range(self.world)]

    def threads(self) -> int:
        """The most threads any worker has now (Linux ``/proc``; 0 where it cannot be read)."""
        counts = []
        for proc in self.procs:
            try:
                counts.append(len(os.listdir(f"/proc/{proc.pid}/task")))
            except OSError:
                counts.append(0)
        return max(counts, default=0)

    def close(self, force: bool = False) -> list[int | None]:
        """Stop the workers; returns their exit codes (0 = clean)."""
        if not force:
            for q in self.jobs:
                q.put(None)
        for proc in self.procs:
            proc.join(timeout=None if not force else 1)
            if proc.is_alive():
                proc.kill()
                proc.join()
        return [proc.exitcode for proc in self.procs]
