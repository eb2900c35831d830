"""Human and machine views of a :class:`~fxplan.core.plan.Plan`.

:func:`plan_summary` is the flat dictionary ``fxplan plan --json`` prints: ``summary``,
``degrees``, ``zero_stage``, ``schedule``, ``microbatch_size``, ``num_microbatches``,
``recompute``, ``sequence_parallel``, ``step_time_s``, ``tokens_per_s``, ``mfu``,
``peak_memory_gib`` (the heaviest pipeline rank), ``capacity_gib``, ``fits``,
``search_time_s``, ``timings``, ``solver_status``, ``runners_up``, ``pruned``, ``fallbacks``.

:func:`render_report` prints the rich report: the summary line, predicted step time,
tokens/s, the achieved TFLOP/s per device (counting recompute, Megatron's convention) and the
MFU (model FLOPs only, against the device's peak), the step's breakdown, memory per pipeline
rank against the capacity with its breakdown, the top three runners-up with their deltas (one
row per configuration), the pruning reasons grouped by kind with the near-misses first
(:func:`fxplan.report_pruning.group_pruned`), the notes on fallbacks and the solver status.
Every number goes through :mod:`fxplan.cli.units` (units, three significant digits).
"""

from __future__ import annotations

import sys
from typing import Any

from fxplan.cli.units import count, gib, percent, seconds, si
from fxplan.core.plan import Plan
from fxplan.report_pruning import group_pruned

__all__ = ["offload_line", "plan_summary", "render_report", "rate_line", "unique_runners_up"]

#: Pruning reasons printed per kind (closest first); the rest of the kind are counted.
SHOW_PER_KIND = 4


def plan_summary(plan: Plan) -> dict[str, Any]:
    """The flat JSON view (module docstring)."""
    est = plan.estimate
    return {
        "model": plan.model, "cluster": plan.cluster, "batch": plan.batch, "seq": plan.seq,
        "summary": plan.summary, "degrees": plan.degrees, "axis_levels": list(plan.axis_levels),
        "zero_stage": plan.zero_stage, "offload": plan.offload, "fp8": plan.config.fp8,
        "schedule": str(plan.schedule),
        "microbatch_size": plan.microbatch_size, "num_microbatches": plan.num_microbatches,
        "recompute": plan.recompute_summary, "sequence_parallel": plan.sequence_parallel,
        "stage_layers": [s.num_layers for s in plan.stages],
        "step_time_s": est.get("step_time_s"), "tokens_per_s": est.get("tokens_per_s"),
        "tflops_per_device": est.get("tflops_per_device"), "mfu": est.get("mfu"),
        "peak_memory_gib": est.get("max_memory_gib"), "capacity_gib": est.get("capacity_gib"),
        "fits": est.get("fits"), "breakdown": est.get("breakdown"),
        "search_time_s": plan.search_time_s, "timings": dict(plan.timings),
        "solver_status": plan.solver.status, "solver_backend": plan.solver.backend,
        "solver_gap": plan.solver.gap, "runners_up": [dict(r) for r in plan.runners_up],
        "pruned": list(plan.pruned), "pruned_detail": [dict(d) for d in plan.pruned_detail],
        "fallbacks": list(plan.fallbacks),
    }


def _console(console: Any = None) -> Any:
    if console is not None:
        return console
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 140, highlight=False, emoji=False)


def _memory_table(plan: Plan) -> Any:
    from rich.table import Table

    rows = plan.estimate.get("memory_breakdown_gib", [])
    cap = plan.estimate.get("capacity_gib", 0.0)
    table = Table(title=f"memory per rank (GiB, capacity {gib(cap)})", title_justify="left")
    for column in ("stage", "layers", "params", "grads", "optimizer", "activations",
                   "recompute", "buffers", "reserved", "total", "use"):
        table.add_column(column, justify="right")
    layers = [s.num_layers for s in plan.stages]
    per_rank = [sum(layers[j] for j in range(s, len(layers), plan.pp)) for s in range(plan.pp)]
    indexed = list(enumerate(rows))
    shown = indexed if len(indexed) <= 8 else indexed[:4] + indexed[-4:]
    for s, m in shown:
        table.add_row(str(s), str(per_rank[s] if s < len(per_rank) else "?"),
                      *(f"{m[k]:.1f}" for k in ("params", "grads", "optimizer", "activations",
                                               "recompute_working", "buffers", "reserved",
                                               "total")),
                      percent(m["total"] / cap, 2) if cap else "–")
    return table


def offload_line(plan: Plan) -> str:
    """``optimizer states on the host: 14 GiB per rank, 112 GiB of 512 GiB per node; PCIe
    copies and CPU step 3.43 s per step`` ("" without offload)."""
    if plan.offload == "none":
        return ""
    est = plan.estimate
    rows = est.get("memory_breakdown_gib", [])
    worst = max(rows, key=lambda m: m.get("host_node_total", 0.0), default={})
    what = ("optimizer states" if plan.offload == "optimizer"
            else "optimizer states and parameter shards")
    seconds_ = est.get("breakdown", {}).get("offload")
    return (f"{what} on the host: {gib(worst.get('host', 0.0))} per rank, "
            f"{gib(worst.get('host_node_total', 0.0))} of {gib(worst.get('host_capacity', 0.0))} "
            "host memory per node"
            + (f"; host↔device copies and CPU optimizer step {seconds(seconds_)} per step "
               "(not hidden)" if seconds_ is not None else ""))


