"""Measure the host side of offload on this machine: torch's CPU AdamW step against the
machine's memory bandwidth, as JSON (the figures behind :mod:`fxplan.cost_model.memory.offload`).

    python benchmarks/host_adam_rate.py [--params 16] [--threads 1 2] [--repeats 5]

What the runtime runs. ``offload=optimizer`` steps ``torch.optim.AdamW`` on the host over
fp32 masters of the rank's local tensors (``fxplan.runtime.train.host_optimizer``, built with
``foreach=False, fused=False``); ``offload=optimizer+params`` runs as FSDP2's
``CPUOffloadPolicy``: the parameter shards (fp32 ``DTensor``s) and their gradients live on the
CPU, and the optimizer the runtime builds, ``torch.optim.AdamW(params, lr, betas)``
(``fxplan.runtime.train.optim``), keeps its moments beside them. With neither ``foreach`` nor
``fused`` given, torch 2.13 picks ``_default_to_fused_or_foreach``: fused never by default,
foreach only on CUDA/XPU/MTIA devices — on the CPU either way it runs ``_single_tensor_adam``:
per parameter tensor, one eager kernel after another::

    p.mul_(1 − lr·wd)              read p, write p                      8 B   (decay group)
    m.lerp_(g, 1 − β₁)             read m, g, write m                   12 B
    v.mul_(β₂)                     read v, write v                      8 B
    v.addcmul_(g, g, 1 − β₂)       read v, g, write v                   12 B
    d = v.sqrt()                   read v, write d                      8 B
    d = d / √(1 − β₂ᵗ)             read d, write d'                     8 B
    d.add_(ε)                      read d, write d                      8 B
    p.addcdiv_(m, d, −lr/(1−β₁ᵗ))  read p, m, d, write p                16 B
                                                             total  80 B per parameter

and, under ``optimizer+params`` only (whose gradients are on the host), before it the gradient
clipping of ``fxplan.runtime.train.optim`` (``grad_clip`` 1.0 by default): ``torch._foreach_norm``
(read g, 4 B) and ``torch._foreach_mul_`` (read g, write g, 8 B) — 92 B per parameter of host
traffic in all; ``offload=optimizer`` clips on the device, 80 B (``ADAM_HOST_BYTES``,
``CLIP_HOST_BYTES``).

against the 28 B a fused step streams (read p, m, v, g; write p, m, v: the cost model's
``OptimizerSpec.step_bytes`` unit). Each kernel is an ATen CPU elementwise loop over
``torch.get_num_threads()`` threads; ``fxplan launch`` starts every rank with
``OMP_NUM_THREADS=1`` (``fxplan.cli.torchrun_command``), so each rank's step runs on one core.

Measured (every figure a median over ``--repeats``; one thread on ``time.thread_time``,
several threads on the wall clock):

* ``copy_gb_per_s`` — ``out.copy_(x)`` of a 512 MiB fp32 tensor, ``2·S / t`` (bytes read +
  written), per thread count: the memory bandwidth ``b(t)`` the same threads reach;
* ``adamw`` — one ``AdamW.step`` over ``--params`` M fp32 parameters in 4 tensors (a decay
  group and one without: the runtime's two groups), gradients set, after a warm-up step
  (the states exist): ``params_per_s``, ``step_gb_per_s = 28·params_per_s`` (the cost
  model's unit) and ``eta = step_gb_per_s / b(t)``, the efficiency the cost model's
  ``HOST_STREAM_EFFICIENCY`` stands for; variants ``default`` (what the runtime runs),
  ``clip`` (the default preceded by the clipping's norm and multiply: the runtime's host
  work per step), ``fused`` (``fused=True``: ATen's one-pass CPU kernel) and ``dtensor``
  (the default on ``DTensor`` parameters sharded on a one-rank mesh, as FSDP2 hands them
  over); ``traffic_eta`` = the bytes the variant really moves (92 B per parameter for
  ``clip``, 80 for the others, 28 for ``fused``) per second over ``b(t)``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Callable

import torch

#: Bytes per parameter of the cost model's CPU step unit (``OptimizerSpec.step_bytes``).
STEP_BYTES = 28.0
#: Bytes per parameter each variant really moves (module docstring).
TRAFFIC_BYTES = {"default": 80.0, "clip": 92.0, "fused": 28.0, "dtensor": 80.0}


def _median_s(fn: Callable[[], object], repeats: int, threads: int) -> float:
    """Median seconds of ``fn``: the thread's CPU clock on one thread, else the wall clock."""
    clock = time.thread_time if threads == 1 else time.perf_counter
    fn()
    samples = []
    for _ in range(repeats):
        start = clock()
        fn()
        samples.append(clock() - start)
    return statistics.median(samples)


