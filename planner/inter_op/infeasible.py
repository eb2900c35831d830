"""The error for a model that fits in no configuration, with the numbers to act on.

The smallest memory any configuration needs, ``M_min``, is the lightest candidate's peak
over the pipeline ranks: ZeRO-3 (ZeRO-0 without data parallelism), full recompute,
microbatch 1, sequence parallelism where tensor parallelism is on, 1F1B, the most even
split, minimised over every valid mesh family. Against a capacity ``C`` per device (less the
memory headroom the plan must leave free):

- model states dominate when ``M_min`` is mostly weights, gradients and optimizer state;
  they shrink as ``1/N`` with the device count under ZeRO-3 and pipeline splitting, so about
  ``N · M_states / (C − M_rest)`` devices would hold them;
- activations dominate otherwise: they scale with the microbatch and the sequence length.

Before that, the search may end with no plan for reasons other than memory
(:func:`no_plan_error`, checked in this order): no mesh factorisation ``pp·dp·tp = N`` is valid,
the constraints exclude every valid family or every candidate of the allowed ones, or every
finalist failed when the step simulator priced it.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from fxplan.cost_model.memory.breakdown import GIB, MemoryBreakdown
from fxplan.core.errors import UserError
from fxplan.inter_op.constraints import ConstraintError
from fxplan.inter_op.reasons import Reason
from fxplan.inter_op.space import MAX_MICROBATCH, Family

__all__ = ["InfeasibleError", "NoRunnablePlan", "infeasible_message", "no_plan_error"]


class InfeasibleError(UserError):
    """No configuration of the search space fits in device memory."""


def infeasible_message(model: str, cluster: str, world: int, batch: int,
                       lightest: MemoryBreakdown | None, lightest_config: str,
                       per_node: int, constraints: str = "") -> str:
    """One paragraph: what is needed, what there is, and what would make it fit.
    ``constraints`` (text, empty when none) limits "any configuration" to the allowed ones."""
    if lightest is None:
        return (f"{model} on {cluster} ({world} devices, batch {batch}): no valid mesh "
                "factorisation (see the pruned reasons: tp must divide the heads, dp the batch)")
    need, cap = lightest.total, lightest.capacity - lightest.headroom
    states = lightest.params + lightest.grads + lightest.optimizer
    rest = need - states
    runtime = lightest.cuda_context + lightest.nccl + lightest.fragmentation
    scope = f" allowed by the constraints {constraints}" if constraints else ""
    room = (f" less the {lightest.headroom / GIB:.1f} GiB memory headroom, "
            f"{cap / GIB:.1f} GiB" if lightest.headroom else "")
    text = (f"{model} does not fit on {cluster} ({world} devices) with batch {batch}: the "
            f"smallest memory any configuration{scope} needs is {need / GIB:.1f} GiB per device "
            f"({lightest_config}: model states {states / GIB:.1f} GiB, activations "
            f"{(lightest.activations + lightest.recompute_working) / GIB:.1f} GiB, buffers "
            f"{lightest.buffers / GIB:.1f} GiB, CUDA context, NCCL and fragmentation "
            f"{runtime / GIB:.1f} GiB, reserved {lightest.reserved / GIB:.1f} GiB) "
            f"but a device holds {lightest.capacity / GIB:.1f} GiB{room}.")
    if constraints:
        text += f" Relax the constraints ({constraints}) or use devices with more memory."
    elif rest < cap:
        devices = math.ceil(world * states / (cap - rest))
        nodes = math.ceil(devices / max(per_node, 1))
        text += (f" To fit, use more devices: about {devices} ({nodes} nodes of {per_node}) "
                 "would spread the model states thin enough")
        if states < need / 2:
            text += ", or a smaller batch or sequence length (activations dominate)"
        text += ", or devices with more memory."
    else:
        text += (" Activations and buffers alone exceed a device: use a shorter sequence, "
                 "a smaller model, or devices with more memory.")
    return text


def no_plan_error(where: str, world: int, valid: list[Family], invalid: list[Reason],
                  allowed: list[Family], constraints: str, no_candidate: Callable[[], bool],
                  failed: list[Reason], tied_ends: bool = False) -> UserError | None:
    """Why the search found no finalist other than memory (module docstring), or ``None``.
    ``where``: "model on cluster (…)"; ``valid``: the valid families of the ``world`` devices
    (``invalid``: why the others are not); ``allowed``: those the mesh constraints allow;
    ``constraints``: the constraints as text; ``no_candidate()``: whether the constraints allow
    no candidate of any allowed family (asked only when it matters); ``failed``: the
    finalists the step simulator refused or found over memory; ``tied_ends``: the model's
    first and last stage share a weight, so the V-shaped schedules were not offered."""
    if not valid:
        shown = "; ".join(map(str, invalid[:4])) + (f"; … {len(invalid) - 4} more"
                                                    if len(invalid) > 4 else "")
        return InfeasibleError(f"{where}: no valid mesh factorisation pp·dp·tp = "
                               f"{world}: {shown}")
    if not allowed:
        return ConstraintError(
            f"{where}: the constraints {constraints} exclude every mesh "
            "family; the valid (tp, pp, dp) are "
            + ", ".join(f"({f.tp}, {f.pp}, {f.dp})" for f in valid))
    if no_candidate():
        return ConstraintError(
            f"{where}: the constraints {constraints} exclude every candidate "
            "of the allowed mesh families (microbatch sizes divide batch/dp up to "
            f"{MAX_MICROBATCH}; 1f1b needs m ≥ pp, interleaved:v needs m mod pp = 0 and "
            "pp·v ≤ layers; zb:v the same, zbv 2·pp ≤ layers, dualpipev that and m ≥ 2·pp, "
            "all three beside dp > 1 ZeRO-0, or ZeRO-1 without tp or ep; sequence "
            "parallelism needs tp > 1)"
            + ("; zbv and dualpipev are not offered to this model: its first and last stage "
               "share a weight (a tied embedding and head), and both schedules run those two "
               "stages on pipeline rank 0, where the runtime cannot keep the copies equal; use "
               "zb or interleaved, or untie the weight" if tied_ends else ""))
    if failed:
        return InfeasibleError(
            f"{where}: every finalist failed when priced by the step simulator: "
            + "; ".join(failed))
    return None


class NoRunnablePlan(UserError):
    """Every plan the search priced is one the runtime cannot apply to the model.

    ``refused``: ``(plan summary, the runtime's reason)`` per plan; plans refused for the same
    reason are listed together, the reason said once after them."""

    def __init__(self, model: str, refused: Sequence[tuple[str, str]]) -> None:
        by_reason: dict[str, list[str]] = {}
        for summary, why in refused:
            by_reason.setdefault(why, []).append(summary)
        lines = "".join("\n  · " + "\n    ".join(summaries) + f": {why}"
                        for why, summaries in by_reason.items())
        super().__init__(f"no plan for {model}: the runtime cannot apply any of the "
                         f"{len(refused)} plan(s) the search priced to this model:{lines}\n"
                         "Constrain the search (--constrain) to what the model supports, "
                         "e.g. tp=1 or pp=1.")
