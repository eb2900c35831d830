"""``fxplan.core.loopback``: the one spelling of fxplan's single-machine torchrun, shared by
``fxplan launch``, ``fxplan calibrate`` and the emitted programs' tests."""

from __future__ import annotations

import sys

from fxplan.core.loopback import loopback_interface, loopback_torchrun


def test_the_command_rendezvous_on_a_loopback_port(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    env, argv = loopback_torchrun(3)
    assert env == {"GLOO_SOCKET_IFNAME": loopback_interface(),
                   "NCCL_SOCKET_IFNAME": loopback_interface()}
    assert argv[:4] == [sys.executable, "-m", "fxplan.runtime.launch.torchrun", "--nnodes=1"]
    assert "--nproc-per-node=3" in argv and argv[-1] == "--local-addr=127.0.0.1"
    endpoint = next(a for a in argv if a.startswith("--rdzv-endpoint="))
    host, port = endpoint.split("=", 1)[1].rsplit(":", 1)
    assert host == "127.0.0.1" and 0 < int(port) < 65536


def test_an_interface_the_environment_names_is_kept(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth7")
    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    env, argv = loopback_torchrun(2, "--nnodes=1:4")
    assert "GLOO_SOCKET_IFNAME" not in env and "NCCL_SOCKET_IFNAME" in env
    assert argv[3] == "--nnodes=1:4"


def test_a_free_port_is_drawn_below_the_ephemeral_range_and_skips_taken_ones(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The port comes from below the kernel's ephemeral range (where no ``bind(0)`` or outgoing
    connection takes it), is free, and a port already bound is drawn past, not returned."""
    import random
    import socket

    from fxplan.core import loopback

    low = loopback._ephemeral_range()[0]
    ports = [loopback.free_loopback_port(random.Random(seed)) for seed in range(20)]
    assert all(loopback.LOWEST_DRAWN_PORT <= port < low for port in ports)
    taken = ports[0]
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        assert loopback.free_loopback_port(random.Random(0)) != taken  # seed 0 drew it first
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", loopback.free_loopback_port()))  # free: binds


def test_with_no_room_below_the_ephemeral_range_the_kernel_picks(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from fxplan.core import loopback

    low, high = loopback._ephemeral_range()  # the kernel's own, where bind(0) draws
    monkeypatch.setattr(loopback, "_ephemeral_range", lambda: (loopback.LOWEST_DRAWN_PORT, high))
    port = loopback.free_loopback_port()
    assert low <= port <= high
