"""``TargetConfig``: what a plan asks of a training framework, in the terms the exporters write.

A :class:`~fxplan.core.plan.Plan` says more than any one framework can; this is the part they
share, normalised so that two spellings of the same run compare equal:

* sequence parallelism only counts with ``tp > 1`` (with ``tp = 1`` there is nothing to split);
* a ZeRO stage only counts with ``dp > 1`` (with one replica there is nothing to shard);
* the schedule only counts with ``pp > 1`` (``1f1b`` otherwise);
* ``stage_layers`` is ``None`` when the layers are split evenly over the (virtual) stages;
* a per-block recompute choice (``Plan.block_recompute``) becomes one policy, the strongest
  any block uses (``full`` > ``selective`` > ``none``), so that the run fits in memory, and a
  note says so.

:meth:`TargetConfig.from_plan` builds it from a plan; each format's parser
(:func:`fxplan.export.megatron.parse`, …) builds one from exported text with ``None`` for
what that format does not express, which is what the round trip compares.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from typing import Any

from fxplan.core.config_fields import RECOMPUTE_POLICIES
from fxplan.core.schedule import Schedule
from fxplan.core.plan import Plan

__all__ = ["TargetConfig", "plan_dtype", "without_zero_bubble"]


def without_zero_bubble(target: "TargetConfig", framework: str, notes: list[str],
                        changes: dict[str, Any]) -> str | None:
    """The schedule a framework without zero-bubble schedules runs instead of the plan's
    ``zb:v``/``zbv``/``dualpipev`` (``1f1b`` for ``v = 1``, else ``interleaved:v`` over the same
    chunks in the loop placement), with a note and the change priced; ``None`` for any other
    schedule."""
    text = target.schedule or "1f1b"
    kind, _, chunks = text.partition(":")
    if kind not in ("zb", "zbv", "dualpipev"):
        return None
    v = 2 if kind in ("zbv", "dualpipev") else int(chunks or 1)
    schedule = Schedule("interleaved", v) if v > 1 else Schedule("1f1b")
    changes["schedule"] = schedule
    notes.append(f"approximated: {framework} has no zero-bubble schedule; the plan's {text} "
                 f"runs as {schedule} (the weight-gradient work no longer fills the bubbles)")
    return str(schedule)


@dataclass(frozen=True)
class TargetConfig:
    """Degrees, batching, schedule, memory savers and precision; ``None`` = not expressed.

    ``global_batch = dp · microbatch_size · num_microbatches``; ``virtual_stages`` is ``v``
    of ``interleaved:v`` (1 otherwise); ``layers`` counts the repeated blocks;
    ``stage_layers`` lists the layers of each virtual stage when they differ; ``dtype`` is a
    torch dtype name (``bfloat16``, ``float16``, ``float32``); ``cp``/``ep`` the context- and
    expert-parallel degrees, ``offload`` what lives in host memory (``none``, ``optimizer``,
    ``optimizer+params``), ``fp8`` whether the matrix products run in FP8 and
    ``tp_comm_overlap`` whether the sequence-parallel collectives are pipelined with their GEMMs
    (Megatron-Core ``--tp-comm-overlap``), ``param_gather_overlap`` whether the updated
    parameters' all-gather hides behind the next forward (``--overlap-param-gather``);
    ``cp_comm`` how context parallelism exchanges K/V (``all_gather``, what
    :mod:`fxplan.cost_model.parallel.context_parallel` prices; ``None`` without context parallelism);
    ``model`` the plan's model spec (``hf:mixtral-8x7b``), for the targets that name models.
    """

    dp: int | None = None
    tp: int | None = None
    pp: int | None = None
    schedule: str | None = None
    virtual_stages: int | None = None
    microbatch_size: int | None = None
    num_microbatches: int | None = None
    global_batch: int | None = None
    sequence_parallel: bool | None = None
    recompute: str | None = None
    zero_stage: int | None = None
    layers: int | None = None
    stage_layers: tuple[int, ...] | None = None
    seq: int | None = None
    dtype: str | None = None
    cp: int | None = None
    ep: int | None = None
    offload: str | None = None
    fp8: bool | None = None
    tp_comm_overlap: bool | None = None
    param_gather_overlap: bool | None = None
    cp_comm: str | None = None
    model: str | None = None

    @classmethod
    def from_plan(cls, plan: Plan) -> tuple["TargetConfig", list[str]]:
        """The plan's target configuration and the notes every format shares (a per-block
        recompute choice made uniform, a precision the plan's cluster does not tell)."""
        config = plan.config
        notes: list[str] = []
        recompute = config.recompute
        if plan.block_recompute is not None:
            counts = Counter(plan.block_recompute)
            recompute = max(counts, key=RECOMPUTE_POLICIES.index)
            mix = ", ".join(f"{policy}×{counts[policy]}" for policy in RECOMPUTE_POLICIES
                            if counts[policy])
            notes.append(f"approximated: the plan chooses recompute per block ({mix}); the "
                         f"export applies the strongest, {recompute!r}, to every layer (more "
                         "recompute than planned, never more memory)")
        if config.zero_stages is not None and config.dp > 1:
            notes.append(f"approximated: the plan chooses the ZeRO stage per pipeline rank "
                         f"({config.zero_text}); the export applies the strongest, "
                         f"ZeRO-{config.zero_stage}, on every rank (less memory than planned, "
                         "more communication where a rank planned a lower stage)")
        if config.offload_stages is not None:
            notes.append(f"approximated: the plan chooses the offload per pipeline rank "
                         f"({config.offload_text}); the export applies the strongest, "
                         f"offload={config.offload}, on every rank (less device memory than "
                         "planned, more host↔device copies and CPU optimizer steps where a "
                         "rank planned less offload)")
        layers = _layer_counts(plan)
        dtype = plan_dtype(plan)
        if dtype is None:
            notes.append(f"precision omitted: the plan does not record its dtype and its "
                         f"cluster {plan.cluster!r} cannot be loaded here to derive it")
        return cls(
            dp=config.dp, tp=config.tp, pp=config.pp,
            schedule=str(config.schedule) if config.pp > 1 else "1f1b",
            virtual_stages=config.virtual_stages if config.pp > 1 else 1,
            microbatch_size=config.microbatch_size,
            num_microbatches=config.num_microbatches,
            global_batch=plan.batch,
            sequence_parallel=config.sequence_parallel and config.tp > 1,
            recompute=recompute,
            zero_stage=config.zero_stage if config.dp > 1 else 0,
            layers=sum(layers) if layers else None,
            stage_layers=layers if layers and len(set(layers)) > 1 else None,
            seq=plan.seq,
            dtype=dtype,
            cp=config.cp, ep=config.ep, offload=config.offload, fp8=config.fp8,
            tp_comm_overlap=config.tp_comm_overlap,
            param_gather_overlap=config.param_gather_overlap,
            cp_comm="all_gather" if config.cp > 1 else None,
            model=plan.model,
        ), notes

    @property
    def layers_per_virtual_stage(self) -> int | None:
        """Layers in each virtual stage when they are split evenly and the count is known."""
        if self.layers is None or self.stage_layers is not None or not self.pp:
            return None
        return self.layers // (self.pp * (self.virtual_stages or 1))


def _layer_counts(plan: Plan) -> tuple[int, ...] | None:
    """Repeated blocks per virtual stage in pipeline order, from the plan's stages (or the
    config's explicit ``stage_layers``); ``None`` when the plan records neither."""
    if plan.stages:
        return tuple(stage.num_layers for stage in sorted(plan.stages, key=lambda s: s.index))
    return plan.config.stage_layers


def plan_dtype(plan: Plan) -> str | None:
    """The precision the plan was searched in: ``fxplan plan`` and :func:`fxplan.search`
    capture in the cluster's training dtype (:func:`fxplan.cluster_specs.training_dtype`), so it
    is derived from the plan's cluster spec; ``None`` when that spec cannot be loaded here
    (a YAML file that is not on this machine)."""
    from fxplan.cluster_specs import Cluster
    from fxplan.core.errors import UserError
    from fxplan.cluster_specs import training_dtype

    try:
        return training_dtype(Cluster.load(plan.cluster))
    except (UserError, OSError):
        return None
