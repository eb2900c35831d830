"""Training checkpoints: everything a run needs to go on at exactly the next sample.

``save_training_checkpoint`` writes, collectively over the plan's ranks, one directory::

    step-N/.metadata, __R_0.distcp …   DCP: parameters and optimizer state (any plan can load)
    step-N/train_state.json            :class:`TrainPosition`: step, seed, data identity,
                                       global batch, next global sample, optimizer, plan
    step-N/rng/rank-R.json             rank R's generators (:mod:`fxplan.runtime.checkpoint.rng_state`)
    step-N/fxplan-manifest.json        written last (:mod:`fxplan.runtime.checkpoint.manifest`)

The learning-rate schedule is a pure function of the step and the run's settings (warm-up +
cosine to ``--steps``), so its state *is* the step; the data order is a pure function of
``(seed, step, global sample)``, so the step and the seed give the data position (the next
global sample ``step·B`` is stored too, with the data source's identity, to be checked).

Saving is atomic (staging directory, barrier, manifest, rename; see ``ckpt_manifest``).
Loading verifies the manifest on the group's first rank before DCP unpickles anything.

The manifest also records ``model_fingerprint`` (:func:`model_fingerprint`: the sha256 of the
model's state-dict names and shapes, what a load must find) and ``plan_fingerprint`` (the plan
it was saved under), so that ``fxplan launch --resume`` refuses another model's checkpoint
before any worker starts (:func:`fxplan.runtime.checkpoint.manifest.check_model`). A write that fails
for lack of room or permission (``ENOSPC``, ``EDQUOT``, ``EFBIG``, ``EROFS``, ``EACCES``) is a
:class:`CheckpointError` naming the checkpoint's directory and the cause.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from fxplan.runtime.checkpoint.manifest import (CheckpointError, commit_checkpoint, read_json_file,
                                          resolve_checkpoint, staging_dir)
from fxplan.runtime.checkpoint.rng_state import capture_rng, restore_rng

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.runtime.apply.sharded_module import ShardedModule

__all__ = ["TrainPosition", "save_training_checkpoint", "locate_checkpoint",
           "load_training_checkpoint", "data_identity", "model_fingerprint", "plan_fingerprint"]

TRAIN_STATE = "train_state.json"


@dataclass(frozen=True)
class TrainPosition:
    """Where a run stands after ``step`` updates (``train_state.json``)."""

    step: int
    seed: int
    global_batch: int
    data: dict[str, Any]
    optimizer: str
    world_size: int
    plan: str

    @property
    def next_sample(self) -> int:
        """The global index of the first sample the next step reads."""
        return self.step * self.global_batch

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "next_sample": self.next_sample}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainPosition":
        names = {f.name for f in dataclasses.fields(cls)}
        missing = names - set(data)
        if missing:
            raise CheckpointError(f"{TRAIN_STATE} lacks {', '.join(sorted(missing))}")
        return cls(**{k: data[k] for k in names})


def data_identity(spec: str) -> dict[str, Any]:
    """What identifies the ``--data`` source: the spec, and a file's absolute path and size."""
    hook = spec.rpartition(":")[0]
    path = hook if hook.endswith(".py") else spec
    if spec != "synthetic" and os.path.isfile(path):
        return {"spec": spec, "path": os.path.abspath(path), "bytes": os.path.getsize(path)}
    return {"spec": spec}


def model_fingerprint(module: torch.nn.Module) -> str:
    """sha256 of ``name shape`` of every state-dict entry of ``module`` (parameters and
    persistent buffers) in order: equal exactly when a checkpoint of one loads into the other
    by name and shape. Dtypes are left out (checkpoints hold fp32 master weights whatever the
    compute dtype); works on a module built on ``meta``."""
    digest = hashlib.sha256()
    for name, value in module.state_dict(keep_vars=True).items():
        digest.update(f"{name} {tuple(value.shape)}\n".encode())
    return digest.hexdigest()


def plan_fingerprint(plan_dict: dict[str, Any]) -> str:
    """sha256 of a plan's JSON (sorted keys)."""
    return hashlib.sha256(json.dumps(plan_dict, sort_keys=True).encode()).hexdigest()


#: Causes of a failed write that a retry would meet again.
NO_ROOM = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
           errno.EFBIG: "file too large for the file system or the process's file size limit",
           errno.EROFS: "read-only file system", errno.EACCES: "permission denied"}


