"""What an approximated export costs, by fxplan's own cost model.

An exporter that cannot write the plan exactly returns the changes the framework will run
instead, as :class:`~fxplan.core.config.ParallelConfig` fields (``{"zero_stage": 2}``,
``{"schedule": Schedule("1f1b")}``, ``{"stage_layers": None}``, …). :func:`price_changes`
prices both runs on the plan's model and cluster, re-captured as the search captured them and
checked against the plan's fingerprints (:func:`fxplan.plan_context.plan_context`):

* the plan: :func:`fxplan.inter_op.pricing.priced_config`, the configuration its step time
  priced, against the plan's memory headroom;
* as exported: the same configuration with the changes applied (the plan's placements only
  when ``dp``, ``tp`` and ``sp`` stay, else the default Megatron layout), its model states in
  the framework's layout (``STATE_LAYOUT`` of each format: Megatron-LM's and DeepSpeed's
  16-bit weights and gradients beside fp32 masters, torchtitan's FSDP2 over fp32 parameters
  as fxplan's runtime); an export that changes nothing but the layout is priced too.

The note says ``T_export`` against ``T_plan`` (``Δ = T_export − T_plan``, and ``Δ / T_plan``),
the largest per-rank peak memory on each side, and whether the exported run fits (else the
stage that overflows and by how much). A plan whose model or cluster cannot be rebuilt here
gets a note saying the difference was not priced, and why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from fxplan.core.units import gib, percent, seconds
from fxplan.core.config import ParallelConfig
from fxplan.core.config_error import CostModelError
from fxplan.core.errors import UserError
from fxplan.core.plan import Plan
from fxplan.cost_model.memory.breakdown import state_layout_text

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cost_model.step.estimate import Estimate

__all__ = ["describe_changes", "price_changes"]

_GIB = 2 ** 30

def describe_changes(changes: Mapping[str, Any]) -> str:
    """``zero=2, schedule=1f1b`` in the text form of ``--config`` keys."""
    names = {"zero_stage": "zero", "microbatch_size": "mb", "num_microbatches": "m",
             "sequence_parallel": "sp", "tp_comm_overlap": "tp_overlap",
             "param_gather_overlap": "pg_overlap", "stage_layers": "stages"}
    parts = []
    for key, value in changes.items():
        if isinstance(value, bool):
            value = "on" if value else "off"
        elif key == "stage_layers":
            value = "even" if value is None else "/".join(map(str, value))
        elif key == "recompute_layers":
            value = "every layer" if value is None else "/".join(map(str, value))
        elif key in ("zero_stages", "offload_stages"):
            value = ("one for every pipeline rank" if value is None
                     else "/".join(map(str, value)))
        parts.append(f"{names.get(key, key)}={value}")
    return ", ".join(parts)


def exported_config(plan: Plan, changes: Mapping[str, Any]) -> ParallelConfig:
    """The plan's priced configuration with ``changes``; its placements kept only when the
    tensor-parallel layout they were solved for (``dp``, ``tp``, ``sp``) stays."""
    from fxplan.inter_op.pricing import priced_config

    base = priced_config(plan)
    config = base.replace(**changes)
    same_layout = (config.dp, config.tp, config.sequence_parallel) == \
        (base.dp, base.tp, base.sequence_parallel)
    return config if same_layout else config.replace(placements=None)


def price_changes(plan: Plan, changes: Mapping[str, Any], state_layout: str | None = None) -> str:
    """One note: the run as exported (``plan`` with ``changes``, its model states kept in the
    framework's ``state_layout``; ``None``: the plan's) against the plan, priced by fxplan's
    cost model now, or why it could not be priced."""
    from fxplan.cost_model import estimate
    from fxplan.inter_op.pricing import priced_config
    from fxplan.plan_context import plan_context

    layout = plan.state_layout
    theirs_layout = state_layout or layout
    described = [describe_changes(changes)] if changes else []
    if theirs_layout != layout:
        described.append(state_layout_text(theirs_layout, brief=True))
    what = f"fxplan's estimate of the run as exported ({', '.join(described)})"
    try:
        graph, cluster = plan_context(plan)
    except (UserError, OSError) as err:
        return f"{what}: not priced, the plan's model and cluster cannot be rebuilt here ({err})"
    headroom = plan.estimate.get("memory_headroom")
    try:
        mine = estimate(graph, cluster, priced_config(plan), batch=plan.batch, seq=plan.seq,
                        memory_headroom=headroom, state_layout=layout)
        theirs = estimate(graph, cluster, exported_config(plan, changes), batch=plan.batch,
                          seq=plan.seq, memory_headroom=headroom, state_layout=theirs_layout)
    except (CostModelError, ValueError) as err:
        return f"{what}: the cost model refuses it ({err})"
    return f"{what}: {_compare(mine, theirs)}"


def _compare(mine: "Estimate", theirs: "Estimate") -> str:
    t0, t1 = mine.step_time_s, theirs.step_time_s
    m0, m1 = max(m.total for m in mine.memory), max(m.total for m in theirs.memory)
    text = (f"step {seconds(t1)} against the plan's {seconds(t0)} "
            f"({percent((t1 - t0) / t0, sign=True)}), peak memory per rank "
            f"{gib(m1 / _GIB)} against {gib(m0 / _GIB)} ({gib((m1 - m0) / _GIB, sign=True)}), ")
    if theirs.fits:
        return text + "fits"
    stage, worst = min(enumerate(theirs.memory), key=lambda s: s[1].free)
    return text + (f"does not fit: pipeline rank {stage} is over its capacity by "
                   f"{gib(-worst.free / _GIB)}")
