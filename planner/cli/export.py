"""``fxplan export PLAN.json --to megatron|torchtitan|deepspeed``: the plan in another
framework's configuration.

    fxplan export plan.json --to megatron              Megatron-LM arguments
    fxplan export plan.json --to torchtitan -o fxplan_plan.py      current torchtitan
    fxplan export plan.json --to torchtitan --torchtitan-version 0.2.2 -o job.toml
    fxplan export plan.json --to deepspeed --json      {"target", "text", "notes"}

Prints the text on stdout (or writes it to ``-o FILE``) and what the target cannot express on
stderr, one ``note:`` line each (:mod:`fxplan.export`), the last one fxplan's estimate of
what the target runs differently from the plan. An unknown target or torchtitan version, or a
missing plan file, ends with exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fxplan.cli.arguments import output_path

#: Listed here rather than imported so that ``fxplan --help`` stays instant; the test checks
#: it against :data:`fxplan.export.TARGETS`.
TARGET_NAMES = ("megatron", "torchtitan", "deepspeed")


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "export", help="write a plan as Megatron-LM, torchtitan or DeepSpeed configuration",
        description="Write PLAN as Megatron-LM arguments, a torchtitan job TOML or a DeepSpeed "
        "JSON; notes on stderr say what the target cannot express.")
    parser.add_argument("plan", metavar="PLAN.json", help="a plan written by `fxplan plan -o`")
    parser.add_argument("--to", required=True, metavar="TARGET",
                        help=f"target framework: {', '.join(TARGET_NAMES)}")
    parser.add_argument("-o", "--output", metavar="FILE", type=output_path(),
                        help="write the text here")
    parser.add_argument("--torchtitan-version", metavar="VERSION",
                        help="torchtitan to write for: current (a Python config function, "
                        "the default unless an installed torchtitan release says otherwise) "
                        "or a release 0.2.0-0.2.2 (a job-config TOML)")
    parser.add_argument("--no-price", action="store_true",
                        help="skip fxplan's estimate of what the export runs differently (it "
                        "re-captures the plan's model)")
    parser.add_argument("--json", action="store_true",
                        help="print {\"target\", \"text\", \"notes\"} as JSON")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from fxplan.core.plan import load_plan
    from fxplan.export import export_plan

    plan = load_plan(args.plan)
    result = export_plan(plan, args.to, torchtitan_version=args.torchtitan_version,
                         price=not args.no_price)
    if args.json:
        text = json.dumps({"target": result.target, "text": result.text,
                           "notes": list(result.notes)}, indent=2) + "\n"
    else:
        text = result.text
        for note in result.notes:
            print(f"note: {note}", file=sys.stderr)
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
