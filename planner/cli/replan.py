"""``fxplan replan plan.json --cluster NEW``: the plan for the cluster a job has now, offline.

    fxplan replan plan.json --cluster local-cpu:devices=2 -o plan2.json
    fxplan replan plan.json --devices 24                 # the plan's cluster, 24 devices in all
    fxplan replan plan.json --cluster dgx-a100-80g:nodes=3 --json

What ``fxplan launch`` does by itself when the world it gets is not the plan's
(:mod:`fxplan.replan`, docs/elastic.md): the same model at the same global batch, searched on
the new cluster. Prints what changed (cluster, degrees, batch split, predicted step time) and
the search time; ``--json`` prints ``{"old", "new", "replan_time_s", "changes"}``; ``-o``
writes the new plan, which ``fxplan launch --resume RUN_DIR`` runs from any checkpoint of the
old one (resharded).
"""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "replan", help="replan a plan for another cluster (same model and global batch)",
        description="Search the plan's model at its global batch on another cluster, as an "
        "elastic launch does when devices were taken away or added; print what changed.")
    parser.add_argument("plan", metavar="PLAN.json", help="plan file written by `fxplan plan -o`")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--cluster", help="the new cluster spec (name:key=value, or a YAML file)")
    target.add_argument("--devices", type=int, metavar="N",
                        help="the plan's cluster with N devices in all (part of a node, or "
                        "whole nodes)")
    parser.add_argument("-o", "--output", metavar="NEW.json", help="write the new plan here")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from fxplan.core.plan import load_plan
    from fxplan.replan import replan

    old = load_plan(args.plan)
    if args.devices is not None:
        found = replan(old, world=args.devices)
    else:
        found = replan(old, cluster=args.cluster)
    if args.output:
        found.new.save(args.output)
    if args.json:
        print(json.dumps({**found.to_dict(), "output": args.output}, indent=1))
        return 0
    for line in found.changes():
        print(line)
    print(f"replanned in {found.replan_time_s * 1e3:.0f} ms ({found.cpu_s * 1e3:.0f} ms CPU; + "
          f"{found.import_s * 1e3:.0f} ms loading the solvers)")
    if args.output:
        print(f"new plan written to {args.output}")
    return 0
