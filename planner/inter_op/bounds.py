"""Lower bounds the search prunes with, and the reasons it records.

**Memory** of a family ``(tp, pp, dp)`` at ZeRO stage ``z``: some pipeline rank holds at least
the average share of the (tp-local) parameters, and activations are never negative, so

    M ≥ k_z(dp) · Ψ_tp / pp + reserved + C_ctx + NCCL    k_0 = 16, k_1 = 4 + 12/dp, k_2 = 2 + 14/dp,
                                                 k_3 = 16/dp  bytes per parameter

in Megatron's layout, ``k_1 = 8 + 8/dp`` (DDP) or ``2 + 16/dp`` (FSDP2, with DTensor
parameters), ``k_2 = 2 + 16/dp`` in the runtime's (:mod:`cost_model.memory.breakdown`; where
``ep`` may make the parameters DTensors the smaller form is taken), plus the runtime terms of
:mod:`cost_model.memory.runtime` that do not depend on the split. If
this exceeds the capacity less the headroom, ``C − H``, every candidate of the family at that
stage is pruned before any microbatch variant is tried. With pipeline ranks on device groups
of different capacities ``C_s`` (reserves ``r_s``, headrooms ``H_s``) the stages may be
uneven, so the bound is on the pipeline's total: ``k_z·Ψ_tp/pp + mean_s r_s + runtime >
mean_s (C_s − H_s)`` (:mod:`fxplan.inter_op.stage_devices`).

The time bound below takes ``W`` on the fastest device group (every layer runs somewhere, at
best at that group's speed).

**Time** of a candidate: every microbatch passes every layer on some rank, and a rank's step
is at least its busy time, so with ``W`` the whole model's per-microbatch work on one tp rank
(:attr:`fxplan.inter_op.profile.SegmentProfile.total_work`)

    T ≥ m · max_s w_s ≥ m · W / pp

A candidate whose bound reaches the ``K``-th best estimate found so far cannot enter the top
``K``; candidates are visited in increasing order of the tightest bound that holds (the
pipeline bound below on one kind of device, this one elsewhere), and once it exceeds the
``K``-th best estimate the search stops.

**Pipeline** bound of a candidate on one kind of device, checked before its partition is
solved. The closed form (:mod:`fxplan.inter_op.surrogate`) is at least its slowest rank's
``m·w_max + β·w_max`` with ``β = (p−1)/v`` (:func:`~fxplan.inter_op.surrogate.bubble_weight`),
the first rank's once-per-step terms (exposed gradient sync, ZeRO gathers, optimizer step,
offload; no drain hides them) being ``≥ 0``, and ``w_max ≥ Σ_s w_s / p ≥ W / p`` (the
stages' work covers every layer and the embedding and head once, plus sends and ZeRO-3
traffic ``≥ 0``), at every memory rung and for every split, so

    T̂ ≥ (m + β) · W / pp

A candidate whose bound exceeds the ``K``-th best estimate found so far cannot enter the top
``K``: it is skipped without pricing its partition (the gain is the pipeline's fill and drain,
which ``m·W/pp`` leaves out), and the search visits the candidates in the order of this
bound. On several device groups each rank's ``w`` is priced on its own group, and
``Σ_s w_s ≥ W`` need not hold for the fastest group's ``W``: the bound is not used there.
"""

from __future__ import annotations

from fxplan.cost_model.memory.breakdown import GIB
from fxplan.inter_op.profile import SegmentProfile
from fxplan.core.config import ParallelConfig
from fxplan.inter_op.reasons import MEMORY, Reason
from fxplan.inter_op.space import Family
from fxplan.inter_op.stage_memory import DeviceMemory, state_bytes_per_param
from fxplan.inter_op.surrogate import bubble_weight

__all__ = ["memory_lower_bound", "memory_reason", "pipeline_lower_bound", "time_lower_bound"]


def memory_lower_bound(family: Family, zero: int, lightest: SegmentProfile,
                       mem: DeviceMemory, offload: str = "none") -> float:
    """Bytes some rank needs at least (module docstring; ``k`` less what ``offload`` keeps on
    the host); ``lightest`` is the profile with full recompute, microbatch 1 and sequence
    parallelism where possible."""
    k = _least_state_bytes(family, zero, offload, lightest)
    probe = ParallelConfig(dp=family.dp, tp=family.tp, pp=family.pp)
    return k * lightest.total_params / family.pp + mem.reserved + mem.fixed_runtime(probe)


def _least_state_bytes(family: Family, zero: int, offload: str,
                       lightest: SegmentProfile) -> float:
    """Model-state bytes per parameter of the family at ``zero`` in the profile's layout, the
    smaller of its DDP and its FSDP2 form where ``ep`` (not part of the family) may make the
    parameters DTensors (:func:`~fxplan.inter_op.stage_memory.state_bytes_per_param`)."""
    forms = (True,) if family.tp > 1 else (False, True)
    return min(state_bytes_per_param(family.dp, zero, offload, lightest.optimizer, dtensor)
               for dtensor in forms)


def memory_reason(family: Family, zero: int, needed: float, lightest: SegmentProfile,
                  mem: DeviceMemory, config: ParallelConfig | None = None,
                  offload: str = "none", mean: bool = False) -> Reason:
    """``needs ≥ 93.4 GiB > 76.0 GiB (80 GiB less 4.0 GiB headroom) at zero=0, tp=4, pp=1,
    dp=8 (16.0 B/param × 5.62 G …)``.

    ``config``: the family's lightest variant at ``zero`` (the bound holds for it, so its
    estimated peak is at least ``needed``); kept in the reason for checking. ``mean``: ``mem``
    is the mean over pipeline ranks on different device groups
    (:meth:`fxplan.inter_op.stage_devices.StageDevices.mean_memory`), and the text says so."""
    k = _least_state_bytes(family, zero, offload, lightest)
    probe = ParallelConfig(dp=family.dp, tp=family.tp, pp=family.pp)
    where = f"zero={zero}" + (f" with offload={offload}" if offload != "none" else "")
    of = " (the mean capacity of its stages' devices)" if mean else ""
    text = (f"needs ≥ {needed / GIB:.1f} GiB > {mem.limit_text()}{of} at {where}, "
            f"tp={family.tp}, pp={family.pp}, dp={family.dp} (model states {k:.2f} B/param × "
            f"{lightest.total_params / family.pp / 1e9:.3g} G params per rank + "
            f"{mem.reserved / GIB:.1f} GiB reserved + "
            f"{mem.fixed_runtime(probe) / GIB:.2f} GiB CUDA context and NCCL buffers)")
    return Reason(text, MEMORY, needed_gib=needed / GIB, capacity_gib=mem.limit / GIB,
                  bound=True, family_wide=True,
                  config=config.to_string() if config is not None else None)


def time_lower_bound(c: ParallelConfig, prof: SegmentProfile) -> float:
    """``m · W / pp`` seconds (module docstring)."""
    return c.num_microbatches * prof.total_work / c.pp


def pipeline_lower_bound(c: ParallelConfig, prof: SegmentProfile) -> float:
    """``(m + (p−1)/v) · W / pp`` seconds: a lower bound of ``c``'s closed form ``T̂`` at every
    memory rung and split on one kind of device (module docstring)."""
    return (c.num_microbatches + bubble_weight(c)) * prof.total_work / c.pp
