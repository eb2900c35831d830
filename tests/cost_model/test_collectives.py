"""Collective times: the published numbers of benchmarks/data/hardware.md, and the α-β
formulas of cost_model/comm/collectives.py worked by hand from the built-in spec values."""

from __future__ import annotations

import pytest

from fxplan.cluster_specs import Cluster
from fxplan.cost_model.comm.collectives import ALGORITHMS, bus_factor, collective_cost, collective_time_s

GiB = 2**30
US = 1e-6


@pytest.fixture(scope="module")
def a100() -> Cluster:
    return Cluster.load("dgx-a100-80g")


@pytest.fixture(scope="module")
def a100x2() -> Cluster:
    return Cluster.load("dgx-a100-80g:nodes=2")


@pytest.fixture(scope="module")
def h100() -> Cluster:
    return Cluster.load("dgx-h100")


# -- hardware.md: each within 10 % -----------------------------------------------------------
def test_1gib_allreduce_8x_a100_nvswitch(a100: Cluster) -> None:
    cost = collective_cost("all_reduce", GiB, range(8), a100)
    assert cost.time_s == pytest.approx(8.2e-3, rel=0.10)
    assert cost.algorithm == "ring"
    assert cost.bus_bandwidth_gb_per_s == pytest.approx(230, rel=0.10)


def test_1gib_allreduce_8x_h100_uses_nvls(h100: Cluster) -> None:
    cost = collective_cost("all_reduce", GiB, range(8), h100)
    assert cost.time_s == pytest.approx(3.9e-3, rel=0.10)
    assert cost.algorithm == "nvls"
    assert cost.bus_bandwidth_gb_per_s == pytest.approx(480, rel=0.10)
    ring = collective_cost("all_reduce", GiB, range(8), h100, algorithm="ring")
    assert ring.bus_bandwidth_gb_per_s == pytest.approx(370, rel=0.10)


def test_1gib_allreduce_two_dgx_a100_nodes(a100x2: Cluster) -> None:
    cost = collective_cost("all_reduce", GiB, range(16), a100x2)
    assert cost.time_s == pytest.approx(10.5e-3, rel=0.10)
    assert cost.bus_bandwidth_gb_per_s == pytest.approx(192, rel=0.10)


def test_small_allreduce_latency(a100: Cluster) -> None:
    assert 20 * US <= collective_time_s("all_reduce", 8, range(8), a100) <= 40 * US
    assert collective_time_s("all_reduce", 8, range(2), a100) == pytest.approx(10 * US, rel=0.30)


# -- the formulas, by hand -------------------------------------------------------------------
# dgx-a100-80g: NVSwitch 300 GB/s × 0.77 = 231 GB/s per GPU, hop 2 µs; IB HDR 8 NICs × 25 × 0.96
# = 192 GB/s per node (24 per GPU rail), hop 8 µs; base latency α = 6 µs (data/collectives.json).
def test_ring_allgather_reduce_scatter_broadcast(a100: Cluster) -> None:
    ag = 7 / 8 * GiB / 231e9 + (6 + 7 * 2) * US
    assert collective_time_s("all_gather", GiB, range(8), a100) == pytest.approx(ag, rel=1e-9)
    assert collective_time_s("reduce-scatter", GiB, range(8), a100) == pytest.approx(ag, rel=1e-9)
    assert collective_time_s("broadcast", GiB, range(8), a100) == pytest.approx(
        GiB / 231e9 + (6 + 7 * 2) * US, rel=1e-9)


