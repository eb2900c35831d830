"""``Cluster.load``: built-in names, paths, ``name:key=value`` overrides, ``local-cpu``."""

from __future__ import annotations

from pathlib import Path

import pytest

from fxplan.cluster_specs import Cluster, ClusterSpecError, available_specs
from fxplan.cluster_specs import local_cpu


def test_nodes_override_scales_a_builtin():
    cluster = Cluster.load("dgx-a100-80g:nodes=192")
    assert (cluster.num_nodes, cluster.num_devices) == (192, 1536)
    assert cluster.name == "dgx-a100-80g:nodes=192"
    assert cluster.source == "dgx-a100-80g:nodes=192"


def test_nodes_override_keeps_heterogeneous_proportions():
    cluster = Cluster.load("hetero-v100-a100:nodes=8")
    assert [(g.name, g.nodes, g.first_rank) for g in cluster.device_groups] == [("v100", 4, 0), ("a100", 4, 32)]
    with pytest.raises(ClusterSpecError) as err:
        Cluster.load("hetero-v100-a100:nodes=3")
    message = str(err.value)
    assert message.startswith("hetero-v100-a100:nodes=3: nodes: found 3, expected a multiple of 2")
    assert "2 (v100) + 2 (a100) = 4 nodes" in message


def test_named_overrides_of_groups_and_levels():
    cluster = Cluster.load("hetero-v100-a100:v100.nodes=3,a100.nodes=1,ib-hdr.nics_per_node=4")
    assert [g.nodes for g in cluster.device_groups] == [3, 1]
    assert cluster.cluster_level.nics_per_node == 4
    tweaked = Cluster.load("dgx-a100-80g:devices_per_node=4,nvswitch.efficiency=0.5")
    assert tweaked.num_devices == 4 and tweaked.level("nvswitch").efficiency == 0.5


def test_override_values_are_validated_by_the_schema():
    with pytest.raises(ClusterSpecError) as err:
        Cluster.load("dgx-a100-80g:a100.memory_gib=-1")
    assert str(err.value) == (
        "dgx-a100-80g:a100.memory_gib=-1: device_groups[0].memory_gib: found -1, "
        "expected a number > 0 and ≤ 1,048,576 (GiB per device)"
    )


@pytest.mark.parametrize(
    "spec,fragments",
    [
        ("dgx-a100-80g:nodes=0", ["dgx-a100-80g:nodes=0: nodes: found 0, expected an integer ≥ 1"]),
        ("dgx-a100-80g:nodes", ["found override 'nodes', expected key=value"]),
        ("dgx-a100-80g:gpus=4", ["found unknown override key 'gpus'", "nodes, devices_per_node, devices, a100.KEY"]),
        ("local-cpu:devices=zero", ["devices: found 'zero' (a string), expected an integer in 1 … 4,096"]),
        ("local-cpu:matmul_tflops=0", ["matmul_tflops: found 0, expected a number > 0"]),
        ("local-cpu:eager_op_us=fast", ["eager_op_us: found 'fast' (a string), expected a number > 0"]),
    ],
)
def test_bad_overrides(spec, fragments):
    with pytest.raises(ClusterSpecError) as err:
        Cluster.load(spec)
    for fragment in fragments:
        assert fragment in str(err.value), str(err.value)


def test_unknown_name_lists_the_builtins():
    with pytest.raises(ClusterSpecError) as err:
        Cluster.load("dgx-a100")
    message = str(err.value)
    assert "found 'dgx-a100': not a built-in spec name and not a file" in message
    assert ", ".join(available_specs()) in message
    assert message.endswith("Did you mean dgx-a100-40g or dgx-a100-80g?")


def test_missing_file():
    with pytest.raises(ClusterSpecError, match="found 'nope/cluster.yaml': no such file"):
        Cluster.load("nope/cluster.yaml")


def test_paths_with_and_without_overrides(two_level, write_spec):
    path = write_spec(two_level, "mine.yaml")
    assert Cluster.load(path).num_devices == 8
    assert Cluster.load(str(path)).source == str(path)
    assert Cluster.load(f"{path}:nodes=4").num_nodes == 4


def test_a_cluster_loads_as_itself():
    cluster = Cluster.load("h200-single")
    assert Cluster.load(cluster) is cluster


def test_local_cpu_default_is_one_rank_per_core():
    cores, total = local_cpu.cpu_cores(), local_cpu.memory_gib()
    cluster = Cluster.load("local-cpu")
    (cpu,) = cluster.device_groups
    assert cluster.num_devices == cores and cpu.kind == "cpu"
    assert cpu.memory_gib == pytest.approx(total / cores, abs=1e-3)
    assert cpu.peak_tflops["fp32"] == pytest.approx(local_cpu.FP32_TFLOPS_PER_CORE, abs=1e-5)
    assert cluster.levels[0].kind == "loopback" and cluster.group_level(range(cores)).name == "loopback"


def test_local_cpu_devices_splits_the_machine():
    cores, total = local_cpu.cpu_cores(), local_cpu.memory_gib()
    cluster = Cluster.load("local-cpu:devices=4")
    (cpu,) = cluster.device_groups
    assert cluster.num_devices == 4
    assert cpu.memory_gib == pytest.approx(total / 4, abs=1e-3)
    share = local_cpu.core_share(cores, 4)
    assert share == (1.0 if cores >= 4 else local_cpu.TIME_SHARING_EFFICIENCY * cores / 4)
    assert cpu.peak_tflops["fp32"] == pytest.approx(local_cpu.FP32_TFLOPS_PER_CORE * share, abs=1e-5)
    assert cpu.kernel_launch_us == pytest.approx(local_cpu.EAGER_OP_US / share, abs=1e-3)
    assert cpu.host.step_overhead_us == pytest.approx(local_cpu.STEP_OVERHEAD_US / share, abs=0.1)
    assert cpu.host.pipeline_step_us == pytest.approx(local_cpu.PIPELINE_STEP_US / share, abs=0.1)
    assert cpu.host.pipeline_microbatch_us == pytest.approx(local_cpu.PIPELINE_MICROBATCH_US / share,
                                                       abs=0.1)
    assert Cluster.load("local-cpu:devices=2,nodes=2").num_devices == 4


