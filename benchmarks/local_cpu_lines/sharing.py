"""Time-sharing the cores: ``N`` one-thread processes at 1, ``C`` and ``2C`` (line 6.,
``--sharing``). The formulas are in ``local_cpu_calibration.py``'s docstring."""

from __future__ import annotations

import json
import os
import resource
import statistics
import time
from pathlib import Path
from typing import Any

import torch

__all__ = ["print_sharing", "time_sharing"]


def _sharing_worker(rank: int, world: int, iterations: int, out: str) -> None:
    import torch.nn.functional as F

    from fxplan.examples.model_spec import resolve_model
    from fxplan.runtime.launch.affinity import pin_rank

    pin_rank(rank, world)   # as fxplan launch places its ranks
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = resolve_model("gpt-tiny").build("cpu")
    x, y = torch.randint(0, 512, (4, 64)), torch.randint(0, 512, (4, 64))

    def forward_backward() -> None:
        out_ = model(x)
        F.cross_entropy(out_.reshape(-1, out_.size(-1)), y.reshape(-1)).backward()

    forward_backward()
    before = resource.getrusage(resource.RUSAGE_SELF)
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(iterations):
        forward_backward()
    after = resource.getrusage(resource.RUSAGE_SELF)
    Path(out, f"{rank}.json").write_text(json.dumps({
        "wall": time.perf_counter() - start, "cpu": time.process_time() - cpu,
        "voluntary": after.ru_nvcsw - before.ru_nvcsw,
        "involuntary": after.ru_nivcsw - before.ru_nivcsw}))


def time_sharing(iterations: int = 150, rounds: int = 3) -> dict[str, Any]:
    """``T_1``, ``T_C``, ``T_2C`` (s), ``κ = T_1 / T_C`` and ``η = 2·T_C / T_2C`` (module
    docstring); each ``N`` runs ``rounds`` times, interleaved, and its median is taken."""
    import tempfile

    import torch.multiprocessing as mp

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    runs: dict[int, list[float]] = {n: [] for n in (1, cores, 2 * cores)}
    # per N and round, the medians over processes of their CPU and context switches
    usage: dict[int, list[dict[str, float]]] = {n: [] for n in runs}
    keys = ("cpu", "voluntary", "involuntary")
    for _ in range(rounds):
        for n in runs:
            with tempfile.TemporaryDirectory() as tmp:
                mp.spawn(_sharing_worker, args=(n, iterations, tmp), nprocs=n)
                procs = [json.loads(p.read_text()) for p in Path(tmp).glob("*.json")]
                runs[n].append(statistics.median(p["wall"] for p in procs))
                usage[n].append({k: statistics.median(p[k] for p in procs) for k in keys})
    t = {n: statistics.median(v) for n, v in runs.items()}
    per = {n: {k: statistics.median(u[k] for u in usage[n]) for k in keys} for n in runs}
    return {"cores": cores, "t_1": t[1], "t_c": t[cores], "t_2c": t[2 * cores],
            "runs": {str(n): v for n, v in runs.items()}, "load": os.getloadavg()[0],
            "concurrency": t[1] / t[cores], "efficiency": 2 * t[cores] / t[2 * cores],
            # a process's CPU (all its threads) and context switches over the loop, per N
            "usage": {str(n): u for n, u in per.items()}}


def print_sharing(share: dict[str, Any]) -> None:
    print(f"| time-sharing, gpt-tiny fwd+bwd ×150: 1 / {share['cores']} / {2 * share['cores']} "
          f"processes on {share['cores']} cores | {share['t_1']:.2f} s / {share['t_c']:.2f} s / "
          f"{share['t_2c']:.2f} s ⇒ κ = {share['concurrency']:.3f}, η = "
          f"{share['efficiency']:.3f} |")
    usage = share["usage"]
    c, c2 = usage[str(share["cores"])], usage[str(2 * share["cores"])]
    switches = (c2["voluntary"] + c2["involuntary"]) - (c["voluntary"] + c["involuntary"])
    print(f"| … CPU per process, {share['cores']} / {2 * share['cores']} processes; context "
          f"switches (voluntary + involuntary) | {c['cpu']:.3f} s / {c2['cpu']:.3f} s; "
          f"{c['voluntary']:.0f} + {c['involuntary']:.0f} / {c2['voluntary']:.0f} + "
          f"{c2['involuntary']:.0f} ⇒ "
          + (f"{(c2['cpu'] - c['cpu']) / switches * 1e6:.0f} µs of CPU per added switch |"
             if switches > 0 else "no added switch |"))
