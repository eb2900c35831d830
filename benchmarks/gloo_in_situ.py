"""What gloo's collectives cost inside a launched training step, and the loopback level's
constants fitted to it in the cost model's own form.

    python benchmarks/gloo_in_situ.py [--ranks 2 4] [--runs 3] [--rounds 10] [--out F]
    flock bench.lock python benchmarks/gloo_in_situ.py --autogroup-nice -19 --out F

**Why.** The loopback level's constants were first measured in tight loops of collectives
between 0.1 ms bursts of compute (``local_cpu_calibration.py --gloo-cpu``: hop latency, CPU per
step, bus bandwidth). Inside a training step a collective comes after milliseconds of the
model's compute, on cores its peers are computing on, and costs something else: measured
here, a 64 KiB all-reduce between two ranks that have a core each adds 1.2–1.6 ms to the step
where the tight loop said 0.66 ms, and a 1 MiB all-reduce of four ranks time-sharing two
cores adds 2.6–3.3 ms where the spec's core-shared bandwidth said 5.8 ms (2026-11-25 (`42788fc`), six
runs).

**What runs.** For each ``N`` it plans gpt-tiny at global batch 16 on
``local-cpu:devices=N`` as plain data parallelism (``fxplan.search``, ``dp=N, zero=0,
recompute=none``) and runs the plan's training step (:func:`fxplan.runtime.apply.graph.apply_plan`
and the trainer's phases: schedule, partial gradients, clipping, AdamW, zeroed gradients) on
``N`` one-thread gloo ranks placed as ``fxplan launch`` places them
(:mod:`fxplan.runtime.launch.affinity`). Forward hooks on the attention and the MLP of each block
(``k = 4`` for gpt-tiny) can each issue one blocking collective — a kind ``K`` of the
runtime's (all-reduce, all-gather, broadcast, and a send/recv ping-pong between rank pairs
``(2i, 2i+1)``, two messages) at a size ``S`` (nccl-tests sizes: the gathered output of an
all-gather) — which the ranks reach from a millisecond or two of compute, as a step's own
collectives. For each ``(K, S)`` blocks of ``--block`` steps with the hooks off and on
alternate for ``--rounds`` rounds (the first step of a block untimed); per rank
``marginal = (median step on − median step off) / k``, per run the median over ranks, and
over ``--runs`` runs (fresh process groups) the median.

**The fit.** The cost model prices a collective over ``n`` ranks of one node
(:mod:`fxplan.cost_model.comm.collectives`) as::

    t_K(S) = α + s_K·(h + c_K·f_K(S)) + b_K·S/B

with ``s`` the ring's steps (all-reduce ``2(n−1)``, all-gather and broadcast ``n−1``, a
send/recv 1: the ping-pong is two), ``f`` the filled share of an all-reduce's segments
(``min(1, ⌈S/4⌉/2n)``; 1 otherwise), ``b`` the bus factor (``2(n−1)/n``, ``(n−1)/n``, 1, 1)
and ``α`` the ring's base latency (6 µs, ``cost_model/data/collectives.json``). The marginal
costs are linear in ``h``, the ``c_K`` and ``1/B``; their least-squares solution (every
point weighted alike, every unknown ≥ 0) is the regime's in-situ hop latency, CPU per step of each kind and bus
bandwidth — the spec's loopback ``latency_us``, ``step_cpu_us`` and ``bandwidth_gb_per_s``
(``cluster_specs/local_cpu.py``: a core per rank, ``N ≤ C``, or time-shared, ``N > C``). The
script prints each point beside the fit's price and the model's price with the spec as it
is.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from fxplan.core.loopback import free_loopback_port

sys.path.insert(0, str(Path(__file__).resolve().parent))
from launched_rank import (add_measurement_arguments, apply_autogroup_nice,  # noqa: E402
                           launched_rank)  # (benchmarks/, a script)
from local_cpu_lines.gloo_cpu import collective_call  # noqa: E402

#: Modules whose forward ends with the hooked collective (suffixes of module names).
HOOKED = (".attn", ".mlp")
KINDS = ("all_reduce", "all_gather", "broadcast", "send_recv")
SIZES = (4, 64 * 2**10, 256 * 2**10, 2**20)
WARMUP = 3
#: The ring's base latency α, µs (``cost_model/data/collectives.json``).
BASE_LATENCY_US = 6.0


def _worker(rank: int, world: int, plan_file: str, port: int, points: list[tuple[str, int]],
            rounds: int, block: int, out_dir: str) -> None:
    import torch.distributed as dist

    from fxplan.runtime.train.optim import build_optimizer, clip_grad_norm, set_lr
    from fxplan.runtime.apply.partial_grads import reduce_partial_grads
    from fxplan.rank.loss import loss_fn

    launched = launched_rank(rank, world, plan_file, port)
    sharded, batch = launched.sharded, launched.batch
    optimizer = build_optimizer(sharded, "adamw", lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95))
    call: list[Callable[[], object] | None] = [None]

    def hook(*_: Any) -> None:
        if call[0] is not None:
            call[0]()

    hooked = 0
    for stage in sharded.stages:
        for name, module in stage.inner.named_modules():
            if name.endswith(HOOKED):
                module.register_forward_hook(hook)
                hooked += 1

    def step() -> None:
        float(sharded.train_step(batch, loss_fn, local=True))
        reduce_partial_grads(sharded)
        clip_grad_norm(sharded, 1.0)
        set_lr(optimizer, 1e-3)
        optimizer.step()
        optimizer.zero_grad()

    for _ in range(WARMUP):
        step()
    rows = []
    for kind, nbytes in points:
        collective = collective_call(kind, nbytes, rank, world)
        times: dict[bool, list[float]] = {False: [], True: []}
        for r in range(rounds):
            for on in ((False, True) if r % 2 == 0 else (True, False)):
                call[0] = collective if on else None
                step()
                for _ in range(block):
                    began = time.perf_counter()
                    step()
                    times[on].append(time.perf_counter() - began)
        off, on = (statistics.median(times[k]) for k in (False, True))
        rows.append({"kind": kind, "bytes": nbytes, "off_ms": off * 1e3, "on_ms": on * 1e3,
                     "marginal_us": (on - off) / hooked * 1e6})
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(rows))
    dist.barrier()
    dist.destroy_process_group()


def _plan(world: int, path: Path) -> None:
    import fxplan
    from fxplan.cli.constraint_text import parse_constraints

    plan = fxplan.search("gpt-tiny", f"local-cpu:devices={world}", batch=16,
                         constraints=parse_constraints(f"dp={world},zero=0,recompute=none"),
                         progress=False)
    path.write_text(json.dumps(plan.to_dict()))


def _shape(kind: str, nbytes: int, n: int) -> tuple[float, float, float]:
    """``(s, s·f, b·S)`` of the model's form (module docstring) for one hooked call; the
    send/recv ping-pong is two messages."""
    if kind == "all_reduce":
        steps, filled, bus = 2 * (n - 1), min(1.0, math.ceil(nbytes / 4) / (2 * n)), 2 * (n - 1) / n
    elif kind == "all_gather":
        steps, filled, bus = n - 1, 1.0, (n - 1) / n
    elif kind == "broadcast":
        steps, filled, bus = n - 1, 1.0, 1.0
    else:
        steps, filled, bus = 2, 1.0, 2.0
    return steps, steps * filled, bus * nbytes


def _nonnegative_lstsq(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every unknown ≥ 0: solve for the free unknowns, fix the negative
    ones at 0, repeat (a cost is never negative; noise can make an unconstrained one so)."""
    free = np.ones(a.shape[1], dtype=bool)
    solution = np.zeros(a.shape[1])
    while free.any():
        part, *_ = np.linalg.lstsq(a[:, free], y, rcond=None)
        solution[:] = 0.0
        solution[free] = part
        if (part >= 0).all():
            break
        free[np.flatnonzero(free)[part < 0]] = False
    return solution


