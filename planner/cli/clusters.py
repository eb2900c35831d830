"""``fxplan clusters``: the built-in cluster specs, or one spec in full.

    fxplan clusters                    table of built-in specs
    fxplan clusters --json             the same as JSON
    fxplan clusters --show SPEC        one spec in full (a built-in name, name:key=value,..., or a
                                       file — which is how a user checks a file: a malformed one
                                       ends with the schema message and exit code 2)
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "clusters",
        help="list the built-in cluster specs, or show (and check) one",
        description="List the built-in cluster specs, or print one in full. "
        "SPEC is a built-in name, a YAML (or PaddlePaddle JSON) file, or name:key=value,... "
        "such as dgx-a100-80g:nodes=4.",
    )
    parser.add_argument("--show", metavar="SPEC", help="print this spec in full (checks a file)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.set_defaults(func=run)
    return parser


def _row(cluster: "Cluster") -> dict[str, Any]:
    """What the listing shows of one cluster."""
    groups = cluster.device_groups
    return {
        "name": cluster.name,
        "num_devices": cluster.num_devices,
        "num_nodes": cluster.num_nodes,
        "models": [g.model for g in groups],
        "memory_gib": [g.memory_gib for g in groups],
        "peak_bf16_tflops": [g.peak_tflops.get("bf16") for g in groups],
        "levels": [
            {"name": lv.name, "kind": lv.kind, "scope": lv.scope,
             "bandwidth_gb_per_s": lv.bandwidth_gb_per_s, "nics_per_node": lv.nics_per_node,
             "efficiency": lv.efficiency}
            for lv in cluster.levels
        ],
        "fingerprint": cluster.fingerprint(),
    }


def _level_text(level: dict[str, Any]) -> str:
    nics = f"{level['nics_per_node']}×" if level["nics_per_node"] else ""
    return f"{level['name']} {nics}{level['bandwidth_gb_per_s']:g}"


def _console() -> Any:
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 140, highlight=False)


def _list(as_json: bool) -> None:
    from rich.table import Table

    from fxplan.cluster_specs import Cluster, available_specs

    rows = [_row(Cluster.load(name)) for name in available_specs()]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title="built-in cluster specs (fxplan clusters --show NAME for one in full)",
                  title_justify="left")
    for column in ("name", "devices", "device model", "memory GiB", "peak bf16 TFLOP/s",
                   "levels (GB/s per direction)"):
        table.add_column(column, no_wrap=column == "name", overflow="fold")
    for row in rows:
        table.add_row(
            row["name"],
            f"{row['num_devices']} ({row['num_nodes']} node{'s' if row['num_nodes'] != 1 else ''})",
            " + ".join(row["models"]),
            " / ".join(f"{m:g}" for m in row["memory_gib"]),
            " / ".join("–" if p is None else f"{p:g}" for p in row["peak_bf16_tflops"]),
            " → ".join(_level_text(level) for level in row["levels"]),
        )
    _console().print(table)


def _show(spec: str, as_json: bool) -> None:
    import yaml

    from fxplan.cluster_specs import Cluster

    cluster = Cluster.load(spec)
    if as_json:
        print(json.dumps({**_row(cluster), "source": cluster.source, "spec": cluster.to_dict()}, indent=2))
        return
    console = _console()
    console.print(cluster)
    console.print(f"\n{cluster.source}: a valid cluster spec (schema v1). Canonical form:\n")
    print(yaml.safe_dump(cluster.to_dict(), sort_keys=False, allow_unicode=True), end="")


def run(args: argparse.Namespace) -> int:
    if args.show is not None:
        _show(args.show, args.json)
    else:
        _list(args.json)
    return 0
