"""``fxplan plan MODEL --cluster SPEC --batch B``: search for the fastest plan that fits.

    fxplan plan gpt-1.7b --cluster dgx-a100-80g:nodes=4 --batch 512 --seq 2048
    fxplan plan gpt3-175b --cluster dgx-a100-80g:nodes=128 --batch 1536 -o plan.json
    fxplan plan gpt-7.5b --cluster aws-p3-v100:nodes=4 --batch 256 --json
    fxplan plan gpt-1.7b --cluster dgx-a100-80g:nodes=4 --batch 512 --emit program.py
    fxplan plan gpt-tiny --cluster local-cpu:devices=4 --batch 16 --plot tiny
    fxplan plan hf:llama-2-7b --cluster dgx-a100-80g:nodes=4 --batch 512 --seq 4096
    fxplan plan model.py:build --cluster local-cpu:devices=4 --batch 8 --leaf Attention
    fxplan plan gpt-1.7b --cluster dgx-a100-80g:nodes=4 --batch 512 --constrain "tp=8,zero=1"

Prints the report (:mod:`fxplan.report.terminal`) or, with ``--json``, the flat summary; ``-o`` writes
the full plan JSON; ``--time-budget`` bounds the search; ``--emit`` writes a program that
embeds the plan and trains it like ``fxplan launch`` under torchrun (:mod:`fxplan.program`;
the launch's flags, ``--path auto|module|graph`` among them: how the plan is applied, as
``fxplan.plan(path=...)``),
with the model's fx code per stage, every planned placement annotated, as comments
(:func:`fxplan.passes.rewrite.emit.emit_program`); ``--html``/``--trace`` write the report
page and the predicted trace (:mod:`fxplan.cli.report`); ``--plot
PREFIX`` draws ``PREFIX-timeline.png`` and ``PREFIX-memory.png`` of the chosen plan
(:func:`fxplan.report.plots.plot_plan`). ``--leaf`` and ``--method`` capture as ``fxplan graph``
does; ``--constrain`` restricts the search as the API's ``constraints=``
(:mod:`fxplan.cli.constraint_text`); ``--allow-fp8`` lets it try FP8 linear layers. The plan
names its model as a spec that resolves from
anywhere: a user file or a Hugging Face config file by absolute path
(:func:`~fxplan.examples.model_spec.canonical_spec`), next to the graph's fingerprint. A
model that fits in no configuration ends with exit code 2 and the memory it needs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from fxplan.cli.arguments import (add_capture_arguments, add_cluster_argument, add_headroom_argument,
                                  add_state_layout_argument,
                                  add_model_argument, add_workload_arguments, number,
                                  output_path, check_batch_arguments, resolve_batch)
from fxplan.cli.report import add_output_arguments, write_artifacts
from fxplan.core.bounds import MAX_TIME_BUDGET_S

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster
    from fxplan.core.plan import Plan
    from fxplan.passes.captured_graph import CapturedGraph


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "plan", help="find the fastest parallel plan that fits",
        description="Capture MODEL, search data/tensor/pipeline/ZeRO/recompute configurations "
        "on the cluster and print the fastest that fits in memory, with runners-up and the "
        "reasons others were pruned.")
    add_model_argument(parser)
    add_cluster_argument(parser)
    add_workload_arguments(parser, batch_tokens=True)
    add_capture_arguments(parser)
    parser.add_argument("--constrain", metavar="K=V,...", default=None,
                        help="restrict the search, e.g. \"tp=8,pp=2,zero=1\" (keys: tp, pp, dp, "
                        "microbatch_size|mb, schedule, recompute, sequence_parallel|sp, "
                        "zero_stage|zero, offload (none|optimizer|optimizer+params), fp8 "
                        "(true|false), cp (context parallelism: splits each sequence over cp of "
                        "the dp ranks), ep (expert parallelism of a mixture of experts: E/ep "
                        "experts per rank, ep dividing dp); alternatives with |, "
                        "e.g. tp=4|8)")
    parser.add_argument("--allow-fp8", action="store_true",
                        help="let the search run the linear layers in FP8 where it is faster "
                        "(devices with an fp8 peak: H100, H200; it changes the numerics, so it "
                        "is off unless asked; the same as --constrain \"fp8=false|true\")")
    parser.add_argument("-o", "--output", metavar="PLAN.json", type=output_path(".json"),
                        help="write the plan here")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--time-budget", type=number(0, MAX_TIME_BUDGET_S, low_open=False), default=None,
                        metavar="S",
                        help="stop the search after S seconds and keep the best found")
    parser.add_argument("--emit", metavar="PROGRAM.py", type=output_path(".py"),
                        help="write a program that trains the plan like `fxplan launch` (run it "
                        "under torchrun on the plan's cluster; it takes the launch's flags, "
                        "--path auto|module|graph among them), with the planned fx code per "
                        "stage, placements annotated, as comments")
    parser.add_argument("--plot", metavar="PREFIX", type=output_path(prefix=True),
                        help="draw PREFIX-timeline.png and PREFIX-memory.png for the chosen plan")
    add_headroom_argument(parser)
    add_state_layout_argument(parser)
    add_output_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def _emit(plan: Plan, graph: CapturedGraph, cluster: Cluster, path: str) -> str:
    from fxplan.passes.rewrite.emit import emit_program
    from fxplan.program import runnable_program

    nnodes = cluster.num_nodes
    Path(path).write_text(runnable_program(plan, emit_program(graph.gm, plan),
                                           name=Path(path).name, nnodes=nnodes,
                                           nproc=cluster.devices_per_node(0)), encoding="utf-8")
    return (f"program written to {path}: torchrun --nnodes={nnodes} "
            f"--nproc-per-node={cluster.devices_per_node(0)} {path} --data synthetic")


def run(args: argparse.Namespace) -> int:
    from fxplan.cluster_specs import Cluster
    from fxplan.report.terminal import plan_summary, render_report
    from fxplan.api import capture_for_search, runtime_check
    from fxplan.cli.constraint_text import parse_constraints
    from fxplan.examples.model_spec import canonical_spec
    from fxplan.cluster_specs import training_dtype
    from fxplan.inter_op import search
    from fxplan.inter_op.progress import PhaseTimer

    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s", stream=sys.stderr)
    if args.json:
        logging.getLogger("fxplan.planner").setLevel(logging.ERROR)  # fallbacks are in the JSON
    from fxplan.cost_model.memory.headroom import parse_headroom

    check_batch_arguments(args)
    constraints = parse_constraints(args.constrain)
    if args.allow_fp8 and "fp8" not in constraints:
        constraints["fp8"] = [False, True]
    headroom = parse_headroom(args.memory_headroom)
    cluster = Cluster.load(args.cluster)
    model = canonical_spec(args.model)
    timer = PhaseTimer()
    graph = capture_for_search(model, seq=args.seq, dtype=training_dtype(cluster), timer=timer,
                               leaf_modules=tuple(args.leaf), method=args.method)
    from fxplan.cost_model.step.layer_costs import graph_segments

    batch = resolve_batch(args, args.seq or graph_segments(graph).seq)
    plan = search(graph, cluster, batch=batch, seq=args.seq, constraints=constraints,
                  time_budget_s=args.time_budget, progress=not args.json, model=model,
                  memory_headroom=headroom, runnable=runtime_check(graph, cluster),
                  state_layout=args.state_layout)
    plan = dataclasses.replace(plan, timings={**timer.rounded(), **plan.timings})
    if args.output:
        plan.save(args.output)
    emitted = _emit(plan, graph, cluster, args.emit) if args.emit else None
    if args.plot:
        from fxplan.report.plots import plot_plan

        plotted = " and ".join(map(str, plot_plan(plan, graph, cluster, args.plot)))
        emitted = "\n".join(filter(None, [emitted, f"plots written to {plotted}"]))
    written = write_artifacts(plan, graph, cluster, html=args.html, trace=args.trace)
    emitted = "\n".join(filter(None, [emitted, *written])) or None
    if args.json:
        data = plan_summary(plan)
        if emitted:
            data["emit"] = emitted
        print(json.dumps(data, indent=2, default=str))
    else:
        render_report(plan)
        if args.output:
            print(f"plan written to {args.output}")
        if emitted:
            print(emitted)
    return 0
