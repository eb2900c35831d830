"""Malformed and contradictory cluster files: each error names the file, the key path, what
was found and what was expected."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from fxplan.cluster_specs import Cluster, ClusterSpecError


def _set(path: str, value: Any) -> Callable[[dict], None]:
    """A mutation that sets ``a.b[0].c`` style paths (value ``...`` deletes the key)."""

    def mutate(spec: dict) -> None:
        *parents, last = path.replace("]", "").replace("[", ".").split(".")
        target: Any = spec
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        if value is ...:
            del target[last]
        else:
            target[last] = value

    return mutate


def _append_level(spec: dict) -> None:
    spec["levels"].append(dict(spec["levels"][1], name="eth", kind="ethernet"))


def _single_level_two_nodes(spec: dict) -> None:
    del spec["levels"][1]


def _cluster_first(spec: dict) -> None:
    spec["levels"].reverse()


def _duplicate_group(spec: dict) -> None:
    spec["device_groups"].append(dict(spec["device_groups"][0]))


CASES = [
    # (id, mutation, file name, message fragments)
    ("unknown-key", _set("levels[1].bandwith_gb_per_s", 25), "typo.yaml",
     ["levels[1].bandwith_gb_per_s", "unknown key 'bandwith_gb_per_s'", "did you mean 'bandwidth_gb_per_s'"]),
    ("missing-key", _set("levels[0].latency_us", ...), "missing.yaml",
     ["levels[0].latency_us", "found nothing (the key is missing)", "expected a number ≥ 0 and ≤ 1,000,000 (µs per hop)"]),
    ("wrong-type", _set("device_groups[0].memory_gib", "80GB"), "type.yaml",
     ["device_groups[0].memory_gib", "found '80GB' (a string)", "expected a number > 0 and ≤ 1,048,576 (GiB per device)"]),
    ("negative", _set("levels[1].bandwidth_gb_per_s", -25), "negative.yaml",
     ["levels[1].bandwidth_gb_per_s: found -25, expected a number ≥ 0.001 and ≤ 1,000,000 (GB/s per direction"]),
    ("zero-nodes", _set("device_groups[0].nodes", 0), "zero.yaml",
     ["device_groups[0].nodes: found 0, expected an integer in 1 … 1,048,576"]),
    ("float-count", _set("device_groups[0].devices_per_node", 8.0), "float.yaml",
     ["device_groups[0].devices_per_node: found 8.0, expected an integer in 1 … 4,096"]),
    ("efficiency-range", _set("levels[0].efficiency", 1.2), "eff.yaml",
     ["levels[0].efficiency: found 1.2, expected a number ≥ 0.0001 and ≤ 1 (fraction)"]),
    ("efficiency-zero", _set("levels[1].efficiency", 0), "eff0.yaml",
     ["levels[1].efficiency: found 0, expected a number ≥ 0.0001 and ≤ 1"]),
    ("intra-level-missing", _set("device_groups[0].intra_node_level", "nvlnk"), "intra.yaml",
     ["device_groups[0].intra_node_level: found 'nvlnk' (no level of this spec)",
      "expected the name of a scope: node level (nvswitch)"]),
    ("intra-level-cluster", _set("device_groups[0].intra_node_level", "ib"), "intra2.yaml",
     ["device_groups[0].intra_node_level: found 'ib' (a scope: cluster level)"]),
    ("nics-missing", _set("levels[1].nics_per_node", ...), "nics.yaml",
     ["levels[1].nics_per_node: found nothing", "required on the scope: cluster level"]),
    ("nics-on-node-level", _set("levels[0].nics_per_node", 8), "nics2.yaml",
     ["levels[0].nics_per_node: found 8, expected no nics_per_node on a scope: node level"]),
    ("duplicate-group", _duplicate_group, "dup.yaml",
     ["device_groups[1].name: found 'gpu' (a string), expected a name not already used by device_groups[0]"]),
    ("schema-missing", _set("schema_version", ...), "noversion.yaml",
     ["schema_version: found nothing (the key is missing)"]),
    ("schema-unsupported", _set("schema_version", 2), "v2.yaml",
     ["schema_version: found 2, expected 1 (the schema versions this fxplan reads)"]),
    ("unknown-dtype", _set("device_groups[0].peak_tflops.bf32", 300), "dtype.yaml",
     ["device_groups[0].peak_tflops.bf32", "unknown key 'bf32'", "fp32, tf32, bf16, fp16, fp8"]),
    ("negative-peak", _set("device_groups[0].peak_tflops.bf16", -1), "peak.yaml",
     ["device_groups[0].peak_tflops.bf16: found -1, expected a number ≥ 0.001 and ≤ 1,000,000 (dense TFLOP/s)"]),
    ("unknown-op-class", _set("device_groups[0].compute_efficiency", {"matmull": 0.7}), "eff2.yaml",
     ["device_groups[0].compute_efficiency.matmull", "did you mean 'matmul'"]),
    ("reserved-too-big", _set("device_groups[0].reserved_memory_gib", 80), "reserved.yaml",
     ["device_groups[0].reserved_memory_gib: found 80 ≥ memory_gib 80",
      "expected reserved_memory_gib < memory_gib (80 − 80 = 0 GiB would be left for the model)"]),
    ("nodes-without-network", _single_level_two_nodes, "nonet.yaml",
     ["levels: found only scope: node levels but 2 (gpu) = 2 nodes", "expected a scope: cluster level"]),
    ("kind-scope", _set("levels[0].kind", "infiniband"), "kind.yaml",
     ["levels[0].kind: found 'infiniband' (a string), expected for scope: node one of nvlink, nvswitch, pcie, loopback"]),
    ("cluster-level-first", _cluster_first, "order.yaml",
     ["levels[1].scope: found 'node'", "node-scope levels before the cluster-scope level 'ib' (levels[0])"]),
    ("two-cluster-levels", _append_level, "twonet.yaml",
     ["levels[2].scope: found 'cluster'", "one scope: cluster level only"]),
    ("bad-kind", _set("device_groups[0].kind", "tpu"), "tpu.yaml",
     ["device_groups[0].kind: found 'tpu' (a string), expected one of gpu, cpu"]),
    ("bad-name", _set("device_groups[0].name", "gpu.0"), "name.yaml",
     ["device_groups[0].name: found 'gpu.0'", "letters, digits, '_' and '-'"]),
]


@pytest.mark.parametrize("mutate,file_name,fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_file_names_file_path_found_expected(two_level, write_spec, mutate, file_name, fragments):
    mutate(two_level)
    path = write_spec(two_level, file_name)
    with pytest.raises(ClusterSpecError) as err:
        Cluster.load(str(path))
    message = str(err.value)
    assert message.startswith(f"{path}: "), message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_error_is_a_value_error_with_fields(two_level, write_spec):
    two_level["levels"][1]["bandwidth_gb_per_s"] = -25
    path = write_spec(two_level, "fields.yaml")
    with pytest.raises(ValueError) as err:
        Cluster.load(path)
    assert isinstance(err.value, ClusterSpecError)
    assert (err.value.source, err.value.path, err.value.found) == (str(path), "levels[1].bandwidth_gb_per_s", -25)


@pytest.mark.parametrize(
    "text,fragments",
    [
        ("schema_version: 1\nname: a\nname: b\n", ["found the key 'name' twice", "line 3"]),
        ("schema_version: 1\nname: [unclosed\n", ["not valid YAML"]),
        ("- 1\n- 2\n", ["(top level): found a list of 2 items, expected a mapping (a cluster spec)"]),
        ("schema_version: 1\nname: x\ndevice_groups: []\nlevels: []\n",
         ["device_groups: found a list of 0 items, expected a non-empty list"]),
    ],
    ids=["duplicate-yaml-key", "yaml-syntax", "not-a-mapping", "empty-groups"],
)
def test_unparseable_documents(write_spec, text, fragments):
    path = write_spec(text, "raw.yaml")
    with pytest.raises(ClusterSpecError) as err:
        Cluster.load(path)
    message = str(err.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message, message


def test_yaml_exponent_without_dot_gets_a_hint(two_level, write_spec):
    text = write_spec(two_level, "x.yaml").read_text().replace("bandwidth_gb_per_s: 10\n", "bandwidth_gb_per_s: 1e1\n")
    path = write_spec(text, "exp.yaml")
    with pytest.raises(ClusterSpecError, match=r"levels\[1\]\.bandwidth_gb_per_s: found '1e1' \(a string\).*1\.0e3, not 1e3"):
        Cluster.load(path)


def test_python_objects_are_refused_safe_loading(write_spec):
    path = write_spec("!!python/object/apply:os.system ['true']\n", "evil.yaml")
    with pytest.raises(ClusterSpecError, match="not valid YAML"):
        Cluster.load(path)


@pytest.mark.parametrize("key, value", [("bandwidth_gb_per_s", 1e-300), ("efficiency", 1e-300)])
def test_a_vanishing_rate_or_efficiency_is_refused(key: str, value: float) -> None:
    """A rate or efficiency of 1e-300 would price steps of 10^300 s: below the physical floor
    (``MIN_RATE`` GB/s, ``MIN_FRACTION`` of peak) the spec is refused, naming the bound."""
    from fxplan.cluster_specs import Cluster, ClusterSpecError

    spec = Cluster.load("dgx-a100-80g").to_dict()
    spec["levels"][0][key] = value
    with pytest.raises(ClusterSpecError, match=f"levels\\[0\\].{key}: found 1e-300, expected a number ≥"):
        Cluster.from_dict(spec)
