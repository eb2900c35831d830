"""``ParallelConfig``: the one description of "what to run", the point of the strategy space
that the search enumerates, the cost model prices and a plan carries.

A configuration fixes the degrees ``dp × tp × pp`` (their product is the world size), the
microbatching (``microbatch_size`` sequences per microbatch, ``num_microbatches`` per step and
pipeline, so that ``batch = dp · microbatch_size · num_microbatches``), the pipeline
:class:`~fxplan.core.schedule.Schedule` (``gpipe``, ``1f1b``, ``interleaved:v`` with ``v ≥ 2`` model
chunks per stage, or the zero-bubble ``zb[:v]`` and ``zbv`` and DeepSeek's ``dualpipev``, whose
backward is split into the input gradient and the weight gradient, the latter run in the bubbles),
the ZeRO stage (0–3), the recompute policy (:data:`~fxplan.core.config_fields.RECOMPUTE_POLICIES`:
``none``, ``selective`` = the attention core, ``full`` = whole layers), sequence parallelism,
optionally explicit layer counts per (virtual) stage and the placements to price
(:class:`~fxplan.core.placements.PlacementMap`).

Its parts live beside it: the fields and the values they take (:mod:`fxplan.core.config_fields`),
the pipeline :class:`~fxplan.core.schedule.Schedule`, the error
(:class:`~fxplan.core.config_error.CostModelError`), each pipeline rank's ZeRO stage and offload
(:mod:`fxplan.core.config_ranks`), the per-stage and per-rank lists checked when a
configuration is made (:mod:`fxplan.core.config_lists`), the one-line text form and the summary
(:mod:`fxplan.core.config_text`) and the checks against a model and a cluster
(:mod:`fxplan.core.config_fit`).
"""

from __future__ import annotations

from dataclasses import dataclass

from fxplan.core.config_error import CostModelError, positive_int
from fxplan.core.config_fields import OFFLOAD_POLICIES, RECOMPUTE_POLICIES
from fxplan.core.config_fit import ModelFit
from fxplan.core.config_lists import StageLists
from fxplan.core.config_text import TextForm
from fxplan.core.placements import PlacementMap
from fxplan.core.schedule import Schedule

__all__ = ["ParallelConfig"]


def fsdp_shards(dp: int, zero_stage: int, dtensor: bool) -> bool:
    """Whether the runtime shards the parameters over ``dp`` ranks with FSDP2 at
    ``zero_stage``: ZeRO-2/3, and ZeRO-1 where the parameters are DTensors (``dtensor``:
    ``tp > 1`` or ``ep > 1``; :mod:`fxplan.runtime.styles.data_parallel`), at ``dp > 1``."""
    return dp > 1 and (zero_stage >= 2 or (zero_stage == 1 and dtensor))


