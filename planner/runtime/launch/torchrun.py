"""``python -m fxplan.runtime.launch.torchrun ARGS``: torchrun whose TCP stores listen on loopback only.

A single-node ``fxplan launch`` needs no port reachable from other machines, yet torchrun's
c10d rendezvous store and the store it shares with the workers (``TORCHELASTIC_USE_AGENT_STORE``)
are ``TCPStore`` servers, and a ``TCPStore`` server binds its port on *every* interface
(``::``), whatever host it is given — with ``--standalone`` or ``--rdzv-endpoint=127.0.0.1:P``
alike (measured with ``/proc/net/tcp6``: two listeners on ``::``).

This module runs ``torch.distributed.run`` unchanged except that a store server whose host is
a loopback address (``127.0.0.1``, ``::1``, ``localhost``) is given a socket bound to that
address (``TCPStore(master_listen_fd=…)``), so it listens on loopback only. Stores for other
hosts (multi-node rendezvous) are untouched. Gloo's own sockets follow ``GLOO_SOCKET_IFNAME``,
which ``fxplan launch`` sets to the loopback interface for single-node runs.

The ranks of ``-m fxplan.worker`` are forked from one server that imported torch once
(:mod:`fxplan.runtime.launch.forked_workers`) rather than each started as an interpreter; run
as the agent, this module starts that server before it imports torch, so that both import at
once (:func:`~fxplan.runtime.launch.forked_workers.start_server_early`).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import sys
from typing import Any

from fxplan.runtime.launch.forked_workers import forking_elastic_launch, start_server_early
from fxplan.runtime.launch.heartbeat import STATUS_DIR_ENV
from fxplan.runtime.launch.rank_errors import FAILURE_EXIT, INPUT_ERROR_EXIT, read_failures, read_reports

if __name__ == "__main__":  # pragma: no cover - the agent: the ranks' server imports meanwhile
    start_server_early(sys.argv[1:])

import torch.distributed as dist  # noqa: E402  (after the server's start, on purpose)

__all__ = ["is_loopback", "LoopbackTCPStore", "main", "quiet_torch_logs"]

_TCPStore = dist.TCPStore


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback interface."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _bound_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    address = "127.0.0.1" if host == "localhost" else host.strip("[]")
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address, port))
    sock.listen(socket.SOMAXCONN)
    return sock


class LoopbackTCPStore(_TCPStore):  # type: ignore[misc, valid-type]
    """``TCPStore`` whose server, for a loopback host, listens on that address only."""

    def __init__(self, host_name: str, port: int, world_size: int | None = None,
                 is_master: bool = False, *args: Any, **kwargs: Any) -> None:
        if is_master and kwargs.get("master_listen_fd") is None and len(args) < 4 \
                and is_loopback(host_name):
            sock = _bound_socket(host_name, int(port))
            port = sock.getsockname()[1]
            kwargs["master_listen_fd"] = sock.detach()  # the store owns the descriptor now
        super().__init__(host_name, port, world_size, is_master, *args, **kwargs)


class _QuietOnInputError(logging.Filter):
    """Drops torchrun's failure log lines once a worker has reported an input error or a
    failure: the launcher reports it, once (:mod:`fxplan.runtime.launch.rank_errors`)."""

    def __init__(self, directory: str) -> None:
        super().__init__()
        self.directory = directory

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.WARNING or not _reported(self.directory)


def quiet_torch_logs(directory: str) -> None:
    """Filter the agent's loggers (``torch.distributed.*``, by module) and the process
    context's that stops the other workers once one has failed (``torch.multiprocessing.*``:
    "Terminating process … via signal SIGTERM") with :class:`_QuietOnInputError`."""
    quiet = _QuietOnInputError(directory)
    for name in {*logging.root.manager.loggerDict, "torch.multiprocessing.spawn"}:
        if name.startswith(("torch.distributed", "torch.multiprocessing")):
            logging.getLogger(name).addFilter(quiet)


def _reported(directory: str) -> bool:
    """A worker reported an input error or a failure (the launcher prints it)."""
    return bool(read_reports(directory) or read_failures(directory))


def main(argv: list[str] | None = None) -> None:
    """``torch.distributed.run`` with :class:`LoopbackTCPStore` in place of ``TCPStore``. Under
    ``fxplan launch`` (a status directory), a worker's input error ends torchrun with exit code
    :data:`~fxplan.runtime.launch.rank_errors.INPUT_ERROR_EXIT` and a reported failure with
    :data:`~fxplan.runtime.launch.rank_errors.FAILURE_EXIT`, neither with a traceback of its own."""
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend

    dist.TCPStore = LoopbackTCPStore  # dynamic_rendezvous looks it up as dist.TCPStore
    run.elastic_launch = forking_elastic_launch(run.elastic_launch)  # looked up by name in run.run
    c10d_rendezvous_backend.TCPStore = LoopbackTCPStore  # imported by name there
    status = os.environ.get(STATUS_DIR_ENV)
    if status:
        quiet_torch_logs(status)
    try:
        run.main(sys.argv[1:] if argv is None else argv)
    except ChildFailedError:
        if status and read_reports(status):
            raise SystemExit(INPUT_ERROR_EXIT) from None
        if status and read_failures(status):   # no error box: the launcher's paragraph
            raise SystemExit(FAILURE_EXIT) from None
        raise


if __name__ == "__main__":  # pragma: no cover
    from fxplan.core.quick_exit import exit_now
    from fxplan.runtime.launch.forked_workers import stop_server

    try:
        main()
        code: int | str | None = 0
    except SystemExit as ended:   # the agent's own exit codes, and torchrun's
        code = ended.code
    stop_server()   # every rank has ended: the server's teardown is nobody's wait
    exit_now(code)   # nor the agent's, which the launcher waits for (fxplan.core.quick_exit)
