"""``name:key=value,key=value`` overrides on a spec.

Keys:

- ``nodes=N`` — the number of nodes in total. Device groups keep the proportions of the spec:
  group ``g`` gets ``N × nodes_g / Σ nodes``, which must be whole (``hetero-v100-a100`` has
  2 + 2 nodes, so ``nodes=8`` gives 4 + 4 and ``nodes=3`` is refused).
- ``devices_per_node=N`` — for every device group.
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

_WHOLE_SPEC_KEYS = ("nodes", "devices_per_node")


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
        items.append((key, value))
    return items


def positive_int(key: str, value: Any, source: str) -> int:
    """An override value that must be an integer ≥ 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ClusterSpecError(source, key, found=value, expected="an integer ≥ 1")
    return value


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


def apply_overrides(spec: dict[str, Any], items: list[tuple[str, Any]], source: str) -> dict[str, Any]:
    """A copy of ``spec`` (canonical) with ``items`` applied; validate the result afterwards."""
    out = copy.deepcopy(spec)
    groups, levels = out["device_groups"], out["levels"]
    by_name = {entry["name"]: entry for entry in [*groups, *levels]}
    for key, value in items:
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
            raise ClusterSpecError(
                source, key, message=f"found unknown override key {key!r}, expected one of "
                f"{', '.join(_WHOLE_SPEC_KEYS)}, {names}",
            )
    return out
