"""Import a PaddlePaddle auto-parallel cluster JSON (``paddle.distributed.auto_parallel.Cluster``).

Paddle's format::

    {"alpha_latency": {"base": {"ring": 8.4, "tree": 0}, "intra": {"ring": "NVL", "tree": "PHB"},
                       "inter": {"ring": "NET", "tree": "NET"}, "switch": 10.0},
     "machines": [{"hostname": ..., "addr": ..., "port": ...,
                   "devices": [{"global_id": 0, "local_id": 0, "type": "GPU", "model": "...",
                                "memory": "32", "sp_gflops": "15700", "dp_gflops": "7800"},
                               {"global_id": 9, "type": "NIC", "width": 12.5}, ...],
                   "links": [{"source_global_id": 0, "target_global_id": 1, "type": "NVL",
                              "bandwidth": 235.0}, ...]}]}

Mapping to schema v1:

- accelerators (``GPU``, ``XPU``, ``NPU``, ``DCU``) are the ranks, in machine order; CPUs are
  not ranks. Consecutive machines with the same accelerators, links and NICs form one device
  group. ``memory`` (GB) becomes ``memory_gib``; ``sp_gflops / 1000`` becomes
  ``peak_tflops.fp32``. Paddle gives no bf16/fp16 peak nor memory bandwidth: they come from the
  built-in spec whose device model matches (``V100-SXM2-32GB`` …); an unknown model is an error.
- the slowest accelerator–accelerator link of a machine is its intra-node level (``nvlink`` if
  all are ``NVL``/``NVB``, else ``pcie``; no link listed: ``pcie`` at Paddle's default 24 GB/s).
  Its latency is ``alpha_latency.intra.ring`` (µs, or a link type: NVL 3.4, PHB 5.7 — Paddle's
  own defaults).
- ``NIC`` devices give ``nics_per_node`` and the per-NIC bandwidth (``width``, GB/s; none listed:
  one NIC at Paddle's default 24 GB/s). The cluster-scope level's latency is
  ``alpha_latency.inter.ring`` (NET: 9.6) plus ``alpha_latency.switch`` (10.0). ``base``
  latencies are per collective, which schema v1 does not hold; they are dropped.
- Paddle's bandwidths are what its cost model uses as achieved rates, so every efficiency is 1.
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from itertools import groupby
from pathlib import Path
from typing import Any

from fxplan.cluster_specs.documents import BUILTIN_DIR, read_document
from fxplan.cluster_specs.errors import ClusterSpecError
from fxplan.cluster_specs.schema import validate

ACCELERATOR_TYPES = ("GPU", "XPU", "NPU", "DCU")
#: Paddle's CommContext defaults (µs) for link types named in ``alpha_latency``.
_LINK_TYPE_LATENCY_US = {"NVL": 3.4, "PHB": 5.7, "NET": 9.6}
_DEFAULT_SWITCH_US = 10.0
_DEFAULT_LINK_GB_PER_S = 24.0  # Paddle's Link.default_nic_bandwith
_NVLINK_TYPES = ("NVL", "NVB")
#: Keys of a built-in device group that Paddle's format does not carry.
_BORROWED = ("memory_bandwidth_gb_per_s", "peak_tflops", "reserved_memory_gib",
             "kernel_launch_us", "compute_efficiency")


def _alnum(text: str) -> str:
    return re.sub(r"[^A-Z0-9]", "", text.upper())


def _number(value: Any, source: str, path: str, unit: str, *, zero_ok: bool = False) -> float:
    """Paddle writes numbers as numbers or numeric strings ("32"); > 0 (``zero_ok``: ≥ 0)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    ok = number >= 0 if zero_ok else number > 0
    if isinstance(value, bool) or not (ok and math.isfinite(number)):
        relation = "≥" if zero_ok else ">"
        raise ClusterSpecError(source, path, found=value, expected=f"a number {relation} 0 ({unit})")
    return number


def _list(container: Any, key: str, source: str, path: str, *, required: bool = True) -> list:
    value = container.get(key) if isinstance(container, dict) else None
    if value is None and not required:
        return []
    if not isinstance(value, list) or (required and not value):
        raise ClusterSpecError(source, f"{path}.{key}" if path else key, found=value,
                               expected="a non-empty list")
    return value


