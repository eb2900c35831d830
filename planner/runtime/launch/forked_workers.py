"""Ranks forked from one process that imported torch once, instead of one interpreter each.

``torchrun -m fxplan.worker`` starts every rank as ``python -u -m fxplan.worker …``: each
interpreter imports torch, ``torch.distributed.tensor``, ``torch.distributed.pipelining`` (and
with them dynamo and sympy) and fxplan's runtime before its first step — profiled on a 2-core
machine (2026-11-28, a 4-rank launch of 4 steps), more than half of each rank's 12.5 s went to
imports (5.0 s to ``import torch`` alone), four ranks over, against a training loop of a few
seconds; and a restarted or resized job pays it again.

Under ``python -m fxplan.runtime.launch.torchrun`` (what ``fxplan launch`` runs) the agent
instead starts the ranks with multiprocessing's *forkserver*: a server process, started once
per agent from a clean interpreter (no threads, no CUDA context), imports :data:`PRELOAD`, and
each rank is a ``fork`` of it running :func:`run_module` — ``fxplan.worker`` as ``-m`` runs it,
with the same arguments, the same environment (torchrun's per-rank variables are set before the
call) and unbuffered output, as ``-u`` gives. The rendezvous, the agent's monitoring, its
restarts and the exit codes are torchrun's own: torchrun's function entry point (its
``--run-path`` path) instead of its command entry point.

Only CPU ranks are forked: where torch sees a CUDA device the ranks start as their own
interpreters, as torchrun starts them. A preloaded module that asks for the device count
initialises the CUDA driver in the server, which no forked child may inherit (torch's "Cannot
re-initialize CUDA in forked subprocess"); and the import time forking saves is spread over a
GPU node's many cores, while CPU ranks share the cores they import on.

What differs from the command form: a rank's parent is the server, not the agent (the server
ends when the agent does, and a rank dies with its parent: :mod:`~fxplan.runtime.launch.
parent_death`); the ranks share the agent's process group rather than a session each. Set
``FXPLAN_FORK_WORKERS=0`` to start every rank as its own interpreter; a command other than
``-m fxplan.worker`` or ``fxplan calibrate``'s worker (:data:`FORKED_MODULES`), ``--no-python``
or ``--run-path`` is started as torchrun starts it.
"""

from __future__ import annotations

import multiprocessing
import os
import runpy
import sys
from typing import Any, Callable

__all__ = ["PRELOAD", "FORK_ENV", "FORKED_MODULES", "forks_workers", "run_module",
           "forking_elastic_launch"]

#: what the server imports before it forks a rank: everything a rank imports before its first
#: step, whatever the plan (a module that fails to import is skipped by multiprocessing) — but
#: not the rank's own module (:data:`FORKED_MODULES`), which runs as ``__main__`` as under
#: ``-m`` (found in ``sys.modules`` beforehand, runpy would warn on every rank)
PRELOAD = ["torch", "torch.distributed", "torch.distributed.tensor",
           "torch.distributed.pipelining", "torch.distributed.fsdp",
           "torch.distributed.checkpoint", "fxplan.rank.args", "fxplan.rank.prepare",
           "fxplan.rank.resume", "fxplan.rank.run_report", "fxplan.rank.steps",
           "fxplan.runtime.apply.graph", "fxplan.runtime.apply.module",
           "fxplan.runtime.train.pipeline", "fxplan.runtime.train.trainer"]

#: ``0`` starts each rank as its own interpreter (torchrun's command form)
FORK_ENV = "FXPLAN_FORK_WORKERS"

#: the modules whose ranks are forked: a launch's and ``fxplan calibrate``'s (whose memory
#: baseline is then measured as a launch's ranks have it)
FORKED_MODULES = frozenset({"fxplan.worker", "fxplan.calibration.collectives_worker"})


def forks_workers(entrypoint: Callable[..., Any] | str, args: tuple[str, ...]) -> bool:
    """Whether the ranks of ``entrypoint args`` are forked: the entry point is this Python
    running ``-u -m`` one of :data:`FORKED_MODULES`, the platform has a forkserver,
    :data:`FORK_ENV` is not ``0`` and the ranks are CPU ranks (the module docstring)."""
    return (entrypoint == sys.executable and tuple(args[:2]) == ("-u", "-m")
            and len(args) > 2 and args[2] in FORKED_MODULES
            and os.environ.get(FORK_ENV, "1") != "0"
            and "forkserver" in multiprocessing.get_all_start_methods()
            and not _cuda_devices())


def _cuda_devices() -> bool:
    """Whether this machine's ranks are CUDA ranks (asked in the agent, which forks nothing:
    the server is a fresh interpreter)."""
    import torch

    return torch.cuda.is_available()


def run_module(module: str, *argv: str) -> None:
    """``python -u -m MODULE ARGV…`` in a forked process: ``sys.argv`` and output as the command
    form has them (line-buffered, as ``-u`` leaves them), then the module run as ``__main__``
    (:func:`runpy.run_module`, what ``-m`` does), so its exit — ``raise SystemExit(main())`` in
    ``fxplan.worker`` — ends the process with the same code."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(write_through=True, line_buffering=True)
    sys.argv = [module, *argv]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def forking_elastic_launch(elastic_launch: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.distributed.launcher.api.elastic_launch`` with the ranks of ``-m fxplan.worker``
    forked from a server that imported :data:`PRELOAD` (:func:`forks_workers`), other entry
    points unchanged."""

    def launch(config: Any, entrypoint: Callable[..., Any] | str) -> Callable[..., Any]:
        def call(*args: str) -> Any:
            if not forks_workers(entrypoint, args):
                return elastic_launch(config=config, entrypoint=entrypoint)(*args)
            multiprocessing.set_forkserver_preload(PRELOAD)
            config.start_method = "forkserver"
            return elastic_launch(config=config, entrypoint=run_module)(*args[2:])

        return call

    return launch
