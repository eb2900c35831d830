"""The training loop of ``fxplan launch``: data → schedule → clip → schedule the lr → update.

One step ``t = 1 … T`` on every rank of a :class:`ShardedModule`:

1. this replica's slice of the global batch of step ``t`` (:mod:`fxplan.runtime.train.data`), read
   only by ranks that run the first or the last pipeline stage;
2. ``train_step``: the plan's schedule over its microbatches — forward, loss, backward, with
   gradient accumulation over the microbatches and the dp reduction (DDP / FSDP2); with
   ``pp = 1`` a plain loop whose last backward reduces (:mod:`fxplan.runtime.train.accumulate`);
3. every ``Partial`` gradient (tp with sp: replicated parameters on sequence-sharded
   activations) reduced once, one flattened all-reduce per mesh group
   (:mod:`fxplan.runtime.apply.partial_grads`); then the global gradient norm over every shard and
   stage, and clipping to ``grad_clip``
   (:func:`fxplan.runtime.train.optim.clip_grad_norm`);
4. the learning rate of step ``t`` (warm-up + cosine), the optimizer step, zeroed gradients.

Every ``log_every`` steps (and at the last) the slowest rank's step time and the largest peak
memory over ranks are gathered (one all-reduce) and rank 0 logs :class:`StepMetrics`.

With ``trace=PATH`` every rank records up to :data:`TRACE_STEPS` steps after the first (the
first builds the schedule and warms caches) with :mod:`torch.profiler` (CPU, and CUDA on
GPUs) and writes them to ``PATH`` in the Chrome trace format, beside which the predicted trace
(:mod:`fxplan.report.trace`) can be opened.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.distributed as dist

from fxplan.runtime.train.metrics import (FlopCounts, MetricsLog, StepMetrics, peak_memory_gib,
                                    peak_reserved_gib)
from fxplan.core.training import TrainConfig
from fxplan.runtime.train.optim import build_optimizer, clip_grad_norm, set_lr
from fxplan.runtime.apply.partial_grads import reduce_partial_grads

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.runtime.train.data import DataSource
    from fxplan.runtime.apply.sharded_module import ShardedModule

__all__ = ["TRACE_STEPS", "TrainResult", "train"]

#: Steps a ``trace`` records (after the first).
TRACE_STEPS = 3


@dataclass
class TrainResult:
    """Per-step values (the same on every rank) and the measured step time and memory."""

    losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    step_times_s: list[float] = field(default_factory=list)  # slowest rank's, per step
    peak_memory_gib: float = 0.0                              # largest over ranks
    #: per rank of the plan's group: its own ``step_times_s``, ``peak_memory_gib`` (allocated on
    #: CUDA, resident set on CPU) and ``peak_reserved_gib`` (CUDA's caching allocator, else None)
    ranks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def median_step_time_s(self) -> float:
        """Median over steps 2… (step 1 builds the schedule and warms caches)."""
        times = self.step_times_s[1:] or self.step_times_s
        return statistics.median(times)


def train(sharded: "ShardedModule", data: "DataSource", loss_fn: Callable[..., torch.Tensor],
          config: TrainConfig, *, tokens_per_step: int, optimizer: torch.optim.Optimizer | None = None,
          flops: FlopCounts | None = None, capacity_gib: float | None = None,
          log: MetricsLog | None = None, on_step: Callable[[int], Any] | None = None,
          start_step: int = 0, trace: str | Path | None = None
          ) -> tuple[TrainResult, torch.optim.Optimizer]:
    """Train steps ``start_step + 1 … config.steps`` (collective over the plan's ranks); ``log``
    on rank 0 only. ``start_step``: updates already done (a resumed run; the data order and the
    schedule are functions of the step, so step ``t`` reads and runs exactly as it would have
    without the interruption). ``on_step(t)`` runs after each update (printing fallbacks after
    the first, saving checkpoints). ``result`` holds the steps run here; ``trace``: the Chrome
    trace file this rank writes (module docstring)."""
    if not 0 <= start_step < config.steps:
        raise ValueError(f"start_step {start_step}: expected 0 ≤ start_step < {config.steps}")
    if optimizer is None:
        optimizer = build_optimizer(sharded, config.optimizer, lr=config.lr,
                                    weight_decay=config.weight_decay,
                                    betas=(config.beta1, config.beta2))
    start, stop = sharded.replica_slice()
    reads = sharded.is_first or sharded.is_last
    devices = dist.get_world_size(sharded.group)
    result = TrainResult()
    local_times: list[float] = []
    profiler = _profiler(sharded.device, config.steps - start_step) if trace else None
    if profiler is not None:
        profiler.start()
    for step in range(start_step + 1, config.steps + 1):
        began = time.perf_counter()
        batch = data.batch(step - 1, start, stop) if reads else ((), None)
        loss = float(sharded.train_step(batch, loss_fn, local=True))
        reduce_partial_grads(sharded)
        norm = clip_grad_norm(sharded, config.grad_clip)
        lr = config.lr_at(step)
        set_lr(optimizer, lr)
        optimizer.step()
        optimizer.zero_grad()
        if sharded.device.type == "cuda":
            torch.cuda.synchronize(sharded.device)
        elapsed = time.perf_counter() - began
        local_times.append(elapsed)
        result.losses.append(loss)
        result.grad_norms.append(norm)
        result.lrs.append(lr)
        if step % config.log_every == 0 or step == config.steps:
            slowest = torch.tensor([elapsed, peak_memory_gib(sharded.device)],
                                   dtype=torch.float64, device=sharded.device)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=sharded.group)
            if log is not None:
                log.log(StepMetrics.make(
                    step=step, loss=loss, grad_norm=norm, lr=lr, step_time_s=float(slowest[0]),
                    tokens=tokens_per_step, devices=devices, flops=flops,
                    peak_memory_gib=float(slowest[1]), capacity_gib=capacity_gib))
        elif log is not None:
            log.progress(step, loss, elapsed)
        if on_step is not None:
            on_step(step)
        if profiler is not None:
            profiler.step()
    if profiler is not None and trace:
        profiler.stop()
        Path(trace).parent.mkdir(parents=True, exist_ok=True)
        profiler.export_chrome_trace(str(trace))
    own = {"step_times_s": local_times, "peak_memory_gib": peak_memory_gib(sharded.device),
           "peak_reserved_gib": peak_reserved_gib(sharded.device)}
    result.ranks = [{}] * dist.get_world_size(sharded.group)
    dist.all_gather_object(result.ranks, own, group=sharded.group)
    # the slowest rank's time of each step and the largest peak, from what every rank sent
    result.step_times_s = [max(step) for step in zip(*(r["step_times_s"] for r in result.ranks))]
    result.peak_memory_gib = max(r["peak_memory_gib"] for r in result.ranks)
    if log is not None:
        log.close()
    return result, optimizer


def _profiler(device: torch.device, steps: int) -> Any:
    """A :class:`torch.profiler.profile` that skips the first step and records the next
    ``min(TRACE_STEPS, steps − 1)`` (the only one when one step runs)."""
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    wait = 1 if steps > 1 else 0
    active = max(1, min(TRACE_STEPS, steps - wait))
    return profile(activities=activities, schedule=schedule(wait=wait, warmup=0, active=active,
                                                             repeat=1))