def test_ring_across_nodes_latency_and_tree_for_small_messages(a100x2: Cluster) -> None:
    # ring: 2(n−1) = 30 steps, 2(m−1) = 2 of them between nodes
    ring = collective_cost("all_reduce", 8, range(16), a100x2, algorithm="ring")
    assert ring.latency_s == pytest.approx((6 + 28 * 2 + 2 * 8) * US)
    # tree: 2((k−1)·h_i + log2(m)·h_e)
    tree = collective_cost("all_reduce", 8, range(16), a100x2, algorithm="tree")
    assert tree.latency_s == pytest.approx((6 + 2 * (7 * 2 + 1 * 8)) * US)
    assert collective_cost("all_reduce", 8, range(16), a100x2).algorithm == "tree"
    assert collective_cost("all_reduce", GiB, range(16), a100x2).algorithm == "ring"


def test_tree_bandwidth_term(a100x2: Cluster) -> None:
    tree = collective_cost("all_reduce", GiB, range(16), a100x2, algorithm="tree")
    assert tree.time_s - tree.latency_s == pytest.approx(2 * GiB / (0.9 * 192e9), rel=1e-9)


def test_hierarchical_wins_on_a_single_slow_nic() -> None:
    # a100-pcie-8: PCIe 32 × 0.75 = 24 GB/s per GPU, hop 3.4 µs; one 12.5 GB/s × 0.8 = 10 GB/s
    # Ethernet NIC per node (1.25 GB/s per GPU rail when all 8 rails run), hop 14 µs.
    cluster = Cluster.load("a100-pcie-8:nodes=2")
    ring = 2 * 15 / 16 * GiB / 10e9 + (6 + 28 * 3.4 + 2 * 14) * US
    intra = 7 / 8 * GiB / 24e9 + (6 + 7 * 3.4) * US
    inter = 2 * (1 / 2) * (GiB / 8) / 1.25e9 + (6 + 2 * 14) * US
    assert collective_time_s("all_reduce", GiB, range(16), cluster, algorithm="ring") == pytest.approx(ring)
    hier = collective_cost("all_reduce", GiB, range(16), cluster)
    assert hier.algorithm == "hierarchical"
    assert hier.time_s == pytest.approx(2 * intra + inter)
    assert hier.time_s < ring


def test_all_to_all_across_nodes(a100x2: Cluster) -> None:
    # 8 of 16 peers off-node over the 24 GB/s rail; 7/16 inside at 231 GB/s; the slower wins
    expected = 8 / 16 * GiB / 24e9 + (6 + 14 * 2 + 1 * 8) * US
    assert collective_time_s("all_to_all", GiB, range(16), a100x2) == pytest.approx(expected)


def test_send_recv_inside_and_across_nodes(a100x2: Cluster) -> None:
    assert collective_time_s("send_recv", GiB, (0, 1), a100x2) == pytest.approx(GiB / 231e9 + 8 * US)
    assert collective_time_s("send", GiB, (0, 8), a100x2) == pytest.approx(GiB / 24e9 + 14 * US)


def test_dp_group_of_one_rank_per_node_gets_one_rail(a100x2: Cluster) -> None:
    cost = collective_cost("all_reduce", GiB, (3, 11), a100x2, algorithm="ring")
    assert cost.time_s == pytest.approx(GiB / 24e9 + (6 + 2 * 8) * US)


def test_degenerate_and_invalid(a100: Cluster) -> None:
    assert collective_time_s("all_reduce", GiB, [5], a100) == 0.0
    assert collective_time_s("all_gather", 0, range(8), a100) == 0.0
    with pytest.raises(ValueError, match="does not apply"):
        collective_cost("all_reduce", GiB, range(8), a100, algorithm="nvls")
    with pytest.raises(ValueError, match="does not apply"):
        collective_cost("all_reduce", GiB, range(8), a100, algorithm="hierarchical")
    with pytest.raises(ValueError, match="cannot run as"):
        collective_cost("all_gather", GiB, range(8), a100, algorithm="tree")
    with pytest.raises(ValueError, match="unknown collective"):
        collective_cost("gossip", GiB, range(8), a100)
    with pytest.raises(ValueError, match="pair"):
        collective_cost("send_recv", GiB, range(3), a100)


