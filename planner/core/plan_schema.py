"""Reading a plan file's JSON object (format :data:`~fxplan.core.plan_parts.
PLAN_FORMAT_VERSION`) back into the fields of a :class:`~fxplan.core.plan.Plan`, with every
check a hand-edited or foreign file needs.

The object has required keys (:data:`REQUIRED`), optional ones (:data:`OPTIONAL`) and keys
derived from ``config`` (:data:`DERIVED`: written for readers, checked on load, never trusted).
Any other key, a wrong type (``"4"`` or ``true`` for an integer), a derived key that disagrees
with the config (``mesh_shape ≠ (pp, dp, tp)``, ``degrees``, ``cp_attention``, ``offload``) or an
``estimate.config`` that is not the plan's config (a stale prediction), or a number of the
estimate that is not finite (JSON's ``NaN``/``Infinity``), is a
:class:`~fxplan.core.plan_parts.PlanError` naming the file and key. The plan's own invariants
(``batch = (dp/cp) · microbatch_size · num_microbatches``, stage ranges, …) are checked by the
Plan itself when :func:`plan_from_dict` builds it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, TypeVar

from fxplan.core.bounds import BoundsError
from fxplan.core.config import ParallelConfig
from fxplan.core.config_fields import CP_ATTENTION
from fxplan.core.placements import PlacementMap
from fxplan.core.plan_parts import (MESH_AXES, PLAN_FORMAT_VERSION, PlanError, SolverInfo,
                                    StageAssignment)

__all__ = ["DERIVED", "OPTIONAL", "REQUIRED", "extra_degrees", "plan_from_dict"]

T = TypeVar("T")

#: JSON keys a plan file must have, those it may have, and those derived from ``config``.
REQUIRED = ("model", "cluster", "graph_fingerprint", "cluster_fingerprint", "batch", "seq",
            "config")
OPTIONAL = ("placements", "block_recompute", "axis_levels", "stages", "estimate", "solver",
            "search_time_s", "runners_up", "pruned", "pruned_detail", "fallbacks", "timings",
            "fxplan_version")
DERIVED = ("format_version", "summary", "degrees", "cp_attention", "offload", "mesh_shape",
           "mesh_axes")


def extra_degrees(config: ParallelConfig) -> dict[str, int]:
    """``{"cp", "ep"}``: the context- and expert-parallel degrees (1 when unused)."""
    return {"cp": config.cp, "ep": config.ep}


def plan_from_dict(make: Callable[..., T], data: Mapping[str, Any], source: str) -> T:
    """``make(**fields)`` (the Plan class) of the plan file's object ``data`` read from ``source``
    (module docstring); every error, the Plan's own included, is a PlanError naming
    ``source``."""
    version = data.get("format_version")
    if version != PLAN_FORMAT_VERSION:
        raise PlanError(
            f"{source}: plan format_version {version!r} is not supported; this fxplan reads "
            f"format_version {PLAN_FORMAT_VERSION} (re-run `fxplan plan` to make a new one)"
        )
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise PlanError(f"{source}: plan is missing required keys {missing}")
    unknown = sorted(set(data) - set(REQUIRED) - set(OPTIONAL) - set(DERIVED))
    if unknown:
        raise PlanError(f"{source}: plan has unknown keys {unknown}")
    key: str | None = None
    try:
        kwargs: dict[str, Any] = {k: data[k] for k in REQUIRED + OPTIONAL if k in data}
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
        return make(**kwargs)
    except (PlanError, BoundsError) as err:
        raise PlanError(f"{source}: {err}") from err
    except (TypeError, KeyError, ValueError, AttributeError) as err:
        where = f", key {key!r}" if key else ""
        raise PlanError(f"{source}: malformed plan{where}: {type(err).__name__}: {err}"
                        ) from err


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
            degrees = {**extra_degrees(ParallelConfig()), **degrees}
        want = {**want, **extra_degrees(config)}
        if degrees != want:
            raise PlanError(f"degrees {data['degrees']} disagree with the config's {want}")
    if "cp_attention" in data and data["cp_attention"] != (CP_ATTENTION if config.cp > 1
                                                            else None):
        raise PlanError(f"cp_attention {data['cp_attention']!r}: this version runs context "
                        f"parallelism as {CP_ATTENTION!r} (cp > 1 only)")
    if "offload" in data and data["offload"] != config.offload:
        raise PlanError(f"offload {data['offload']!r} disagrees with the config's "
                        f"{config.offload!r}")


def _check_estimate(estimate: Any, config: ParallelConfig) -> None:
    """The prediction must be the one priced for the plan's configuration: a hand-edited
    config (a dp edit) leaves a stale ``estimate.config``, which is refused rather than
    re-priced here (``fxplan estimate --config`` prices the edited configuration)."""
    if not isinstance(estimate, Mapping):
        raise PlanError(f"estimate must be an object, got {type(estimate).__name__}")
    for key, value in _numbers(estimate, "estimate"):
        if not math.isfinite(value):
            raise PlanError(f"{key} is {value}: a prediction is finite numbers (JSON's NaN and "
                            "Infinity are not); re-plan with `fxplan plan`")
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


def _numbers(value: Any, key: str) -> list[tuple[str, float]]:
    """Every float inside ``value`` (objects and lists, recursively) with its key path."""
    if isinstance(value, float):
        return [(key, value)]
    if isinstance(value, Mapping):
        return [found for k, v in value.items() for found in _numbers(v, f"{key}.{k}")]
    if isinstance(value, (list, tuple)):
        return [found for i, v in enumerate(value) for found in _numbers(v, f"{key}[{i}]")]
    return []


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
