"""``DeviceGroup.host``: the CPU host costs as one optional object, loaded from the device
group's keys of the unchanged schema."""

from __future__ import annotations

import dataclasses

from fxplan.cluster_specs import Cluster, DeviceGroup, HostCosts, available_specs, local_cpu
from fxplan.cluster_specs.host_costs import HOST_FIELDS, split_host


def test_every_builtin_gpu_spec_has_no_host_costs() -> None:
    for name in available_specs():
        cluster = Cluster.load(name)
        for group in cluster.device_groups:
            if group.kind == "gpu":
                assert group.host is None, (name, group.name)


def test_local_cpu_carries_every_host_cost_it_measured(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(local_cpu, "cpu_cores", lambda: 2)   # 4 ranks time-share 2 cores
    host = Cluster.load("local-cpu:devices=2").device_groups[0].host
    assert isinstance(host, HostCosts)
    # every field but the refill (time-shared only) is measured and positive with a core each
    assert all(getattr(host, f) > 0 for f in HOST_FIELDS if f != "switch_refill_us")
    assert host.switch_refill_us == 0.0
    assert Cluster.load("local-cpu:devices=4").device_groups[0].host.switch_refill_us > 0


def test_a_specs_host_keys_still_load_into_the_object() -> None:
    spec = Cluster.load("dgx-a100-80g").to_dict()
    spec["device_groups"][0]["dtensor_op_us"] = 12.5
    spec["device_groups"][0]["ddp_step_us"] = 40.0
    group = Cluster.from_dict(spec).device_groups[0]
    assert group.host == HostCosts(dtensor_op_us=12.5, ddp_step_us=40.0)
    # the schema's keys, not the dataclass's: no host field left on DeviceGroup itself
    assert not set(HOST_FIELDS) & {f.name for f in dataclasses.fields(DeviceGroup)}
    # an override string reaches it the same way
    assert Cluster.load("dgx-a100-80g:a100.view_op_us=3").device_groups[0].host == \
        HostCosts(view_op_us=3.0)


def test_split_host_gives_none_for_all_zero_host_keys() -> None:
    rest, host = split_host({"name": "g", "step_overhead_us": 0.0, "view_op_us": 0})
    assert rest == {"name": "g"} and host is None
    rest, host = split_host({"name": "g", "view_op_us": 2})
    assert host == HostCosts(view_op_us=2.0)


def test_fingerprint_and_round_trip_are_the_specs() -> None:
    """Where the host costs live in memory does not change the spec a plan records."""
    cluster = Cluster.load("local-cpu:devices=2")
    again = Cluster.from_dict(cluster.to_dict())
    assert again.fingerprint() == cluster.fingerprint()
    assert again.device_groups[0].host == cluster.device_groups[0].host