@dataclass(frozen=True)
class ParallelConfig(StageLists, TextForm, ModelFit):
    """Degrees, microbatching, schedule, ZeRO stage, recompute, sequence parallelism,
    offload and FP8 (the fields: :class:`~fxplan.core.config_fields.ConfigFields`), validated
    when made.
    """

    def __post_init__(self) -> None:
        """Normalise the per-rank lists, then check every field; a wrong value is one
        :class:`~fxplan.core.config_error.CostModelError` that says what was expected."""
        self._normalise_zero_stages()
        self._normalise_offload_stages()
        if self.offload not in OFFLOAD_POLICIES:
            raise CostModelError(f"offload={self.offload!r}: expected one of "
                                 f"{', '.join(OFFLOAD_POLICIES)}")
        if self.offload == "optimizer+params" and self.zero_stage != 3:
            raise CostModelError(
                f"offload=optimizer+params needs zero=3 (got zero={self.zero_stage}): parameters "
                "live on the host only as ZeRO-3 shards, gathered onto the device layer by "
                "layer (FSDP2's CPU offload, DeepSpeed's offload_param)")
        if not isinstance(self.fp8, bool):
            raise CostModelError(f"fp8 must be True or False, got {self.fp8!r}")
        if not isinstance(self.tp_comm_overlap, bool):
            raise CostModelError(f"tp_comm_overlap must be True or False, got "
                                 f"{self.tp_comm_overlap!r}")
        if self.tp_comm_overlap and not (self.sequence_parallel and self.tp > 1):
            raise CostModelError(
                f"tp_overlap=on needs tp > 1 and sp=on (got tp={self.tp}, "
                f"sp={'on' if self.sequence_parallel else 'off'}): the overlap splits the "
                "sequence-parallel all-gather and reduce-scatter into chunks pipelined with the "
                "adjacent GEMM (Megatron-Core --tp-comm-overlap requires "
                "--sequence-parallel)")
        for name in ("dp", "tp", "pp", "microbatch_size", "cp", "ep"):
            positive_int(name, getattr(self, name))
        if not isinstance(self.param_gather_overlap, bool):
            raise CostModelError(f"param_gather_overlap must be True or False, got "
                                 f"{self.param_gather_overlap!r}")
        if self.param_gather_overlap and not (self.zero_stage in (1, 2) and self.dp > 1):
            raise CostModelError(
                f"pg_overlap=on needs zero=1 or 2 and dp > 1 (got zero={self.zero_stage}, "
                f"dp={self.dp}): it hides the all-gather of the updated parameter shards "
                "behind the next step's forward (Megatron-Core --overlap-param-gather needs "
                "--use-distributed-optimizer); ZeRO-0 has no such gather and ZeRO-3 gathers "
                "every layer's weights anyway")
        if self.dp % self.cp:
            raise CostModelError(
                f"cp={self.cp} does not divide dp={self.dp} ({self.dp} mod {self.cp} = "
                f"{self.dp % self.cp}): context-parallel ranks are taken from the data-parallel "
                "ones (Megatron-Core, torchtitan)")
        if self.dp % self.ep:
            raise CostModelError(
                f"ep={self.ep} does not divide dp={self.dp} ({self.dp} mod {self.ep} = "
                f"{self.dp % self.ep}): expert-parallel ranks are taken from the data-parallel "
                "ones (Megatron-Core, DeepSpeed-MoE)")
        if self.num_microbatches is not None:
            positive_int("num_microbatches", self.num_microbatches)
        if not isinstance(self.schedule, Schedule):
            raise CostModelError(f"schedule must be a Schedule (Schedule.parse reads text), got "
                                 f"{self.schedule!r}")
        if self.zero_stage not in (0, 1, 2, 3) or isinstance(self.zero_stage, bool):
            raise CostModelError(f"zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        if self.recompute not in RECOMPUTE_POLICIES:
            raise CostModelError(
                f"recompute={self.recompute!r}: expected one of {', '.join(RECOMPUTE_POLICIES)}"
            )
        if not isinstance(self.sequence_parallel, bool):
            raise CostModelError(f"sequence_parallel must be True or False, got "
                                 f"{self.sequence_parallel!r}")
        if self.stage_layers is not None:
            layers = tuple(self.stage_layers)
            if layers != (0,):  # (0,): one stage of a model without repeated layers
                for count in layers:
                    positive_int("each entry of stage_layers", count)
            if len(layers) != self.pp * self.virtual_stages:
                raise CostModelError(
                    f"stages={'/'.join(map(str, layers))} lists {len(layers)} stages, expected "
                    f"pp·v = {self.pp}·{self.virtual_stages} = {self.pp * self.virtual_stages}"
                )
            object.__setattr__(self, "stage_layers", layers)
        self._check_recompute_layers()
        if self.placements is not None and not isinstance(self.placements, PlacementMap):
            raise CostModelError(f"placements must be a PlacementMap, got "
                                 f"{type(self.placements).__name__}")
        self._check_rank_views()

    # -- derived ------------------------------------------------------------------------
    def layer_recompute(self, layers: int) -> tuple[str, ...]:
        """The recompute policy of each of the model's ``layers`` repeated layers: with
        ``recompute_layers`` the first ``k_j`` layers of virtual stage ``j`` (which holds
        layers ``[Σ_{i<j} n_i, Σ_{i≤j} n_i)`` in model order) run ``recompute`` and the rest
        ``none``; without, every layer runs ``recompute``."""
        if self.recompute_layers is None:
            return (self.recompute,) * layers
        out: list[str] = []
        for k, n in zip(self.recompute_layers, self.layers_per_stage(layers)):
            out += [self.recompute] * k + ["none"] * (n - k)
        return tuple(out)

    @property
    def splits_backward(self) -> bool:
        """Whether the pipeline runs each backward as two passes, the input gradient (``B``)
        and later the weight gradient (``W``): a zero-bubble schedule (``zb``, ``zbv``,
        ``dualpipev``) over more than one pipeline rank."""
        return self.schedule.split_backward and self.pp > 1

    @property
    def shards_params_with_fsdp(self) -> bool:
        """Whether the runtime shards the parameters over dp with FSDP2: ZeRO-2/3, and ZeRO-1
        with ``tp > 1`` or ``ep > 1`` (DTensor parameters), at ``dp > 1``."""
        return self._fsdp_at(self.zero_stage)

    def _fsdp_at(self, zero_stage: int) -> bool:
        return fsdp_shards(self.dp, zero_stage, self.tp > 1 or self.ep > 1)

    @property
    def defers_sharded_reduction(self) -> bool:
        """Whether FSDP2's reduction waits for the last of ``m > 1`` microbatches, its gradient
        sync off in between (:attr:`shards_params_with_fsdp` without
        :attr:`reduces_every_microbatch`: ZeRO-1, or any stage under torch's multi-stage
        schedules): each rank keeps its unsharded gradients, accumulated in the reduction's
        dtype, across the step, and under ZeRO-3 its gathered blocks (resharded only after the
        reduction)."""
        return self.defers_sharded_reduction_at(self.zero_stage)

    @property
    def rank_defers_sharded_reduction(self) -> tuple[bool, ...]:
        """:meth:`defers_sharded_reduction_at` of every pipeline rank at its own ZeRO stage
        (:attr:`rank_zero_stages`)."""
        return tuple(self.defers_sharded_reduction_at(z) for z in self.rank_zero_stages)

    def defers_sharded_reduction_at(self, zero_stage: int) -> bool:
        """:attr:`defers_sharded_reduction` of a pipeline rank at ``zero_stage`` (its own, under
        ``zero_stages``), without building the rank's view."""
        return (self._fsdp_at(zero_stage) and (self.num_microbatches or 1) > 1
                and not self._reduces_every_microbatch_at(zero_stage))

    @property
    def reduces_every_microbatch(self) -> bool:
        """Whether the data-parallel gradient reduction runs in every microbatch's backward
        (ZeRO ≥ 2 with ``dp > 1``: a rank keeps only its shard of the gradients, so each
        microbatch's are reduce-scattered as its backward passes them, ``m`` reductions per
        step) rather than once, in the last microbatch's backward, after gradients accumulated
        unsharded (ZeRO-0/1: one all-reduce or reduce-scatter per step). Without a
        pipeline or under GPipe and 1F1B; torch's multi-stage schedules (interleaved,
        zero-bubble) keep their own reduction pass after the last backward. The runtime does
        what this says and the cost model prices it; with ``zero_stages`` it is a rank's rule,
        read on its view (:meth:`at_pipeline_rank`)."""
        return self._reduces_every_microbatch_at(self.zero_stage)

    def _reduces_every_microbatch_at(self, zero_stage: int) -> bool:
        return (zero_stage >= 2 and self.dp > 1
                and (self.pp == 1 or self.schedule.kind in ("gpipe", "1f1b")))

    @property
    def keeps_blocks_gathered(self) -> bool:
        """Whether the blocks stay gathered from one microbatch's backward to the next
        forward: ZeRO-2 reducing in every backward (:attr:`reduces_every_microbatch`), whose
        parameters are gathered once per step — before the step's first forward — and counted
        whole by the memory model; only the last backward reshards them, so that the next
        step gathers the updated shards."""
        return self.zero_stage == 2 and self.reduces_every_microbatch