def _known_devices() -> list[dict[str, Any]]:
    """Device groups of the built-in YAML specs (their numbers fill what Paddle lacks)."""
    out = []
    for path in sorted(BUILTIN_DIR.glob("*.yaml")):
        out.extend(read_document(path, str(path))["device_groups"])
    return out


def _match_device(model: str, memory: float, source: str, path: str) -> dict[str, Any]:
    """The built-in device group for ``model``: exact model name, else same family and memory."""
    wanted, known = _alnum(model), _known_devices()
    for group in known:
        if _alnum(group["model"]) in wanted:
            return group
    family = [g for g in known if _alnum(g["model"].split("-")[0]) in wanted]
    for group in family:
        if group["memory_gib"] == memory:
            return group
    if family:
        return family[0]
    models = sorted({g["model"] for g in known})
    raise ClusterSpecError(
        source, path, found=model,
        expected=f"a device model fxplan knows ({', '.join(models)}); for another device "
        "write a schema-v1 YAML file (docs/cluster_specs.md)",
    )


def _latency(alpha: dict, section: str, default: float, source: str) -> float:
    part = alpha.get(section)
    value = part.get("ring") if isinstance(part, dict) else None
    if value is None:
        return default
    if isinstance(value, str) and value in _LINK_TYPE_LATENCY_US:
        return _LINK_TYPE_LATENCY_US[value]
    return _number(value, source, f"alpha_latency.{section}.ring", "µs, or NVL, PHB, NET", zero_ok=True)


def _check_ids(devices: list, links: list, source: str, path: str) -> None:
    """Every device of a machine has its own ``global_id`` and every link joins two of them:
    a duplicate id or a link to a device the machine does not list is refused, as a negative
    bandwidth is (dropping the link would silently change the intra-node level)."""
    seen: dict[Any, int] = {}
    for k, device in enumerate(devices):
        if not isinstance(device, dict):
            continue
        gid = device.get("global_id")
        if gid in seen:
            raise ClusterSpecError(source, f"{path}.devices[{k}].global_id", found=gid,
                                   expected=f"an id no other device has (devices[{seen[gid]}] "
                                   "has it already)")
        seen[gid] = k
    for k, link in enumerate(links):
        if not isinstance(link, dict):
            raise ClusterSpecError(source, f"{path}.links[{k}]", found=link,
                                   expected="an object with source_global_id, target_global_id, "
                                   "type and bandwidth")
        for end in ("source_global_id", "target_global_id"):
            if link.get(end) not in seen:
                raise ClusterSpecError(source, f"{path}.links[{k}].{end}", found=link.get(end),
                                       expected="the global_id of a device listed in "
                                       f"{path}.devices ({', '.join(map(str, seen))})")


def _machine(machine: Any, i: int, alpha: dict, source: str) -> dict[str, Any]:
    """One machine's accelerators, intra-node link and NICs, as plain values."""
    path = f"machines[{i}]"
    devices = _list(machine, "devices", source, path)
    accel = [(j, d) for j, d in enumerate(devices)
             if isinstance(d, dict) and d.get("type") in ACCELERATOR_TYPES]
    if not accel:
        raise ClusterSpecError(source, f"{path}.devices", found=devices,
                               expected=f"at least one accelerator (type {', '.join(ACCELERATOR_TYPES)})")
    j, first = accel[0]
    model = str(first.get("model", "")).strip()
    memory = _number(first.get("memory"), source, f"{path}.devices[{j}].memory", "GB")
    for k, other in accel[1:]:
        if str(other.get("model", "")).strip() != model:
            raise ClusterSpecError(source, f"{path}.devices[{k}].model", found=other.get("model"),
                                   expected=f"{model!r} like the machine's other accelerators")
    ids = {d.get("global_id") for _, d in accel}
    links = _list(machine, "links", source, path, required=False)
    _check_ids(devices, links, source, path)
    pairs = [(k, link) for k, link in enumerate(links)
             if isinstance(link, dict)
             and link.get("source_global_id") in ids and link.get("target_global_id") in ids]
    if pairs:
        kind = "nvlink" if all(link.get("type") in _NVLINK_TYPES for _, link in pairs) else "pcie"
        bandwidth = min(_number(link.get("bandwidth"), source, f"{path}.links[{k}].bandwidth", "GB/s")
                        for k, link in pairs)
    else:
        kind, bandwidth = "pcie", _DEFAULT_LINK_GB_PER_S
    nics = [(k, d) for k, d in enumerate(devices) if isinstance(d, dict) and d.get("type") == "NIC"]
    widths = [_number(d.get("width"), source, f"{path}.devices[{k}].width", "GB/s") for k, d in nics]
    sp_gflops = first.get("sp_gflops")
    fp32 = _number(sp_gflops, source, f"{path}.devices[{j}].sp_gflops", "GFLOP/s") / 1000 if sp_gflops else None
    link_type = "NVL" if kind == "nvlink" else "PHB"
    return {
        "model": model, "memory": memory, "count": len(accel), "kind": kind, "bandwidth": bandwidth,
        "latency": _latency(alpha, "intra", _LINK_TYPE_LATENCY_US[link_type], source), "fp32": fp32,
        "nics": len(nics) or 1, "nic_width": min(widths, default=_DEFAULT_LINK_GB_PER_S),
        "device_path": f"{path}.devices[{j}].model",
    }


