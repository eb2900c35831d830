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

from dataclasses import dataclass

from fxplan.core.config_error import CostModelError
from fxplan.core.config_fields import OFFLOAD_POLICIES
from fxplan.core.config_ranks import RankViews

__all__ = ["StageLists"]


@dataclass(frozen=True)
class _RankList:
    """A per-pipeline-rank field and the words its errors use."""

    name: str                          # the list field: ``zero_stages``
    plain: str                         # the plan-wide field it sets: ``zero_stage``
    word: str                          # how users write the plan-wide field: ``zero``
    allowed: tuple                     # its values, lowest first (the default first)
    what: str                          # one entry, in words
    plural: str
    shared: str                        # what a rank's virtual stages share
    noun: str
    order: str                         # the order the highest is taken in, in words
    example: str


_ZERO_LIST = _RankList("zero_stages", "zero_stage", "zero", (0, 1, 2, 3),
                       "ZeRO stage 0, 1, 2 or 3", "ZeRO stages", "ZeRO stage", "stage", "",
                       "3/3/1/1")
_OFFLOAD_LIST = _RankList("offload_stages", "offload", "offload", OFFLOAD_POLICIES,
                          f"offload policy ({', '.join(OFFLOAD_POLICIES)})", "offload policies",
                          "offload", "policy", f"{' < '.join(OFFLOAD_POLICIES)}: ",
                          "optimizer/optimizer/none/none")


class StageLists(RankViews):
    """The checks and normalisation of ``zero_stages``, ``offload_stages`` and
    ``recompute_layers`` that :meth:`~fxplan.core.config.ParallelConfig.__post_init__` runs."""

    def _normalise_zero_stages(self) -> None:
        """``zero_stages``: integers 0–3, one per pipeline rank; all equal is stored as that
        ``zero_stage`` (``None``); otherwise ``zero_stage`` becomes the highest entry (given
        as 0, the default, or as that entry). Runs before the plan-wide checks, which then
        see the highest stage; :meth:`_check_zero_stages` checks each entry after them."""
        self._normalise_rank_list(_ZERO_LIST)

    def _normalise_offload_stages(self) -> None:
        """``offload_stages``: one of :data:`OFFLOAD_POLICIES` per pipeline rank; all equal is
        stored as that ``offload`` (``None``); otherwise ``offload`` becomes the highest entry
        in the order ``none < optimizer < optimizer+params`` (given as ``none``, the default,
        or as that entry). Runs before the plan-wide checks, as
        :meth:`_normalise_zero_stages` does; :meth:`_check_rank_views` checks each entry."""
        self._normalise_rank_list(_OFFLOAD_LIST)

    def _normalise_rank_list(self, kind: "_RankList") -> None:
        """One value per pipeline rank in field ``kind.name``, each among ``kind.allowed``,
        ``pp`` of them; the plan-wide field ``kind.plain`` becomes the highest (in the order
        of ``kind.allowed``) and must have been left at its default or given as it; a list of
        equal entries is stored as ``None`` (the plan-wide value says it all)."""
        given = getattr(self, kind.name)
        if given is None:
            return
        values = tuple(given) if isinstance(given, (tuple, list)) else ()
        text = "/".join(map(str, values)) or repr(given)
        if not values or any(isinstance(x, bool) or x not in kind.allowed for x in values):
            raise CostModelError(f"{kind.name}={text}: expected one {kind.what} per pipeline "
                                 f"rank, separated by '/' (e.g. {kind.name}={kind.example})")
        pp = self.pp if isinstance(self.pp, int) and not isinstance(self.pp, bool) else None
        if len(values) != pp:
            raise CostModelError(f"{kind.name}={text} lists {len(values)} {kind.plural} for "
                                 f"pp={self.pp} pipeline ranks: give one per rank (every "
                                 f"virtual stage of a rank shares its rank's {kind.shared})")
        top = max(values, key=kind.allowed.index)
        plain = getattr(self, kind.plain)
        if plain not in (kind.allowed[0], top):
            raise CostModelError(f"{kind.word}={plain} disagrees with {kind.name}={text}: "
                                 f"with a {kind.noun} per pipeline rank, {kind.word} is the "
                                 f"highest of them ({kind.order}{top}); leave {kind.word} out "
                                 f"or write {kind.word}={top}")
        object.__setattr__(self, kind.plain, top)
        object.__setattr__(self, kind.name, None if len(set(values)) == 1 else values)

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
