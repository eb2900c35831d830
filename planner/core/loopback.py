"""fxplan's torchrun on this machine alone: every socket on loopback.

A single-node run needs no port other machines can reach: ``fxplan launch`` (without
``--rdzv-endpoint``), the programs ``--emit`` writes and ``fxplan calibrate``'s collectives
benchmark all start :mod:`fxplan.runtime.launch.torchrun` (torchrun whose stores listen on loopback
only) with the rendezvous on ``127.0.0.1`` and gloo's and NCCL's sockets on the loopback
interface, unless the environment names another.
"""

from __future__ import annotations

import os
import random
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


#: The lowest port :func:`free_loopback_port` draws (above the registered services people run).
LOWEST_DRAWN_PORT = 20000


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range of ports for ``bind(0)`` and outgoing connections (Linux:
    ``/proc/sys/net/ipv4/ip_local_port_range``; elsewhere the IANA range 49152–65535)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as handle:
            low, high = (int(word) for word in handle.read().split())
        return low, high
    except (OSError, ValueError):
        return 49152, 65535


def free_loopback_port(rng: random.Random | None = None) -> int:
    """A port free on 127.0.0.1 now (torchrun binds it a moment later), drawn at random below
    the kernel's ephemeral range where there is room (:data:`LOWEST_DRAWN_PORT` up to it).

    A port the kernel handed out by ``bind(0)`` lies in the ephemeral range, from which it also
    takes the local port of every outgoing connection: between this check and torchrun's bind
    any process connecting anywhere may take it (``EADDRINUSE``, seen with two launches on one
    machine). A port below that range is only taken by a process that names it; drawn at random
    from the thousands there, two launches meet with a chance of about one in ten thousand.
    Falls back to ``bind(0)`` when 64 draws are all taken or the range leaves no room."""
    draw = rng or random.SystemRandom()
    low = _ephemeral_range()[0]
    for _ in range(64 if low - LOWEST_DRAWN_PORT >= 1024 else 0):
        port = draw.randrange(LOWEST_DRAWN_PORT, low)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
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