def _no_room(err: BaseException) -> OSError | None:
    """The :data:`NO_ROOM` ``OSError`` behind ``err`` (its causes, contexts, and the per-rank
    failures of DCP's ``CheckpointException``), else ``None``."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [err]
    while todo:
        item = todo.pop()
        if item is None or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, OSError) and item.errno in NO_ROOM:
            return item
        todo += [item.__cause__, item.__context__]
        failures = getattr(item, "failures", None)  # DCP: rank → (exception, traceback)
        if isinstance(failures, dict):
            for failure in failures.values():
                first = failure[0] if isinstance(failure, tuple) and failure else failure
                todo.append(first if isinstance(first, BaseException) else None)
        todo += [a for a in getattr(item, "args", ()) if isinstance(a, BaseException)]
    return None


def _first_rank(group: dist.ProcessGroup | None) -> int:
    return dist.get_global_rank(group, 0) if group is not None else 0


def _from_first(value: Any, group: dist.ProcessGroup | None) -> Any:
    """``value`` as the group's first rank has it (collective)."""
    box = [value]
    dist.broadcast_object_list(box, src=_first_rank(group), group=group)
    return box[0]


def save_training_checkpoint(sharded: "ShardedModule", optimizer: torch.optim.Optimizer,
                             position: TrainPosition, final: str | Path, *,
                             latest: bool = True, model: tuple[str, str] | None = None) -> Path:
    """Write the checkpoint of ``position`` to ``final`` atomically (collective over the plan's
    ranks; module docstring). Every rank returns ``final`` once it is committed. ``model``:
    ``(spec, fingerprint)`` of the model run (:func:`model_fingerprint` of it as built), written
    to the manifest as ``model`` and ``model_fingerprint`` with the plan's fingerprint."""
    group, final = sharded.group, Path(final)
    first = dist.get_rank(group) == 0
    token = _from_first(uuid.uuid4().hex[:12] if first else None, group)
    staging = staging_dir(final, token)
    try:
        if first:
            (staging / "rng").mkdir(parents=True, exist_ok=False)
        dist.barrier(group=group)
        sharded.save(str(staging), optimizer)
        rank = dist.get_rank(group)
        (staging / "rng" / f"rank-{rank}.json").write_text(json.dumps(capture_rng(sharded.device)))
        if first:
            (staging / TRAIN_STATE).write_text(json.dumps(position.to_dict(), indent=1) + "\n")
    except BaseException as err:  # DCP's CheckpointException is a BaseException
        if isinstance(err, (KeyboardInterrupt, SystemExit)):
            raise
        cause = _no_room(err)
        if cause is None:
            raise
        raise CheckpointError(
            f"checkpoint {final}: writing it failed: {NO_ROOM[cause.errno]} "
            f"({cause.filename or staging}); free space or give a --run-dir on a file system "
            f"with room (a checkpoint needs about the size of the model and its optimizer "
            f"state); {staging} is left incomplete and is never resumed from") from None
    dist.barrier(group=group)
    error = None
    if first:
        info = {"step": position.step, "world_size": position.world_size,
                "plan": position.plan, "ranks_with_rng": dist.get_world_size(group)}
        plan = getattr(sharded, "plan", None)
        if plan is not None and hasattr(plan, "to_dict"):
            info["plan_fingerprint"] = plan_fingerprint(plan.to_dict())
        if model is not None:
            info.update(model=model[0], model_fingerprint=model[1])
        try:
            commit_checkpoint(staging, final, info, latest=latest)
        except (OSError, CheckpointError) as err:
            error = f"checkpoint {final}: commit failed ({err}); {staging} is left incomplete"
    error = _from_first(error, group)
    if error:
        raise CheckpointError(error)
    return final


def locate_checkpoint(path: str | Path, group: dist.ProcessGroup | None = None
                      ) -> tuple[Path, dict[str, Any]]:
    """The checkpoint ``--resume path`` names and its manifest, verified by the group's first
    rank (hashes every file) before anything is unpickled; collective. Every rank raises the
    same :class:`CheckpointError` when it is refused."""
    result: Any = None
    if dist.get_rank(group) == 0:
        try:
            found, manifest = resolve_checkpoint(path)
            result = (str(found), manifest)
        except CheckpointError as err:
            result = str(err)
    result = _from_first(result, group)
    if isinstance(result, str):
        raise CheckpointError(result)
    return Path(result[0]), result[1]


def load_training_checkpoint(sharded: "ShardedModule", optimizer: torch.optim.Optimizer,
                             directory: Path, manifest: dict[str, Any]
                             ) -> tuple[TrainPosition, list[str]]:
    """Parameters, optimizer state and this rank's generators from a checkpoint that
    :func:`locate_checkpoint` verified; returns its position and lines to report (RNG not
    restorable under another world size)."""
    sharded.load(str(directory), optimizer)
    position = TrainPosition.from_dict(read_json_file(directory, TRAIN_STATE))
    notes = []
    ranks = dist.get_world_size(sharded.group)
    if manifest.get("ranks_with_rng") == ranks:
        rank = dist.get_rank(sharded.group)
        restore_rng(read_json_file(directory, f"rng/rank-{rank}.json"), sharded.device)
    else:
        notes.append(f"random generators not restored: the checkpoint was saved by "
                     f"{manifest.get('ranks_with_rng')} ranks and this run has {ranks}, so no "
                     "rank is the same process; dropout masks differ from an uninterrupted run")
    return position, notes
