"""The lists of a configuration, one entry per (virtual) stage or pipeline rank —
``zero_stages``, ``offload_stages`` and ``recompute_layers`` — checked and normalised when a
:class:`~fxplan.core.config.ParallelConfig` is made.

``recompute_layers`` (with ``stages``) recomputes only some layers: virtual stage ``j``'s first
``k_j`` layers run the ``recompute`` policy and its other ``n_j − k_j`` layers none — the
per-stage memory knob of Mist (EuroSys'25) and the ``block`` method of Megatron-LM's
``--recompute-num-layers``, one count per stage (:meth:`ParallelConfig.layer_recompute`). A
count list equal to ``stages`` is every layer (stored as ``None``); all zeros is
``recompute=none`` and refused in this form.

``zero_stages`` (one ZeRO stage per pipeline rank, ``zero_stages=3/3/1/1``) shards each rank's
model states as its own memory needs: every virtual stage a rank holds shares its stage, since
one rank's optimizer and its FSDP2 wrapping are per rank (:meth:`ParallelConfig.zero_stage_of`,
:meth:`ParallelConfig.at_pipeline_rank`). ``zero`` is then the highest entry (what the
plan-wide rules and the exports that take one stage read); a list whose entries are all equal
is that plain ``zero`` (stored as ``None``). Each entry must be a ZeRO stage the plan-wide
``zero`` could be for the same configuration (``offload=optimizer+params`` needs 3,
``pg_overlap`` 1 or 2), and ``dp > 1`` (ZeRO shards over dp).
"""

from __future__ import annotations

from fxplan.core.config_error import CostModelError
from fxplan.core.config_fields import OFFLOAD_POLICIES
from fxplan.core.config_ranks import RankViews

__all__ = ["StageLists"]


