"""Cluster spec schema v1: the keys, their units, and the checks that tie them together.

:func:`validate` takes what ``yaml.safe_load`` returned and gives back the *canonical* spec:
every key in schema order, optional keys filled with their defaults, numbers as ``float``
(counts as ``int``). The canonical spec is what ``Cluster.to_dict()`` returns and what
``Cluster.fingerprint()`` hashes, so ``80`` and ``80.0`` or a different key order in the file
give the same cluster.

Checks, in the order they run (the first failure is reported):

1. the document is a mapping; ``schema_version`` is present and supported;
2. each key of the document, of each ``device_groups[i]`` and of each ``levels[j]`` is known,
   required keys are present, each value has its type and range (numbers > 0, efficiencies
   in (0, 1], latencies ≥ 0, ``peak_tflops`` keys among fp32/tf32/bf16/fp16/fp8, ...);
3. names are unique among device groups and among levels;
4. levels: a scope of ``node`` (or 1), a whole number of nodes ``s ≥ 2`` (a domain level,
   e.g. a rack of 18 trays) or ``cluster`` (or ``all``); a kind that fits the scope; node-scope
   levels first, then domain levels in increasing scope, each a multiple of the one before
   (domains nest), then the cluster-scope level; at most one cluster-scope level;
   ``nics_per_node`` on the cluster-scope level and only there;
5. device groups: ``intra_node_level`` names a node-scope level; ``reserved_memory_gib <
   memory_gib``; ``nics_per_node`` only when there is a cluster-scope level;
6. every node-scope level is some group's ``intra_node_level``; a domain level needs a spec of
   one device group (its domains count that group's nodes); more nodes than the largest
   domain holds (more than one node without a domain level) need a cluster-scope level.
"""

from __future__ import annotations

from typing import Any

from fxplan.cluster_specs.devices import DEVICE_KINDS, DTYPES
from fxplan.cluster_specs.errors import ClusterSpecError
from fxplan.cluster_specs.fields import (
    Field,
    check_mapping,
    boolean,
    choice,
    integer,
    number,
    number_map,
    optional,
    text,
)
from fxplan.cluster_specs.links import COLLECTIVE_KINDS, LEVEL_KINDS, SCOPES, scope_class
from fxplan.core.bounds import MAX_DEVICES, MAX_DEVICES_PER_NODE, MAX_MEMORY_GIB, MAX_NODES

SCHEMA_VERSION = 1
SUPPORTED_VERSIONS: tuple[int, ...] = (1,)

#: Keys of ``compute_efficiency``: the capture's op classes, the cost model's family ``memory``
#: (the memory-bound op classes together), and ``memory_bound`` (a fraction of
#: ``memory_bandwidth_gb_per_s`` rather than of a peak, for any op limited by memory).
OP_CLASSES: tuple[str, ...] = (
    "matmul", "attention", "conv", "memory_bound", "memory", "elementwise", "norm", "softmax",
    "embedding", "reduction", "view", "loss", "pool", "dropout", "other",
)

_ALL_LEVEL_KINDS = tuple(dict.fromkeys(kind for kinds in LEVEL_KINDS.values() for kind in kinds))
#: Rates (GB/s, TFLOP/s) and latencies (µs) beyond any device: 10⁶ GB/s is a thousand times
#: HBM3e, 10⁶ TFLOP/s an exaflop per device, 10⁶ µs a second per hop or kernel.
MAX_RATE = 1e6
#: The slowest rate (GB/s, TFLOP/s) and the smallest efficiency a spec may state: a thousandth of
#: a GB/s and a ten-thousandth of peak are far below any device, yet keep every price finite and
#: printable (a rate of 1e-300 would price steps of 10^300 s).
MIN_RATE = 1e-3
MIN_FRACTION = 1e-4
MAX_LATENCY_US = 1e6
_FRACTION = number(low=MIN_FRACTION, low_open=False, high=1.0, unit="fraction")


def _microseconds(unit: str) -> Field:
    """A time in µs, from 0 to :data:`MAX_LATENCY_US` (host work, hop latencies)."""
    return number(low=0, low_open=False, high=MAX_LATENCY_US, unit=unit)


