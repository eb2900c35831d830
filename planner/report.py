"""Human and machine views of a :class:`~fxplan.core.plan.Plan`.

:func:`plan_summary` is the flat dictionary ``fxplan plan --json`` prints: ``summary``,
``degrees``, ``zero_stage``, ``schedule``, ``microbatch_size``, ``num_microbatches``,
``recompute``, ``sequence_parallel``, ``step_time_s``, ``tokens_per_s``, ``mfu``,
``peak_memory_gib`` (the heaviest pipeline rank), ``capacity_gib``, ``fits``,
``search_time_s``, ``timings``, ``solver_status``, ``runners_up``, ``pruned``, ``fallbacks``.

:func:`render_report` prints the rich report: the summary line, predicted step time,
tokens/s, MFU, the step's breakdown, memory per pipeline rank against the capacity with its
breakdown, the top three runners-up with their deltas, the pruning reasons, the fallbacks and
the solver status.
"""

from __future__ import annotations

import sys
from typing import Any

from fxplan.core.plan import Plan

__all__ = ["plan_summary", "render_report"]

#: Pruning reasons printed in full; the rest are counted.
SHOW_PRUNED = 12


def plan_summary(plan: Plan) -> dict[str, Any]:
    """The flat JSON view (module docstring)."""
    est = plan.estimate
    return {
        "model": plan.model, "cluster": plan.cluster, "batch": plan.batch, "seq": plan.seq,
        "summary": plan.summary, "degrees": plan.degrees, "axis_levels": list(plan.axis_levels),
        "zero_stage": plan.zero_stage, "schedule": str(plan.schedule),
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
        "pruned": list(plan.pruned), "fallbacks": list(plan.fallbacks),
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
    table = Table(title=f"memory per rank (GiB, capacity {cap:.0f})", title_justify="left")
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
                      f"{100 * m['total'] / cap:.0f}%" if cap else "–")
    return table


def _runners_table(plan: Plan) -> Any:
    from rich.table import Table

    table = Table(title="runners-up", title_justify="left")
    for column in ("configuration", "step s", "Δ", "MFU", "peak GiB"):
        table.add_column(column, justify="left" if column == "configuration" else "right")
    table.add_row(f"[bold]{plan.summary}[/bold] (chosen)", f"{plan.estimate['step_time_s']:.3f}",
                  "–", f"{100 * plan.estimate['mfu']:.1f}%",
                  f"{plan.estimate['max_memory_gib']:.1f}")
    for r in plan.runners_up[:3]:
        table.add_row(r["summary"], f"{r['step_time_s']:.3f}",
                      f"+{r['delta_s']:.3f} s (+{r['delta_pct']:.1f}%)", f"{100 * r['mfu']:.1f}%",
                      f"{r['peak_memory_gib']:.1f}")
    return table


def _flops_rate(tflops: float) -> str:
    """``127 TFLOP/s`` on accelerators, ``42.3 GFLOP/s`` on a CPU rank."""
    if tflops >= 1:
        return f"{tflops:.0f} TFLOP/s"
    return f"{tflops * 1e3:.1f} GFLOP/s"


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
    rate = (f"{est['tokens_per_s']:,.0f} tokens/s" if est.get("tokens_per_s") is not None
            else f"{est.get('samples_per_s', 0):,.1f} samples/s")
    console.print(f"step time       {est['step_time_s']:.3f} s · {rate}"
                  f" · {_flops_rate(est['tflops_per_device'])} per device · MFU "
                  f"{100 * est['mfu']:.1f}%")
    parts = " · ".join(f"{k} {v:.3f}" for k, v in est.get("breakdown", {}).items() if v > 0)
    console.print(f"breakdown (s)   {parts}")
    console.print(f"memory          peak {est['max_memory_gib']:.1f} GiB of "
                  f"{est['capacity_gib']:.0f} GiB per device ({'fits' if est['fits'] else 'DOES NOT FIT'})")
    console.print(_memory_table(plan))
    if plan.runners_up:
        console.print(_runners_table(plan))
    timings = ", ".join(f"{k} {v:.2f} s" for k, v in plan.timings.items())
    console.print(f"search          {plan.search_time_s:.2f} s ({timings}); "
                  f"{est.get('candidates_visited', '?')} candidates ranked")
    console.print(f"solver          {plan.solver.backend}: {plan.solver.status}"
                  + (f", gap {plan.solver.gap:.2%}" if plan.solver.gap else ""))
    if plan.pruned:
        console.print(f"pruned ({len(plan.pruned)} reasons):")
        for line in plan.pruned[:SHOW_PRUNED]:
            console.print(f"  · {line}", markup=False)
        if len(plan.pruned) > SHOW_PRUNED:
            console.print(f"  … {len(plan.pruned) - SHOW_PRUNED} more (in the plan's JSON)")
    for line in plan.fallbacks:
        console.print(f"[yellow]fallback[/yellow]: {line}")
