"""Human and machine views of a :class:`~fxplan.core.plan.Plan`.

:func:`plan_summary` is the flat dictionary ``fxplan plan --json`` prints: ``summary``,
``degrees``, ``cp_attention`` (``"allgather"`` with context parallelism, else ``None``),
``zero_stage``, ``zero_stages`` and ``offload_stages`` (one entry per pipeline rank, or
``None`` when every rank shares the plan's), ``offload``, ``schedule``, ``microbatch_size``, ``num_microbatches``,
``recompute``, ``recompute_per_stage`` (``[recomputed, layers]`` blocks of each stage, or
``None`` when every block runs the config's policy), ``sequence_parallel``, ``step_time_s``, ``tokens_per_s``, ``mfu``,
``peak_memory_gib`` (the heaviest pipeline rank), ``capacity_gib``, ``fits``,
``search_time_s``, ``timings``, ``solver_status``, ``runners_up``, ``pruned``, ``fallbacks``.

:func:`render_report` prints the rich report: the summary line, predicted step time,
tokens/s, the achieved TFLOP/s per device (counting recompute, Megatron's convention) and the
MFU (model FLOPs only, against the devices' peaks, each device its own), the step's breakdown,
with context parallelism how the sequence is split and K/V exchanged (:func:`context_line`), where blocks
recompute differently the recomputed layers of each stage (:func:`recompute_line`), where pipeline
ranks run their own ZeRO stages or offload each rank's (:func:`zero_line`,
:func:`offload_stage_line`), memory per pipeline
rank against the capacity with its breakdown (on a heterogeneous cluster the mesh line, the
capacity and the memory table per device group: :func:`stage_groups`), the top three runners-up with their deltas (one
row per configuration), the pruning reasons grouped by kind with the near-misses first
(:func:`fxplan.report.pruning.group_pruned`), the notes on fallbacks and the solver status.
Every number goes through :mod:`fxplan.core.units` (units, three significant digits).
"""

from __future__ import annotations

import sys
from typing import Any

from fxplan.core.config_fields import OFFLOAD_POLICIES
from fxplan.core.units import count, gib, percent, seconds, si
from fxplan.core.plan import Plan
from fxplan.cost_model.memory.breakdown import MEMORY_LEGEND, MEMORY_ROWS, state_layout_text
from fxplan.cost_model.memory.headroom import parse_headroom
from fxplan.report.pruning import group_pruned

__all__ = ["capacity_text", "context_line", "headroom_text", "mesh_levels", "offload_line",
           "offload_stage_line", "plan_summary", "recompute_line", "stage_recompute", "zero_line",
           "rate_line", "render_report", "stage_groups", "unique_runners_up"]

#: Pruning reasons printed per kind (closest first); the rest of the kind are counted.
SHOW_PER_KIND = 4


