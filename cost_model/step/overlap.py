"""Which communication an estimate hides behind compute, and the runtime mechanism that hides it.

The cost model credits an overlap only where fxplan's runtime (``fxplan.runtime``) performs
it, and an estimate names the ones it relies on (``Estimate.to_dict()["overlaps"]``, the plan's
``estimate["overlaps"]``, a line of the report). ``ω`` is the device's ``comm_overlap``, the
fraction of a hideable transfer that really runs beside compute; with ``ω = 0`` nothing is
credited and nothing is listed.

``dp_grad_reduce`` (``dp > 1``, ZeRO 0–2): the gradient buckets are reduced while the last
microbatch's backward runs — with ``pp = 1`` the accumulation loop turns gradient sync on for
its last backward only (``runtime.train.accumulate``), DDP's reducer all-reduces its buckets and
FSDP2 reduce-scatters each block as its backward finishes; under GPipe and 1F1B the same
happens in the last microbatch's backward of the stage (``runtime.train.pipeline.
ReduceInLastBackward``, DDP's ``prepare_for_backward``). Under the multi-stage schedules
(``interleaved``, ``zb``, ``zbv``, ``dualpipev``) with FSDP2 or ``replicate`` torch runs its
``REDUCE_GRAD``
action after each stage's last backward and waits for it, and beside a zero-bubble schedule
the runtime wraps nothing and all-reduces every gradient in one pass after the step's last
weight-gradient op (:mod:`fxplan.core.zero_bubble_dp`), so nothing overlaps: the
simulator prices those reductions blocking (:func:`dp_reduce_blocks`), and the overlap is
not listed. (DDP beside ``interleaved`` still reduces inside the last backward; and a
configuration priced for Megatron-Core, :func:`megatron_priced`, keeps the overlap its
``--overlap-grad-reduce`` performs.)

``zero3_prefetch`` (ZeRO-3, ``dp > 1``): FSDP2 gathers the next block's parameters while the
current block computes (forward: issued ahead by the CPU's run-ahead; backward: its explicit
prefetch), so ``ω`` of every gather but a chunk's first may hide
(:func:`cost_model.host.host_overhead.zero3_exposed_s`).

``weight_grad_in_bubbles`` (``zb``, ``zbv``, ``dualpipev``): the weight-gradient GEMMs run as
their own op where the schedule has a bubble (:mod:`cost_model.step.pipeline_schedules`;
``dualpipev`` splits only some of its backwards). ``dualpipev``'s overlapped forward-backward
pairs are not an overlap the runtime performs (torch runs them one after the other) and are
not credited.

``tp_comm`` and ``param_gather``: only when the configuration sets ``tp_overlap`` /
``pg_overlap`` (Megatron-Core's ``--tp-comm-overlap``, ``--overlap-param-gather``), which the
search never does: fxplan's runtime overlaps neither, so such a plan is priced for an export.

Not credited, though the runtime may do it: the pipeline's sends. torch's schedules post them
with ``batch_isend_irecv`` and wait for them later, so a sender computes on while its message
travels; the simulator keeps each send on its sender's timeline (a blocking send), an upper
bound on its cost that only a GPU measurement can narrow.
"""

from __future__ import annotations

from dataclasses import dataclass

from fxplan.core.config import ParallelConfig
from fxplan.cost_model.host.host_overhead import ddp_runs

__all__ = ["MULTI_STAGE_SCHEDULES", "Overlap", "dp_reduce_blocks", "megatron_priced",
           "relied_overlaps"]

#: Schedules that torch runs with its action runtime, several stages per rank.
MULTI_STAGE_SCHEDULES: tuple[str, ...] = ("interleaved", "zb", "zbv", "dualpipev")


@dataclass(frozen=True)
class Overlap:
    """One overlap an estimate relies on: its name and how the runtime performs it."""

    name: str
    mechanism: str

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "mechanism": self.mechanism}


def dp_reduce_blocks(config: ParallelConfig) -> bool:
    """Whether the data-parallel gradient reduction runs after the backward and blocks (torch's
    ``REDUCE_GRAD`` action of the multi-stage schedules with FSDP2 / ``replicate``; the pass
    after a zero-bubble schedule's step, where no DDP runs:
    :func:`~fxplan.cost_model.host.host_overhead.ddp_runs`), rather than inside the last
    microbatch's backward (module docstring)."""
    return (config.pp > 1 and config.dp > 1 and config.zero_stage < 3
            and config.schedule.kind in MULTI_STAGE_SCHEDULES and not ddp_runs(config)
            and not megatron_priced(config))


def megatron_priced(config: ParallelConfig) -> bool:
    """Whether ``config`` asks for Megatron-Core's own overlaps (``tp_overlap``,
    ``pg_overlap``), which fxplan's runtime does not run: such a configuration is priced as
    Megatron-Core runs it, whose ``--overlap-grad-reduce`` reduces the gradient buckets inside
    the backward under every schedule, the interleaved one included."""
    return config.tp_comm_overlap or config.param_gather_overlap


def relied_overlaps(config: ParallelConfig, comm_overlap: float = 1.0) -> tuple[Overlap, ...]:
    """The overlaps the estimate of ``config`` credits (module docstring), ``comm_overlap``
    the devices' ``ω`` (the smallest over the cluster's device groups). With a ZeRO stage per
    pipeline rank (``zero_stages``) or an offload per rank (``offload_stages``), those of every
    rank's own configuration, each named once with its ranks' mechanisms."""
    if config.per_rank:
        merged: dict[str, list[str]] = {}
        for rank in range(config.pp):
            for item in relied_overlaps(config.at_pipeline_rank(rank), comm_overlap):
                mechanisms = merged.setdefault(item.name, [])
                if item.mechanism not in mechanisms:
                    mechanisms.append(item.mechanism)
        return tuple(Overlap(name, "; ".join(m)) for name, m in merged.items())
    out: list[Overlap] = []
    hide = comm_overlap > 0
    if hide and config.dp > 1 and config.zero_stage < 3 and not dp_reduce_blocks(config):
        wrapper = ("Megatron-Core's --overlap-grad-reduce" if megatron_priced(config)
                   else "DDP's bucketed all-reduce" if ddp_runs(config)
                   else "FSDP2's per-block reduce-scatter" if config.zero_stage >= 1
                   else "replicate's per-block all-reduce")
        every = config.reduces_every_microbatch and (config.num_microbatches or 1) > 1
        out.append(Overlap("dp_grad_reduce", f"{wrapper} during "
                                             f"{'every' if every else 'the last'} microbatch's "
                                             f"backward (ω = {comm_overlap:g} of each bucket)"))
    if hide and config.zero_stage == 3 and config.dp > 1:
        out.append(Overlap("zero3_prefetch", "FSDP2 all-gathers the next block while the "
                                             f"current one computes (ω = {comm_overlap:g})"))
    if config.splits_backward:
        out.append(Overlap("weight_grad_in_bubbles", f"{config.schedule}: torch's split "
                                                     "backward runs weight gradients in the "
                                                     "pipeline's bubbles"))
    if config.tp_comm_overlap:
        out.append(Overlap("tp_comm", "sequence-parallel collectives pipelined with their "
                                      "GEMMs (--tp-comm-overlap; not fxplan's runtime)"))
    if config.param_gather_overlap:
        out.append(Overlap("param_gather", "updated parameters gathered behind the next "
                                           "forward (--overlap-param-gather; not fxplan's "
                                           "runtime)"))
    return tuple(out)