def copy_gb_per_s(threads: int, repeats: int, mib: int = 512) -> float:
    """``b(t)``: the copy of a ``mib`` MiB fp32 tensor on ``threads`` threads, GB/s."""
    torch.set_num_threads(threads)
    x = torch.randn(mib * 2**18)
    out = torch.empty_like(x)
    return 2 * x.numel() * 4 / _median_s(lambda: out.copy_(x), repeats, threads) / 1e9


def _params(mparams: int, dtensor: bool) -> list[torch.nn.Parameter]:
    """``mparams`` M fp32 parameters in 4 tensors (3 matrices, 1 vector-sized), gradients set."""
    sizes = [mparams * 2**20 * f // 16 for f in (6, 6, 3, 1)]
    out = []
    for n in sizes:
        data = torch.randn(n // 1024, 1024)
        if dtensor:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor import Shard, distribute_tensor

            data = distribute_tensor(data, init_device_mesh("cpu", (1,)), [Shard(0)])
        p = torch.nn.Parameter(data)
        p.grad = torch.randn_like(p) * 1e-3
        out.append(p)
    return out


def adamw_rate(variant: str, mparams: int, threads: int, repeats: int) -> dict[str, float]:
    """One ``AdamW.step`` per repeat (module docstring): parameters per second."""
    torch.set_num_threads(threads)
    params = _params(mparams, dtensor=variant == "dtensor")
    groups = [dict(params=params[:3], weight_decay=0.1), dict(params=params[3:], weight_decay=0.0)]
    opt = torch.optim.AdamW(groups, lr=1e-4, betas=(0.9, 0.95),
                            **({"fused": True} if variant == "fused" else {}))
    n = sum(p.numel() for p in params)

    def step() -> None:
        if variant == "clip":  # fxplan.runtime.train.optim.clip_grad_norm's host work
            grads = [p.grad for p in params]
            norm = torch.stack(torch._foreach_norm(grads)).double().pow(2).sum().sqrt()
            torch._foreach_mul_(grads, (1.0 / (norm + 1e-6)).clamp(max=1.0).float())
        opt.step()

    seconds = _median_s(step, repeats, threads)
    return {"params": n, "step_s": seconds, "params_per_s": n / seconds}


def main(argv: list[str] | None = None) -> dict[str, object]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=int, default=16, help="M parameters stepped (default 16)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1],
                    help="thread counts (default 1, as fxplan launch runs each rank)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--variants", nargs="+", default=list(TRAFFIC_BYTES))
    args = ap.parse_args(argv)
    from local_cpu_lines.ranks import single_rank_group  # benchmarks/, on sys.path as a script

    single_rank_group()  # DTensor needs a device mesh
    rows: dict[str, object] = {"torch": torch.__version__, "cores": os.cpu_count(),
                               "load": os.getloadavg()[0], "by_threads": {}}
    for t in sorted(set(args.threads)):
        bw = copy_gb_per_s(t, args.repeats)
        per = {"copy_gb_per_s": round(bw, 2)}
        for variant in args.variants:
            r = adamw_rate(variant, args.params, t, args.repeats)
            step_gb = STEP_BYTES * r["params_per_s"] / 1e9
            per[variant] = {"step_s": round(r["step_s"], 4),
                            "gparams_per_s": round(r["params_per_s"] / 1e9, 4),
                            "step_gb_per_s": round(step_gb, 3), "eta": round(step_gb / bw, 3),
                            "traffic_eta": round(TRAFFIC_BYTES[variant] * r["params_per_s"]
                                                 / 1e9 / bw, 3)}
        rows["by_threads"][str(t)] = per  # type: ignore[index]
    rows["load_after"] = os.getloadavg()[0]
    json.dump(rows, sys.stdout, indent=1)
    print()
    return rows


if __name__ == "__main__":
    main()
