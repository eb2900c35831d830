"""The Plan: what to run (a :class:`ParallelConfig`), where every tensor lives (a
:class:`PlacementMap`) and how the search got there, as a frozen value with a versioned JSON form.

A plan holds

* ``config``: the :class:`~fxplan.core.config.ParallelConfig` to run: the degrees of the device
  mesh ``pp × dp × tp`` (axes :data:`MESH_AXES`, ranks laid out row-major with ``tp``
  fastest), the schedule, microbatching (``batch = dp · microbatch_size · num_microbatches``),
  ZeRO stage, recompute policy and sequence parallelism. ``config.placements`` is always
  ``None`` in a plan: the placements are ``placements``;
* ``block_recompute``: an optional per-repeated-block override of ``config.recompute`` (one
  policy per block). A configuration that recomputes some layers of each stage
  (``config.recompute_layers``, what the search chooses where memory needs it) fills it in
  from :meth:`~fxplan.core.config.ParallelConfig.layer_recompute`, the policies the estimate
  priced, and one given beside it must equal them; a hand-written one without
  ``recompute_layers`` is run as written while the estimate prices ``config.recompute``.
  ``None`` = every block runs ``config.recompute``. A uniform override equal to the
  config's policy is stored as ``None``; a uniform one that differs is refused (set the
  config's policy instead);
* ``placements``: per fx node output, per consumer input (keyed by
  :class:`~fxplan.core.placements.DataEdge`, where it differs from the producer's output: the
  reshards the step time priced) and per parameter, over the stage-local axes
  ``placements.axes`` (``("dp", "tp")``);
* provenance: the model, cluster and their fingerprints, ``batch`` and ``seq``, the cluster link
  level each mesh axis runs over (``axis_levels``), the pipeline ``stages`` (repeated-block
  ranges ``[start, stop)`` per virtual stage, the embedding on the first and the head on the
  last), the predicted ``estimate`` (step time and breakdown, MFU, per-stage peak memory,
  ``estimate["config"]`` the priced configuration as text and ``estimate["layout"]`` which
  placements it priced), the solver's status, search time and per-phase ``timings``,
  runners-up, pruning reasons (``pruned``, sentences, and ``pruned_detail``, one JSON object
  per sentence with its kind and numbers, :mod:`fxplan.inter_op.reasons`; empty in plans
  written before it existed) and fallbacks.

Convenience properties (``plan.dp``, ``plan.schedule``, ``plan.summary``, …) read the config.

``to_json``/``from_json`` carry ``format_version`` (:data:`PLAN_FORMAT_VERSION`); strings appear
only there (``config`` as the one-line :meth:`ParallelConfig.to_string` form, placements as
``"S(0)R"``). :func:`load_plan` refuses a plan made for another graph or cluster and says which.

Modules: the Plan's parts (:class:`StageAssignment`, :class:`SolverInfo`, :class:`PlanError`,
:data:`MESH_AXES`, :data:`PLAN_FORMAT_VERSION`) are in :mod:`fxplan.core.plan_parts`, the reading
and checking of a plan file's JSON object in :mod:`fxplan.core.plan_schema`; every public name
stays importable from here.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Mapping, TypeVar

from fxplan.core.config import ParallelConfig
from fxplan.core.config_fields import CP_ATTENTION, RECOMPUTE_POLICIES
from fxplan.core.schedule import Schedule
from fxplan.core.bounds import MAX_BATCH, MAX_SEQ, check_count
from fxplan.core.files import read_text
from fxplan.core.json_object import parse_json_object
from fxplan.core.placements import PlacementMap
from fxplan.core.plan_parts import (MESH_AXES, PLAN_FORMAT_VERSION, PlanError, SolverInfo,
                                    StageAssignment, check_stage_ranges)
from fxplan.core.plan_schema import extra_degrees, plan_from_dict

__all__ = ["MESH_AXES", "PLAN_FORMAT_VERSION", "Plan", "PlanError", "SolverInfo",
           "StageAssignment", "load_plan"]

T = TypeVar("T")


class _FromConfig(Generic[T]):
    """A read-only attribute of :class:`Plan` that is the same-named field (or property) of
    ``plan.config``."""

    def __init__(self, doc: str) -> None:
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, plan: "Plan | None", owner: type | None = None) -> T:
        if plan is None:
            return self  # type: ignore[return-value]  # class access: the descriptor itself
        return getattr(plan.config, self.name)


@dataclass(frozen=True)
class Plan:
    """A configuration, its placements and its provenance (module docstring)."""

    model: str
    cluster: str
    graph_fingerprint: str
    cluster_fingerprint: str
    batch: int
    seq: int | None
    config: ParallelConfig
    placements: PlacementMap = PlacementMap()
    block_recompute: tuple[str, ...] | None = None
    axis_levels: tuple[str, ...] = ()
    stages: tuple[StageAssignment, ...] = ()
    estimate: Mapping[str, Any] = field(default_factory=dict)
    solver: SolverInfo = SolverInfo()
    search_time_s: float = 0.0
    runners_up: tuple[Mapping[str, Any], ...] = ()
    pruned: tuple[str, ...] = ()
    pruned_detail: tuple[Mapping[str, Any], ...] = ()
    fallbacks: tuple[str, ...] = ()
    timings: Mapping[str, float] = field(default_factory=dict)
    fxplan_version: str = "0.1.0"

    def __post_init__(self) -> None:
        config = self.config
        if not isinstance(config, ParallelConfig):
            raise PlanError(f"config must be a ParallelConfig, got {type(config).__name__}")
        if config.num_microbatches is None:
            raise PlanError(f"config {config.to_string()!r} must give num_microbatches "
                            "(ParallelConfig.resolve(batch) fills it in)")
        if config.placements is not None:
            raise PlanError("a plan's config carries no placements: they are Plan.placements")
        if not isinstance(self.placements, PlacementMap):
            raise PlanError(f"placements must be a PlacementMap, got "
                            f"{type(self.placements).__name__}")
        expected = config.replicas * self.microbatch_size * self.num_microbatches
        if self.batch != expected:
            dp = f"{self.dp}" if config.cp == 1 else f"({self.dp}/{config.cp})"
            raise PlanError(
                f"batch {self.batch} ≠ {'dp' if config.cp == 1 else '(dp/cp)'}"
                f"·microbatch_size·num_microbatches = "
                f"{dp}·{self.microbatch_size}·{self.num_microbatches} = {expected}"
            )
        for key in ("batch", "seq"):
            value = getattr(self, key)
            if value is not None:
                check_count(key, value, high=MAX_BATCH if key == "batch" else MAX_SEQ)
        if self.stages:
            check_stage_ranges(self.stages)
            per_rank = self.virtual_stages
            if len(self.stages) != self.pp * per_rank:
                raise PlanError(
                    f"{len(self.stages)} stages given but pp·v = {self.pp}·{per_rank} = "
                    f"{self.pp * per_rank} expected for schedule {str(self.schedule)!r}"
                )
            counts = tuple(s.num_layers for s in self.stages)
            if config.stage_layers is not None and config.stage_layers != counts:
                raise PlanError(f"stages hold {'/'.join(map(str, counts))} layers but the "
                                f"config says stages={'/'.join(map(str, config.stage_layers))}")
        if self.axis_levels and len(self.axis_levels) != len(MESH_AXES):
            raise PlanError(f"axis_levels {self.axis_levels} must name one level per mesh axis "
                            f"{MESH_AXES}")
        self._check_block_recompute()

    def _check_block_recompute(self) -> None:
        counts = self.config.recompute_layers
        if counts is not None:
            derived = self.config.layer_recompute(sum(self.config.stage_layers or ()))
            if self.block_recompute is not None and tuple(self.block_recompute) != derived:
                raise PlanError(
                    f"block_recompute disagrees with the config's recompute_layers="
                    f"{'/'.join(map(str, counts))} (the first k layers of each stage run "
                    f"{self.config.recompute!r}, the others none)")
            object.__setattr__(self, "block_recompute", derived)
        if self.block_recompute is None:
            return
        policies = tuple(self.block_recompute)
        for policy in policies:
            if policy not in RECOMPUTE_POLICIES:
                raise PlanError(f"recompute policy {policy!r} is not one of {RECOMPUTE_POLICIES}")
        blocks = sum(s.num_layers for s in self.stages)
        if self.stages and len(policies) != blocks:
            raise PlanError(f"block_recompute lists {len(policies)} policies but the stages hold "
                            f"{blocks} repeated blocks")
        if not policies or set(policies) == {self.config.recompute}:
            policies = None
        elif len(set(policies)) == 1:
            raise PlanError(f"block_recompute is {policies[0]!r} for every block but the config's "
                            f"recompute is {self.config.recompute!r}: set config.recompute instead")
        object.__setattr__(self, "block_recompute", policies)

    # -- the configuration, read through ------------------------------------------------
    dp = _FromConfig[int]("data-parallel degree")
    tp = _FromConfig[int]("tensor-parallel degree")
    pp = _FromConfig[int]("pipeline-parallel degree")
    world_size = _FromConfig[int]("``pp · dp · tp``")
    schedule = _FromConfig[Schedule]("the pipeline schedule")
    virtual_stages = _FromConfig[int]("``v`` of ``interleaved:v``; 1 otherwise")
    microbatch_size = _FromConfig[int]("sequences per microbatch")
    num_microbatches = _FromConfig[int]("microbatches per step and pipeline")
    zero_stage = _FromConfig[int]("ZeRO stage 0–3")
    sequence_parallel = _FromConfig[bool]("sequence parallelism on tp")

    @property
    def mesh_axes(self) -> tuple[str, ...]:
        return MESH_AXES

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        """``(pp, dp, tp)``, the sizes of :data:`MESH_AXES`."""
        return (self.pp, self.dp, self.tp)

    @property
    def degrees(self) -> dict[str, int]:
        """``{"pp", "dp", "tp", "cp", "ep"}``: the mesh's sizes, then the context- and
        expert-parallel degrees (1 when unused)."""
        return {**dict(zip(MESH_AXES, self.mesh_shape)), **extra_degrees(self.config)}

    @property
    def cp_attention(self) -> str | None:
        """How context-parallel attention exchanges K and V (:data:`~fxplan.core.config.
        CP_ATTENTION`, ``"allgather"``), ``None`` without context parallelism."""
        return CP_ATTENTION if self.config.cp > 1 else None

    @property
    def state_layout(self) -> str:
        """The layout its model states were priced in
        (:data:`~fxplan.core.config_fields.STATE_LAYOUTS`). A plan file whose estimate names
        none was written before the runtime's layout was priced, when every estimate took
        Megatron-LM's (16-bit weights and gradients beside fp32 masters): ``"megatron"``,
        so that its re-pricing, ``explain`` and ``export`` reproduce the figures it
        carries."""
        return self.estimate.get("state_layout") or "megatron"

    @property
    def offload(self) -> str:
        """What lives in host memory (:data:`~fxplan.core.config_fields.OFFLOAD_POLICIES`)."""
        return self.config.offload

    def at_pipeline_rank(self, pp_rank: int) -> "Plan":
        """The plan as pipeline rank ``pp_rank`` applies it: its config's rank view
        (:meth:`~fxplan.core.config.ParallelConfig.at_pipeline_rank`, the rank's own ZeRO
        stage); ``self`` when every rank shares one stage."""
        config = self.config.at_pipeline_rank(pp_rank)
        return self if config is self.config else dataclasses.replace(self, config=config)

    def recompute(self, block: int) -> str:
        """The recompute policy of repeated block ``block``: ``block_recompute[block]`` when
        the plan overrides per block, else ``config.recompute``."""
        if self.block_recompute is not None and block < len(self.block_recompute):
            return self.block_recompute[block]
        return self.config.recompute

    @property
    def recompute_summary(self) -> str:
        """``config.recompute``, or ``mixed`` when blocks recompute differently."""
        return "mixed" if self.block_recompute is not None else self.config.recompute

    @property
    def summary(self) -> str:
        """``pp=8 dp=24 tp=8 | zero=1 | interleaved:2 mb=1×96 | recompute=selective | sp=on``."""
        return self.config.summary(recompute=self.recompute_summary)

    def __str__(self) -> str:
        return self.summary

    # -- JSON ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The JSON object of format :data:`PLAN_FORMAT_VERSION` (``summary``, ``degrees``,
        ``mesh_shape`` and ``mesh_axes`` are derived from ``config`` and checked on load)."""
        return {
            "format_version": PLAN_FORMAT_VERSION,
            "summary": self.summary,
            "degrees": self.degrees,
            **({"cp_attention": self.cp_attention} if self.cp_attention else {}),
            "offload": self.offload,
            "model": self.model, "cluster": self.cluster,
            "graph_fingerprint": self.graph_fingerprint,
            "cluster_fingerprint": self.cluster_fingerprint,
            "batch": self.batch, "seq": self.seq,
            "config": self.config.to_string(),
            "block_recompute": None if self.block_recompute is None else list(self.block_recompute),
            "mesh_shape": list(self.mesh_shape), "mesh_axes": list(MESH_AXES),
            "axis_levels": list(self.axis_levels),
            "stages": [dataclasses.asdict(s) for s in self.stages],
            "placements": self.placements.to_json(),
            "estimate": dict(self.estimate),
            "solver": dataclasses.asdict(self.solver),
            "search_time_s": self.search_time_s,
            "runners_up": [dict(r) for r in self.runners_up],
            "pruned": list(self.pruned),
            "pruned_detail": [dict(d) for d in self.pruned_detail],
            "fallbacks": list(self.fallbacks),
            "timings": dict(self.timings),
            "fxplan_version": self.fxplan_version,
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.to_json() + "\n")
        return path

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "plan") -> "Plan":
        """The plan of a plan file's JSON object (:func:`fxplan.core.plan_schema.
        plan_from_dict`: every check, every error a PlanError naming ``source``)."""
        return plan_from_dict(cls, data, source)

    @classmethod
    def from_json(cls, text: str, *, source: str = "plan") -> "Plan":
        data = parse_json_object(text, what=source, kind="plan file", error=PlanError)
        return cls.from_dict(data, source=source)

    def check_matches(self, *, graph_fingerprint: str | None = None,
                      cluster_fingerprint: str | None = None, world_size: int | None = None,
                      source: str = "plan") -> None:
        """Refuse a plan made for another graph, cluster or world size, saying which."""
        if graph_fingerprint is not None and graph_fingerprint != self.graph_fingerprint:
            raise PlanError(
                f"{source} was made for model {self.model!r} (graph {self.graph_fingerprint[:12]}) "
                f"but the model given has graph {graph_fingerprint[:12]}: the model's structure, "
                "shapes or batch differ; re-plan with `fxplan plan`"
            )
        if cluster_fingerprint is not None and cluster_fingerprint != self.cluster_fingerprint:
            raise PlanError(
                f"{source} was made for cluster {self.cluster!r} (fingerprint "
                f"{self.cluster_fingerprint[:12]}) but the cluster given has fingerprint "
                f"{cluster_fingerprint[:12]}; re-plan for this cluster"
            )
        if world_size is not None and world_size != self.world_size:
            raise PlanError(
                f"{source} needs world size pp·dp·tp = {self.pp}·{self.dp}·{self.tp} = "
                f"{self.world_size}, but {world_size} processes were given"
            )


def load_plan(path: str | Path, *, graph_fingerprint: str | None = None,
              cluster_fingerprint: str | None = None) -> Plan:
    """Read a plan file; with fingerprints given, refuse a plan for another graph/cluster."""
    if not isinstance(path, (str, Path)):
        raise PlanError(f"load_plan takes the path of a plan file (str or Path), got "
                        f"{type(path).__name__}")
    path = Path(path)
    plan = Plan.from_json(read_text(path, what="plan file", error=PlanError), source=str(path))
    plan.check_matches(graph_fingerprint=graph_fingerprint,
                       cluster_fingerprint=cluster_fingerprint, source=str(path))
    return plan
