"""``fingerprint()`` is stable (across processes, key order, 80 vs 80.0) and sensitive to what
matters for planning; ``to_dict()`` round-trips through YAML."""

from __future__ import annotations

import pickle
import re
import subprocess
import sys

import pytest
import yaml

from fxplan.cluster_specs import Cluster


def test_stable_across_loads_and_processes():
    here = Cluster.load("dgx-a100-80g:nodes=4").fingerprint()
    assert here == Cluster.load("dgx-a100-80g:nodes=4").fingerprint()
    code = "from fxplan.cluster_specs import Cluster; print(Cluster.load('dgx-a100-80g:nodes=4').fingerprint())"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert other.stdout.strip() == here
    assert re.fullmatch(r"[0-9a-f]{64}", here), here  # a sha256 hex digest


def test_independent_of_key_order_number_spelling_and_name(two_level, write_spec):
    base = Cluster.from_dict(two_level).fingerprint()
    reordered = {key: two_level[key] for key in reversed(list(two_level))}
    reordered["device_groups"] = [dict(reversed(list(g.items()))) for g in two_level["device_groups"]]
    reordered["device_groups"][0]["memory_gib"] = 80.0
    reordered["name"] = "renamed"
    reordered["description"] = "the same hardware"
    assert Cluster.load(write_spec(reordered, "reordered.yaml")).fingerprint() == base


def test_sensitive_to_planning_inputs(two_level):
    base = Cluster.from_dict(two_level).fingerprint()
    changes = [
        ("device_groups", 0, "nodes", 3),
        ("device_groups", 0, "memory_gib", 40),
        ("levels", 0, "efficiency", 0.6),
        ("levels", 1, "nics_per_node", 4),
    ]
    seen = {base}
    for section, index, key, value in changes:
        spec = yaml.safe_load(yaml.safe_dump(two_level))
        spec[section][index][key] = value
        fingerprint = Cluster.from_dict(spec).fingerprint()
        assert fingerprint not in seen, (section, key)
        seen.add(fingerprint)


def test_to_dict_round_trips_through_yaml(write_spec):
    for name in ("hetero-v100-a100", "dgx-h100:nodes=2", "local-cpu"):
        cluster = Cluster.load(name)
        text = yaml.safe_dump(cluster.to_dict(), sort_keys=False, allow_unicode=True)
        again = Cluster.load(write_spec(text, "round.yaml"))
        assert again.to_dict() == cluster.to_dict()
        assert again.fingerprint() == cluster.fingerprint()


def test_to_dict_is_a_copy():
    cluster = Cluster.load("h200-single")
    spec = cluster.to_dict()
    spec["levels"][0]["efficiency"] = 0.1
    assert cluster.to_dict()["levels"][0]["efficiency"] == 0.82


def test_clusters_pickle_and_their_mappings_are_read_only():
    cluster = Cluster.load("hetero-v100-a100")
    cluster.group_links(range(32))
    again = pickle.loads(pickle.dumps(cluster))
    assert again.fingerprint() == cluster.fingerprint() and again.device_groups == cluster.device_groups
    group = cluster.device_groups[1]
    assert hash(group) == hash(again.device_groups[1])
    with pytest.raises(TypeError, match="read-only"):
        group.peak_tflops["bf16"] = 1.0  # type: ignore[index]
