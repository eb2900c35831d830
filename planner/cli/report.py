"""``fxplan report plan.json``: the report of a saved plan, in the terminal or as a web page.

    fxplan report plan.json                       # the terminal report `fxplan plan` prints
    fxplan report plan.json --html plan.html      # one self-contained page (fxplan.report.html)
    fxplan report plan.json --trace plan.trace.json   # Chrome/Perfetto trace (fxplan.report.trace)

``--html`` and ``--trace`` need the step simulation, which a plan file does not hold: the
plan's model is captured again and its cluster loaded (both checked against the plan's
fingerprints, :func:`fxplan.plan_context.plan_context`) and the configuration the plan priced is
estimated again (:func:`fxplan.plan_context.simulate_plan`). ``fxplan plan`` takes the same two flags
(:func:`write_artifacts`).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster
    from fxplan.core.plan import Plan
    from fxplan.passes.captured_graph import CapturedGraph


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """``--html OUT.html`` and ``--trace OUT.json``."""
    parser.add_argument("--html", metavar="OUT.html",
                        help="write the report as one self-contained web page (plots embedded)")
    parser.add_argument("--trace", metavar="OUT.json",
                        help="write the predicted step as a Chrome/Perfetto trace "
                        "(open in chrome://tracing or ui.perfetto.dev)")


def write_artifacts(plan: Plan, graph: CapturedGraph, cluster: Cluster, *,
                    html: str | None, trace: str | None) -> list[str]:
    """Write the page and/or the trace of ``plan``; one line per file written."""
    if not html and not trace:
        return []
    from fxplan.plan_context import simulate_plan
    from fxplan.report.plots import plan_title

    result = simulate_plan(plan, graph, cluster)
    lines = []
    if html:
        from fxplan.report.html import write_html

        lines.append(f"report page written to {write_html(plan, graph, result, html)}")
    if trace:
        from fxplan.report.trace import predicted_trace, write_trace

        written = write_trace(predicted_trace(result, title=plan_title(plan)), trace)
        lines.append(f"predicted trace written to {written} (chrome://tracing, ui.perfetto.dev)")
    return lines


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "report", help="show a saved plan: terminal report, web page, trace",
        description="Print the report of a plan file written by `fxplan plan -o`; --html writes "
        "it as a self-contained web page, --trace the predicted step as a Chrome/Perfetto trace.")
    parser.add_argument("plan", metavar="PLAN.json", help="plan file written by `fxplan plan -o`")
    add_output_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from fxplan.core.plan import load_plan
    from fxplan.plan_context import plan_context
    from fxplan.report.terminal import render_report

    plan = load_plan(args.plan)
    lines = []
    if args.html or args.trace:
        graph, cluster = plan_context(plan, source=args.plan)
        lines = write_artifacts(plan, graph, cluster, html=args.html, trace=args.trace)
    render_report(plan)
    for line in lines:
        print(line)
    return 0
