"""The fields of a :class:`~fxplan.core.config.ParallelConfig` and the values they take:
recompute policies (:data:`RECOMPUTE_POLICIES`), offload policies (:data:`OFFLOAD_POLICIES`),
the context-parallel attention (:data:`CP_ATTENTION`), and what follows from the degrees
alone (world size, virtual stages, replicas).

``offload`` (:data:`OFFLOAD_POLICIES`) puts the optimizer states, or the optimizer states and
the ZeRO-3 parameter shards, in host memory. ``offload_stages`` (one policy per pipeline rank,
``offload_stages=optimizer/optimizer/none/none``) offloads each rank's states as its own memory
needs, exactly as ``zero_stages`` does for the ZeRO stage: ``offload`` is then the highest entry
in the order ``none < optimizer < optimizer+params`` (what the plan-wide rules and the exports
read), a list of equal entries is that plain ``offload`` (stored as ``None``), and each entry
must be a policy the plan-wide ``offload`` could be beside its rank's ZeRO stage
(``optimizer+params`` on a ZeRO-3 rank only). The rank view (:meth:`ParallelConfig.
at_pipeline_rank`) carries both the rank's ZeRO stage and its offload; ``fp8`` runs the matrix products in FP8 (the cost
model's :mod:`fxplan.cost_model.compute.fp8` says what that assumes); ``ep`` (expert parallelism, a
divisor of ``dp``: :mod:`fxplan.cost_model.parallel.expert_parallel`) splits a mixture of experts'
experts over ``ep`` of the data-parallel ranks; ``cp`` (context parallelism, a divisor of
``dp``: :mod:`fxplan.cost_model.parallel.context_parallel`) splits every sample's sequence over ``cp`` of
the data-parallel ranks, so ``batch = (dp/cp) · microbatch_size · num_microbatches``. ``tp_overlap`` says the runtime overlaps the
sequence-parallel all-gathers and reduce-scatters with their adjacent GEMMs (Megatron-Core's
``--tp-comm-overlap``, Transformer Engine's userbuffers); the cost model then prices each such
collective as ``max(0, t_comm − t_gemm)`` (:mod:`fxplan.cost_model.step.stage_costs`). The search
never sets it: fxplan's own runtime does not overlap tensor-parallel communication.
``pg_overlap`` (ZeRO-1/2 only) says the runtime hides the all-gather of the updated parameters
behind the next step's forward, as Megatron-Core's distributed optimizer does with
``--overlap-param-gather`` (each bucket gathered before its module's first forward); the cost
model then charges only what exceeds the stage's forward of one microbatch,
``max(0, t_gather − t_forward)`` (:mod:`fxplan.cost_model.step.stage_costs`). The search never sets
it either: fxplan's runtime gathers the parameters after the optimizer step.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar

from fxplan.core.placements import PlacementMap
from fxplan.core.schedule import Schedule

__all__ = ["CP_ATTENTION", "ConfigFields", "ConfigSelf", "OFFLOAD_POLICIES", "RECOMPUTE_POLICIES"]

#: Activation recompute policies.
RECOMPUTE_POLICIES: tuple[str, ...] = ("none", "selective", "full")

#: What lives in host memory instead of the device's: nothing, the optimizer states (ZeRO-Offload:
#: gradients to the host, the optimizer step on the CPU, the updated 16-bit weights back), or
#: the optimizer states and the (sharded) parameters (ZeRO-3 only: FSDP2's CPU offload).
OFFLOAD_POLICIES: tuple[str, ...] = ("none", "optimizer", "optimizer+params")

#: How a context-parallel rank gets the keys and values of its group's other sequence chunks in
#: the runtime: an all-gather of K and V over the CP group (a reduce-scatter of dK, dV in the
#: backward). A plan with ``cp > 1`` names it (``cp_attention``); the cost model also prices
#: ring attention (:mod:`fxplan.cost_model.parallel.context_parallel`) for comparison.
CP_ATTENTION = "allgather"

#: The configuration type a method returns itself as
#: (:class:`~fxplan.core.config.ParallelConfig`).
ConfigSelf = TypeVar("ConfigSelf", bound="ConfigFields")


@dataclass(frozen=True)
class ConfigFields:
    """The fields of a :class:`~fxplan.core.config.ParallelConfig` (which validates them):
    degrees, microbatching, schedule, ZeRO stage, recompute, sequence parallelism, offload
    and FP8.

    ``num_microbatches`` may be left ``None`` and is then derived from the global batch by
    :meth:`~fxplan.core.config.ParallelConfig.resolve`. ``stage_layers`` lists the layer count of
    each virtual stage in pipeline order (``pp · v`` entries); ``None`` splits the layers evenly.
    ``placements`` are the placements the cost model prices on the ``(dp, tp)`` mesh of one stage
    (:class:`~fxplan.core.placements.PlacementMap`: outputs only override the default layout's node
    states, a map with edges or parameters is priced edge by edge, see
    :mod:`fxplan.cost_model.parallel.priced_layout`); ``None`` uses the default Megatron layout
    derived from the graph (:mod:`fxplan.cost_model.parallel.megatron_layout`).
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    microbatch_size: int = 1
    num_microbatches: int | None = None
    schedule: Schedule = Schedule()
    zero_stage: int = 0
    recompute: str = "none"
    sequence_parallel: bool = False
    stage_layers: tuple[int, ...] | None = None
    placements: PlacementMap | None = None
    cp: int = 1
    ep: int = 1
    offload: str = "none"
    fp8: bool = False
    tp_comm_overlap: bool = False
    param_gather_overlap: bool = False
    recompute_layers: tuple[int, ...] | None = None
    zero_stages: tuple[int, ...] | None = None
    offload_stages: tuple[str, ...] | None = None

    @property
    def world_size(self) -> int:
        """``dp · tp · pp``."""
        return self.dp * self.tp * self.pp

    @property
    def virtual_stages(self) -> int:
        """Model chunks per pipeline stage: ``v`` for ``interleaved:v`` and ``zb:v``, 2 for
        ``zbv`` and ``dualpipev``, else 1."""
        return self.schedule.chunks

    @property
    def replicas(self) -> int:
        """``dp / cp``: the data-parallel replicas that process different samples (each of
        ``cp`` ranks splits its samples' sequences; ``dp`` when ``cp = 1``)."""
        return self.dp // self.cp

    def replace(self: ConfigSelf, **changes: Any) -> ConfigSelf:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)