def test_every_algorithm_prices_something(a100x2: Cluster, h100: Cluster) -> None:
    for kind, names in ALGORITHMS.items():
        ranks = (0, 9) if kind == "send_recv" else tuple(range(16))
        assert collective_time_s(kind, 1 << 20, ranks, a100x2) > 0
        for name in names:
            cluster = h100 if name == "nvls" else a100x2
            group = tuple(range(8)) if name == "nvls" else ranks
            cost = collective_cost(kind, 1 << 20, group, cluster, algorithm=name)
            assert cost.algorithm == name and cost.time_s > cost.latency_s > 0


def test_bus_factor() -> None:
    assert bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert bus_factor("allgather", 8) == pytest.approx(0.875)
    assert bus_factor("broadcast", 8) == 1.0


def test_gloo_runs_a_reduce_scatter_as_an_all_reduce_of_its_input() -> None:
    # gloo's _reduce_scatter_base is a gloo:all_reduce (FSDP2's and DTensor's reduce-scatters,
    # counted with the profiler): local-cpu's levels say so, the GPU specs do not
    cpu = Cluster.load("local-cpu:devices=4")
    assert all(level.reduce_scatter_as_all_reduce for level in cpu.levels)
    nbytes = 4 * 2**20
    assert collective_time_s("reduce_scatter", nbytes, range(4), cpu) == \
        collective_time_s("all_reduce", nbytes, range(4), cpu)
    gpu = Cluster.load("dgx-a100-80g")
    assert collective_time_s("reduce_scatter", nbytes, range(8), gpu) < \
        collective_time_s("all_reduce", nbytes, range(8), gpu)


def test_gloo_cpu_per_step_runs_at_the_core_share() -> None:
    # local-cpu: each step of a gloo collective costs the hop's wake-up plus the kind's cost
    # per step at the ranks' core share, and the bytes move at the bandwidth times the share;
    # the three are those of the spec's regime (a core each, or time-shared), measured in situ
    from fxplan.cluster_specs import local_cpu
    from fxplan.cluster_specs.local_cpu import core_share, cpu_cores

    for devices in (2, 4, cpu_cores() + 1):
        cpu = Cluster.load(f"local-cpu:devices={devices}")
        share = core_share(cpu_cores(), devices)
        shared = devices > cpu_cores()
        step_cpu_us = (local_cpu.GLOO_STEP_CPU_SHARED_US if shared
                       else local_cpu.GLOO_STEP_CPU_US)
        wakeup_us = local_cpu.GLOO_WAKEUP_SHARED_US if shared else local_cpu.GLOO_WAKEUP_US
        bus = local_cpu.GLOO_BUS_SHARED_GB_PER_S if shared else local_cpu.GLOO_BUS_GB_PER_S
        level = cpu.levels[0]
        assert level.bandwidth_gb_per_s == pytest.approx(bus * share, rel=1e-3)
        for kind, hops in (("all_gather", 1), ("broadcast", 1)):
            t = collective_time_s(kind, 1.0, (0, 1), cpu)
            step = wakeup_us + step_cpu_us[kind] / share
            assert t == pytest.approx((6.0 + hops * step) * 1e-6, rel=1e-3)
        # an all-reduce of e < 2n elements fills e/2n of the ring's segments
        full = collective_time_s("all_reduce", 4.0 * 2 * devices, range(devices), cpu)
        one = collective_time_s("all_reduce", 4.0, range(devices), cpu)
        steps = 2 * (devices - 1)
        assert full - one == pytest.approx(
            steps * step_cpu_us["all_reduce"] / share * (1 - 1 / (2 * devices)) * 1e-6
            + (2 * devices - 1) * 4.0 * steps / devices / (level.bandwidth_gb_per_s * 1e9),
            rel=1e-3)
    # GPU links have no per-step CPU
    assert not any(level.step_cpu_us for level in Cluster.load("dgx-a100-80g").levels)
