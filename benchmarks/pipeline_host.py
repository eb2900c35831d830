"""The pipeline runtime's host work per step and per microbatch, beside the cost model's
compute of the same stages.

    python benchmarks/pipeline_host.py [--microbatches 1 2 4 8 16] [--steps 30] [--out F]
    flock bench.lock python benchmarks/pipeline_host.py --autogroup-nice -19 --out F

A pipeline stage of ``fxplan launch`` runs :mod:`torch.distributed.pipelining` (the plan's
schedule over ``m`` microbatches, :mod:`fxplan.runtime.train.pipeline`): per step it splits the
batch and builds the schedule's actions, per microbatch and stage it prepares the received
activations, runs the forward, keeps the outputs for the backward, runs the backward through
``torch.autograd`` with the received gradient and posts the sends and receives. That is
Python and dispatcher work on the rank's thread which no op of the model accounts for.

**What runs.** A model whose compute is negligible beside that work — ``gpt:layers=2,
hidden=8,heads=1,vocab=16`` at sequence 8 and global batch 16 — planned on
``local-cpu:devices=2`` as ``pp=2`` with each schedule (``gpipe``, ``1f1b``) and
``m`` microbatches (1f1b: ``m ≥ 2``; ``fxplan.search`` with ``pp=2, schedule=…, mb=16/m``), its training
step run on 2 one-thread gloo ranks placed as ``fxplan launch`` places them. Per rank the
median over steps (the first 3 dropped) of the main thread's CPU time (``thread_time``) in
the schedule's ``step`` (forward, loss, backward, sends and receives), and of the wall.

**What it reports.** The cost model's compute of each stage for the step,
``m·(f_s + b_s)`` (:attr:`fxplan.cost_model.step.estimate.Estimate.stage_plan`, at the per-core
rates probed before each plan: ``local_cpu_lines.rates.rate_probe``, without the spec's own
pipeline host work), and the residual
``r_s(m) = CPU_s(m) − m·(f_s + b_s)``; the least-squares line through every stage's
residuals over ``m`` and both schedules::

    r(m) = P + Q·m

``P`` is the runtime's host work per step and stage, ``Q`` per microbatch and stage (forward
and backward: the spec's ``pipeline_step_us`` and ``pipeline_microbatch_us``,
``cluster_specs/local_cpu.py``). The gloo threads' CPU (the sends' and receives' copies) is
not the main thread's and is not in ``r``; the main thread's issue and wait of each send and
receive are (the model's p2p row prices them with the message: a few tens of µs of ``r``'s
``Q`` are also there).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from fxplan.core.loopback import free_loopback_port

sys.path.insert(0, str(Path(__file__).resolve().parent))
from launched_rank import (add_measurement_arguments, apply_autogroup_nice,  # noqa: E402
                           launched_rank)  # (benchmarks/, a script)
from local_cpu_lines.rates import rate_probe  # noqa: E402

MODEL, SEQ, BATCH = "gpt:layers=2,hidden=8,heads=1,vocab=16", 8, 16
SCHEDULES = ("gpipe", "1f1b")
WARMUP = 3


def _worker(rank: int, world: int, plan_file: str, port: int, steps: int,
            out_dir: str) -> None:
    import torch.distributed as dist

    from fxplan.rank.loss import loss_fn

    launched = launched_rank(rank, world, plan_file, port)
    sharded, batch = launched.sharded, launched.batch
    cpu, wall = [], []
    for step in range(steps):
        began, began_cpu = time.perf_counter(), time.thread_time()
        sharded.train_step(batch, loss_fn, local=True)
        if step >= WARMUP:
            cpu.append(time.thread_time() - began_cpu)
            wall.append(time.perf_counter() - began)
        for stage in sharded.stages:
            stage.inner.zero_grad(set_to_none=True)
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(
        {"cpu_ms": statistics.median(cpu) * 1e3, "wall_ms": statistics.median(wall) * 1e3}))
    dist.barrier()
    dist.destroy_process_group()


def _planned(schedule: str, microbatches: int, rates: dict[str, float]) -> tuple[Any, list[float]]:
    """The plan and the model's compute per stage for the step, ``m·(f_s + b_s)`` ms, at
    ``rates``."""
    import fxplan
    from fxplan.api import capture_for_search
    from fxplan.cli.constraint_text import parse_constraints
    from fxplan.cluster_specs import Cluster, training_dtype
    from fxplan.plan_context import simulate_plan

    text = f"pp=2,schedule={schedule},mb={BATCH // microbatches},recompute=none"
    plan = fxplan.search(MODEL, "local-cpu:devices=2", batch=BATCH, seq=SEQ,
                         constraints=parse_constraints(text), progress=False)
    spec = ",".join(f"{k}={v:.6g}" for k, v in rates.items())
    # the model's compute without the work measured here (the spec's own line of it)
    cluster = Cluster.load(f"{plan.cluster},{spec},cpu.pipeline_step_us=0,"
                           "cpu.pipeline_microbatch_us=0")
    graph = capture_for_search(plan.model, seq=plan.seq, dtype=training_dtype(cluster))
    costs = simulate_plan(plan, graph, cluster).stage_plan.costs
    compute = (costs.forward[0] + costs.backward[0]).sum(axis=1) * microbatches * 1e3
    return plan, [float(v) for v in compute]


def pipeline_host(microbatches: list[int], steps: int) -> dict[str, Any]:
    """Every ``(schedule, m)`` point (module docstring) and the line through the residuals."""
    import torch.multiprocessing as mp

    points = []
    with tempfile.TemporaryDirectory() as tmp:
        for schedule in SCHEDULES:
            for m in microbatches:
                if schedule == "1f1b" and m < 2:
                    continue                  # 1f1b needs m ≥ pp
                rates = {k: v for k, v in rate_probe().items()
                         if k in ("matmul_tflops", "vector_gb_per_s", "eager_op_us")}
                plan, compute = _planned(schedule, m, rates)
                plan_file = Path(tmp, f"{schedule}-{m}.json")
                plan_file.write_text(json.dumps(plan.to_dict()))
                out = Path(tmp, f"{schedule}-{m}")
                out.mkdir()
                load = os.getloadavg()[0]
                mp.spawn(_worker, args=(2, str(plan_file), free_loopback_port(), steps, str(out)),
                         nprocs=2)
                ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(2)]
                points.append({
                    "schedule": schedule, "microbatches": m, "load": load, "rates": rates,
                    "cpu_ms": [r["cpu_ms"] for r in ranks],
                    "wall_ms": [r["wall_ms"] for r in ranks], "model_compute_ms": compute,
                    "residual_ms": [r["cpu_ms"] - c for r, c in zip(ranks, compute)]})
    xs = [p["microbatches"] for p in points for _ in p["residual_ms"]]
    ys = [r for p in points for r in p["residual_ms"]]
    (slope, intercept) = np.polyfit(xs, ys, 1)
    return {"model": MODEL, "seq": SEQ, "batch": BATCH, "points": points,
            "pipeline_step_us": float(intercept) * 1e3,
            "pipeline_microbatch_us": float(slope) * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--microbatches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--steps", type=int, default=30, help="steps per point (3 warm-up)")
    add_measurement_arguments(parser)
    args = parser.parse_args()
    apply_autogroup_nice(args)
    result = pipeline_host(args.microbatches, args.steps)
    print(f"{MODEL}, sequence {SEQ}, batch {BATCH}, pp=2 on 2 ranks; ms per step, per stage")
    print("  schedule  m  | main-thread CPU | model's compute | residual | wall")
    for p in result["points"]:
        fmt = lambda values: " / ".join(f"{v:5.2f}" for v in values)  # noqa: E731
        print(f"  {p['schedule']:7s} {p['microbatches']:3d} | {fmt(p['cpu_ms'])} | "
              f"{fmt(p['model_compute_ms'])} | {fmt(p['residual_ms'])} | "
              f"{fmt(p['wall_ms'])}")
    print(f"  residual = {result['pipeline_step_us']:.0f} µs + "
          f"{result['pipeline_microbatch_us']:.0f} µs · m", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"argv": sys.argv[1:], **result}, indent=1))


if __name__ == "__main__":
    main()
