"""The Plan: what to run (a :class:`ParallelConfig`), where every tensor lives (a
:class:`PlacementMap`) and how the search got there, as a frozen value with a versioned JSON form.

A plan holds

* ``config``: the :class:`~fxplan.core.config.ParallelConfig` to run: the degrees of the device
  mesh ``pp × dp × tp`` (axes :data:`MESH_AXES`, ranks laid out row-major with ``tp``
  fastest), the schedule, microbatching (``batch = dp · microbatch_size · num_microbatches``),
  ZeRO stage, recompute policy and sequence parallelism. ``config.placements`` is always
  ``None`` in a plan: the placements are ``placements``;
* ``block_recompute``: an optional per-repeated-block override of ``config.recompute`` (one
  policy per block, for hand-written plans; the search leaves it ``None`` = every block runs
  ``config.recompute``, the policy the estimate priced). A uniform override equal to the
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
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Mapping, TypeVar

from fxplan.core.config import CP_ATTENTION, RECOMPUTE_POLICIES, ParallelConfig, Schedule
from fxplan.core.bounds import MAX_BATCH, MAX_SEQ, BoundsError, check_count
from fxplan.core.errors import UserError
from fxplan.core.files import read_text
from fxplan.core.json_object import parse_json_object
from fxplan.core.placements import PlacementMap

__all__ = ["MESH_AXES", "PLAN_FORMAT_VERSION", "Plan", "PlanError", "SolverInfo",
           "StageAssignment", "load_plan"]

T = TypeVar("T")

#: Version 2: ``config`` is one :class:`ParallelConfig` (text form), placements a typed map.
PLAN_FORMAT_VERSION = 2

#: The device mesh's axes, slowest first: ``rank = (pp_i · dp + dp_i) · tp + tp_i``.
MESH_AXES: tuple[str, ...] = ("pp", "dp", "tp")


class PlanError(UserError):
    """A plan file that is malformed, from another version, or for another model/cluster."""


@dataclass(frozen=True)
class StageAssignment:
    """Pipeline stage ``index`` runs repeated blocks ``layers[0] … layers[1]-1``.

    With an interleaved schedule there are ``pp · v`` stages; stage ``i`` runs on pipeline
    rank ``i mod pp``.
    """

    index: int
    layers: tuple[int, int]
    has_embedding: bool = False
    has_head: bool = False

    @property
    def num_layers(self) -> int:
        return self.layers[1] - self.layers[0]


@dataclass(frozen=True)
class SolverInfo:
    backend: str = "none"
    status: str = "not-run"  # optimal | feasible | time-limit | not-run
    gap: float = 0.0
    time_s: float = 0.0


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
            _check_stage_ranges(self.stages)
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
        return {**dict(zip(MESH_AXES, self.mesh_shape)), **_extra_degrees(self.config)}

    @property
    def cp_attention(self) -> str | None:
        """How context-parallel attention exchanges K and V (:data:`~fxplan.core.config.
        CP_ATTENTION`, ``"allgather"``), ``None`` without context parallelism."""
        return CP_ATTENTION if self.config.cp > 1 else None

    @property
    def offload(self) -> str:
        """What lives in host memory (:data:`~fxplan.core.config.OFFLOAD_POLICIES`)."""
        return self.config.offload

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
        version = data.get("format_version")
        if version != PLAN_FORMAT_VERSION:
            raise PlanError(
                f"{source}: plan format_version {version!r} is not supported; this fxplan reads "
                f"format_version {PLAN_FORMAT_VERSION} (re-run `fxplan plan` to make a new one)"
            )
        missing = [k for k in _REQUIRED if k not in data]
        if missing:
            raise PlanError(f"{source}: plan is missing required keys {missing}")
        unknown = sorted(set(data) - set(_REQUIRED) - set(_OPTIONAL) - set(_DERIVED))
        if unknown:
            raise PlanError(f"{source}: plan has unknown keys {unknown}")
        key: str | None = None
        try:
            kwargs: dict[str, Any] = {k: data[k] for k in _REQUIRED + _OPTIONAL if k in data}
            for key in ("model", "cluster", "graph_fingerprint", "cluster_fingerprint"):
                if not isinstance(kwargs[key], str):
                    raise PlanError(f"{key} must be a string, got {kwargs[key]!r}")
            key = "batch"
            kwargs[key] = _integer(kwargs[key], key)
            key = "seq"
            if kwargs[key] is not None:
                kwargs[key] = _integer(kwargs[key], key)
            key = "config"
            if not isinstance(kwargs[key], str):
                raise PlanError(f"config must be the one-line text form, got {kwargs[key]!r}")
            kwargs[key] = ParallelConfig.parse(kwargs[key])
            _check_mesh(data, kwargs["config"])
            for key in ("axis_levels", "pruned", "pruned_detail", "fallbacks", "runners_up"):
                if key in kwargs:
                    kwargs[key] = tuple(_sequence(kwargs[key], key))
            key = "block_recompute"
            if kwargs.get(key) is not None:
                kwargs[key] = tuple(_sequence(kwargs[key], key))
            key = "stages"
            kwargs[key] = tuple(_stage(s, i) for i, s in enumerate(_sequence(kwargs.get(key, ()),
                                                                                key)))
            key = "placements"
            if key in kwargs:
                kwargs[key] = PlacementMap.from_json(kwargs[key])
            key = "solver"
            if key in kwargs:
                kwargs[key] = _dataclass_from(SolverInfo, kwargs[key], key)
            key = "estimate"
            _check_estimate(kwargs.get(key, {}), kwargs["config"])
            key = None
            return cls(**kwargs)
        except (PlanError, BoundsError) as err:
            raise PlanError(f"{source}: {err}") from err
        except (TypeError, KeyError, ValueError, AttributeError) as err:
            where = f", key {key!r}" if key else ""
            raise PlanError(f"{source}: malformed plan{where}: {type(err).__name__}: {err}"
                            ) from err

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


#: JSON keys a plan file must have, those it may have, and those derived from ``config``.
_REQUIRED = ("model", "cluster", "graph_fingerprint", "cluster_fingerprint", "batch", "seq",
             "config")
_OPTIONAL = ("placements", "block_recompute", "axis_levels", "stages", "estimate", "solver",
             "search_time_s", "runners_up", "pruned", "pruned_detail", "fallbacks", "timings",
             "fxplan_version")
_DERIVED = ("format_version", "summary", "degrees", "cp_attention", "offload", "mesh_shape",
            "mesh_axes")


def _extra_degrees(config: ParallelConfig) -> dict[str, int]:
    return {"cp": config.cp, "ep": config.ep}


def _check_mesh(data: Mapping[str, Any], config: ParallelConfig) -> None:
    """``mesh_shape``, ``mesh_axes``, ``degrees`` and ``offload``, when present, must agree
    with the config's ``(pp, dp, tp)``, ``cp``, ``ep`` and ``offload``; plans written before
    ``cp``, ``ep`` and ``offload`` existed lack them and read as 1, 1 and ``none``."""
    want = {"pp": config.pp, "dp": config.dp, "tp": config.tp}
    if "mesh_axes" in data and list(_sequence(data["mesh_axes"], "mesh_axes")) != list(MESH_AXES):
        raise PlanError(f"mesh_axes {data['mesh_axes']} must be {list(MESH_AXES)}")
    if "mesh_shape" in data:
        shape = [_integer(n, f"mesh_shape[{i}]")
                 for i, n in enumerate(_sequence(data["mesh_shape"], "mesh_shape"))]
        if shape != [want[a] for a in MESH_AXES]:
            raise PlanError(f"mesh_shape {shape} disagrees with the config's pp·dp·tp = "
                            f"{config.pp}·{config.dp}·{config.tp}")
    if "degrees" in data:
        degrees = data["degrees"]
        if isinstance(degrees, Mapping):
            degrees = {**_extra_degrees(ParallelConfig()), **degrees}
        want = {**want, **_extra_degrees(config)}
        if degrees != want:
            raise PlanError(f"degrees {data['degrees']} disagree with the config's {want}")
    if "cp_attention" in data and data["cp_attention"] != (CP_ATTENTION if config.cp > 1
                                                            else None):
        raise PlanError(f"cp_attention {data['cp_attention']!r}: this version runs context "
                        f"parallelism as {CP_ATTENTION!r} (cp > 1 only)")
    if "offload" in data and data["offload"] != config.offload:
        raise PlanError(f"offload {data['offload']!r} disagrees with the config's "
                        f"{config.offload!r}")


def _check_stage_ranges(stages: tuple[StageAssignment, ...]) -> None:
    """Stages numbered 0, 1, … in order, holding non-empty, contiguous layer ranges from layer
    0; the embedding on the first stage only and the head on the last only."""
    start = 0
    last = len(stages) - 1
    for i, stage in enumerate(stages):
        if stage.index != i:
            raise PlanError(f"stages[{i}].index is {stage.index}, expected {i}")
        a, b = stage.layers
        if a != start or b < a or (b == a and last > 0):
            raise PlanError(f"stages[{i}].layers is [{a}, {b}], expected [{start}, stop] with "
                            f"stop > {start} (stages hold contiguous, non-empty layer ranges "
                            "from layer 0)")
        start = b
        if stage.has_embedding != (i == 0) or stage.has_head != (i == last):
            raise PlanError(f"stages[{i}]: has_embedding={stage.has_embedding}, has_head="
                            f"{stage.has_head}; expected the embedding on stage 0 and the head "
                            f"on stage {last} only")


def _check_estimate(estimate: Any, config: ParallelConfig) -> None:
    """The prediction must be the one priced for the plan's configuration: a hand-edited
    config (a dp edit) leaves a stale ``estimate.config``, which is refused rather than
    re-priced here (``fxplan estimate --config`` prices the edited configuration)."""
    if not isinstance(estimate, Mapping):
        raise PlanError(f"estimate must be an object, got {type(estimate).__name__}")
    priced = estimate.get("config")
    if priced is None:
        return
    if not isinstance(priced, str):
        raise PlanError(f"estimate.config must be the one-line text form, got {priced!r}")
    if ParallelConfig.parse(priced) != config.replace(placements=None):
        raise PlanError(
            f"estimate.config {priced!r} is not the plan's config {config.to_string()!r}: the "
            "prediction is stale (the plan was edited after the search). Expected them equal: "
            "re-plan with `fxplan plan`, or price the edited configuration with `fxplan "
            "estimate --config`")


def _integer(value: Any, key: str) -> int:
    """``value`` if it is an integer (``bool`` and ``"4"`` are not), else a PlanError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlanError(f"{key} must be an integer, got {value!r} ({type(value).__name__})")
    return value