def unique_runners_up(plan: Plan) -> list[dict[str, Any]]:
    """The runners-up, one per configuration and none equal to the chosen plan's (a plan file
    from before the search deduplicated finalists by configuration may list one twice, priced
    with two layouts: the faster is kept)."""
    best: dict[str, dict[str, Any]] = {}
    for r in plan.runners_up:
        key = r.get("config", r["summary"])
        if r["summary"] == plan.summary and key == plan.config.to_string():
            continue
        if key not in best or r["step_time_s"] < best[key]["step_time_s"]:
            best[key] = dict(r)
    return sorted(best.values(), key=lambda r: r["step_time_s"])


def _runners_table(plan: Plan) -> Any:
    from rich.table import Table

    table = Table(title="runners-up", title_justify="left")
    for column in ("configuration", "step time", "Δ", "MFU", "peak memory"):
        table.add_column(column, justify="left" if column == "configuration" else "right")
    table.add_row(f"[bold]{plan.summary}[/bold] (chosen)", seconds(plan.estimate["step_time_s"]),
                  "–", percent(plan.estimate["mfu"]), gib(plan.estimate["max_memory_gib"]))
    for r in unique_runners_up(plan)[:3]:
        table.add_row(r["summary"], seconds(r["step_time_s"]),
                      f"{seconds(r['delta_s'], sign=True)} ({percent(r['delta_pct'] / 100, 2, sign=True)})",
                      percent(r["mfu"]), gib(r["peak_memory_gib"]))
    return table


def rate_line(est: Any) -> str:
    """``8.72 s · 30.1 K tokens/s · 173 TFLOP/s per device (counting recompute) · MFU 55.5 %
    (model FLOPs of the device's peak)`` from an estimate mapping."""
    rate = (f"{count(est['tokens_per_s'])} tokens/s" if est.get("tokens_per_s") is not None
            else f"{count(est.get('samples_per_s', 0.0))} samples/s")
    return (f"{seconds(est['step_time_s'])} · {rate} · "
            f"{si(est['tflops_per_device'] * 1e12, 'FLOP/s')} per device (counting recompute) · "
            f"MFU {percent(est['mfu'])} (model FLOPs, without recompute, of the peak)")


def render_report(plan: Plan, console: Any = None) -> None:
    """Print the rich report of ``plan`` (module docstring)."""
    console = _console(console)
    est = plan.estimate
    levels = ", ".join(f"{a} over {lv}" for a, lv in zip(plan.mesh_axes, plan.axis_levels)
                       if lv != "-") or "one device"
    console.print(f"[bold]{plan.model}[/bold] on [bold]{plan.cluster}[/bold] ({plan.world_size} "
                  f"devices), batch {plan.batch} × seq {plan.seq}")
    console.print(f"plan            [bold green]{plan.summary}[/bold green]")
    console.print(f"mesh            {levels}; stages (layers) "
                  f"{'/'.join(str(s.num_layers) for s in plan.stages)}")
    console.print(f"step time       {rate_line(est)}")
    parts = " · ".join(f"{k} {seconds(v)}" for k, v in est.get("breakdown", {}).items()
                       if v > 1e-9)
    console.print(f"breakdown       {parts}")
    console.print(f"memory          peak {gib(est['max_memory_gib'])} of "
                  f"{gib(est['capacity_gib'])} per device ({'fits' if est['fits'] else 'DOES NOT FIT'})")
    if plan.offload != "none":
        console.print(f"offload         {offload_line(plan)}")
    console.print(_memory_table(plan))
    if unique_runners_up(plan):
        console.print(_runners_table(plan))
    timings = ", ".join(f"{k} {seconds(v)}" for k, v in plan.timings.items())
    console.print(f"search          {seconds(plan.search_time_s)} ({timings}); "
                  f"{est.get('candidates_visited', '?')} candidates ranked")
    console.print(f"solver          {plan.solver.backend}: {plan.solver.status}"
                  + (f", gap {percent(plan.solver.gap)}" if plan.solver.gap else ""))
    render_pruned(plan, console)
    if plan.fallbacks:
        console.print("notes (where the search took another way than the first one tried):")
        for line in plan.fallbacks:
            console.print(f"  · {line}", markup=False)


def render_pruned(plan: Plan, console: Any) -> None:
    """The pruning reasons by kind, the closest :data:`SHOW_PER_KIND` of each kind."""
    if not plan.pruned:
        return
    console.print(f"pruned ({len(plan.pruned)} reasons, by kind, closest first):")
    for group in group_pruned(plan):
        console.print(f"  {group.kind} ({len(group.reasons)})", markup=False)
        for line in group.reasons[:SHOW_PER_KIND]:
            console.print(f"    · {line}", markup=False)
        if len(group.reasons) > SHOW_PER_KIND:
            console.print(f"    … {len(group.reasons) - SHOW_PER_KIND} more of this kind "
                          "(in the plan's JSON)")