def plan_summary(plan: Plan) -> dict[str, Any]:
    """The flat JSON view (module docstring)."""
    est = plan.estimate
    return {
        "model": plan.model, "cluster": plan.cluster, "batch": plan.batch, "seq": plan.seq,
        "summary": plan.summary, "degrees": plan.degrees, "axis_levels": list(plan.axis_levels),
        "zero_stage": plan.zero_stage,
        "zero_stages": None if plan.config.zero_stages is None else list(plan.config.zero_stages),
        "offload": plan.offload,
        "offload_stages": (None if plan.config.offload_stages is None
                           else list(plan.config.offload_stages)),
        "fp8": plan.config.fp8,
        "cp_attention": plan.cp_attention,
        "schedule": str(plan.schedule),
        "microbatch_size": plan.microbatch_size, "num_microbatches": plan.num_microbatches,
        "recompute": plan.recompute_summary, "sequence_parallel": plan.sequence_parallel,
        "recompute_per_stage": [list(pair) for pair in stage_recompute(plan)] or None,
        "stage_layers": [s.num_layers for s in plan.stages],
        "step_time_s": est.get("step_time_s"), "tokens_per_s": est.get("tokens_per_s"),
        "tflops_per_device": est.get("tflops_per_device"), "mfu": est.get("mfu"),
        "peak_memory_gib": est.get("max_memory_gib"), "capacity_gib": est.get("capacity_gib"),
        "fits": est.get("fits"), "memory_headroom": est.get("memory_headroom"),
        "min_free_gib": est.get("min_free_gib"), "breakdown": est.get("breakdown"),
        "stage_groups": est.get("stage_groups"),
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


def stage_groups(plan: Plan) -> list[dict[str, Any]]:
    """The device group of each pipeline rank (``Plan.estimate["stage_groups"]``, written by
    :func:`fxplan.inter_op.build_plan.stage_groups`) when the stages run on more than one
    group; ``[]`` on one kind of device (and for plans from before it was recorded)."""
    groups = plan.estimate.get("stage_groups") or []
    return groups if len({g["group"] for g in groups}) > 1 else []


def _by_group(groups: list[dict[str, Any]]) -> dict[str, list[int]]:
    """group name → its pipeline ranks, in pipeline order."""
    out: dict[str, list[int]] = {}
    for s, g in enumerate(groups):
        out.setdefault(g["group"], []).append(s)
    return out


def _ranks(stages: list[int]) -> str:
    return (f"stage {stages[0]}" if len(stages) == 1
            else f"stages {stages[0]}–{stages[-1]}")


def mesh_levels(plan: Plan) -> str:
    """``pp over ib-hdr, dp over ib-hdr, tp over nvswitch-a100``; on a heterogeneous cluster
    the pp level, then per device group its stages, device, dp/tp levels and precision
    (``v100 (stage 0, V100-SXM2-32GB, fp16): tp over nvlink-v100``)."""
    levels = {a: lv for a, lv in zip(plan.mesh_axes, plan.axis_levels)}
    groups = stage_groups(plan)
    if not groups:
        return ", ".join(f"{a} over {lv}" for a, lv in levels.items() if lv != "-") or "one device"
    parts = [f"pp over {levels['pp']}"] if levels.get("pp", "-") != "-" else []
    for name, stages in _by_group(groups).items():
        g = groups[stages[0]]
        axes = ", ".join(f"{a} over {g[f'{a}_level']}" for a in ("dp", "tp")
                         if g[f"{a}_level"] != "-") or "one device per stage"
        parts.append(f"{name} ({_ranks(stages)}, {g['model']}, {g['precision']}): {axes}")
    return "; ".join(parts)


def capacity_text(plan: Plan) -> str:
    """``80 GiB`` or, per device group, ``32 GiB (v100), 80 GiB (a100)``."""
    groups = stage_groups(plan)
    if not groups:
        return gib(plan.estimate.get("capacity_gib", 0.0))
    return ", ".join(f"{gib(groups[stages[0]]['capacity_gib'])} ({name})"
                     for name, stages in _by_group(groups).items())


def _memory_table(plan: Plan) -> Any:
    from rich.table import Table

    rows = plan.estimate.get("memory_breakdown_gib", [])
    cap = plan.estimate.get("capacity_gib", 0.0)
    groups = stage_groups(plan)
    layout = state_layout_text(plan.state_layout)
    table = Table(title=f"memory per rank (GiB, capacity {capacity_text(plan)})",
                  title_justify="left", caption=f"{MEMORY_LEGEND}; {layout}",
                  caption_justify="left")
    for column in ("stage", *(("device",) if groups else ()), "layers", *MEMORY_ROWS.values(),
                   "total", "use"):
        table.add_column(column, justify="right")
    layers = [s.num_layers for s in plan.stages]
    per_rank = [sum(layers[j] for j in range(s, len(layers), plan.pp)) for s in range(plan.pp)]
    indexed = list(enumerate(rows))
    shown = indexed if len(indexed) <= 8 else indexed[:4] + indexed[-4:]
    for s, m in shown:
        own = m.get("capacity", cap) if groups else cap   # each stage against its own group's
        table.add_row(str(s), *((groups[s]["group"],) if groups else ()),
                      str(per_rank[s] if s < len(per_rank) else "?"),
                      *(f"{m.get(k, 0.0):.1f}" for k in (*MEMORY_ROWS, "total")),
                      percent(m["total"] / own, 2) if own else "–")
    return table


def offload_line(plan: Plan) -> str:
    """``optimizer states on the host: 14 GiB per rank, 112 GiB of 512 GiB per node; PCIe
    copies and CPU step 3.43 s per step`` ("" without offload)."""
    if plan.offload == "none":
        return ""
    est = plan.estimate
    rows = est.get("memory_breakdown_gib", [])
    # the fullest node, and on it a rank that offloads (offload_stages: others keep 0)
    worst = max(rows, key=lambda m: (m.get("host_node_total", 0.0), m.get("host", 0.0)),
                default={})
    what = ("optimizer states" if plan.offload == "optimizer"
            else "optimizer states and parameter shards")
    seconds_ = est.get("breakdown", {}).get("offload")
    ranks = "per offloading rank" if plan.config.offload_stages is not None else "per rank"
    return (f"{what} on the host: {gib(worst.get('host', 0.0))} {ranks}, "
            f"{gib(worst.get('host_node_total', 0.0))} of {gib(worst.get('host_capacity', 0.0))} "
            "host memory per node"
            + (f"; host↔device copies and CPU optimizer step {seconds(seconds_)} per step "
               "(not hidden)" if seconds_ is not None else ""))


def overlap_line(plan: Plan) -> str:
    """What the estimate hides behind compute, as the runtime does it
    (``estimate["overlaps"]``, :mod:`fxplan.cost_model.step.overlap`), or that it hides nothing."""
    overlaps = plan.estimate.get("overlaps")
    if overlaps is None:
        return "not recorded (a plan written before the estimate listed its overlaps)"
    if not overlaps:
        return "none relied on (pipeline sends priced blocking)"
    return "; ".join(f"{o['name']}: {o['mechanism']}" for o in overlaps) + \
        " (pipeline sends priced blocking)"


def _memory_line(plan: Plan) -> str:
    """``peak 27.9 GiB of 32 GiB per device (fits)``; per group on a heterogeneous cluster."""
    est = plan.estimate
    fits = headroom_text(est)
    groups = stage_groups(plan)
    if not groups:
        return f"peak {gib(est['max_memory_gib'])} of {gib(est['capacity_gib'])} per device ({fits})"
    rows = est.get("memory_breakdown_gib", [])
    parts = [f"{name} peak {gib(max(rows[s]['total'] for s in stages))} of "
             f"{gib(groups[stages[0]]['capacity_gib'])}" for name, stages in _by_group(groups).items()]
    return f"{', '.join(parts)} per device ({fits})"


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
    (model FLOPs of the device's peak)`` from an estimate mapping; with devices of several
    kinds (``precision_per_group`` names more than one group) the MFU is against the sum of
    every device's own peak (:mod:`cost_model.step.estimate`) and the line says so."""
    rate = (f"{count(est['tokens_per_s'])} tokens/s" if est.get("tokens_per_s") is not None
            else f"{count(est.get('samples_per_s', 0.0))} samples/s")
    peak = ("every device's own peak" if len(est.get("precision_per_group") or {}) > 1
            else "the peak")
    return (f"{seconds(est['step_time_s'])} · {rate} · "
            f"{si(est['tflops_per_device'] * 1e12, 'FLOP/s')} per device (counting recompute) · "
            f"MFU {percent(est['mfu'])} (model FLOPs, without recompute, of {peak})")


def headroom_text(est: Any) -> str:
    """``fits with 8.80 GiB (11.0 %) headroom (5 % required)`` for the rank with the least
    free memory of an estimate mapping; ``does not leave the 5 % headroom: …`` or ``DOES NOT
    FIT: over by …`` otherwise (a plan file from before the headroom says fits / DOES NOT FIT)."""
    rows = est.get("memory_breakdown_gib") or []
    if not rows or "free" not in rows[0]:
        return "fits" if est.get("fits") else "DOES NOT FIT"
    worst = min(rows, key=lambda m: m["free"])
    free, cap, need = worst["free"], worst["capacity"], worst.get("headroom", 0.0)
    required = (parse_headroom(est["memory_headroom"]).describe()
                if est.get("memory_headroom") else gib(need))
    share = percent(free / cap) if cap else "–"
    if free < 0:
        return f"DOES NOT FIT: over by {gib(-free)}"
    if est.get("fits"):
        return f"fits with {gib(free)} ({share}) headroom, {required} required"
    return (f"DOES NOT LEAVE the {required} headroom ({gib(need)}): only {gib(free)} "
            f"({share}) free")


def context_line(plan: Plan) -> str:
    """``cp=8: each sequence of 131072 tokens in 16 chunks, 16384 tokens per rank (chunks r
    and 2·cp−1−r); K/V all-gathered over the 8 ranks of a CP group (in tp_comm)``."""
    cp = plan.config.cp
    seq = plan.seq
    tokens = (f"each sequence of {seq} tokens in {2 * cp} chunks, {seq // cp} tokens per rank "
              f"(chunks r and 2·cp−1−r)" if seq else "sequences split")
    return (f"cp={cp}: {tokens}; K/V exchanged by {plan.cp_attention} over the {cp} ranks of "
            f"each CP group (priced in tp_comm; ring attention is priced by the cost model "
            f"only for comparison, the runtime runs the all-gather)")


def stage_recompute(plan: Plan) -> list[tuple[int, int]]:
    """``(recomputed, layers)`` blocks of each (virtual) stage, in pipeline order; ``[]`` when
    every block runs the config's policy or the plan records no stages."""
    if plan.block_recompute is None or not plan.stages:
        return []
    return [(sum(plan.recompute(i) != "none" for i in range(*st.layers)), st.num_layers)
            for st in plan.stages]


def recompute_line(plan: Plan) -> str:
    """``6/8, 4/8, 2/8, 0/8 layers full``: the recomputed blocks of each (virtual) stage and
    the policies they run, where blocks recompute differently (``""`` otherwise)."""
    per_stage = stage_recompute(plan)
    if not per_stage:
        return ""
    policies = sorted({p for p in plan.block_recompute or () if p != "none"},
                      key=lambda p: ("selective", "full").index(p))
    return (", ".join(f"{k}/{n}" for k, n in per_stage)
            + f" layers {' or '.join(policies) or 'none'}, the others none")


def zero_line(plan: Plan) -> str:
    """``ZeRO-3 on pipeline ranks 0, 1 · ZeRO-1 on 2, 3``: the ZeRO stage of each pipeline rank
    where they differ (``zero_stages``; ``""`` otherwise)."""
    stages = plan.config.zero_stages
    if stages is None:
        return ""
    return _per_rank_line([f"ZeRO-{z}" for z in stages],
                          [f"ZeRO-{z}" for z in sorted(set(stages), reverse=True)])


def offload_stage_line(plan: Plan) -> str:
    """``optimizer+params on pipeline ranks 0 · none on 1, 2, 3``: the offload of each
    pipeline rank where they differ (``offload_stages``; ``""`` otherwise), the highest
    first."""
    offloads = plan.config.offload_stages
    if offloads is None:
        return ""
    return _per_rank_line(list(offloads), sorted(set(offloads), key=OFFLOAD_POLICIES.index,
                                                 reverse=True))


def _per_rank_line(values: list[str], order: list[str]) -> str:
    """``A on pipeline ranks 0, 1 · B on 2, 3``: the ranks of each value, in ``order``."""
    parts = [f"{value} on " + ", ".join(str(r) for r, y in enumerate(values) if y == value)
             for value in order]
    return parts[0].replace(" on ", " on pipeline ranks ", 1) + "".join(f" · {p}"
                                                                        for p in parts[1:])


def render_report(plan: Plan, console: Any = None) -> None:
    """Print the rich report of ``plan`` (module docstring)."""
    console = _console(console)
    est = plan.estimate
    levels = mesh_levels(plan)
    console.print(f"[bold]{plan.model}[/bold] on [bold]{plan.cluster}[/bold] ({plan.world_size} "
                  f"devices), batch {plan.batch}"
                  f"{f' × seq {plan.seq}' if plan.seq is not None else ''}")  # images: no seq
    console.print(f"plan            [bold green]{plan.summary}[/bold green]")
    console.print(f"mesh            {levels}; stages (layers) "
                  f"{'/'.join(str(s.num_layers) for s in plan.stages)}")
    if stage_recompute(plan):
        console.print(f"recompute       per stage: {recompute_line(plan)}", markup=False)
    if plan.config.zero_stages is not None:
        console.print(f"zero            per stage: {zero_line(plan)}", markup=False)
    if plan.config.offload_stages is not None:
        console.print(f"offload         per stage: {offload_stage_line(plan)}", markup=False)
    console.print(f"step time       {rate_line(est)}")
    parts = " · ".join(f"{k} {seconds(v)}" for k, v in est.get("breakdown", {}).items()
                       if v > 1e-9)
    console.print(f"breakdown       {parts}")
    console.print(f"overlap         {overlap_line(plan)}", markup=False)
    console.print(f"memory          {_memory_line(plan)}")
    if plan.offload != "none":
        console.print(f"offload         {offload_line(plan)}")
    if plan.config.cp > 1:
        console.print(f"context         {context_line(plan)}", markup=False)
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