def test_local_cpu_time_shared_ranks_take_the_shared_regimes_constants():
    """More ranks than cores: the cache refill per evicting wait, and gloo's per-step CPU and
    wake-up measured with two ranks to a core; a core per rank: no refill, the own-core set."""
    cores = local_cpu.cpu_cores()
    for devices in (cores, cores + 1, 2 * cores):
        cluster = Cluster.load(f"local-cpu:devices={devices}")
        (cpu,), level = cluster.device_groups, cluster.levels[0]
        share = local_cpu.core_share(cores, devices)
        shared = devices > cores
        assert cpu.host.switch_refill_us == (pytest.approx(local_cpu.SWITCH_REFILL_US / share, abs=0.1)
                                        if shared else 0.0)
        steps = local_cpu.GLOO_STEP_CPU_SHARED_US if shared else local_cpu.GLOO_STEP_CPU_US
        assert level.latency_us == (local_cpu.GLOO_WAKEUP_SHARED_US if shared
                                    else local_cpu.GLOO_WAKEUP_US)
        for kind, us in steps.items():
            assert level.step_cpu_us[kind] == pytest.approx(us / share, abs=0.1)


def test_local_cpu_takes_the_rates_measured_now():
    # local-cpu:…,matmul_tflops=F,memory_gb_per_s=M,eager_op_us=e (a rate probe's figures):
    # the arithmetic, the bandwidth and every host cost move with them, the share still applies
    base = Cluster.load("local-cpu:devices=4").device_groups[0]
    now = Cluster.load("local-cpu:devices=4,matmul_tflops=0.0833,memory_gb_per_s=6,"
                       f"eager_op_us={2 * local_cpu.EAGER_OP_US}").device_groups[0]
    share = local_cpu.core_share(local_cpu.cpu_cores(), 4)
    assert now.peak_tflops["fp32"] == pytest.approx(0.0833 * share, abs=1e-5)
    assert now.memory_bandwidth_gb_per_s == pytest.approx(6 * share, abs=1e-4)
    assert now.kernel_launch_us == pytest.approx(2 * base.kernel_launch_us, abs=2e-3)
    for key in ("dtensor_op_us", "dtensor_backward_op_us", "dtensor_view_op_us",
                "dtensor_local_redistribute_us", "dtensor_from_local_us",
                "dtensor_to_local_backward_us",
                "optimizer_tensor_us", "dtensor_optimizer_tensor_us", "step_overhead_us",
                "ddp_tensor_us", "fsdp_gather_us", "fsdp_reduce_tensor_us"):
        assert getattr(now.host, key) == pytest.approx(2 * getattr(base.host, key), rel=1e-3), key
    assert Cluster.load("local-cpu:devices=4").fingerprint() != Cluster.load(
        "local-cpu:devices=4,matmul_tflops=0.0833").fingerprint()
    # the constants by default: the same spec as before the keys existed
    assert Cluster.load(f"local-cpu:devices=4,matmul_tflops={local_cpu.FP32_TFLOPS_PER_CORE},"
                        f"memory_gb_per_s={local_cpu.MEMORY_GB_PER_S_PER_CORE},"
                        f"eager_op_us={local_cpu.EAGER_OP_US}").fingerprint() == \
        Cluster.load("local-cpu:devices=4").fingerprint()


def test_local_cpu_memory_bound_reference_follows_the_vector_probe():
    # the memory-bound classes' reference bandwidth moves with the probed in-cache vector rate
    # V (M₀·V/V₀); without V, with the matmul rate (series probed before V existed); a given
    # memory_gb_per_s wins over both
    share = local_cpu.core_share(local_cpu.cpu_cores(), 2)
    m0, v0 = local_cpu.MEMORY_GB_PER_S_PER_CORE, local_cpu.VECTOR_GB_PER_S_PER_CORE

    def bandwidth(rates: str) -> float:
        return Cluster.load(f"local-cpu:devices=2,{rates}").device_groups[0] \
            .memory_bandwidth_gb_per_s

    assert bandwidth(f"vector_gb_per_s={v0 / 2}") == pytest.approx(m0 / 2 * share, abs=1e-3)
    # the vector rate, not the matmul rate, when both are given
    assert bandwidth(f"matmul_tflops={4 * local_cpu.FP32_TFLOPS_PER_CORE},"
                     f"vector_gb_per_s={v0}") == pytest.approx(m0 * share, abs=1e-3)
    assert bandwidth(f"matmul_tflops={2 * local_cpu.MEMORY_REFERENCE_MATMUL_TFLOPS}") == pytest.approx(
        2 * m0 * share, abs=1e-3)
    assert bandwidth(f"vector_gb_per_s={v0 / 2},memory_gb_per_s=3") == pytest.approx(
        3 * share, abs=1e-3)
    assert local_cpu.memory_bound_reference_gb_per_s() == m0


def test_builtin_dir_is_packaged():
    assert (Path(local_cpu.__file__).parent / "builtin" / "dgx-a100-80g.yaml").is_file()
