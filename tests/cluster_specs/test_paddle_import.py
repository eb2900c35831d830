"""Import of PaddlePaddle auto-parallel cluster JSON (format of
``paddle.distributed.auto_parallel.cluster.Cluster.build_from_file``)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from fxplan.cluster_specs import Cluster, ClusterSpecError

SAMPLE = Path(__file__).parent / "data" / "paddle_a100_2x4.json"


def test_sample_maps_machines_devices_links_and_alpha_latency():
    cluster = Cluster.from_paddle_json(SAMPLE)
    assert (cluster.num_nodes, cluster.num_devices) == (2, 8)  # CPUs and NICs are not ranks
    (group,) = cluster.device_groups
    assert (group.model, group.memory_gib, group.devices_per_node) == ("NVIDIA A100-SXM4-40GB", 40, 4)
    assert group.peak_tflops["fp32"] == 19.5  # sp_gflops 19500 / 1000
    assert group.peak_tflops["bf16"] == 312  # from the matching built-in (Paddle has no bf16 peak)
    assert group.memory_bandwidth_gb_per_s == 1555
    intra, network = cluster.levels
    assert (intra.kind, intra.bandwidth_gb_per_s, intra.latency_us) == ("nvlink", 230, 3.4)  # "NVL" → 3.4 µs
    assert (network.nics_per_node, network.bandwidth_gb_per_s) == (1, 25)  # one NIC, width 25
    assert network.latency_us == pytest.approx(9.6 + 10.0)  # inter "NET" + switch
    assert cluster.group_bandwidth_gb_per_s(range(8)) == 25  # min(230, 25 × 4/4)
    assert cluster.group_bandwidth_gb_per_s([0, 4]) == 6.25  # 25 × 1/4


def test_load_recognises_paddle_json():
    assert Cluster.load(str(SAMPLE)).fingerprint() == Cluster.from_paddle_json(SAMPLE).fingerprint()
    assert Cluster.load(f"{SAMPLE}:nodes=4").num_devices == 16


def _sample() -> dict:
    return json.loads(SAMPLE.read_text())


def _write(tmp_path: Path, document: dict, name: str = "paddle.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(document))
    return path


def test_mixed_machines_become_device_groups(tmp_path):
    document = _sample()
    second = document["machines"][1]
    for device in second["devices"]:
        if device["type"] == "GPU":
            device.update(model="Tesla V100-SXM2-32GB", memory="32", sp_gflops="15700")
    for link in second["links"]:
        if link["type"] == "NVL":
            link["bandwidth"] = 100.0
    second["devices"].append({"global_id": 99, "local_id": 1, "type": "NIC", "width": 25.0})
    document["alpha_latency"] = {"intra": {"ring": 2.5}, "inter": {"ring": 5.0}, "switch": 1.0}
    cluster = Cluster.load(_write(tmp_path, document))
    a100, v100 = cluster.device_groups
    assert (a100.model, v100.model, v100.first_rank) == ("NVIDIA A100-SXM4-40GB", "Tesla V100-SXM2-32GB", 4)
    assert v100.peak_tflops == {"fp32": 15.7, "fp16": 125.0} and v100.nics_per_node == 2
    assert cluster.level(v100.intra_node_level).bandwidth_gb_per_s == 100
    assert cluster.cluster_level.latency_us == 6.0 and cluster.levels[0].latency_us == 2.5
    # Across both: min(A100 230, A100 NIC 25, V100 100, V100 NICs 50) = 25
    assert cluster.group_bandwidth_gb_per_s(range(8)) == 25


@pytest.mark.parametrize(
    "edit,fragments",
    [
        (lambda d: [dev.update(model="Mystery-X1") for dev in d["machines"][0]["devices"] if dev["type"] == "GPU"],
         ["machines[0].devices[0].model: found 'Mystery-X1' (a string), expected a device model fxplan knows"]),
        (lambda d: d["machines"][0]["devices"][1].update(model="Mystery-X1"),
         ["machines[0].devices[1].model: found 'Mystery-X1' (a string)",
          "expected 'NVIDIA A100-SXM4-40GB' like the machine's other accelerators"]),
        (lambda d: d["machines"][0]["devices"][0].update(memory="lots"),
         ["machines[0].devices[0].memory: found 'lots' (a string), expected a number > 0 (GB)"]),
        (lambda d: d["machines"][1].update(devices=[d["machines"][1]["devices"][4]]),
         ["machines[1].devices: found a list of 1 item, expected at least one accelerator"]),
        (lambda d: d.update(machines=[]), ["machines: found a list of 0 items, expected a non-empty list"]),
    ],
    ids=["unknown-model", "mixed-models", "bad-memory", "no-accelerator", "no-machines"],
)
def test_bad_paddle_files(tmp_path, edit, fragments):
    document = copy.deepcopy(_sample())
    edit(document)
    path = _write(tmp_path, document, "bad_paddle.json")
    with pytest.raises(ClusterSpecError) as err:
        Cluster.load(path)
    message = str(err.value)
    assert message.startswith(str(path))
    for fragment in fragments:
        assert fragment in message, message


def test_invalid_json(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"machines": [')
    with pytest.raises(ClusterSpecError, match=r"broken\.json: not valid JSON"):
        Cluster.load(path)
