"""AdamW's step per tensor, and the trainer's host work after ``train_step`` on one rank (line 10.,
``--step``). The formulas are in ``local_cpu_calibration.py``'s docstring."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from local_cpu_lines.ranks import join_gloo, spawn_json
from local_cpu_lines.rates import median_thread_time, rate_probe

__all__ = ["optimizer_us", "step_host_us"]


def optimizer_us(repeats: int) -> dict[str, float]:
    """AdamW ``step`` + ``zero_grad`` on gpt-tiny's parameters: total and per tensor (µs)."""
    from fxplan.examples.model_spec import resolve_model

    model = resolve_model("gpt-tiny").build("cpu")
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.zeros_like(p)
    opt = torch.optim.AdamW(params, lr=1e-3)

    def step() -> None:
        opt.step()
        for p in params:  # keep the grads (zero_grad(set_to_none) would drop them)
            p.grad.zero_()

    t = median_thread_time(step, repeats=repeats)
    return {"tensors": len(params), "elements": sum(p.numel() for p in params),
            "step_us": t * 1e6, "per_tensor_us": t / len(params) * 1e6}


def _step_host_worker(rank: int, world: int, port: int, steps: int, out: str) -> None:
    """One rank (a one-rank gloo group) running the trainer's step on the runtime's one-rank
    gpt-tiny plan, each phase timed once per step as the trainer runs it (module docstring,
    9.)."""
    import fxplan
    from fxplan.cluster_specs import Cluster
    from fxplan.cost_model.compute.op_time import op_time_s
    from fxplan.cost_model.memory.breakdown import adam_for
    from fxplan.examples.model_spec import resolve_model
    from fxplan.runtime.apply.graph import apply_plan
    from fxplan.runtime.train.optim import build_optimizer, clip_grad_norm, set_lr
    from fxplan.runtime.apply.partial_grads import reduce_partial_grads
    from fxplan.rank.loss import loss_fn

    join_gloo(rank, world, port)
    plan = fxplan.search("gpt-tiny", "local-cpu:devices=1", batch=16, progress=False)
    torch.manual_seed(0)
    tokens, targets = (torch.randint(0, 512, (16, plan.seq)) for _ in range(2))
    sharded = apply_plan(resolve_model("gpt-tiny").build("cpu"), plan, (tokens,))
    optimizer = build_optimizer(sharded, "adamw", lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95))
    phases = {"train_step": lambda: sharded.train_step(((tokens,), targets), loss_fn, local=True),
              "partial": lambda: reduce_partial_grads(sharded),
              "clip": lambda: clip_grad_norm(sharded, 1.0),
              "opt": lambda: (set_lr(optimizer, 1e-3), optimizer.step()),
              "zero": optimizer.zero_grad}
    samples: dict[str, list[float]] = {k: [] for k in phases}
    for step in range(steps + 3):
        for name, fn in phases.items():
            c = time.thread_time()
            fn()
            if step >= 3:                    # warm-up: the optimizer's states, the caches
                samples[name].append(time.thread_time() - c)
    probe = rate_probe()
    params = sum(p.numel() for p in sharded.parameters())
    # the optimizer's memory traffic as the cost model prices it at this moment's rates
    device = Cluster.load(f"local-cpu:devices=1,matmul_tflops={probe['matmul_tflops']:.6g},"
                          f"vector_gb_per_s={probe['vector_gb_per_s']:.6g},"
                          f"eager_op_us={probe['eager_op_us']:.6g}").device_groups[0]
    adam = adam_for("fp32")
    traffic = op_time_s("elementwise", adam.step_flops * params, adam.step_bytes * params,
                        torch.float32, device)
    result = {k: statistics.median(v) * 1e6 for k, v in samples.items()}
    result.update(tensors=len(list(sharded.parameters())), params=params,
                  traffic_us=traffic * 1e6, eager_op_us=probe["eager_op_us"],
                  matmul_tflops=probe["matmul_tflops"])
    Path(out).write_text(json.dumps(result))
    import torch.distributed as dist
    dist.destroy_process_group()


def step_host_us(steps: int = 30, runs: int = 3) -> dict[str, Any]:
    """9. The trainer's host work after ``train_step`` on one rank (no DDP), each phase once
    per step in the trainer's order (its caches as a real step leaves them: the forward and
    backward in between), median over ``steps``, then over ``runs`` fresh ranks, µs at the
    spec's eager op (``· EAGER_OP_US / e``, each run's probe): ``clip``, ``partial``,
    ``zero`` — together the spec's ``step_overhead_us`` — and ``opt`` (``set_lr`` + AdamW's
    step) less the cost model's price of its memory traffic at the run's probed rates
    (``traffic``: ``op_time("elementwise", 12·Ψ, 28·Ψ)``), per parameter tensor: the spec's
    ``optimizer_tensor_us``, the host loop the roofline does not price."""
    from fxplan.cluster_specs.local_cpu import EAGER_OP_US

    rows = []
    for _ in range(runs):
        r = spawn_json(_step_host_worker, 1, steps)
        h = EAGER_OP_US / r["eager_op_us"]
        rows.append({**r, **{f"{k}_us": r[k] * h for k in ("clip", "partial", "zero")},
                     "optimizer_tensor_us": (r["opt"] - r["traffic_us"]) * h / r["tensors"]})
    keys = ("train_step", "partial", "clip", "opt", "zero", "traffic_us", "clip_us",
            "partial_us", "zero_us", "optimizer_tensor_us", "eager_op_us", "matmul_tflops")
    out: dict[str, Any] = {k: statistics.median(r[k] for r in rows) for k in keys}
    out["step_overhead_us"] = statistics.median(r["clip_us"] + r["partial_us"] + r["zero_us"]
                                                for r in rows)
    out["runs"] = rows
    return out
