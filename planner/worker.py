"""The process ``fxplan launch`` starts on every rank (``torchrun -m fxplan.worker``).

Builds the plan's model on ``meta`` and materialises only this rank's stages and shards
(values from the seeded single-device initialisation, or from ``--resume CKPT``, a sharded
checkpoint saved under any plan — that is how training goes on after a re-plan for a changed
cluster), applies the plan, and trains ``--steps`` steps on one synthetic batch (random tokens,
fixed across steps, so the loss must fall); ``--save CKPT`` writes parameters and optimizer
state at the end. Rank 0 prints per step ``loss``, step time, tokens/s and peak memory, and at the end the
plan's predicted step time and per-rank memory against the measured ones (median step time after
the first step; memory: the largest peak over ranks — CUDA allocator peak on GPUs, peak resident
set size of the process on CPUs, which includes the Python runtime). After the first step (when
reshards have run) rank 0 prints every rank's runtime fallbacks (``ShardedModule.fallbacks``:
where the plan is realised other than as planned), each once.
"""

from __future__ import annotations

import argparse
import gc
import resource
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

GIB = 2**30


def synthetic_batch(bundle: Any, plan: Any, seed: int = 0) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Model inputs and targets for the plan's global batch: integers below the vocabulary."""
    generator = torch.Generator().manual_seed(seed)
    specs = bundle.example_inputs(plan.batch, plan.seq)
    high = getattr(bundle.config, "vocab", 2)
    made = {}
    for name, spec in specs.items():
        if spec.dtype.is_floating_point:
            made[name] = torch.randn(spec.shape, generator=generator, dtype=spec.dtype)
        else:
            made[name] = torch.randint(0, high, spec.shape, generator=generator, dtype=spec.dtype)
    targets = made.pop("targets")
    return tuple(made.values()), targets


def loss_fn(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every position (integer targets), else mean squared error."""
    if targets.dtype.is_floating_point:
        return F.mse_loss(output, targets)
    return F.cross_entropy(output.reshape(-1, output.size(-1)), targets.reshape(-1))


def peak_memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / GIB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fxplan.worker")
    parser.add_argument("plan")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--model", default=None, help="model spec (default: the plan's)")
    parser.add_argument("--resume", default=None, help="sharded checkpoint to start from")
    parser.add_argument("--save", default=None, help="write a sharded checkpoint at the end")
    args = parser.parse_args(argv)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        import os

        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend)
    try:
        _train(args)
    finally:
        gc.collect()  # drop DTensor/FSDP state before the groups go (clean exit, no SIGABRT)
        dist.destroy_process_group()
    return 0


def _train(args: argparse.Namespace) -> None:
    from fxplan.examples.model_spec import resolve_model
    from fxplan.core.plan import load_plan
    from fxplan.runtime.apply import apply_plan
    from fxplan.runtime.build import meta_parameters

    plan = load_plan(args.plan)
    rank = dist.get_rank()
    bundle = resolve_model(args.model or plan.model)

    def seeded_model() -> torch.nn.Module:
        torch.manual_seed(0)
        return bundle.build("cpu")

    with meta_parameters():
        model = bundle.build("cpu")
    inputs, targets = synthetic_batch(bundle, plan)
    if args.resume:
        sharded = apply_plan(model, plan, inputs, checkpoint=args.resume)
    else:
        sharded = apply_plan(model, plan, inputs, init=seeded_model)
    optimizer = sharded.optimizer(torch.optim.AdamW, lr=args.lr)
    if args.resume:
        sharded.load(args.resume, optimizer)
        if rank == 0:
            print(f"resumed parameters and optimizer state from {args.resume}", flush=True)
    tokens = targets.numel()
    if rank == 0:
        print(f"fxplan launch: {plan.model} on {plan.cluster} | {plan.summary} | "
              f"{dist.get_world_size()} ranks, backend {dist.get_backend()}", flush=True)
    if args.steps == 0:
        _print_fallbacks(sharded, rank)
    times = []
    for step in range(1, args.steps + 1):
        start = time.perf_counter()
        loss = sharded.train_step((inputs, targets), loss_fn)
        optimizer.step()
        optimizer.zero_grad()
        if sharded.device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        times.append(elapsed)
        if rank == 0:
            print(f"step {step:>4}  loss {float(loss):.4f}  time {elapsed * 1e3:8.1f} ms  "
                  f"tokens/s {tokens / elapsed:10.1f}  peak mem "
                  f"{peak_memory_gib(sharded.device):.3f} GiB", flush=True)
        if step == 1:
            _print_fallbacks(sharded, rank)
    if args.save:
        sharded.save(args.save, optimizer)
        if rank == 0:
            print(f"saved parameters and optimizer state to {args.save}", flush=True)
    peak = torch.tensor(peak_memory_gib(sharded.device), device=sharded.device)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    if rank == 0:
        measured = statistics.median(times[1:] if len(times) > 1 else times)
        predicted_time = _number(plan.estimate.get("step_time_s"))
        predicted_mem = _number(plan.estimate.get("peak_memory_gib"))
        print(f"step time  predicted {_show(predicted_time, 'ms', 1e3)}  measured "
              f"{measured * 1e3:.3f} ms (median)", flush=True)
        print(f"peak memory per rank  predicted {_show(predicted_mem, 'GiB')}  measured "
              f"{float(peak):.3f} GiB (max over ranks)", flush=True)


def _print_fallbacks(sharded: Any, rank: int) -> None:
    """Rank 0 prints the union of every rank's fallbacks (collective), each line once."""
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, list(sharded.fallbacks))
    if rank != 0:
        return
    lines = list(dict.fromkeys(line for part in gathered for line in part or ()))
    for line in lines:
        print(f"fallback: {line}", flush=True)


def _number(value: Any) -> float | None:
    """A scalar estimate, or the largest of a per-stage list."""
    if isinstance(value, (list, tuple)):
        return max(value) if value else None
    return None if value is None else float(value)


def _show(value: float | None, unit: str, scale: float = 1.0) -> str:
    return "n/a (no estimate in the plan)" if value is None else f"{value * scale:.3f} {unit}"


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
