"""The Plan: everything the search decided, as a frozen value with a versioned JSON form.

A plan fixes

* the device mesh ``pp × dp × tp`` (``mesh_axes``/``mesh_shape``) and the cluster link level
  each axis runs over (``axis_levels``), ranks laid out row-major with ``tp`` fastest;
* the pipeline: ``stages`` (repeated-block ranges ``[start, stop)`` per stage, the embedding on
  the first and the head on the last), the ``schedule`` (``gpipe``, ``1f1b``,
  ``interleaved:v``) and microbatching (``microbatch_size × num_microbatches`` per data-parallel
  replica, so ``batch = dp · microbatch_size · num_microbatches``);
* data parallelism with ``zero_stage`` 0–3, ``recompute`` per repeated block
  (``none``/``selective``/``full``) and ``sequence_parallel``;
* placements: per fx node (its output) and per parameter, as compact strings over the
  stage-local ``placement_axes`` (``("dp", "tp")`` by default), e.g. ``"S(0)S(1)"``, and in
  ``input_placements`` (keys ``consumer<producer``) what a consumer needs where it differs
  from its producer's output — the reshards the step time priced;
* the predicted ``estimate`` (step time and breakdown, MFU, per-stage peak memory), the
  solver's status, search time and its per-phase ``timings``, runners-up, pruning reasons
  and fallbacks.

``to_json``/``from_json`` carry ``format_version`` and the fingerprints of the captured graph and
of the cluster; :func:`load_plan` refuses a plan made for another graph or cluster and says which.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from fxplan.core.errors import UserError

PLAN_FORMAT_VERSION = 1
SCHEDULES = ("gpipe", "1f1b")  # plus "interleaved:v" with integer v ≥ 2
RECOMPUTE_POLICIES = ("none", "selective", "full")


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


@dataclass(frozen=True)
class Plan:
    model: str
    cluster: str
    graph_fingerprint: str
    cluster_fingerprint: str
    batch: int
    seq: int | None
    mesh_shape: tuple[int, ...]
    mesh_axes: tuple[str, ...] = ("pp", "dp", "tp")
    axis_levels: tuple[str, ...] = ()
    stages: tuple[StageAssignment, ...] = ()
    schedule: str = "1f1b"
    microbatch_size: int = 1
    num_microbatches: int = 1
    zero_stage: int = 0
    recompute: tuple[str, ...] = ()
    sequence_parallel: bool = False
    placement_axes: tuple[str, ...] = ("dp", "tp")
    node_placements: Mapping[str, str] = field(default_factory=dict)
    param_placements: Mapping[str, str] = field(default_factory=dict)
    input_placements: Mapping[str, str] = field(default_factory=dict)
    estimate: Mapping[str, Any] = field(default_factory=dict)
    solver: SolverInfo = SolverInfo()
    search_time_s: float = 0.0
    runners_up: tuple[Mapping[str, Any], ...] = ()
    pruned: tuple[str, ...] = ()
    fallbacks: tuple[str, ...] = ()
    timings: Mapping[str, float] = field(default_factory=dict)
    fxplan_version: str = "0.1.0"

    def __post_init__(self) -> None:
        if len(self.mesh_shape) != len(self.mesh_axes):
            raise PlanError(
                f"mesh_shape {self.mesh_shape} has {len(self.mesh_shape)} axes but mesh_axes "
                f"{self.mesh_axes} names {len(self.mesh_axes)}"
            )
        for axis in ("pp", "dp", "tp"):
            if axis not in self.mesh_axes:
                raise PlanError(f"mesh_axes {self.mesh_axes} must include {axis!r}")
        if self.zero_stage not in (0, 1, 2, 3):
            raise PlanError(f"zero_stage must be 0, 1, 2 or 3, got {self.zero_stage}")
        _check_schedule(self.schedule)
        for policy in self.recompute:
            if policy not in RECOMPUTE_POLICIES:
                raise PlanError(f"recompute policy {policy!r} is not one of {RECOMPUTE_POLICIES}")
        expected = self.dp * self.microbatch_size * self.num_microbatches
        if self.batch != expected:
            raise PlanError(
                f"batch {self.batch} ≠ dp·microbatch_size·num_microbatches = "
                f"{self.dp}·{self.microbatch_size}·{self.num_microbatches} = {expected}"
            )
        if self.stages:
            per_rank = self.virtual_stages
            if len(self.stages) != self.pp * per_rank:
                raise PlanError(
                    f"{len(self.stages)} stages given but pp·v = {self.pp}·{per_rank} = "
                    f"{self.pp * per_rank} expected for schedule {self.schedule!r}"
                )

    # -- degrees and summary ------------------------------------------------------------
    def priced_config(self) -> Any:
        """The :class:`cost_model.ParallelConfig` whose estimate is this plan's step time: the
        estimated configuration, with the plan's own placements when the step time priced
        them (``estimate["layout"] == "intra-op"``), else the default Megatron layout."""
        from fxplan.core.config import ParallelConfig
        from fxplan.inter_op.placements import priced_map

        config = ParallelConfig.parse(self.estimate["config"])
        if self.estimate.get("layout") != "intra-op":
            return config
        return config.replace(placements=priced_map(self.node_placements, self.input_placements,
                                                    self.param_placements))

    def degree(self, axis: str) -> int:
        return self.mesh_shape[self.mesh_axes.index(axis)]

    @property
    def dp(self) -> int:
        return self.degree("dp")

    @property
    def tp(self) -> int:
        return self.degree("tp")

    @property
    def pp(self) -> int:
        return self.degree("pp")

    @property
    def world_size(self) -> int:
        return math.prod(self.mesh_shape)

    @property
    def degrees(self) -> dict[str, int]:
        return {axis: n for axis, n in zip(self.mesh_axes, self.mesh_shape)}

    @property
    def virtual_stages(self) -> int:
        """``v`` of ``interleaved:v``; 1 otherwise."""
        return int(self.schedule.split(":")[1]) if self.schedule.startswith("interleaved:") else 1

    @property
    def recompute_summary(self) -> str:
        policies = set(self.recompute) or {"none"}
        return policies.pop() if len(policies) == 1 else "mixed"

    @property
    def summary(self) -> str:
        """``pp=8 dp=24 tp=8 | zero=1 | interleaved:2 mb=1×96 | recompute=selective | sp=on``."""
        mesh = " ".join(f"{a}={n}" for a, n in zip(self.mesh_axes, self.mesh_shape))
        return (
            f"{mesh} | zero={self.zero_stage} | {self.schedule} "
            f"mb={self.microbatch_size}×{self.num_microbatches} | "
            f"recompute={self.recompute_summary} | sp={'on' if self.sequence_parallel else 'off'}"
        )

    def __str__(self) -> str:
        return self.summary

    # -- JSON ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["format_version"] = PLAN_FORMAT_VERSION
        data["summary"] = self.summary
        data["degrees"] = self.degrees
        return data

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False, default=_json_default)

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
        names = {f.name for f in dataclasses.fields(cls)}
        missing = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING and f.name not in data]
        if missing:
            raise PlanError(f"{source}: plan is missing required keys {missing}")
        kwargs = {k: v for k, v in data.items() if k in names}
        key: str | None = None
        try:
            for key in _INT_FIELDS:
                if key in kwargs and not (key == "seq" and kwargs[key] is None):
                    kwargs[key] = _integer(kwargs[key], key)
            for key in ("mesh_shape", "mesh_axes", "axis_levels", "recompute", "placement_axes",
                        "pruned", "fallbacks", "runners_up"):
                if key in kwargs:
                    kwargs[key] = tuple(_sequence(kwargs[key], key))
            key = "mesh_shape"
            kwargs[key] = tuple(_integer(n, f"{key}[{i}]") for i, n in enumerate(kwargs[key]))
            key = "stages"
            kwargs[key] = tuple(_stage(s, i) for i, s in enumerate(_sequence(kwargs.get(key, ()),
                                                                                key)))
            key = "solver"
            if key in kwargs:
                kwargs[key] = _dataclass_from(SolverInfo, kwargs[key], key)
            key = None
            return cls(**kwargs)
        except PlanError as err:
            raise PlanError(f"{source}: {err}") from err
        except (TypeError, KeyError, ValueError, AttributeError) as err:
            where = f", key {key!r}" if key else ""
            raise PlanError(f"{source}: malformed plan{where}: {type(err).__name__}: {err}"
                            ) from err

    @classmethod
    def from_json(cls, text: str, *, source: str = "plan") -> "Plan":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise PlanError(f"{source}: not a JSON plan file: {err}") from err
        if not isinstance(data, dict):
            raise PlanError(f"{source}: expected a JSON object, found {type(data).__name__}")
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


_INT_FIELDS = ("batch", "seq", "microbatch_size", "num_microbatches", "zero_stage")


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
    return StageAssignment(index=_integer(value["index"], f"{key}.index"),
                           layers=(_integer(layers[0], f"{key}.layers[0]"),
                                   _integer(layers[1], f"{key}.layers[1]")),
                           has_embedding=bool(value.get("has_embedding", False)),
                           has_head=bool(value.get("has_head", False)))


def _check_schedule(schedule: str) -> None:
    if schedule in SCHEDULES:
        return
    if schedule.startswith("interleaved:"):
        tail = schedule.split(":", 1)[1]
        if tail.isdigit() and int(tail) >= 2:
            return
    raise PlanError(
        f"schedule {schedule!r} is not one of gpipe, 1f1b, interleaved:v (v an integer ≥ 2)"
    )


def _json_default(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    raise TypeError(f"cannot write {type(value).__name__} into a plan file")


def load_plan(path: str | Path, *, graph_fingerprint: str | None = None,
              cluster_fingerprint: str | None = None) -> Plan:
    """Read a plan file; with fingerprints given, refuse a plan for another graph/cluster."""
    path = Path(path)
    if not path.exists():
        raise PlanError(f"plan file {path} does not exist")
    plan = Plan.from_json(path.read_text(), source=str(path))
    plan.check_matches(graph_fingerprint=graph_fingerprint,
                       cluster_fingerprint=cluster_fingerprint, source=str(path))
    return plan
