"""``name:key=value,key=value`` overrides on a spec.

Keys:

- ``nodes=N`` — the number of nodes in total. Device groups keep the proportions of the spec:
  group ``g`` gets ``N × nodes_g / Σ nodes``, which must be whole (``hetero-v100-a100`` has
  2 + 2 nodes, so ``nodes=8`` gives 4 + 4 and ``nodes=3`` is refused).
- ``racks=N`` — on a spec with a domain-scope level (a level whose scope is a number of nodes
  ``s``, e.g. ``gb200-nvl72``'s rack of 18 trays): ``N`` whole domains of its outermost such
  level, i.e. ``nodes=N·s``; not with ``nodes=`` as well.
- ``devices_per_node=N`` — for every device group.
- ``devices=N`` — the number of devices in total, on a spec with one device group of ``d``
  devices per node: ``N ≤ d`` is one node with ``N`` of its devices (a job on part of a node;
  the node's links keep their level and bandwidth, the cluster-scope level then joins
  nothing), ``N > d`` must be a multiple of ``d`` and is ``N / d`` whole nodes. Applied after
  the other keys; with ``nodes=`` also given the two must agree. (``local-cpu`` takes
  ``devices`` itself: its number of CPU ranks.)
- ``NAME.KEY=VALUE`` — one key of the device group or level called ``NAME``
  (``a100.nodes=3``, ``ib-hdr.nics_per_node=4``, ``nvswitch.efficiency=0.7``).

Values are read as YAML scalars; the overridden spec is validated again as a whole, so a bad
value gets the usual schema message.
"""

from __future__ import annotations

import copy
import math
from functools import reduce
from typing import Any

import yaml

from fxplan.cluster_specs.errors import ClusterSpecError

__all__ = ["parse_overrides", "positive_float", "positive_int", "apply_overrides", "with_devices"]

_WHOLE_SPEC_KEYS = ("nodes", "devices_per_node", "devices")
#: Keys that set the size of the whole spec (dropped by :func:`with_devices`).
_SIZE_KEYS = (*_WHOLE_SPEC_KEYS, "racks")


def parse_overrides(text: str, source: str) -> list[tuple[str, Any]]:
    """``"nodes=4,a100.memory_gib=40"`` → ``[("nodes", 4), ("a100.memory_gib", 40)]``."""
    items: list[tuple[str, Any]] = []
    for part in text.split(","):
        key, eq, raw = part.partition("=")
        key, raw = key.strip(), raw.strip()
        if not eq or not key or not raw:
            raise ClusterSpecError(
                source, message=f"found override {part.strip()!r}, expected key=value "
                "(e.g. nodes=4 or a100.memory_gib=40), several separated by commas",
            )
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        if any(key == seen for seen, _ in items):
            raise ClusterSpecError(source, message=f"found override {key!r} given twice, "
                                   "expected each key once")
        items.append((key, value))
    return items


def positive_int(key: str, value: Any, source: str, high: int | None = None) -> int:
    """An override value that must be an integer ≥ 1 (and ≤ ``high``)."""
    if (isinstance(value, bool) or not isinstance(value, int) or value < 1
            or (high is not None and value > high)):
        raise ClusterSpecError(source, key, found=value, expected="an integer ≥ 1" if high is None
                               else f"an integer in 1 … {high:,}")
    return value