def fit(points: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """Least squares of ``marginal − α = s·h + Σ_K [K]·s·f·c_K + b·S·(1/B)`` over the points
    (module docstring): ``latency_us`` ``h``, ``step_cpu_us`` per kind, ``bandwidth_gb_per_s``
    ``B`` (bytes per µs = 10⁻³ GB/s)."""
    kinds = sorted({p["kind"] for p in points})
    rows, y = [], []
    for p in points:
        steps, cpu_steps, moved = _shape(p["kind"], p["bytes"], n)
        rows.append([steps] + [cpu_steps if p["kind"] == k else 0.0 for k in kinds] + [moved])
        y.append(p["marginal_us"] - BASE_LATENCY_US * (2 if p["kind"] == "send_recv" else 1))
    solution = _nonnegative_lstsq(np.array(rows), np.array(y))
    h, *cpu, per_byte = (float(v) for v in solution)
    fitted = np.array(rows) @ solution
    for p, value in zip(points, fitted):
        p["fit_us"] = float(value) + BASE_LATENCY_US * (2 if p["kind"] == "send_recv" else 1)
    return {"latency_us": h, "step_cpu_us": dict(zip(kinds, cpu)),
            "bandwidth_gb_per_s": 1e-3 / per_byte if per_byte > 0 else math.inf}


def spec_price_us(kind: str, nbytes: int, world: int) -> float:
    """The cost model's price of one hooked call with the spec as it is."""
    from fxplan.cluster_specs import Cluster
    from fxplan.cost_model.comm.collectives import collective_time_s

    cluster = Cluster.load(f"local-cpu:devices={world}")
    if kind == "send_recv":
        return 2 * collective_time_s("send_recv", nbytes, (0, 1), cluster) * 1e6
    return collective_time_s(kind, nbytes, tuple(range(world)), cluster) * 1e6


def gloo_in_situ(world: int, runs: int, rounds: int, block: int) -> dict[str, Any]:
    """``runs`` runs on ``world`` ranks (module docstring): every point's marginal cost per
    run, their medians, the fit and the spec's prices."""
    import torch.multiprocessing as mp

    grid = [(k, s) for k in KINDS for s in SIZES if k != "send_recv" or world % 2 == 0]
    per_run: list[list[dict[str, Any]]] = []
    loads = []
    with tempfile.TemporaryDirectory() as tmp:
        plan_file = Path(tmp, "plan.json")
        _plan(world, plan_file)
        for run in range(runs):
            out = Path(tmp, f"run{run}")
            out.mkdir()
            loads.append(os.getloadavg()[0])
            mp.spawn(_worker, args=(world, str(plan_file), free_loopback_port(), grid, rounds, block,
                                    str(out)), nprocs=world)
            ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world)]
            per_run.append([{**ranks[0][i], "marginal_us": statistics.median(
                r[i]["marginal_us"] for r in ranks)} for i in range(len(grid))])
    points = [{"kind": k, "bytes": s,
               "runs_us": [run[i]["marginal_us"] for run in per_run],
               "marginal_us": statistics.median(run[i]["marginal_us"] for run in per_run),
               "step_off_ms": statistics.median(run[i]["off_ms"] for run in per_run),
               "spec_us": spec_price_us(k, s, world)}
              for i, (k, s) in enumerate(grid)]
    return {"ranks": world, "cores": len(os.sched_getaffinity(0)), "loads": loads,
            "points": points, "fit": fit(points, world)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--runs", type=int, default=3, help="independent runs per rank count")
    parser.add_argument("--rounds", type=int, default=10, help="alternating off/on rounds")
    parser.add_argument("--block", type=int, default=5, help="timed steps per block")
    add_measurement_arguments(parser)
    args = parser.parse_args()
    apply_autogroup_nice(args)
    results = []
    for world in args.ranks:
        result = gloo_in_situ(world, args.runs, args.rounds, args.block)
        results.append(result)
        fitted = result["fit"]
        print(f"{world} ranks on {result['cores']} cores (load average "
              f"{min(result['loads']):.1f}–{max(result['loads']):.1f}); µs per collective")
        print("  kind        bytes    | in situ (runs)            | fit   | spec now")
        for p in result["points"]:
            runs = " ".join(f"{v:5.0f}" for v in p["runs_us"])
            print(f"  {p['kind']:11s} {p['bytes']:8d} | {p['marginal_us']:5.0f} ({runs}) | "
                  f"{p['fit_us']:5.0f} | {p['spec_us']:5.0f}")
        print(f"  fit: latency_us {fitted['latency_us']:.0f}, bandwidth_gb_per_s "
              f"{fitted['bandwidth_gb_per_s']:.3f}, step_cpu_us "
              + ", ".join(f"{k} {v:.0f}" for k, v in fitted["step_cpu_us"].items()),
              flush=True)
    if args.out:
        args.out.write_text(json.dumps({"argv": sys.argv[1:], "results": results}, indent=1))


if __name__ == "__main__":
    main()
