"""``fxplan explain PLAN.json --vs ALTERNATIVE``: why this plan and not that one.

    fxplan explain plan.json --vs "tp=8,pp=2"        # the plan's configuration, changed so
    fxplan explain plan.json --vs "recompute=full,zero=3"
    fxplan explain plan.json --vs other.json         # another plan of the same model/cluster/batch
    fxplan explain plan.json --vs "tp=8" --json

``--vs`` takes the ``--constrain`` text of ``fxplan plan`` (one value per key; the keys not
given keep the plan's values, the rest follows as :func:`fxplan.report.explain.alternative_config`
says) or a plan file. Both sides are priced now by the cost model on the plan's model
(re-captured from its spec), cluster and batch (:mod:`fxplan.report.explain`). Prints the step time
of each and the difference term by term (compute, each kind of communication, pipeline
send/recv and bubble, optimizer), the stage imbalance, the peak memory of every pipeline rank
against the capacity, and the sentence saying what decided. ``--json`` prints the same as
JSON (``plan``, ``alternative``, ``delta``, ``notes``, ``verdict``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "explain", help="price an alternative to a plan and show what decided, term by term",
        description="Price the plan and an alternative (a configuration change such as "
        "\"tp=8,pp=2\", or another plan file) under the same cost model, model, cluster and "
        "batch, and print the difference term by term with the constraint or cost that "
        "decided.")
    parser.add_argument("plan", metavar="PLAN.json", help="a plan written by `fxplan plan -o`")
    parser.add_argument("--vs", required=True, metavar="K=V,...|OTHER.json",
                        help="the alternative: the plan's configuration with these changes "
                        "(keys as for `fxplan plan --constrain`: tp, pp, dp, mb, schedule, "
                        "recompute, sp, zero, offload, fp8; one value each), or another plan "
                        "file")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.set_defaults(func=run)
    return parser


def _is_plan_file(text: str) -> bool:
    return text.endswith(".json") or ("=" not in text and Path(text).exists())


def _side_rows(data: dict[str, Any]) -> list[list[str]]:
    from fxplan.core.units import percent, seconds
    from fxplan.report.explain import TERMS

    plan, alt = data["plan"], data["alternative"]
    delta = data.get("delta", {})
    rows = [["step time", seconds(plan["step_time_s"]),
             seconds(alt["step_time_s"]) if alt["valid"] else "–",
             (f"{seconds(delta['step_time_s'], sign=True)} "
              f"({percent(delta['step_time_pct'] / 100, sign=True)})") if delta else "–"]]
    for key, words in TERMS.items():
        mine = plan["breakdown"].get(key, 0.0)
        theirs = alt["breakdown"].get(key, 0.0) if alt["valid"] else None
        if mine < 1e-9 and (theirs is None or theirs < 1e-9):
            continue
        rows.append([f"  {words}", seconds(mine), "–" if theirs is None else seconds(theirs),
                     seconds(delta["breakdown"][key], sign=True) if delta else "–"])
    rows.append(["stage imbalance (slowest / mean − 1)", percent(plan["stage_imbalance"]),
                 percent(alt["stage_imbalance"]) if alt["valid"] else "–",
                 percent(delta["stage_imbalance"], sign=True) if delta else "–"])
    rows.append(["MFU", percent(plan["mfu"]), percent(alt["mfu"]) if alt["valid"] else "–", ""])
    return rows


def _memory_rows(data: dict[str, Any]) -> list[list[str]]:
    from fxplan.core.units import gib

    plan, alt = data["plan"], data["alternative"]
    mine = plan["memory_gib"]
    theirs = alt["memory_gib"] if alt["valid"] else []
    rows = []
    for s in range(max(len(mine), len(theirs))):
        cells = [str(s)]
        for side in (mine, theirs):
            if s < len(side):
                m = side[s]
                flag = "" if m["total"] <= m["capacity"] else " (over)"
                cells.append(f"{gib(m['total'])} of {gib(m['capacity'])}{flag}")
            else:
                cells.append("–")
        rows.append(cells)
    return rows


def _print(data: dict[str, Any]) -> None:
    from rich.table import Table

    from fxplan.report.console import console

    out = console()
    plan, alt = data["plan"], data["alternative"]
    out.print(f"plan          [bold]{plan['summary']}[/bold] ({plan['layout']})")
    out.print(f"{alt['label']:<13} [bold]{alt['summary']}[/bold] ({alt['layout']})")
    for note in data["notes"]:
        out.print(f"  · {note}", markup=False)
    if alt["valid"]:
        table = Table(title="step time on each side's critical stage", title_justify="left")
        for i, column in enumerate(("term", "plan", alt["label"], "Δ")):
            table.add_column(column, justify="left" if i == 0 else "right")
        for row in _side_rows(data):
            table.add_row(*row)
        out.print(table)
        table = Table(title="peak memory per pipeline rank", title_justify="left")
        for i, column in enumerate(("rank", "plan", alt["label"])):
            table.add_column(column, justify="left" if i == 0 else "right")
        for row in _memory_rows(data):
            table.add_row(*row)
        out.print(table)
    recorded = plan.get("recorded_step_time_s")
    if recorded is not None and abs(recorded - plan["step_time_s"]) > 1e-6 * recorded:
        from fxplan.core.units import seconds

        out.print(f"note: the plan file records {seconds(recorded)}; this fxplan's cost model "
                  f"prices it at {seconds(plan['step_time_s'])} (both sides above are priced now)")
    out.print(f"[bold]decided by[/bold]    {data['verdict']}")


def run(args: argparse.Namespace) -> int:
    from fxplan.cli.constraint_text import parse_constraints
    from fxplan.core.plan import load_plan
    from fxplan.report.explain import compare

    plan = load_plan(args.plan)
    if _is_plan_file(args.vs):
        comparison = compare(plan, vs_plan=load_plan(args.vs))
    else:
        comparison = compare(plan, changes=parse_constraints(args.vs))
    data = comparison.to_dict()
    if args.json:
        print(json.dumps(data, indent=2, default=str))
    else:
        _print(data)
    return 0
