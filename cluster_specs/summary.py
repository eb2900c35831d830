"""Readable summaries of a ``Cluster`` with ``rich`` tables (imported only when shown)."""

from __future__ import annotations

import io
from typing import Any, Mapping, Protocol, Sequence

from fxplan.cluster_specs.devices import DeviceGroup
from fxplan.cluster_specs.links import LinkLevel


class Described(Protocol):
    """What a summary shows of a cluster (:class:`~fxplan.cluster_specs.Cluster` is one)."""

    name: str
    description: str
    num_devices: int
    num_nodes: int
    device_groups: Sequence[DeviceGroup]
    levels: Sequence[LinkLevel]

    def fingerprint(self) -> str: ...


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:g}"


def _pairs(mapping: Mapping[str, float]) -> str:
    return " ".join(f"{key}={value:g}" for key, value in mapping.items()) or "–"


def _scope(level: LinkLevel, nodes: int) -> str:
    """``node``, ``cluster``, or a domain level's ``18 nodes (4 domains)``."""
    if not level.domain_nodes:
        return level.scope_text()
    count = -(-nodes // level.domain_nodes)
    return f"{level.scope_text()} ({count} domain{'s' if count != 1 else ''})"


def _table(title: str, columns: tuple[str, ...]) -> Any:
    """A table whose first column (a name) never wraps and whose others fold."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for i, column in enumerate(columns):
        table.add_column(column, no_wrap=i == 0, overflow="fold")
    return table


def renderable(cluster: Described) -> Any:
    """A ``rich`` renderable: a heading, the device-group table and the level table."""
    from rich.console import Group
    from rich.text import Text

    heading = Text.assemble(
        (cluster.name, "bold"),
        f" — {cluster.num_devices} devices on {cluster.num_nodes} node"
        f"{'s' if cluster.num_nodes != 1 else ''}; fingerprint {cluster.fingerprint()[:12]}",
    )
    parts: list[Any] = [heading]
    if cluster.description:
        parts.append(Text(cluster.description, style="dim"))

    groups = _table("device groups", ("group", "model", "ranks", "nodes × devices",
                                      "memory GiB (reserved)", "mem GB/s", "peak TFLOP/s",
                                      "intra-node level"))
    defaults = _table("cost-model starting values",
                      ("group", "kernel launch µs", "compute efficiency (fraction of peak)",
                       "attention"))
    for g in cluster.device_groups:
        last = g.first_rank + g.num_devices - 1
        groups.add_row(
            g.name, f"{g.model} ({g.kind})", f"{g.first_rank}–{last}",
            f"{g.nodes} × {g.devices_per_node}", f"{g.memory_gib:g} ({g.reserved_memory_gib:g})",
            f"{g.memory_bandwidth_gb_per_s:g}", _pairs(g.peak_tflops), g.intra_node_level,
        )
        defaults.add_row(g.name, f"{g.kernel_launch_us:g}", _pairs(g.compute_efficiency),
                         "fused (flash) kernel" if g.fused_attention else "op by op")
    levels = _table("link levels (innermost first)",
                    ("level", "kind", "scope", "GB/s per dir.", "NICs/node", "efficiency",
                     "effective GB/s", "latency µs", "all-reduce GB/s"))
    for lv in cluster.levels:
        nics = _num(lv.nics_per_node)
        overrides = [f"{g.name}: {g.nics_per_node}" for g in cluster.device_groups if g.nics_per_node]
        if lv.is_cluster_scope and overrides:
            nics += f" ({', '.join(overrides)})"
        levels.add_row(
            lv.name, lv.kind, _scope(lv, cluster.num_nodes), f"{lv.bandwidth_gb_per_s:g}", nics, f"{lv.efficiency:g}",
            f"{lv.effective_bandwidth_gb_per_s:.4g}", f"{lv.latency_us:g}",
            _num(lv.allreduce_bandwidth_gb_per_s),
        )
    parts += [groups, levels, defaults]
    return Group(*parts)


def render(cluster: Described, width: int = 120) -> str:
    """The summary as plain text (no colour codes)."""
    from rich.console import Console

    buffer = io.StringIO()
    Console(file=buffer, width=width, color_system=None, highlight=False).print(renderable(cluster))
    return buffer.getvalue()