def _host_us(unit: str) -> Field:
    """An optional host-work time in µs of a device group, 0 when absent (the GPU specs)."""
    return optional(_microseconds(unit), 0.0)


def _version(value: Any, source: str, path: str) -> int:
    if isinstance(value, bool) or value not in SUPPORTED_VERSIONS:
        raise ClusterSpecError(
            source, path, found=value,
            expected=f"{' or '.join(map(str, SUPPORTED_VERSIONS))} (the schema versions this fxplan reads)",
        )
    return int(value)


_SCOPE_EXPECTED = (
    "node (or 1: the devices of one node), cluster (or all: every node), or a whole number of "
    f"nodes from 2 to {MAX_NODES:,} that the level joins into one domain (18: a rack of 18 "
    "trays, as in a GB200 NVL72)")


def _scope(value: Any, source: str, path: str) -> str | int:
    """A level's scope in canonical form: ``"node"``, ``"cluster"`` or an integer ``≥ 2``."""
    if value == "all":
        return "cluster"
    if isinstance(value, str) and value in SCOPES:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_NODES:
        return "node" if value == 1 else value
    raise ClusterSpecError(source, path, found=value, expected=_SCOPE_EXPECTED)


def _items(what: str) -> Field:
    """A non-empty list (its items are checked by the caller)."""
    expected = f"a non-empty list ({what})"

    def check(value: Any, source: str, path: str) -> list:
        if not isinstance(value, list) or not value:
            raise ClusterSpecError(source, path, found=value, expected=expected)
        return value

    return Field(check, expected)


TOP_FIELDS: dict[str, Field] = {
    "schema_version": Field(_version, "1 (the schema version)"),
    "name": text(what="the cluster's name"),
    "description": optional(text(what="free text", empty_ok=True), ""),
    "device_groups": _items("device groups, each a mapping"),
    "levels": _items("link levels, innermost first, each a mapping"),
}

