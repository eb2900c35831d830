"""A process's random number generators as JSON (saved per rank in a checkpoint, no pickle).

Dropout draws from torch's CPU generator (and on GPUs from the CUDA generator of the device);
Python's ``random`` and NumPy's global generator are saved too, in case a model or hook uses
them. A checkpoint holds one ``rng/rank-R.json`` per rank; a run resumed with the same world
size restores rank R's generators exactly, so dropout masks continue as if never interrupted.
Under another world size the ranks are not the same processes (another plan splits the work
differently): the generators are left as seeded and the worker says so.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

__all__ = ["capture_rng", "restore_rng"]


def _bytes(tensor: torch.Tensor) -> str:
    return bytes(tensor.tolist()).hex()


def _tensor(text: str) -> torch.Tensor:
    return torch.tensor(list(bytes.fromhex(text)), dtype=torch.uint8)


def capture_rng(device: torch.device) -> dict[str, Any]:
    """This process's generator states, JSON-serialisable."""
    version, words, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch_cpu": _bytes(torch.get_rng_state()),
        "python": [version, list(words), gauss],
        "numpy": [kind, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)],
    }
    if device.type == "cuda":
        state["torch_cuda"] = _bytes(torch.cuda.get_rng_state(device))
    return state


def restore_rng(state: dict[str, Any], device: torch.device) -> None:
    """Set this process's generators to ``state`` (from :func:`capture_rng`)."""
    torch.set_rng_state(_tensor(state["torch_cpu"]))
    version, words, gauss = state["python"]
    random.setstate((version, tuple(words), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    if device.type == "cuda" and "torch_cuda" in state:
        torch.cuda.set_rng_state(_tensor(state["torch_cuda"]), device)
