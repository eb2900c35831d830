"""``cost_model.memory.offload``: device and host bytes under offload, the step's ``offload`` row
(PCIe copies and the CPU Adam step), and the host-memory check per node."""

from __future__ import annotations

import pytest
import torch

from fxplan.api import capture
from fxplan.cluster_specs import Cluster
from fxplan.cost_model import CostModelError, ParallelConfig, estimate
from fxplan.cost_model.memory.breakdown import model_state_bytes
from fxplan.cost_model.memory.offload import (ADAM_HOST_BYTES, CLIP_HOST_BYTES,
                                              CORE_MEMORY_GB_PER_S, HOST_STEP_EFFICIENCY,
                                              HostSide, host_step_s, offload_segment_s,
                                              offload_step_s)

SPEC = "gpt:layers=4,hidden=256,heads=8,vocab=1024,seq=128"


@pytest.fixture(scope="module")
def graph():  # type: ignore[no-untyped-def]
    return capture(SPEC, batch=1, dtype=torch.float16)


def test_state_bytes_move_to_the_host() -> None:
    psi, n = 1e9, 8
    s = model_state_bytes(psi, n, 1, offload="optimizer")
    assert (s.params, s.grads, s.optimizer) == (2 * psi, 2 * psi, 0.0)
    assert s.host == 16 * psi / n
    s = model_state_bytes(psi, 1, 0, offload="optimizer")
    assert s.total == 4 * psi and s.host == 16 * psi
    s = model_state_bytes(psi, n, 3, offload="optimizer+params")
    assert s.total == 0.0 and s.host == 16 * psi / n


def test_offload_prices_the_cpu_step_and_copies(graph) -> None:  # type: ignore[no-untyped-def]
    cluster = Cluster.load("dgx1-v100-16g")
    base = ParallelConfig(dp=8, zero_stage=1, microbatch_size=1)
    plain = estimate(graph, cluster, base, batch=8)
    off = estimate(graph, cluster, base.replace(offload="optimizer"), batch=8)
    assert "offload" not in plain.breakdown
    assert off.memory[0].optimizer == 0.0 and plain.memory[0].optimizer > 0
    assert off.memory[0].total < plain.memory[0].total
    psi = graph.num_params / 8
    device = cluster.device(0)
    # one core per rank would stream 21.9 GB/s; the DGX-1's 8 ranks share 136.5 GB/s: 17.1
    # each; AdamW alone on the host (the clipping ran on the device)
    cpu = 80 * psi / (0.6 * device.host_memory_bandwidth_gb_per_s / 8 * 1e9)
    # the fp32 gradients down after the clipping and the fp32 weights back, neither hidden,
    # in the fp16 plan too (the runtime keeps fp32 parameters on the device)
    d2h = h2d = 4 * psi / (device.host_link_gb_per_s * 1e9)
    assert off.breakdown["offload"] == pytest.approx(d2h + cpu + h2d, rel=0.05)
    assert off.step_time_s > plain.step_time_s
    node = off.memory[0]
    assert node.host_node_total == pytest.approx(8 * node.host)
    assert node.host_capacity == 512 * 2**30 and node.fits


def test_offload_params_adds_shard_copies_to_zero3(graph) -> None:  # type: ignore[no-untyped-def]
    cluster = Cluster.load("dgx1-v100-16g")
    z3 = ParallelConfig(dp=8, zero_stage=3, offload="optimizer")
    params = estimate(graph, cluster, z3.replace(offload="optimizer+params"), batch=8)
    opt = estimate(graph, cluster, z3, batch=8)
    assert params.memory[0].params == 0.0 and opt.memory[0].params > 0
    assert params.breakdown["zero_comm"] >= opt.breakdown["zero_comm"]


def test_host_memory_is_checked_per_node(graph) -> None:  # type: ignore[no-untyped-def]
    small = Cluster.load("dgx1-v100-16g:v100.host_memory_gib=0.001")
    est = estimate(graph, small, ParallelConfig(dp=8, zero_stage=1, offload="optimizer"),
                   batch=8)
    assert not est.fits and not est.memory[0].host_fits