GROUP_FIELDS: dict[str, Field] = {
    "name": text(what="the device group's name", name=True),
    "kind": choice(DEVICE_KINDS, what="device kind"),
    "model": text(what="device model, e.g. A100-SXM4-80GB"),
    "nodes": integer(low=1, high=MAX_NODES, unit="nodes of this group"),
    "devices_per_node": integer(low=1, high=MAX_DEVICES_PER_NODE, unit="devices in each node"),
    "memory_gib": number(low=0, low_open=True, high=MAX_MEMORY_GIB, unit="GiB per device"),
    "reserved_memory_gib": optional(number(low=0, low_open=False, high=MAX_MEMORY_GIB,
                                           unit="GiB per device"), 0.0),
    "memory_bandwidth_gb_per_s": number(low=MIN_RATE, low_open=False, high=MAX_RATE,
                                        unit="GB/s per device"),
    "peak_tflops": number_map(
        DTYPES, number(low=MIN_RATE, low_open=False, high=MAX_RATE, unit="dense TFLOP/s"),
        what="peak per dtype",
        nonempty=True,
    ),
    "intra_node_level": text(what="name of the scope: node level joining a node's devices"),
    "compute_efficiency": optional(
        number_map(OP_CLASSES, _FRACTION, what="fraction of peak per op class", nonempty=False), {}
    ),
    # A spec whose peak and bandwidth are measured reference rates (local-cpu: a 1024³ matmul,
    # a copy through DRAM) may state backward kernels that beat them: an elementwise backward
    # in cache runs faster than a DRAM copy. Up to 4× the reference.
    "backward_efficiency": optional(
        number_map(OP_CLASSES, number(low=0.0, low_open=True, high=4.0,
                                      unit="fraction of the reference rate"),
                   what="efficiency per op class of backward kernels", nonempty=False), {}
    ),
    "kernel_launch_us": _host_us("µs per kernel"),
    "step_overhead_us": _host_us("µs per training step"),
    "fused_attention": optional(boolean(
        what="whether attention runs as one fused (flash) kernel on these devices; "
             "cost_model.attention_kernel prices it so"), False),
    "dtensor_op_us": _host_us("µs per forward op on a DTensor"),
    "dtensor_backward_op_us": _host_us("µs per backward of an op on a DTensor"),
    "dtensor_view_op_us": _host_us("µs per view op on a DTensor"),
    "dtensor_redistribute_us": _host_us(
        "µs of host work per tensor-parallel collective issued by DTensor"),
    "dtensor_local_redistribute_us": _host_us(
        "µs of host work per DTensor redistribution that communicates nothing"),
    "dtensor_from_local_us": _host_us(
        "µs per local tensor wrapped as a DTensor by a tensor-parallel style"),
    "dtensor_to_local_backward_us": _host_us(
        "µs per backward of a DTensor handed on as a local tensor"),
    "optimizer_tensor_us": _host_us("µs per parameter tensor per optimizer step"),
    "view_op_us": _host_us("µs of host work per view node, forward"),
    "view_backward_op_us": _host_us("µs of host work per view node, backward"),
    "first_touch_us_per_mib": _host_us(
        "µs per MiB of saved activations faulted in again each microbatch"),
    "switch_refill_us": _host_us(
        "µs of CPU refilling a rank's caches after another rank ran on its core"),
    "queued_collective_us": _host_us(
        "µs per further collective of an async batch (0: a full collective)"),
    "ddp_step_us": optional(_microseconds("µs of DDP host work per training step")),
    "ddp_tensor_us": optional(_microseconds("µs of DDP host work per parameter tensor and step")),
    "pipeline_step_us": optional(_microseconds(
        "µs of the pipeline runtime's host work per step and stage (pp > 1)")),
    "pipeline_microbatch_us": optional(_microseconds(
        "µs of the pipeline runtime's host work per microbatch and stage (pp > 1)")),
    **{f"fsdp_{what}{part}_us": optional(_microseconds(
        f"µs of FSDP2 host work per fully_shard group{per}: {doc}"))
       for what, doc in (("gather", "unshard and hooks, per microbatch"),
                         ("reduce", "post-backward reduce, per step"),
                         ("regather", "ZeRO-3's reshard and re-gather, per microbatch"))
       for part, per in (("", ""), ("_tensor", " and parameter tensor"))},
    "dtensor_optimizer_tensor_us": _host_us("µs per DTensor parameter tensor per optimizer step"),
    "comm_overlap": optional(number(low=0.0, low_open=False, high=1.0,
                                    unit="fraction of a collective that overlaps compute"), 1.0),
    "ddp_bucket_mib": optional(number(low=0, low_open=False, high=MAX_MEMORY_GIB * 1024,
                                      unit="MiB per DDP gradient bucket (0: one per segment)"),
                               0.0),
    "nics_per_node": optional(integer(low=1, high=MAX_DEVICES_PER_NODE,
                                      unit="NICs per node, overriding the cluster-scope level's")),
    "host_memory_gib": optional(number(low=0, low_open=True, high=MAX_MEMORY_GIB,
                                       unit="GiB of host memory per node")),
    "host_memory_bandwidth_gb_per_s": optional(number(low=MIN_RATE, low_open=False, high=MAX_RATE,
                                                      unit="GB/s of host memory per node")),
    "host_link_gb_per_s": optional(number(low=MIN_RATE, low_open=False, high=MAX_RATE,
                                          unit="GB/s host↔device per device and direction")),
    "sm_count": optional(integer(low=1, high=4096, unit="streaming multiprocessors per device")),
    "cuda_context_gib": optional(number(low=0, low_open=False, high=MAX_MEMORY_GIB,
                                        unit="GiB a GPU process holds before its first tensor")),
}