class StageLists(RankViews):
    """The checks and normalisation of ``zero_stages``, ``offload_stages`` and
    ``recompute_layers`` that :meth:`~fxplan.core.config.ParallelConfig.__post_init__` runs."""

    def _normalise_zero_stages(self) -> None:
        """``zero_stages``: integers 0–3, one per pipeline rank; all equal is stored as that
        ``zero_stage`` (``None``); otherwise ``zero_stage`` becomes the highest entry (given
        as 0, the default, or as that entry). Runs before the plan-wide checks, which then
        see the highest stage; :meth:`_check_zero_stages` checks each entry after them."""
        if self.zero_stages is None:
            return
        stages = tuple(self.zero_stages) if isinstance(self.zero_stages, (tuple, list)) else ()
        text = "/".join(map(str, stages)) or repr(self.zero_stages)
        if not stages or any(isinstance(z, bool) or z not in (0, 1, 2, 3) for z in stages):
            raise CostModelError(f"zero_stages={text}: expected one ZeRO stage 0, 1, 2 or 3 per "
                                 "pipeline rank, separated by '/' (e.g. zero_stages=3/3/1/1)")
        pp = self.pp if isinstance(self.pp, int) and not isinstance(self.pp, bool) else None
        if len(stages) != pp:
            raise CostModelError(f"zero_stages={text} lists {len(stages)} ZeRO stages for "
                                 f"pp={self.pp} pipeline ranks: give one per rank (every "
                                 "virtual stage of a rank shares its rank's ZeRO stage)")
        top = max(stages)
        if self.zero_stage not in (0, top):
            raise CostModelError(f"zero={self.zero_stage} disagrees with zero_stages={text}: "
                                 f"with a stage per pipeline rank, zero is the highest of them "
                                 f"({top}); leave zero out or write zero={top}")
        object.__setattr__(self, "zero_stage", top)
        object.__setattr__(self, "zero_stages", None if len(set(stages)) == 1 else stages)

    def _normalise_offload_stages(self) -> None:
        """``offload_stages``: one of :data:`OFFLOAD_POLICIES` per pipeline rank; all equal is
        stored as that ``offload`` (``None``); otherwise ``offload`` becomes the highest entry
        in the order ``none < optimizer < optimizer+params`` (given as ``none``, the default,
        or as that entry). Runs before the plan-wide checks, as
        :meth:`_normalise_zero_stages` does; :meth:`_check_rank_views` checks each entry."""
        if self.offload_stages is None:
            return
        given = self.offload_stages
        policies = tuple(given) if isinstance(given, (tuple, list)) else ()
        text = "/".join(map(str, policies)) or repr(given)
        if not policies or any(o not in OFFLOAD_POLICIES for o in policies):
            raise CostModelError(f"offload_stages={text}: expected one offload policy "
                                 f"({', '.join(OFFLOAD_POLICIES)}) per pipeline rank, separated "
                                 "by '/' (e.g. offload_stages=optimizer/optimizer/none/none)")
        pp = self.pp if isinstance(self.pp, int) and not isinstance(self.pp, bool) else None
        if len(policies) != pp:
            raise CostModelError(f"offload_stages={text} lists {len(policies)} offload policies "
                                 f"for pp={self.pp} pipeline ranks: give one per rank (every "
                                 "virtual stage of a rank shares its rank's offload)")
        top = max(policies, key=OFFLOAD_POLICIES.index)
        if self.offload not in ("none", top):
            raise CostModelError(f"offload={self.offload} disagrees with offload_stages={text}: "
                                 "with a policy per pipeline rank, offload is the highest of "
                                 f"them (none < optimizer < optimizer+params: {top}); leave "
                                 f"offload out or write offload={top}")
        object.__setattr__(self, "offload", top)
        object.__setattr__(self, "offload_stages", None if len(set(policies)) == 1 else policies)

    def _check_rank_views(self) -> None:
        """Each entry of ``zero_stages`` and ``offload_stages`` is what the plan-wide ``zero``
        and ``offload`` could be for this configuration (its rank's view,
        :meth:`at_pipeline_rank`, passes every check); ``zero_stages`` over ``dp > 1``
        replicas."""
        if self.zero_stages is None and self.offload_stages is None:
            return
        if self.zero_stages is not None and self.dp == 1:
            raise CostModelError(f"zero_stages={self.zero_text} needs dp > 1: ZeRO shards the "
                                 "model states over the data-parallel ranks, and dp=1 has one, "
                                 "so every stage is the same; write zero=0")
        for rank in range(self.pp):
            try:
                self.at_pipeline_rank(rank)
            except CostModelError as err:
                given = [f"{name}={text}" for name, text, listed in (
                    ("zero_stages", self.zero_text, self.zero_stages),
                    ("offload_stages", self.offload_text, self.offload_stages)) if listed]
                own = [f"zero={self.zero_stage_of(rank)}"] * (self.zero_stages is not None) \
                    + [f"offload={self.offload_of(rank)}"] * (self.offload_stages is not None)
                raise CostModelError(f"{', '.join(given)}: pipeline rank {rank}'s "
                                     f"{' with '.join(own)} is not allowed here: {err}") from None

    def _check_recompute_layers(self) -> None:
        """``recompute_layers``: one count ``0 ≤ k_j ≤ n_j`` per entry of ``stage_layers``
        (which it needs), under a policy other than ``none``; every ``k_j = n_j`` is stored as
        ``None`` (every layer recomputes), all zeros refused (write ``recompute=none``)."""
        if self.recompute_layers is None:
            return
        counts = tuple(self.recompute_layers)
        text = "/".join(map(str, counts))
        if self.recompute == "none":
            raise CostModelError(f"recompute_layers={text} needs recompute=selective or full "
                                 "(the policy its counted layers run); got recompute=none")
        if self.stage_layers is None:
            raise CostModelError(f"recompute_layers={text} counts layers of each stage: give "
                                 "stages=… too (the layer count of each virtual stage)")
        if len(counts) != len(self.stage_layers):
            raise CostModelError(f"recompute_layers={text} lists {len(counts)} counts for "
                                 f"{len(self.stage_layers)} stages "
                                 f"(stages={'/'.join(map(str, self.stage_layers))})")
        for k, n in zip(counts, self.stage_layers):
            if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= n:
                raise CostModelError(
                    f"recompute_layers={text}: each count must be an integer from 0 to its "
                    f"stage's layers (stages={'/'.join(map(str, self.stage_layers))})")
        if not any(counts):
            raise CostModelError(f"recompute_layers={text} recomputes no layer: write "
                                 "recompute=none instead")
        object.__setattr__(self, "recompute_layers",
                           None if counts == self.stage_layers else counts)
