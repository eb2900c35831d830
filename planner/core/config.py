"""``ParallelConfig``: the one description of "what to run", the point of the strategy space
that the search enumerates, the cost model prices and a plan carries.

A configuration fixes the degrees ``dp × tp × pp`` (their product is the world size), the
microbatching (``microbatch_size`` sequences per microbatch, ``num_microbatches`` per step
and pipeline, so that ``batch = dp · microbatch_size · num_microbatches``), the pipeline
:class:`Schedule` (``gpipe``, ``1f1b``, ``interleaved:v`` with ``v ≥ 2`` model chunks per
stage, or the zero-bubble ``zb[:v]`` and ``zbv`` and DeepSeek's ``dualpipev``, whose backward
is split into the input gradient and the weight gradient, the latter run in the bubbles), the
ZeRO stage (0–3),
the recompute policy (:data:`RECOMPUTE_POLICIES`: ``none``,
``selective`` = the attention core, ``full`` = whole layers), sequence parallelism,
optionally explicit layer counts per (virtual) stage and the placements to price
(:class:`~fxplan.core.placements.PlacementMap`).

The one-line form is the edge to text: what ``fxplan estimate --config`` takes, what
:meth:`ParallelConfig.parse` reads and :meth:`ParallelConfig.to_string` writes::

    dp=24,tp=8,pp=8,mb=1,schedule=interleaved:2,zero=0,recompute=full,sp=off
    [,m=96][,stages=3/3/2/2][,recompute_layers=3/2/1/0][,zero_stages=3/3/1/1][,offload=optimizer]
    [,offload_stages=none/none/optimizer/optimizer]
    [,fp8=on][,cp=1][,ep=1][,tp_overlap=on][,pg_overlap=on]

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

and :meth:`ParallelConfig.summary` prints ``pp=8 dp=24 tp=8 | zero=0 | interleaved:2 mb=1×96 |
recompute=full | sp=off``.

:meth:`ParallelConfig.check` validates the configuration against the facts of a model and a
cluster and raises :class:`CostModelError` with the arithmetic::

    dp·tp·pp = 24·8·8 = 1536 ≠ 3072 devices
    tp=8 does not divide heads=12 (12 mod 8 = 4)
    pp=5 does not divide layers=24 (24 mod 5 = 4); or give stages=… (5 counts summing to 24) for uneven stages
    batch=512 is not divisible by dp·mb = 24·1 = 24 (512 mod 24 = 8)
    interleaved:2 needs layers divisible by pp·v = 8·2 = 16 (24 mod 16 = 8)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from fxplan.core.errors import UserError
from fxplan.core.placements import PlacementMap

__all__ = ["CP_ATTENTION", "CostModelError", "OFFLOAD_POLICIES", "ParallelConfig",
           "RECOMPUTE_POLICIES", "SCHEDULE_KINDS", "SPLIT_BACKWARD_KINDS", "Schedule",
           "V_SHAPE_KINDS"]

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

_ON = ("on", "true", "yes", "1")
_OFF = ("off", "false", "no", "0")

#: ``parse`` keys → field names.
_KEYS: dict[str, str] = {
    "dp": "dp", "tp": "tp", "pp": "pp",
    "mb": "microbatch_size", "microbatch_size": "microbatch_size",
    "m": "num_microbatches", "microbatches": "num_microbatches",
    "num_microbatches": "num_microbatches",
    "schedule": "schedule", "zero": "zero_stage", "zero_stage": "zero_stage",
    "recompute": "recompute", "sp": "sequence_parallel", "sequence_parallel": "sequence_parallel",
    "stages": "stage_layers", "cp": "cp", "ep": "ep", "offload": "offload", "fp8": "fp8",
    "tp_overlap": "tp_comm_overlap", "tp_comm_overlap": "tp_comm_overlap",
    "pg_overlap": "param_gather_overlap", "param_gather_overlap": "param_gather_overlap",
    "recompute_layers": "recompute_layers", "zero_stages": "zero_stages",
    "offload_stages": "offload_stages",
}
#: The short keys the error messages list (the others in :data:`_KEYS` are their long names).
_KEY_NAMES = ("dp, tp, pp, mb, m, schedule, zero, recompute, sp, stages, recompute_layers, "
              "zero_stages, cp, ep, offload, offload_stages, fp8, tp_overlap, pg_overlap")


class CostModelError(UserError, ValueError):
    """A configuration the cost model cannot price; the message shows the arithmetic."""


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CostModelError(f"{name} must be a positive integer, got {value!r}")
    return value


def _parse_bool(name: str, text: str) -> bool:
    if text.lower() in _ON:
        return True
    if text.lower() in _OFF:
        return False
    raise CostModelError(f"{name}={text!r}: expected on or off")


def _parse_int(name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise CostModelError(f"{name}={text!r}: expected an integer") from None


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


@dataclass(frozen=True)
class ParallelConfig:
    """Degrees, microbatching, schedule, ZeRO stage, recompute, sequence parallelism,
    offload and FP8.

    ``num_microbatches`` may be left ``None`` and is then derived from the global batch by
    :meth:`resolve`. ``stage_layers`` lists the layer count of each virtual stage in
    pipeline order (``pp · v`` entries); ``None`` splits the layers evenly.
    ``placements`` are the placements the cost model prices on the ``(dp, tp)`` mesh of one
    stage (:class:`~fxplan.core.placements.PlacementMap`: outputs only override the default
    layout's node states, a map with edges or parameters is priced edge by edge, see
    :mod:`fxplan.cost_model.parallel.priced_layout`); ``None`` uses the default Megatron layout derived
    from the graph (:mod:`fxplan.cost_model.parallel.megatron_layout`).
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

    def __post_init__(self) -> None:
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
            _positive_int(name, getattr(self, name))
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
            _positive_int("num_microbatches", self.num_microbatches)
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
                    _positive_int("each entry of stage_layers", count)
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

    # -- derived ------------------------------------------------------------------------
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

    def at_pipeline_rank(self, pp_rank: int) -> "ParallelConfig":
        """The configuration as pipeline rank ``pp_rank`` runs it: ``zero_stage`` and
        ``offload`` its own (:meth:`zero_stage_of`, :meth:`offload_of`), no ``zero_stages``
        or ``offload_stages``. A rank's memory, its collectives, its host copies and its
        optimizer read only this view (the other ranks' ZeRO stages and offload do not change
        them); ``self`` when every rank shares one stage and one offload."""
        if not self.per_rank:
            return self
        return self.uniform(self.zero_stage_of(pp_rank), self.offload_of(pp_rank))

    def uniform(self, zero_stage: int, offload: str) -> "ParallelConfig":
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
    def world_size(self) -> int:
        """``dp · tp · pp``."""
        return self.dp * self.tp * self.pp

    @property
    def virtual_stages(self) -> int:
        """Model chunks per pipeline stage: ``v`` for ``interleaved:v`` and ``zb:v``, 2 for
        ``zbv`` and ``dualpipev``, else 1."""
        return self.schedule.chunks

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
        return (self.zero_stage >= 2 and self.dp > 1
                and (self.pp == 1 or self.schedule.kind in ("gpipe", "1f1b")))

    @property
    def keeps_blocks_gathered(self) -> bool:
        """Whether the blocks stay gathered from one microbatch's backward to the next
        forward: ZeRO-2 reducing in every backward (:attr:`reduces_every_microbatch`), whose
        parameters are gathered once per step — before the step's first forward — and counted
        whole by the memory model; only the last backward reshards them, so that the next
        step gathers the updated shards."""
        return self.zero_stage == 2 and self.reduces_every_microbatch

    def replace(self, **changes: Any) -> "ParallelConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    # -- text forms -----------------------------------------------------------------------
    @classmethod
    def parse(cls, text: str) -> "ParallelConfig":
        """Read ``"dp=24,tp=8,pp=8,mb=1,schedule=interleaved:2,zero=0,recompute=full,sp=off"``.

        Keys: ``dp tp pp mb m schedule zero recompute sp stages`` (``stages=3/3/2/2``),
        ``recompute_layers`` (``recompute_layers=2/1/1/0``, with ``stages``), one entry per
        pipeline rank ``zero_stages`` (``zero_stages=3/3/1/1``) and ``offload_stages``
        (``offload_stages=optimizer/none/none/none``)
        and ``cp ep offload fp8 tp_overlap pg_overlap`` (``offload=optimizer``, ``fp8=on``,
        ``tp_overlap=on``, ``pg_overlap=on``; absent: 1, 1, ``none``, off, off, off); unknown or
        repeated keys are errors.
        """
        if not isinstance(text, str) or not text.strip():
            raise CostModelError(f"config {text!r}: expected key=value,... with keys "
                                 f"{_KEY_NAMES} (e.g. \"dp=4,tp=2,mb=1\")")
        values: dict[str, Any] = {}
        for item in filter(None, (part.strip() for part in text.replace(" ", ",").split(","))):
            key, sep, value = item.partition("=")
            key = key.strip().lower()
            if not sep or key not in _KEYS:
                raise CostModelError(
                    f"config {text!r}: cannot read {item!r}; expected key=value with keys "
                    f"{_KEY_NAMES}")
            name = _KEYS[key]
            if name in values:
                raise CostModelError(f"config {text!r}: {key} is given twice")
            value = value.strip()
            if name in ("sequence_parallel", "fp8", "tp_comm_overlap", "param_gather_overlap"):
                values[name] = _parse_bool(key, value)
            elif name == "offload":
                values[name] = value.lower()
            elif name == "offload_stages":
                values[name] = tuple(v.strip().lower() for v in value.split("/"))
            elif name in ("stage_layers", "recompute_layers", "zero_stages"):
                values[name] = tuple(_parse_int(key, v) for v in value.split("/"))
            elif name == "schedule":
                values[name] = Schedule.parse(value)
            elif name == "recompute":
                values[name] = value.lower()
            else:
                values[name] = _parse_int(key, value)
        return cls(**values)

    def to_string(self) -> str:
        """The :meth:`parse` form; round-trips every field but ``placements``, which it
        drops (they are a placement map, not part of the text form). ``cp``, ``ep``,
        ``offload`` and ``fp8`` are written only when they differ from their defaults, so the
        text of a configuration without them is what it was before they existed."""
        parts = [f"dp={self.dp}", f"tp={self.tp}", f"pp={self.pp}", f"mb={self.microbatch_size}"]
        if self.num_microbatches is not None:
            parts.append(f"m={self.num_microbatches}")
        parts += [f"schedule={self.schedule}", f"zero={self.zero_stage}",
                  f"recompute={self.recompute}", f"sp={'on' if self.sequence_parallel else 'off'}"]
        if self.stage_layers is not None:
            parts.append("stages=" + "/".join(map(str, self.stage_layers)))
        if self.recompute_layers is not None:
            parts.append("recompute_layers=" + "/".join(map(str, self.recompute_layers)))
        if self.zero_stages is not None:
            parts.append(f"zero_stages={self.zero_text}")
        # an offload per pipeline rank is written as its list (offload, the highest, follows)
        parts += [f"{'offload_stages' if k == 'offload' and self.offload_stages else k}={v}"
                  for k, v in self.extras().items()]
        return ",".join(parts)

    def extras(self) -> dict[str, str]:
        """The fields beyond the classic ones that differ from their defaults, as text:
        ``{"cp": "2", "ep": "4", "offload": "optimizer", "fp8": "on"}``; an offload per
        pipeline rank as its list (:attr:`offload_text`, ``"optimizer/none"``)."""
        out: dict[str, str] = {}
        for name in ("cp", "ep"):
            if getattr(self, name) != 1:
                out[name] = str(getattr(self, name))
        if self.offload != "none":
            out["offload"] = self.offload_text
        if self.fp8:
            out["fp8"] = "on"
        if self.tp_comm_overlap:
            out["tp_overlap"] = "on"
        if self.param_gather_overlap:
            out["pg_overlap"] = "on"
        return out

    def summary(self, *, recompute: str | None = None) -> str:
        """``pp=8 dp=24 tp=8 | zero=0 | interleaved:2 mb=1×96 | recompute=full | sp=off``
        (``mb=1×?`` while ``num_microbatches`` is not resolved), then ``| offload=optimizer``
        and ``| fp8=on`` when set. ``recompute`` replaces the policy's name: a plan whose
        blocks recompute differently prints ``mixed``; a configuration that recomputes some
        layers per stage prints the policy and the counts, ``recompute=full:3/2/1/0``; a ZeRO
        stage or an offload per pipeline rank prints them all, ``zero=3/3/1/1``,
        ``offload=optimizer/none/none/none``."""
        m = "?" if self.num_microbatches is None else str(self.num_microbatches)
        extras = "".join(f" | {k}={v}" for k, v in self.extras().items())
        return (f"pp={self.pp} dp={self.dp} tp={self.tp} | zero={self.zero_text} | "
                f"{self.schedule} mb={self.microbatch_size}×{m} | "
                f"recompute={recompute or self.recompute_text} | "
                f"sp={'on' if self.sequence_parallel else 'off'}{extras}")

    @property
    def recompute_text(self) -> str:
        """``full``, or ``full:3/2/1/0`` with per-stage counts (``recompute_layers``)."""
        if self.recompute_layers is None:
            return self.recompute
        return f"{self.recompute}:{'/'.join(map(str, self.recompute_layers))}"

    def __str__(self) -> str:
        return self.summary()

    # -- validation -------------------------------------------------------------------------
    @property
    def replicas(self) -> int:
        """``dp / cp``: the data-parallel replicas that process different samples (each of
        ``cp`` ranks splits its samples' sequences; ``dp`` when ``cp = 1``)."""
        return self.dp // self.cp

    def resolve(self, batch: int) -> "ParallelConfig":
        """This configuration with ``num_microbatches = batch / ((dp/cp) · mb)`` filled in.

        Raises when ``batch`` is not a multiple of ``(dp/cp) · mb`` or contradicts an explicit
        ``num_microbatches``.
        """
        _positive_int("batch", batch)
        per_step = self.replicas * self.microbatch_size
        if batch % per_step:
            who = (f"dp·mb = {self.dp}·{self.microbatch_size}" if self.cp == 1 else
                   f"(dp/cp)·mb = ({self.dp}/{self.cp})·{self.microbatch_size}")
            raise CostModelError(
                f"batch={batch} is not divisible by {who} = "
                f"{per_step} ({batch} mod {per_step} = {batch % per_step})"
            )
        m = batch // per_step
        if self.num_microbatches is not None and self.num_microbatches != m:
            who = "dp·mb" if self.cp == 1 else "(dp/cp)·mb"
            raise CostModelError(
                f"m={self.num_microbatches} contradicts batch={batch}: batch / ({who}) = "
                f"{batch} / {per_step} = {m} microbatches"
            )
        return self if self.num_microbatches == m else self.replace(num_microbatches=m)

    def check(self, *, world_size: int, layers: int, heads: int | None = None,
              seq: int | None = None, batch: int | None = None,
              tp_widths: Mapping[str, int] | None = None) -> None:
        """Raise :class:`CostModelError` unless the configuration fits the model and cluster.

        ``layers`` counts the repeated blocks, ``heads`` the attention heads, ``tp_widths``
        names dimensions tensor parallelism must split evenly (``{"vocab": 51200}``).
        """
        if self.world_size != world_size:
            raise CostModelError(
                f"dp·tp·pp = {self.dp}·{self.tp}·{self.pp} = {self.world_size} ≠ {world_size} "
                "devices in the cluster"
            )
        if heads is not None and heads % self.tp:
            raise CostModelError(
                f"tp={self.tp} does not divide heads={heads} ({heads} mod {self.tp} = "
                f"{heads % self.tp})"
            )
        for name, width in (tp_widths or {}).items():
            if width % self.tp:
                raise CostModelError(
                    f"tp={self.tp} does not divide {name}={width} ({width} mod {self.tp} = "
                    f"{width % self.tp})"
                )
        if self.sequence_parallel and self.tp == 1:
            raise CostModelError("sp=on needs tp > 1: sequence parallelism splits the sequence "
                                 "over the tensor-parallel ranks, and tp=1 has one")
        if self.sequence_parallel and seq is not None and seq % self.tp:
            raise CostModelError(
                f"sequence parallelism splits seq={seq} over tp={self.tp} ({seq} mod {self.tp} = "
                f"{seq % self.tp})"
            )
        if self.cp > 1 and seq is not None and seq % (2 * self.cp):
            raise CostModelError(
                f"context parallelism cuts seq={seq} into 2·cp = {2 * self.cp} chunks (the "
                f"load-balanced causal split) and {seq} mod {2 * self.cp} = {seq % (2 * self.cp)}")
        if self.cp > 1 and self.sequence_parallel and seq is not None \
                and seq % (self.cp * self.tp):
            raise CostModelError(
                f"sequence parallelism splits each rank's seq/cp = {seq}/{self.cp} tokens over "
                f"tp={self.tp} ({seq} mod {self.cp * self.tp} = {seq % (self.cp * self.tp)})")
        self._check_stages(layers)
        if batch is not None:
            resolved = self.resolve(batch)
            m = resolved.num_microbatches or 0
            if self.schedule.needs_round_microbatches and self.pp > 1 and m % self.pp:
                raise CostModelError(
                    f"{self.schedule} needs the microbatch count to be a multiple of pp: "
                    f"m = batch / ({'dp·mb' if self.cp == 1 else '(dp/cp)·mb'}) = {batch} / "
                    f"({self.replicas}·{self.microbatch_size}) = {m}, {m} mod {self.pp} = "
                    f"{m % self.pp}"
                )
            if m < self.schedule.min_microbatches(self.pp):
                raise CostModelError(
                    f"{self.schedule} needs at least 2·pp = {2 * self.pp} microbatches (one per "
                    f"virtual stage): m = batch / ({'dp·mb' if self.cp == 1 else '(dp/cp)·mb'}) "
                    f"= {batch} / ({self.replicas}·{self.microbatch_size}) = {m}")

    def _check_stages(self, layers: int) -> None:
        v = self.virtual_stages
        if self.stage_layers is not None:
            if sum(self.stage_layers) != layers:
                raise CostModelError(
                    f"stages={'/'.join(map(str, self.stage_layers))} hold "
                    f"{sum(self.stage_layers)} layers, the model has {layers}"
                )
            return
        stages = self.pp * v
        if stages > max(layers, 1):  # uneven stages cannot help: every stage needs a layer
            # (a model without repeated layers runs as one stage: layers = 0, pp·v = 1)
            raise CostModelError(
                f"pp·v = {self.pp}·{v} = {stages} stages for {layers} layers: every stage needs "
                f"at least one layer; use pp·v ≤ {max(layers, 1)}"
            )
        uneven = f"; or give stages=… ({stages} counts summing to {layers}) for uneven stages"
        if v > 1 and layers % stages:
            raise CostModelError(
                f"{self.schedule} needs layers divisible by pp·v = {self.pp}·{v} = "
                f"{stages} ({layers} mod {stages} = {layers % stages}){uneven}"
            )
        if layers % self.pp:
            raise CostModelError(
                f"pp={self.pp} does not divide layers={layers} ({layers} mod {self.pp} = "
                f"{layers % self.pp}){uneven}"
            )

    def layers_per_stage(self, layers: int) -> tuple[int, ...]:
        """Layer count of each virtual stage in pipeline order (``pp · v`` entries).

        Virtual stage ``j`` is chunk ``j // pp`` of pipeline stage ``j mod pp`` (Megatron's
        interleaved assignment), in a V (``zbv``, ``dualpipev``) that of
        :meth:`Schedule.placement`; without chunks ``j`` is simply stage ``j``.
        """
        if self.stage_layers is not None:
            return self.stage_layers
        chunks = self.pp * self.virtual_stages
        self._check_stages(layers)
        return (layers // chunks,) * chunks