LEVEL_FIELDS: dict[str, Field] = {
    "name": text(what="the level's name", name=True),
    "kind": choice(_ALL_LEVEL_KINDS, what="link technology"),
    "scope": Field(_scope, _SCOPE_EXPECTED),
    "bandwidth_gb_per_s": number(
        low=MIN_RATE, low_open=False, high=MAX_RATE,
        unit="GB/s per direction, per device (node, domain) or per NIC (cluster)"
    ),
    "latency_us": _microseconds("µs per hop"),
    "efficiency": _FRACTION,
    "nics_per_node": optional(integer(low=1, high=MAX_DEVICES_PER_NODE, unit="NICs per node")),
    "allreduce_bandwidth_gb_per_s": optional(
        number(low=MIN_RATE, low_open=False, high=MAX_RATE,
               unit="GB/s all-reduce bus bandwidth with in-network reduction")
    ),
    "reduce_scatter_as_all_reduce": optional(boolean(
        what="whether the backend runs a reduce-scatter as an all-reduce of its whole input "
             "(gloo); cost_model.collectives prices it so")),
    "step_cpu_us": optional(number_map(
        COLLECTIVE_KINDS, _microseconds("µs of CPU per rank and algorithm step"),
        what="per collective kind, each rank's CPU per step beyond the hop latency (gloo)",
        nonempty=False)),
}


def validate(data: Any, source: str) -> dict[str, Any]:
    """Check a loaded spec and return its canonical form; raise ``ClusterSpecError``."""
    if isinstance(data, dict) and "schema_version" in data:
        _version(data["schema_version"], source, "schema_version")
    spec = check_mapping(data, TOP_FIELDS, source, "", what="a cluster spec")
    spec["levels"] = [
        check_mapping(item, LEVEL_FIELDS, source, f"levels[{j}]", what="a link level")
        for j, item in enumerate(spec["levels"])
    ]
    spec["device_groups"] = [
        check_mapping(item, GROUP_FIELDS, source, f"device_groups[{i}]", what="a device group")
        for i, item in enumerate(spec["device_groups"])
    ]
    _unique_names(spec["device_groups"], "device_groups", source)
    _unique_names(spec["levels"], "levels", source)
    _check_levels(spec["levels"], source)
    _check_groups(spec["device_groups"], spec["levels"], source)
    _check_whole(spec, source)
    # Canonical key order: as the tables list them.
    return {key: spec[key] for key in TOP_FIELDS if key in spec}


def _unique_names(items: list[dict], section: str, source: str) -> None:
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        if item["name"] in first:
            raise ClusterSpecError(
                source, f"{section}[{i}].name", found=item["name"],
                expected=f"a name not already used by {section}[{first[item['name']]}]",
            )
        first[item["name"]] = i


def _check_levels(levels: list[dict], source: str) -> None:
    cluster_level: int | None = None
    last_domain: int | None = None
    for j, level in enumerate(levels):
        path, scope = f"levels[{j}]", level["scope"]
        kind_of_scope = scope_class(scope)
        if level["kind"] not in LEVEL_KINDS[kind_of_scope]:
            shown = f"{scope} (a domain of nodes)" if kind_of_scope == "domain" else scope
            raise ClusterSpecError(
                source, f"{path}.kind", found=level["kind"],
                expected=f"for scope: {shown} one of {', '.join(LEVEL_KINDS[kind_of_scope])}",
            )
        if kind_of_scope != "cluster":
            if cluster_level is not None:
                raise ClusterSpecError(
                    source, f"{path}.scope", found=scope,
                    expected=f"{kind_of_scope}-scope levels before the cluster-scope level "
                    f"{levels[cluster_level]['name']!r} (levels[{cluster_level}]): innermost first",
                )
            if "nics_per_node" in level:
                raise ClusterSpecError(
                    source, f"{path}.nics_per_node", found=level["nics_per_node"],
                    expected=f"no nics_per_node on a scope: {scope} level "
                    "(NICs belong to the scope: cluster level)",
                )
            if kind_of_scope == "node":
                if last_domain is not None:
                    raise ClusterSpecError(
                        source, f"{path}.scope", found=scope,
                        expected=f"node-scope levels before the domain level "
                        f"{levels[last_domain]['name']!r} (levels[{last_domain}]): innermost first")
                continue
            if last_domain is not None:
                inner = levels[last_domain]["scope"]
                if scope <= inner or scope % inner:
                    raise ClusterSpecError(
                        source, f"{path}.scope", found=scope,
                        expected=f"a multiple of {inner} larger than it: the domains of "
                        f"{levels[last_domain]['name']!r} (levels[{last_domain}], {inner} nodes "
                        "each) must nest in this level's, innermost first")
            last_domain = j
            continue
        if cluster_level is not None:
            raise ClusterSpecError(
                source, f"{path}.scope", found=scope,
                expected=f"one scope: cluster level only (levels[{cluster_level}] "
                f"{levels[cluster_level]['name']!r} is one already; schema v1 has one level across nodes)",
            )
        cluster_level = j
        if "nics_per_node" not in level:
            raise ClusterSpecError.missing(
                source, f"{path}.nics_per_node",
                "an integer ≥ 1 (NICs per node; required on the scope: cluster level)",
            )


