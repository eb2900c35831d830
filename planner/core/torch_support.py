"""The torch releases fxplan runs on, checked when a command or an API entry point starts.

fxplan needs PyTorch's public DTensor (``torch.distributed.tensor``), FSDP2
(``torch.distributed.fsdp.fully_shard``), ``torch.distributed.pipelining`` with its
zero-bubble schedules, ``torch.export`` and the DTensor sharding propagator whose op
strategies the search reads. :data:`OLDEST` is the oldest release that has all of them and on
which the suite passes (CI runs the oldest and the newest of the range on CPU: ``make
test-oldest``); :data:`NEWEST` is the newest release tested. A release below the range is
refused with one paragraph; one above it runs with a warning.

Features that arrived inside the range are asked for by name with :func:`torch_has`, and the
runtime refuses a plan that needs a missing one before it starts (not with a traceback on
every rank). The version is read from the installed package's metadata, so checking it does
not import torch.
"""

from __future__ import annotations

import re
import warnings
from functools import lru_cache
from importlib import metadata

from fxplan.core.errors import UserError

__all__ = ["OLDEST", "NEWEST", "TorchVersionError", "check_torch", "installed_torch",
           "parse_version", "require", "torch_has", "FEATURES", "supported_range"]

#: The oldest supported release (major, minor). torch 2.9 lacks DTensor's single-dim op
#: strategies (``torch.distributed.tensor._ops.single_dim_strategy``) that the search reads;
#: 2.10 was not tested.
OLDEST: tuple[int, int] = (2, 11)
#: The newest release tested (major, minor); newer ones run with a warning.
NEWEST: tuple[int, int] = (2, 13)

#: Features that arrived inside the supported range: name → (module, attribute that must exist
#: in it, what needs the feature). Detected by import, not by version number.
FEATURES: dict[str, tuple[str, str, str]] = {
    "fsdp_spmd_mesh_dims": ("torch.distributed.fsdp", "DataParallelMeshDims",
                            "FSDP2's DataParallelMeshDims (expert weights sharded over the "
                            "expert-data-parallel group with ZeRO ≥ 1 beside ep > 1; torch 2.13)"),
    "pipelining_zbv": ("torch.distributed.pipelining.stage", "_StageMeta",
                       "torch.distributed.pipelining's reworked stage set-up (_StageMeta) "
                       "under which ScheduleZBVZeroBubble runs (schedule zbv; torch 2.13 — on "
                       "2.11 its stages' set-up fails on gloo ranks)"),
    "pipelining_dualpipev": ("torch.distributed.pipelining", "ScheduleDualPipeV",
                             "torch.distributed.pipelining's ScheduleDualPipeV (schedule "
                             "dualpipev; it runs on the same V stage set-up as zbv)"),
    "dtensor_view_sharding": ("torch.distributed.tensor._ops._view_ops",
                              "_ViewShardingPropagator",
                              "DTensor's view propagation that merges a sharded dimension with "
                              "its neighbours (the graph rewrite's tensor parallelism: an "
                              "attention's matmuls fold the sharded heads into the batch, "
                              "sequence parallelism the sharded tokens; torch 2.12 — 2.11's "
                              "DTensor refuses those views on every rank)"),
}


class TorchVersionError(UserError):
    """The installed torch is outside the supported range, or lacks a feature a plan needs."""


def parse_version(text: str) -> tuple[int, int, int]:
    """``"2.11.0+cu130"`` → ``(2, 11, 0)``; pre-release and local tags are dropped."""
    match = re.match(r"\s*(\d+)\.(\d+)(?:\.(\d+))?", text)
    if match is None:
        raise ValueError(f"not a torch version: {text!r}")
    return int(match[1]), int(match[2]), int(match[3] or 0)


def installed_torch() -> str | None:
    """The installed torch's version string, or ``None`` when torch is not installed."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def supported_range() -> str:
    """``"2.11 – 2.13"``."""
    return f"{OLDEST[0]}.{OLDEST[1]} – {NEWEST[0]}.{NEWEST[1]}"


def check_torch(version: str | None = None) -> str:
    """Refuse a torch below :data:`OLDEST` (:class:`TorchVersionError`), warn above
    :data:`NEWEST`; return the version checked (``version`` defaults to the installed one)."""
    text = version if version is not None else installed_torch()
    if text is None:
        raise TorchVersionError(
            f"torch is not installed: fxplan needs torch {supported_range()} (install the build "
            "for your machine from pytorch.org, then `pip install fxplan`)")
    found = parse_version(text)[:2]
    if found < OLDEST:
        raise TorchVersionError(
            f"torch {text} is too old for fxplan: it needs torch {supported_range()} (public "
            "DTensor, FSDP2's fully_shard, torch.distributed.pipelining's zero-bubble schedules "
            "and DTensor's sharding propagator as fxplan uses them). Upgrade torch, e.g. "
            f"`pip install 'torch>={OLDEST[0]}.{OLDEST[1]}'` with the index URL of your CUDA "
            "or ROCm build")
    if found > NEWEST:
        _warn_newer(text)
    return text


@lru_cache(maxsize=None)
def _warn_newer(text: str) -> None:
    warnings.warn(f"torch {text} is newer than the newest release fxplan was tested with "
                  f"({NEWEST[0]}.{NEWEST[1]}); report what breaks", stacklevel=3)


@lru_cache(maxsize=None)
def torch_has(feature: str) -> bool:
    """Whether the installed torch has ``feature`` (a key of :data:`FEATURES`; imports torch)."""
    import importlib

    module, attribute, _ = FEATURES[feature]
    try:
        return hasattr(importlib.import_module(module), attribute)
    except ImportError:
        return False


def require(feature: str, what: str) -> None:
    """:class:`TorchVersionError` naming ``what`` when the installed torch lacks ``feature``."""
    if not torch_has(feature):
        raise TorchVersionError(
            f"{what} needs {FEATURES[feature][2]}, which this torch ({installed_torch()}) does "
            "not have. Upgrade torch, or choose a plan without it (the search's --constrain)")