def _slug(model: str) -> str:
    words = [w for w in re.split(r"[^a-z0-9]+", model.lower()) if w and w not in ("tesla", "nvidia")]
    return "-".join(words) or "accelerator"


def _signature(machine: dict[str, Any]) -> tuple:
    """Machines with equal signatures (all but where they were read) share a device group."""
    return tuple(value for key, value in machine.items() if key != "device_path")


def _group_and_level(run: list[dict[str, Any]], name: str, source: str) -> tuple[dict, dict]:
    """The device group and intra-node level for a run of identical machines."""
    m = run[0]
    known = _match_device(m["model"], m["memory"], source, m["device_path"])
    group = {"name": name, "kind": "gpu", "model": m["model"], "nodes": len(run),
             "devices_per_node": m["count"], "memory_gib": m["memory"],
             "intra_node_level": f"{name}-{m['kind']}", "nics_per_node": m["nics"]}
    group.update({key: known[key] for key in _BORROWED if key in known})
    if m["fp32"]:
        group["peak_tflops"] = {**group["peak_tflops"], "fp32": m["fp32"]}
    level = {"name": group["intra_node_level"], "kind": m["kind"], "scope": "node",
             "bandwidth_gb_per_s": m["bandwidth"], "latency_us": m["latency"], "efficiency": 1.0}
    return group, level


def paddle_to_spec(document: Any, source: str, *, name: str | None = None) -> dict[str, Any]:
    """The canonical schema-v1 spec for a Paddle cluster document (see the module docstring)."""
    if not isinstance(document, dict):
        raise ClusterSpecError(source, "(top level)", found=document, expected="a mapping with machines")
    alpha = document.get("alpha_latency") or {}
    if not isinstance(alpha, dict):
        raise ClusterSpecError(source, "alpha_latency", found=alpha,
                               expected="a mapping (inter, intra, base, switch)")
    machines = [_machine(m, i, alpha, source) for i, m in enumerate(_list(document, "machines", source, ""))]
    groups, levels, names = [], [], Counter()
    for _, run in groupby(machines, key=_signature):
        run = list(run)
        slug = _slug(run[0]["model"])
        names[slug] += 1
        group, level = _group_and_level(run, slug if names[slug] == 1 else f"{slug}-{names[slug]}", source)
        groups.append(group)
        levels.append(level)
    if len(machines) > 1:
        switch = alpha.get("switch", _DEFAULT_SWITCH_US)
        levels.append({
            "name": "network", "kind": "ethernet", "scope": "cluster",
            "bandwidth_gb_per_s": min(m["nic_width"] for m in machines),
            "nics_per_node": Counter(g["nics_per_node"] for g in groups).most_common(1)[0][0],
            "latency_us": _latency(alpha, "inter", _LINK_TYPE_LATENCY_US["NET"], source)
            + _number(switch, source, "alpha_latency.switch", "µs", zero_ok=True),
            "efficiency": 1.0,
        })
    for group in groups:
        if len(machines) == 1 or group["nics_per_node"] == levels[-1]["nics_per_node"]:
            del group["nics_per_node"]
    spec = {
        "schema_version": 1,
        "name": name or document.get("name") or Path(source).stem,
        "description": f"imported from PaddlePaddle cluster JSON {source} ({len(machines)} machines)",
        "device_groups": groups,
        "levels": levels,
    }
    return validate(spec, source)


def read_paddle_json(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a Paddle cluster JSON file and import it into our schema (validated)."""
    source = os.fspath(path)
    return paddle_to_spec(read_document(Path(source), source), source)
