"""fxplan's torchrun on this machine alone: every socket on loopback.

A single-node run needs no port other machines can reach: ``fxplan launch`` (without
``--rdzv-endpoint``), the programs ``--emit`` writes and ``fxplan calibrate``'s collectives
benchmark all start :mod:`fxplan.runtime.launch.torchrun` (torchrun whose stores listen on loopback
only) with the rendezvous on ``127.0.0.1`` and gloo's and NCCL's sockets on the loopback
interface, unless the environment names another.
"""

from __future__ import annotations

import os
import socket
import sys

from fxplan.core.errors import UserError

__all__ = ["LoopbackError", "free_loopback_port", "loopback_interface", "loopback_torchrun"]

#: The environment variables that bind the collectives' sockets to an interface.
SOCKET_IFNAME_ENV: tuple[str, ...] = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


class LoopbackError(UserError):
    """This machine has no loopback interface to bind a single-node run to."""


def loopback_interface() -> str:
    """The name of the loopback network interface (``lo`` on Linux, ``lo0`` on macOS)."""
    names = [name for _, name in socket.if_nameindex()]
    for name in ("lo", "lo0"):
        if name in names:
            return name
    raise LoopbackError(f"no loopback interface among {names}: a single-node launch binds its "
                        "sockets to loopback; give --rdzv-endpoint HOST:PORT to use another")


def free_loopback_port() -> int:
    """A port free on 127.0.0.1 now (torchrun binds it a moment later)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def loopback_torchrun(nproc: int, nodes_flag: str = "--nnodes=1") -> tuple[dict[str, str],
                                                                          list[str]]:
    """``(environment to add, argv)`` of :mod:`fxplan.runtime.launch.torchrun` starting ``nproc``
    local ranks, rendezvous on a free loopback port; the argv ends before the worker's module
    or script. ``nodes_flag``: torchrun's ``--nnodes`` (an elastic range under
    ``fxplan launch --elastic``). The environment binds the sockets of gloo and NCCL to
    loopback where this process's environment does not bind them already."""
    env = {key: loopback_interface() for key in SOCKET_IFNAME_ENV if key not in os.environ}
    argv = [sys.executable, "-m", "fxplan.runtime.launch.torchrun", nodes_flag,
            f"--nproc-per-node={nproc}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{free_loopback_port()}", "--local-addr=127.0.0.1"]
    return env, argv
