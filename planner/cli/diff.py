"""``fxplan diff A.json B.json``: what differs between two plans.

    fxplan diff plan.json other.json
    fxplan diff plan.json other.json --json

Prints the differing fields (model, cluster, batch; degrees, link levels, schedule,
microbatching, ZeRO, recompute, sequence parallelism, the layout the step time priced), the
stages' layer ranges when they differ, the placements summarised by pattern (layer numbers
folded into ``*``, most frequent first; :mod:`fxplan.report.diff`) and the predicted step time,
MFU and memory with ``b − a``. Identical plans say so. ``--json``: the same as JSON
(``identical``, ``fields``, ``stages``, ``placements``, ``predicted``).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

#: Placement patterns printed; the rest are counted.
SHOW_PATTERNS = 12
#: Prediction keys → words.
LABELS = {"step_time_s": "step time", "mfu": "MFU (model FLOPs of the peak)",
          "tflops_per_device": "per device (counting recompute)",
          "max_memory_gib": "peak memory (heaviest rank)",
          "peak_memory_gib": "peak memory per pipeline rank", "capacity_gib": "capacity",
          "fits": "fits"}


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "diff", help="show what differs between two plans",
        description="Compare two plan files: degrees, schedule, microbatching, stages, "
        "placements (summarised by pattern), recompute/ZeRO and the predicted time and memory.")
    parser.add_argument("a", metavar="A.json", help="a plan file")
    parser.add_argument("b", metavar="B.json", help="another plan file")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.set_defaults(func=run)
    return parser


def _value(key: str, value: Any) -> str:
    from fxplan.core.units import gib, percent, seconds, si

    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if key == "step_time_s":
        return seconds(value)
    if key == "mfu":
        return percent(value)
    if key == "tflops_per_device":
        return si(value * 1e12, "FLOP/s")
    if key.endswith("_gib"):
        return " / ".join(gib(v) for v in value) if isinstance(value, list) else gib(value)
    return str(value)


def _delta(key: str, a: Any, b: Any) -> str:
    from fxplan.core.units import gib, percent, seconds, si

    if isinstance(a, bool) or not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return ""
    if key == "step_time_s":
        return f"{seconds(b - a, sign=True)} ({percent((b - a) / a, sign=True)})" if a else ""
    if key == "mfu":
        return f"{100 * (b - a):+.3g} points"
    if key.endswith("_gib"):
        return gib(b - a, sign=True)
    if key == "tflops_per_device":
        return ("+" if b > a else "") + si((b - a) * 1e12, "FLOP/s")
    return f"{b - a:+.3g}"


def _stages(ranges: list[list[int]]) -> str:
    return " ".join(f"[{s},{e})" for s, e in ranges) or "–"


def _print(data: dict[str, Any], a: str, b: str) -> None:
    from rich.table import Table

    from fxplan.report.console import console

    out = console()
    if data["identical"]:
        out.print(f"{a} and {b} are identical plans (configuration, stages, placements and "
                  "prediction)")
        return
    if data["fields"]:
        table = Table(title="configuration", title_justify="left")
        for column in ("field", a, b):
            table.add_column(column)
        for row in data["fields"]:
            table.add_row(row["field"], str(row["a"]), str(row["b"]))
        out.print(table)
    if data["stages"]:
        out.print(f"stages (layers [start, stop) per virtual stage)\n  {a}: "
                  f"{_stages(data['stages']['a'])}\n  {b}: {_stages(data['stages']['b'])}",
                  markup=False)
    placements = data["placements"]
    if placements["by_pattern"]:
        counts = ", ".join(f"{v['count']} of {v['of']} {k}"
                           for k, v in placements["differing"].items())
        table = Table(title=f"placements that differ ({counts}; layer numbers folded into *)",
                      title_justify="left")
        for column in ("kind", "name", a, b, "count"):
            table.add_column(column, justify="right" if column == "count" else "left")
        rows = placements["by_pattern"]
        for row in rows[:SHOW_PATTERNS]:
            table.add_row(row["kind"], row["pattern"], row["a"], row["b"], str(row["count"]))
        out.print(table)
        if len(rows) > SHOW_PATTERNS:
            out.print(f"  … {len(rows) - SHOW_PATTERNS} more patterns (--json lists all)")
    if data["predicted"]:
        table = Table(title="prediction", title_justify="left")
        for i, column in enumerate(("", a, b, "b − a")):
            table.add_column(column, justify="left" if i == 0 else "right")
        for row in data["predicted"]:
            table.add_row(LABELS.get(row["key"], row["key"]), _value(row["key"], row["a"]), _value(row["key"], row["b"]),
                          _delta(row["key"], row["a"], row["b"]))
        out.print(table)


def run(args: argparse.Namespace) -> int:
    from fxplan.core.plan import load_plan
    from fxplan.report.diff import diff_plans

    data = diff_plans(load_plan(args.a), load_plan(args.b)).to_dict()
    if args.json:
        print(json.dumps(data, indent=2, default=str))
    else:
        _print(data, args.a, args.b)
    return 0
