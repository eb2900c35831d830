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

The server's imports (about 2.4 s on that machine) are the agent's critical path if it starts
with the first rank, after the agent imported torch itself (about 1.5 s) and met at the
rendezvous. :func:`start_server_early` starts it first thing in the agent instead, before the
agent imports torch, so the two import side by side; the ranks fork from that server, as from
one started later. Started early only where a fork is sure to be asked for without asking torch
(:func:`early_start_applies`: no GPU device node on the machine, ``OMP_NUM_THREADS`` already set,
so that the server's environment is the one torchrun would give it later); elsewhere it starts
with the first rank, as before. The decision to fork stays :func:`forks_workers`'s: a server
started early that it does not use does no more than import, and ends with the agent.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import runpy
import signal
import sys
from typing import Any, Callable

__all__ = ["PRELOAD", "FORK_ENV", "FORKED_MODULES", "forks_workers", "run_module",
           "forking_elastic_launch", "early_start_applies", "start_server_early", "stop_server"]

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


#: device nodes present on a machine whose torch may see a GPU (CUDA, ROCm, WSL's GPU)
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg")

#: torchrun flags that run the script other than as ``python -u -m MODULE``
_NOT_A_MODULE = frozenset({"--no-python", "--no_python", "--run-path", "--run_path"})
#: torchrun's other options that take no value (a word after one of them is the script)
_FLAGS = frozenset({"--standalone", "--virtual-local-rank", "--virtual_local_rank"})


def early_start_applies(torchrun_argv: list[str]) -> bool:
    """Whether the agent of ``torchrun TORCHRUN_ARGV`` may start its ranks' server before it
    imports torch (module docstring): the script is ``-m`` one of :data:`FORKED_MODULES` and no
    flag before it runs it otherwise, :data:`FORK_ENV` is not ``0``, the platform has a
    forkserver, no :data:`GPU_DEVICE_NODES` exists and ``OMP_NUM_THREADS`` is set.

    Read without torchrun's parser (which imports torch): an option without ``=`` is taken to
    own the word after it unless it is one of torchrun's flags. A wrong guess costs a server
    that imports and is never used; which ranks fork stays :func:`forks_workers`'s."""
    if os.environ.get(FORK_ENV, "1") == "0" or "OMP_NUM_THREADS" not in os.environ \
            or "forkserver" not in multiprocessing.get_all_start_methods() \
            or any(os.path.exists(node) for node in GPU_DEVICE_NODES):
        return False
    takes_value = False      # the word before was an option that may take this one as value
    for i, word in enumerate(torchrun_argv[:-1]):
        if word in _NOT_A_MODULE:
            return False
        if word in ("-m", "--module"):
            return torchrun_argv[i + 1] in FORKED_MODULES
        if not word.startswith("-") and not takes_value:
            return False     # the script: what follows are its own arguments
        takes_value = word.startswith("-") and "=" not in word and word not in _FLAGS
    return False


def start_server_early(torchrun_argv: list[str]) -> bool:
    """Start the forkserver with :data:`PRELOAD` now, when :func:`early_start_applies`; whether
    it was started. Call it before importing torch: the server imports while the caller does."""
    if not early_start_applies(torchrun_argv):
        return False
    from multiprocessing import forkserver

    multiprocessing.set_forkserver_preload(PRELOAD)
    forkserver.ensure_running()
    return True


def stop_server() -> None:
    """End this process's forkserver, if it started one, at once: at the agent's end, when
    every rank has ended. Left alone it would notice the agent's exit and then spend about a
    second of CPU on the interpreter's teardown (torch imported), a second that a supervised
    launch waits for (it ends the attempt's whole process group) and that every launch takes
    from what runs next. ``SIGTERM``, which the server does not handle, ends it without that
    teardown; it holds nothing to save."""
    from multiprocessing import forkserver

    pid = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):   # ended already, or reaped
        pass


def _cuda_devices() -> bool:
    """Whether this machine's ranks are CUDA ranks (asked in the agent, which forks nothing:
    the server is a fresh interpreter)."""
    import torch

    return torch.cuda.is_available()


def run_module(module: str, *argv: str) -> None:
    """``python -u -m MODULE ARGV…`` in a forked process: ``sys.argv`` and output as the command
    form has them (line-buffered, as ``-u`` leaves them), then the module run as ``__main__``
    (:func:`runpy.run_module`, what ``-m`` does), so its exit — ``raise SystemExit(main())`` in
    ``fxplan.worker`` — ends the process with the same code.

    What the rank inherits from the server (:data:`PRELOAD`'s modules, about 300 000 objects)
    is frozen first (:func:`gc.freeze`): it lives as long as the rank, and each collection —
    the interpreter's, and the worker's before its process group goes — would walk it again
    (about 0.16 s a full collection on the 2-core machine, 2026-11-28); frozen, its pages are
    not written by the collector either, and stay shared with the server."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(write_through=True, line_buffering=True)
    gc.freeze()   # the server's imports, the rank's for life: no collection walks them again
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
