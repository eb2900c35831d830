"""A pipeline schedule: its kind (GPipe, 1F1B, interleaved, the zero-bubble ``zb`` and ``zbv``,
DeepSeek's ``dualpipev``), its model chunks per stage and where each virtual stage sits.

The text form is ``gpipe``, ``1f1b``, ``interleaved:v`` (``v ≥ 2``), ``zb`` or ``zb:v``, ``zbv``
and ``dualpipev`` (:meth:`Schedule.parse`; ``str()`` gives it back).
"""

from __future__ import annotations

from dataclasses import dataclass

from fxplan.core.config_error import CostModelError

__all__ = ["SCHEDULE_KINDS", "SPLIT_BACKWARD_KINDS", "Schedule", "V_SHAPE_KINDS"]


#: Pipeline schedule kinds; ``interleaved`` is written ``interleaved:v`` (``v ≥ 2``), ``zb``
#: (torch's ``ScheduleInterleavedZeroBubble``, ZB1P of Qi et al. 2024) ``zb`` (``v = 1``) or
#: ``zb:v``, ``zbv`` (torch's ``ScheduleZBVZeroBubble``) and ``dualpipev`` (torch's
#: ``ScheduleDualPipeV``, DeepSeek's DualPipe folded into a V; ``m ≥ 2·pp``) always run
#: ``v = 2`` chunks per stage placed in a V: pipeline rank ``r`` holds virtual stages ``r``
#: and ``2·pp − 1 − r``.
SCHEDULE_KINDS: tuple[str, ...] = ("gpipe", "1f1b", "interleaved", "zb", "zbv", "dualpipev")


#: Kinds whose backward runs as two ops, the input gradient ``B`` (sent on at once) and the
#: weight gradient ``W`` (run later, in what would be a bubble).
SPLIT_BACKWARD_KINDS: tuple[str, ...] = ("zb", "zbv", "dualpipev")


#: Kinds whose two chunks per stage sit in a V (:attr:`Schedule.v_shape`).
V_SHAPE_KINDS: tuple[str, ...] = ("zbv", "dualpipev")


@dataclass(frozen=True)
class Schedule:
    """A pipeline schedule: ``kind`` (:data:`SCHEDULE_KINDS`) and ``chunks``, the ``v`` model
    chunks per pipeline stage: ``interleaved:v`` (``v ≥ 2``; ``interleaved:1`` would be
    1F1B, so it is written ``1f1b``), ``zb:v`` (``v ≥ 1``, written ``zb`` for ``v = 1``),
    ``zbv`` and ``dualpipev`` (``v = 2``, placed in a V); ``gpipe`` and ``1f1b`` have
    ``chunks = 1``."""

    kind: str = "1f1b"
    chunks: int = 1

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULE_KINDS:
            raise CostModelError(_schedule_message(str(self)))
        if isinstance(self.chunks, bool) or not isinstance(self.chunks, int):
            raise CostModelError(f"schedule chunks must be an integer, got {self.chunks!r}")
        if self.kind == "interleaved" and self.chunks < 2:
            raise CostModelError(_schedule_message(
                f"interleaved:{self.chunks}", "interleaved needs its chunk count v ≥ 2, e.g. "
                "interleaved:2 (interleaved:1 is 1f1b)"))
        if self.kind == "zb" and self.chunks < 1:
            raise CostModelError(_schedule_message(f"zb:{self.chunks}",
                                                   "zb needs its chunk count v ≥ 1"))
        if self.kind in V_SHAPE_KINDS and self.chunks != 2:
            raise CostModelError(_schedule_message(f"{self.kind}:{self.chunks}",
                                                   f"{self.kind} always runs 2 chunks per stage"))
        if self.kind in ("gpipe", "1f1b") and self.chunks != 1:
            raise CostModelError(_schedule_message(f"{self.kind}:{self.chunks}",
                                                   "only interleaved and zb take ':v'"))

    @classmethod
    def parse(cls, text: str) -> "Schedule":
        """``"gpipe"``, ``"1f1b"``, ``"interleaved:v"``, ``"zb"``, ``"zb:v"``, ``"zbv"`` or
        ``"dualpipev"`` (case and spaces ignored)."""
        kind, sep, chunks = str(text).strip().lower().partition(":")
        if kind not in SCHEDULE_KINDS:
            raise CostModelError(_schedule_message(text))
        if kind in V_SHAPE_KINDS:
            if sep:
                raise CostModelError(_schedule_message(text, f"{kind} always runs 2 chunks per "
                                                             f"stage; write {kind}"))
            return cls(kind, 2)
        if kind not in ("interleaved", "zb"):
            if sep:
                raise CostModelError(_schedule_message(text, "only interleaved and zb take ':v'"))
            return cls(kind)
        if kind == "zb" and not sep:
            return cls(kind, 1)
        if not chunks.isdigit():
            raise CostModelError(_schedule_message(
                text, f"{kind} needs its chunk count v as an integer, e.g. {kind}:2"))
        return cls(kind, int(chunks))

    @property
    def interleaved(self) -> bool:
        return self.kind == "interleaved"

    @property
    def split_backward(self) -> bool:
        """Whether the backward runs as an input-gradient and a weight-gradient op."""
        return self.kind in SPLIT_BACKWARD_KINDS

    @property
    def v_shape(self) -> bool:
        """Whether the chunks sit in a V (``zbv``, ``dualpipev``): pipeline rank ``r`` holds
        virtual stages ``r`` and ``2·pp − 1 − r``, so the first and the last stage share
        rank 0."""
        return self.kind in V_SHAPE_KINDS

    def min_microbatches(self, pp: int) -> int:
        """The fewest microbatches the schedule runs on ``pp`` stages: ``2·pp`` (one per
        virtual stage) for ``dualpipev`` (torch's ``ScheduleDualPipeV`` refuses fewer), else 1."""
        return 2 * pp if self.kind == "dualpipev" and pp > 1 else 1

    @property
    def needs_round_microbatches(self) -> bool:
        """Whether the microbatch count must be a multiple of pp (torch's interleaved
        schedules run whole rounds of pp microbatches)."""
        return self.kind in ("interleaved", "zb")

    def virtual_stage(self, rank: int, chunk: int, pp: int) -> int:
        """The virtual stage ``j`` that chunk ``chunk`` of pipeline rank ``rank`` holds: the
        loop ``j = chunk·pp + rank`` (Megatron's and torch's interleaved assignment), or in
        the V (``zbv``, ``dualpipev``) ``j = rank`` (chunk 0), ``2·pp − 1 − rank`` (chunk 1)."""
        if self.v_shape:
            return rank if chunk == 0 else 2 * pp - 1 - rank
        return chunk * pp + rank

    def placement(self, virtual: int, pp: int) -> tuple[int, int]:
        """``(rank, chunk)`` of virtual stage ``virtual`` (the inverse of
        :meth:`virtual_stage`)."""
        if self.v_shape:
            return (virtual, 0) if virtual < pp else (2 * pp - 1 - virtual, 1)
        return virtual % pp, virtual // pp

    def __str__(self) -> str:
        if self.kind == "zb":
            return "zb" if self.chunks == 1 else f"zb:{self.chunks}"
        return f"{self.kind}:{self.chunks}" if self.interleaved else self.kind


def _schedule_message(text: str, why: str = "") -> str:
    return (f"schedule {text!r} is not one of gpipe, 1f1b, interleaved:v, zb, zb:v, zbv, "
            "dualpipev"
            + (f": {why}" if why else " (v an integer ≥ 2)"))