def test_a_spec_without_host_side_cannot_offload(graph) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(CostModelError, match="does not give host_memory_gib"):
        estimate(graph, Cluster.load("h200-single"),
                 ParallelConfig(offload="optimizer"), batch=8)


def test_host_step_is_bound_by_one_core_or_the_node_share() -> None:
    """``cpu = Ψ_o·Q/(η_q·min(t·b_c, H/r))``: on a DGX H100 (614.4 GB/s over 8 ranks) one core
    per rank binds, on a DGX-1 (136.5 GB/s) the node's share does. ``Q`` = 80 B (AdamW) under
    ``offload=optimizer``, 92 B (clip + AdamW on host gradients) under ``optimizer+params``."""
    psi = 1e9
    h100 = HostSide.of(Cluster.load("dgx-h100").device(0))
    v100 = HostSide.of(Cluster.load("dgx1-v100-16g").device(0))
    assert host_step_s(psi, h100, "optimizer") == pytest.approx(80 * psi / (0.6 * 21.9e9))
    assert host_step_s(psi, h100, "optimizer+params") == pytest.approx(92 * psi / (0.6 * 21.9e9))
    assert host_step_s(psi, v100, "optimizer") == pytest.approx(80 * psi / (0.6 * 136.5e9 / 8))
    assert host_step_s(2 * psi, h100, "optimizer") == pytest.approx(
        2 * host_step_s(psi, h100, "optimizer"))
    # Llama-2 70B sharded over 64 H100s, parameters offloaded: 1.09 G parameters per rank take
    # 7.7 s on one core each, not the 0.8 s that 0.5 of the node's bandwidth (the unmeasured
    # rate) priced
    assert host_step_s(70e9 / 64, h100, "optimizer+params") == pytest.approx(7.66, rel=0.01)


def test_expert_states_are_updated_over_their_own_replicas() -> None:
    """Under ZeRO ≥ 1 a rank's expert parameters are sharded over their ``dp/ep`` replicas
    only: with ep = dp = 8 its experts' optimizer steps whole on its host."""
    device = Cluster.load("dgx1-v100-16g").device(0)
    config = ParallelConfig(dp=8, zero_stage=1, offload="optimizer", ep=8)
    dense = offload_step_s(config, 1e9, device)
    moe = offload_step_s(config, 1e9, device, expert_params=0.5e9)
    # Ψ_o = 0.5e9/8 + 0.5e9 against 1e9/8: the copies and the host step scale alike
    assert moe == pytest.approx(dense * (0.5e9 / 8 + 0.5e9) / (1e9 / 8))
    assert offload_step_s(config.replace(zero_stage=0), 1e9, device,
                          expert_params=0.5e9) == pytest.approx(8 * dense)
    # optimizer+params: each segment's expert shard is copied whole too (4 B per parameter)
    z3 = config.replace(zero_stage=3, offload="optimizer+params")
    link = device.host_link_gb_per_s * 1e9
    assert offload_segment_s(z3, 1e6, device, expert_params=0.5e6) == pytest.approx(
        (4 * (0.5e6 / 8 + 0.5e6) / link,) * 2)


def test_host_step_constants_are_the_recorded_measurements() -> None:
    """The constants lie inside what ``benchmarks/host_adam_rate.py`` recorded
    (``benchmarks/data/host_adam_rate.json``): the chain's bytes over the core's copy."""
    import json
    from pathlib import Path

    data = json.loads((Path(__file__).parents[2] / "benchmarks/data/host_adam_rate.json")
                      .read_text())
    runs = [r["by_threads"]["1"] for r in data["runs"]]
    copies = [r["copy_gb_per_s"] for r in runs]
    assert min(copies) <= CORE_MEMORY_GB_PER_S <= max(copies)
    # the one efficiency of both host chains: AdamW alone (offload=optimizer) and clip + AdamW
    for variant, nbytes in (("default", ADAM_HOST_BYTES),
                            ("clip", ADAM_HOST_BYTES + CLIP_HOST_BYTES)):
        etas = [nbytes * r[variant]["gparams_per_s"] / r["copy_gb_per_s"] for r in runs]
        assert min(etas) - 0.01 <= HOST_STEP_EFFICIENCY <= max(etas) + 0.01, (variant, etas)
