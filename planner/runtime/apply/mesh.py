"""The plan's device mesh as a :class:`torch.distributed.device_mesh.DeviceMesh`.

The plan's mesh is ``pp × dp × tp`` over ranks ``r_0 … r_{N-1}`` laid out row-major, ``tp``
fastest, so the rank at coordinate ``(p, d, t)`` is ``r[(p·dp + d)·tp + t]``. By default the
ranks are ``0 … N-1`` of the default process group; a test harness may pass a subset (a 2-rank
plan on ranks 0, 1 of a 4-rank pool). Creating process groups is collective over the *whole*
default group, so every process calls :func:`build_mesh`, members or not; non-members get
``None`` from :func:`mesh_coordinate`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.plan import Plan

__all__ = ["build_mesh", "device_type", "gather_merged", "mesh_coordinate", "rank_at"]


def device_type() -> str:
    """``cuda`` when this process has a GPU (nccl), else ``cpu`` (gloo)."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def build_mesh(plan: "Plan", ranks: Sequence[int] | None = None) -> DeviceMesh:
    """The ``mesh_axes``-named mesh of ``plan.mesh_shape`` over ``ranks`` (default all)."""
    world = dist.get_world_size()
    ranks = list(range(plan.world_size)) if ranks is None else list(ranks)
    if len(ranks) != plan.world_size:
        raise ValueError(
            f"plan needs pp·dp·tp = {plan.pp}·{plan.dp}·{plan.tp} = {plan.world_size} ranks, "
            f"{len(ranks)} given"
        )
    if max(ranks) >= world:
        raise ValueError(f"mesh rank {max(ranks)} ≥ world size {world}")
    layout = torch.tensor(ranks, dtype=torch.int).reshape(plan.mesh_shape)
    return DeviceMesh(device_type(), layout, mesh_dim_names=plan.mesh_axes)


def mesh_coordinate(mesh: DeviceMesh) -> dict[str, int] | None:
    """This process's coordinate on each named axis, or ``None`` if it is not in the mesh."""
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        return None
    return dict(zip(mesh.mesh_dim_names or (), coordinate))


def rank_at(mesh: DeviceMesh, **coordinate: int) -> int:
    """Global rank at a full coordinate, e.g. ``rank_at(mesh, pp=1, dp=0, tp=1)``."""
    index = tuple(coordinate[name] for name in mesh.mesh_dim_names or ())
    return int(mesh.mesh[index].item())


def gather_merged(local: dict[str, Any], group: dist.ProcessGroup) -> dict[str, Any]:
    """The union of every rank's ``local`` dict (first rank wins on a shared key); collective."""
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, local, group=group)
    merged: dict[str, Any] = {}
    for part in gathered:
        for key, value in part.items():
            merged.setdefault(key, value)
    return merged