def positive_float(key: str, value: Any, source: str) -> float:
    """An override value that must be a number > 0 (a measured rate)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ClusterSpecError(source, key, found=value, expected="a number > 0")
    return float(value)


def _scale_nodes(groups: list[dict], total_new: int, source: str) -> None:
    sizes = [group["nodes"] for group in groups]
    total = sum(sizes)
    step = reduce(math.lcm, (total // math.gcd(total, size) for size in sizes), 1)
    if total_new % step:
        split = " + ".join(f"{s} ({g['name']})" for s, g in zip(sizes, groups))
        raise ClusterSpecError(
            source, "nodes", found=total_new,
            expected=f"a multiple of {step}: nodes scales the device groups in proportion to "
            f"{split} = {total} nodes (or set GROUP.nodes=N for each group)",
        )
    for group in groups:
        group["nodes"] = total_new * group["nodes"] // total


def _set_devices(groups: list[dict], total: int, nodes: int | None, source: str) -> None:
    """``devices=total`` on the one device group (module docstring); ``nodes`` is the
    ``nodes=`` override given with it, if any, which must agree."""
    if len(groups) != 1:
        names = ", ".join(g["name"] for g in groups)
        raise ClusterSpecError(
            source, "devices", found=total,
            expected=f"no devices= override on a spec with {len(groups)} device groups "
            f"({names}): set GROUP.nodes=N and GROUP.devices_per_node=N for each")
    group = groups[0]
    per_node = group["devices_per_node"]
    if total <= per_node:
        new_nodes, new_per_node = 1, total
    elif total % per_node:
        raise ClusterSpecError(
            source, "devices", found=total,
            expected=f"at most {per_node} (part of one node) or a multiple of the "
            f"{per_node} devices per node of {group['name']!r} (whole nodes): {total} = "
            f"{total // per_node}·{per_node} + {total % per_node}")
    else:
        new_nodes, new_per_node = total // per_node, per_node
    if nodes is not None and nodes != new_nodes:
        raise ClusterSpecError(
            source, "devices", found=total,
            expected=f"a device count that agrees with nodes={nodes}: devices={total} with "
            f"{per_node} devices per node is {new_nodes} node{'s' if new_nodes != 1 else ''}"
            f" of {new_per_node}, not {nodes}; give one of nodes= and devices=")
    group["nodes"], group["devices_per_node"] = new_nodes, new_per_node


def _racks_as_nodes(levels: list[dict], items: list[tuple[str, Any]], source: str
                    ) -> list[tuple[str, Any]]:
    """``racks=N`` rewritten as ``nodes=N·s`` (module docstring)."""
    racks = [positive_int(k, v, source) for k, v in items if k == "racks"]
    if not racks:
        return items
    scopes = [level["scope"] for level in levels if isinstance(level["scope"], int)]
    if not scopes:
        raise ClusterSpecError(
            source, "racks", found=racks[0],
            expected="racks= only on a spec with a level whose scope is a number of nodes (a "
            "rack, e.g. gb200-nvl72); this spec has none: give nodes=N")
    if any(k == "nodes" for k, _ in items):
        raise ClusterSpecError(source, "racks", found=racks[0],
                               expected="one of racks= and nodes=, not both")
    return [("nodes", racks[0] * max(scopes)) if k == "racks" else (k, v) for k, v in items]


def apply_overrides(spec: dict[str, Any], items: list[tuple[str, Any]], source: str) -> dict[str, Any]:
    """A copy of ``spec`` (canonical) with ``items`` applied; validate the result afterwards."""
    out = copy.deepcopy(spec)
    items = _racks_as_nodes(out["levels"], items, source)
    groups, levels = out["device_groups"], out["levels"]
    by_name = {entry["name"]: entry for entry in [*groups, *levels]}
    devices = [positive_int(k, v, source) for k, v in items if k == "devices"]
    nodes = [positive_int(k, v, source) for k, v in items if k == "nodes"]
    for key, value in items:
        if key == "devices":
            continue
        if key == "nodes":
            _scale_nodes(groups, positive_int(key, value, source), source)
        elif key == "devices_per_node":
            for group in groups:
                group["devices_per_node"] = positive_int(key, value, source)
        elif "." in key and key.split(".", 1)[0] in by_name:
            name, field = key.split(".", 1)
            by_name[name][field] = value
        else:
            names = ", ".join(f"{name}.KEY" for name in by_name)
            whole = [*_WHOLE_SPEC_KEYS, *(["racks"] if any(
                isinstance(level["scope"], int) for level in levels) else [])]
            raise ClusterSpecError(
                source, key, message=f"found unknown override key {key!r}, expected one of "
                f"{', '.join(whole)}, {names}",
            )
    if devices:
        _set_devices(groups, devices[-1], nodes[-1] if nodes else None, source)
    return out


def with_devices(spec: str, devices: int) -> str:
    """The spec string ``spec`` resized to ``devices`` devices in all: its ``nodes=``,
    ``devices_per_node=`` and ``devices=`` overrides dropped and ``devices=N`` appended (part of
    one node, or whole nodes; see the module docstring). What a job replans for when the
    world it got is not its plan's: ``local-cpu:devices=4`` → ``local-cpu:devices=2``,
    ``dgx-a100-80g:nodes=4`` → ``dgx-a100-80g:devices=24`` (3 nodes of 8)."""
    positive_int("devices", devices, spec)
    base, colon, text = spec.partition(":")
    kept = [part.strip() for part in text.split(",") if colon and part.strip()
            and part.partition("=")[0].strip() not in _SIZE_KEYS]
    return f"{base}:{','.join([*kept, f'devices={devices}'])}"
