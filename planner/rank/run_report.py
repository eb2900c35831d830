"""What rank 0 reports of a run: the settings, the plan as applied and the precision before the
first step, and at the end the predicted step time, memory, MFU and tokens/s against the
measured ones (``summary.json`` and a table)."""

from __future__ import annotations

import argparse
from typing import Any

import torch.distributed as dist

from fxplan.rank.resume import log_resume
from fxplan.rank.run import Run

__all__ = ["announce", "log_precision", "summarise"]


def announce(run: Run, args: argparse.Namespace, log: Any, position: Any,
             notes: list[str]) -> None:
    """Rank 0, before the first step: the settings, the plan as applied, a re-plan, a resume,
    the precision and what the FLOP counts could not cover."""
    from fxplan.cluster_specs import training_dtype

    plan = run.plan
    log.write_json("run_config.json", {k: v for k, v in vars(args).items()
                                       if k not in ("plan_object", "heartbeat")})
    log.print(f"fxplan launch: {plan.model} on {plan.cluster} | {plan.summary} | "
              f"{dist.get_world_size()} ranks, backend {dist.get_backend()} | data {args.data} | "
              f"applied: {run.sharded.path} level")
    if run.replanned is not None:
        from fxplan.replan import report_replan

        report_replan(run.replanned, log.print, run.events)
    if position is not None and run.resume is not None:
        log.print(f"resumed parameters, optimizer state and data position from {run.resume[0]}: "
                  f"step {position.step} done, going on at step {position.step + 1} "
                  f"(global sample {position.next_sample}) up to step {args.steps}")
        log_resume(log, run.events, position, run.resume[0], plan)
    for line in notes:
        log.print(f"resume: {line}")
    log_precision(log, run.precision, training_dtype(run.cluster))
    if run.no_flops:
        log.print(run.no_flops)
    if getattr(args, "affinity", None):
        log.print(args.affinity)


def summarise(run: Run, args: argparse.Namespace, log: Any, result: Any) -> None:
    """Rank 0, at the end: ``summary.json`` (predicted against measured step time, memory,
    MFU and tokens/s, every rank's own figures) and the same as a table."""
    import dataclasses

    plan, measured = run.plan, result.median_step_time_s
    tokens = plan.batch * (plan.seq or 1)
    summary = {
        "plan": plan.summary, "model": plan.model, "cluster": plan.cluster,
        "applied": run.sharded.path,  # module (the user's module) or graph (the graph rewrite)
        "world_size": plan.world_size, "batch": plan.batch, "seq": plan.seq,
        "steps": args.steps, "final_loss": result.losses[-1],
        "predicted_step_time_s": _number(plan.estimate.get("step_time_s")),
        "measured_step_time_s": measured,
        "predicted_peak_memory_gib": _number(plan.estimate.get("peak_memory_gib")),
        "measured_peak_memory_gib": result.peak_memory_gib,
        "predicted_mfu": _number(plan.estimate.get("mfu")),
        "measured_mfu": None if run.flops is None else run.flops.mfu(measured),
        "predicted_tokens_per_s": _number(plan.estimate.get("tokens_per_s")),
        "measured_tokens_per_s": tokens / measured,
        "capacity_gib": plan.estimate.get("capacity_gib"),
        "mixed_precision": run.precision.describe(), "compute_dtype": run.precision.name,
        "memory_measured_as": ("torch.cuda.max_memory_allocated"
                               if run.sharded.device.type == "cuda"
                               else "peak resident set size of the process (getrusage)"),
        "step_time_measured_as": "median over steps 2… of the slowest rank's step",
        "ranks": result.ranks,   # each rank's own step times and peaks (fxplan validate)
        "config": dataclasses.asdict(run.config),
    }
    log.write_json("summary.json", summary)
    rows = [("step time", "predicted_step_time_s", "measured_step_time_s", 1e3, "ms"),
            ("peak memory per rank", "predicted_peak_memory_gib", "measured_peak_memory_gib", 1,
             "GiB"),
            ("MFU", "predicted_mfu", "measured_mfu", 100, "%"),
            ("tokens/s", "predicted_tokens_per_s", "measured_tokens_per_s", 1, "")]
    log.print(f"{'':<22}{'predicted':>14}{'measured':>14}")
    for label, p, m, scale, unit in rows:
        log.print(f"{label:<22}{_show(summary[p], scale):>14}{_show(summary[m], scale):>14} {unit}")
    log.print(f"wrote {log.path} and {log.dir / 'summary.json'}")


def log_precision(log: Any, precision: Any, plan_dtype: str) -> None:
    """Rank 0: the run's mixed precision (:mod:`fxplan.runtime.apply.precision`), where it departs
    from the dtype the plan was priced in, and its fallback (fp16 without a loss scaler)."""
    from fxplan.runtime.apply.precision import DTYPES

    log.print(f"mixed precision: {precision.describe()} ({precision.source})")
    if DTYPES.get(plan_dtype) != precision.compute:
        log.print(f"precision: the plan was priced in {plan_dtype}, this run computes in "
                  f"{precision.name}: expect step time and memory other than predicted")
    if precision.fallback():
        log.print(f"fallback: {precision.fallback()}")


def _number(value: Any) -> float | None:
    """A scalar estimate, or the largest of a per-stage list."""
    if isinstance(value, (list, tuple)):
        return max(value) if value else None
    return None if value is None else float(value)


def _show(value: float | None, scale: float = 1.0) -> str:
    from fxplan.core.units import plain

    return "n/a" if value is None else plain(value * scale)