def _sequence(value: Any, key: str) -> list[Any]:
    if not isinstance(value, (list, tuple)):
        raise PlanError(f"{key} must be a list, got {value!r} ({type(value).__name__})")
    return list(value)


def _dataclass_from(cls: type, value: Any, key: str) -> Any:
    if not isinstance(value, Mapping):
        raise PlanError(f"{key} must be an object, got {type(value).__name__}")
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(value) - fields)
    if unknown:
        raise PlanError(f"{key} has unknown keys {unknown} (known: {sorted(fields)})")
    return cls(**value)


def _stage(value: Any, i: int) -> StageAssignment:
    key = f"stages[{i}]"
    if not isinstance(value, Mapping):
        raise PlanError(f"{key} must be an object, got {type(value).__name__}")
    for name in ("index", "layers"):
        if name not in value:
            raise PlanError(f"{key} is missing key {name!r}")
    layers = _sequence(value["layers"], f"{key}.layers")
    if len(layers) != 2:
        raise PlanError(f"{key}.layers must be [start, stop], got {layers!r}")
    unknown = sorted(set(value) - {"index", "layers", "has_embedding", "has_head"})
    if unknown:
        raise PlanError(f"{key} has unknown keys {unknown}")
    flags = {name: value.get(name, False) for name in ("has_embedding", "has_head")}
    for name, flag in flags.items():
        if not isinstance(flag, bool):
            raise PlanError(f"{key}.{name} must be true or false, got {flag!r}")
    return StageAssignment(index=_integer(value["index"], f"{key}.index"),
                           layers=(_integer(layers[0], f"{key}.layers[0]"),
                                   _integer(layers[1], f"{key}.layers[1]")), **flags)


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