def _check_groups(groups: list[dict], levels: list[dict], source: str) -> None:
    scope_of = {level["name"]: level["scope"] for level in levels}
    node_levels = [name for name, scope in scope_of.items() if scope == "node"]
    has_cluster_level = "cluster" in scope_of.values()
    for i, group in enumerate(groups):
        path, intra = f"device_groups[{i}]", group["intra_node_level"]
        if scope_of.get(intra) != "node":
            what = "a scope: cluster level" if intra in scope_of else "no level of this spec"
            raise ClusterSpecError(
                source, f"{path}.intra_node_level",
                message=f"found {intra!r} ({what}), expected the name of a scope: node level "
                f"({', '.join(node_levels) or 'none is defined'})",
            )
        memory, reserved = group["memory_gib"], group["reserved_memory_gib"]
        if reserved >= memory:
            raise ClusterSpecError(
                source, f"{path}.reserved_memory_gib",
                message=f"found {reserved:g} ≥ memory_gib {memory:g}, expected reserved_memory_gib "
                f"< memory_gib ({memory:g} − {reserved:g} = {memory - reserved:g} GiB would be left "
                "for the model)",
            )
        if "nics_per_node" in group and not has_cluster_level:
            raise ClusterSpecError(
                source, f"{path}.nics_per_node", found=group["nics_per_node"],
                expected="no nics_per_node when no scope: cluster level is defined",
            )


def _check_whole(spec: dict[str, Any], source: str) -> None:
    groups, levels = spec["device_groups"], spec["levels"]
    used = {group["intra_node_level"] for group in groups}
    for j, level in enumerate(levels):
        if level["scope"] == "node" and level["name"] not in used:
            raise ClusterSpecError(
                source, f"levels[{j}].name", found=level["name"],
                expected="a scope: node level that some device group names as intra_node_level "
                f"(they name {', '.join(sorted(used))})",
            )
    domains = [(j, level) for j, level in enumerate(levels) if scope_class(level["scope"]) == "domain"]
    if domains and len(groups) > 1:
        j, level = domains[0]
        raise ClusterSpecError(
            source, f"levels[{j}].scope", found=level["scope"],
            expected=f"a domain level only on a spec of one device group (this one has "
            f"{len(groups)}: {', '.join(g['name'] for g in groups)}); a domain counts the nodes "
            "of one kind of device, so give each kind its own spec")
    nodes = [group["nodes"] for group in groups]
    devices = sum(group["nodes"] * group["devices_per_node"] for group in groups)
    if devices > MAX_DEVICES:
        raise ClusterSpecError(
            source, "device_groups",
            message=f"found {devices:,} devices in all (Σ nodes × devices_per_node), expected at "
            f"most {MAX_DEVICES:,} (fxplan.core.bounds: ten times the largest clusters built)")
    widest = max((level["scope"] for _, level in domains), default=1)
    if sum(nodes) > widest and not any(level["scope"] == "cluster" for level in levels):
        split = " + ".join(f"{n} ({g['name']})" for n, g in zip(nodes, groups))
        within = "node" if widest == 1 else f"node and {widest}-node domain"
        raise ClusterSpecError(
            source, "levels",
            message=f"found only scope: {within} levels but {split} = {sum(nodes)} nodes, "
            "expected a scope: cluster level (with nics_per_node) joining the nodes",
        )
