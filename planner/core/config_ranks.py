"""A configuration as each pipeline rank runs it: the ZeRO stage and the offload of every rank
(``zero_stages``, ``offload_stages``; equal without them), the view of one rank
(:meth:`RankViews.at_pipeline_rank`) and their text (``zero=3/3/1/1``,
``offload=optimizer/none``).
"""

from __future__ import annotations

from fxplan.core.config_error import CostModelError
from fxplan.core.config_fields import ConfigFields, ConfigSelf

__all__ = ["RankViews"]


class RankViews(ConfigFields):
    """The per-pipeline-rank accessors of a :class:`~fxplan.core.config.ParallelConfig`."""

    def zero_stage_of(self, pp_rank: int) -> int:
        """The ZeRO stage of pipeline rank ``pp_rank``: its ``zero_stages`` entry, else the
        plan's ``zero_stage``."""
        return self.rank_zero_stages[self._rank(pp_rank)]

    @property
    def rank_zero_stages(self) -> tuple[int, ...]:
        """The ZeRO stage of every pipeline rank (``pp`` entries, equal without
        ``zero_stages``)."""
        return self.zero_stages or (self.zero_stage,) * self.pp

    def offload_of(self, pp_rank: int) -> str:
        """The offload policy of pipeline rank ``pp_rank``: its ``offload_stages`` entry, else
        the plan's ``offload``."""
        return self.rank_offloads[self._rank(pp_rank)]

    @property
    def rank_offloads(self) -> tuple[str, ...]:
        """The offload policy of every pipeline rank (``pp`` entries, equal without
        ``offload_stages``)."""
        return self.offload_stages or (self.offload,) * self.pp

    def _rank(self, pp_rank: int) -> int:
        """``pp_rank``, checked to be one of the ``pp`` pipeline ranks."""
        if not 0 <= pp_rank < self.pp:
            raise CostModelError(f"pipeline rank {pp_rank} is not one of the pp={self.pp} ranks")
        return pp_rank

    @property
    def per_rank(self) -> bool:
        """Whether some pipeline rank runs its own ZeRO stage or offload (``zero_stages``,
        ``offload_stages``)."""
        return self.zero_stages is not None or self.offload_stages is not None

    def at_pipeline_rank(self: ConfigSelf, pp_rank: int) -> ConfigSelf:
        """The configuration as pipeline rank ``pp_rank`` runs it: ``zero_stage`` and
        ``offload`` its own (:meth:`zero_stage_of`, :meth:`offload_of`), no ``zero_stages``
        or ``offload_stages``. A rank's memory, its collectives, its host copies and its
        optimizer read only this view (the other ranks' ZeRO stages and offload do not change
        them); ``self`` when every rank shares one stage and one offload."""
        if not self.per_rank:
            return self
        return self.uniform(self.zero_stage_of(pp_rank), self.offload_of(pp_rank))

    def uniform(self: ConfigSelf, zero_stage: int, offload: str) -> ConfigSelf:
        """This configuration with one ZeRO stage and one offload on every pipeline rank."""
        return self.replace(zero_stage=zero_stage, zero_stages=None, offload=offload,
                            offload_stages=None)

    @property
    def zero_text(self) -> str:
        """``3``, or ``3/3/1/1`` with a ZeRO stage per pipeline rank (``zero_stages``)."""
        if self.zero_stages is None:
            return str(self.zero_stage)
        return "/".join(map(str, self.zero_stages))

    @property
    def offload_text(self) -> str:
        """``optimizer``, or ``optimizer/optimizer/none/none`` with an offload per pipeline
        rank (``offload_stages``)."""
        if self.offload_stages is None:
            return self.offload
        return "/".join(self.offload_stages)
