"""``fxplan estimate MODEL``: predict one training step of a given parallel configuration.

    fxplan estimate gpt-1.7b --cluster dgx-a100-80g:nodes=4 --batch 512 \\
        --config "dp=32,tp=1,pp=1,mb=16,schedule=1f1b,zero=0,recompute=full,sp=off"
    fxplan estimate gpt-1t --cluster dgx-a100-80g:nodes=384 --batch 3072 \\
        --config "dp=6,tp=8,pp=64,mb=1,schedule=interleaved:2,zero=0,recompute=full" \\
        --json --plot timeline.png

Prints the step time with its breakdown (compute, exposed tensor-parallel, ZeRO and
data-parallel communication, pipeline send/recv and bubble, optimizer), tokens/s, TFLOP/s
per device (Megatron's convention: counting recompute), MFU (model FLOPs only), and per stage the peak memory per rank with its
breakdown against the device's capacity. ``--json`` prints the same as JSON (keys
``step_time_s``, ``tflops_per_device``, ``mfu``, ``peak_memory_gib``, ``fits``,
``breakdown``, ``memory_breakdown_gib``, …); ``--plot FILE`` draws the pipeline timeline.
``--dtype`` defaults to the cluster's training precision (bf16, else fp16 on V100, else fp32 on
CPUs); a precision the devices list no peak for is refused (exit 2) naming the ones they do.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fxplan.cli.arguments import (
    DTYPES, add_cluster_argument, add_dtype_argument, add_headroom_argument, add_model_argument,
    add_state_layout_argument, add_workload_arguments,
    output_path,
)


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "estimate", help="predict step time, throughput and memory of a parallel configuration",
        description="Capture MODEL and price one training step on CLUSTER under CONFIG with the "
        "cost model: step time and breakdown, tokens/s, TFLOP/s per device, MFU, peak memory "
        "per stage and whether it fits.")
    add_model_argument(parser)
    add_cluster_argument(parser)
    add_workload_arguments(parser)
    parser.add_argument("--config", required=True, metavar="CONFIG",
                        help='"dp=..,tp=..,pp=..,mb=..,schedule=gpipe|1f1b|interleaved:v,'
                        'zero=0-3,recompute=none|selective|full,sp=on|off[,stages=a/b/..]"')
    add_dtype_argument(parser, what="training precision of weights and activations",
                       follow_cluster=True)
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--plot", metavar="FILE", type=output_path(".png", ".svg", ".pdf"),
                        help="draw the pipeline timeline to FILE (.png, .svg)")
    add_headroom_argument(parser)
    add_state_layout_argument(parser)
    parser.set_defaults(func=run)
    return parser


def _table(title: str, columns: list[str], rows: list[list[str]]) -> Any:
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    return table


def _print(result: dict[str, Any], model: str, cluster: str) -> None:
    from rich.console import Console

    from fxplan.core.units import gib, percent, seconds
    from fxplan.cost_model.memory.breakdown import MEMORY_LEGEND, MEMORY_ROWS, state_layout_text
    from fxplan.report.terminal import headroom_text, rate_line

    console = Console(width=None if sys.stdout.isatty() else 140, highlight=False, emoji=False)
    r = result
    verdict = "[green]fits[/green]" if r["fits"] else "[red]does not fit[/red]"
    shape = f"batch {r['batch']}" + (f" × seq {r['seq']}" if r["seq"] is not None else "")
    console.print(f"[bold]{model}[/bold] on {cluster} · {shape} · {r['num_devices']} devices")
    console.print(f"config      {r['summary']}")
    console.print(f"step time   {rate_line(r)} · {verdict}")
    step = r["step_time_s"]
    console.print(_table(f"step time on the critical stage ({r['critical_stage']})",
                         ["part", "time", "share"],
                         [[k, seconds(v), percent(v / step, 2)]
                          for k, v in r["breakdown"].items()]))
    names = [*MEMORY_ROWS, "total", "capacity", "free"]
    labels = [*MEMORY_ROWS.values(), "total", "capacity", "free"]
    console.print(f"memory      {headroom_text(r)}")
    console.print(f"{MEMORY_LEGEND}; {state_layout_text(r.get('state_layout'))}")
    console.print(_table("memory per rank", ["stage"] + labels,
                         [[str(s)] + [gib(m[n]) for n in names]
                          for s, m in enumerate(r["memory_breakdown_gib"])]))


def run(args: argparse.Namespace) -> int:
    import torch

    from fxplan.cluster_specs import Cluster, check_precision, training_precision
    from fxplan.cost_model import ParallelConfig, estimate
    from fxplan.api import capture

    from fxplan.cost_model.memory.headroom import parse_headroom

    config = ParallelConfig.parse(args.config)
    headroom = parse_headroom(args.memory_headroom)
    cluster = Cluster.load(args.cluster)
    dtype = args.dtype or training_precision(cluster)
    check_precision(cluster, dtype)
    graph = capture(args.model, batch=1, seq=args.seq, dtype=getattr(torch, DTYPES[dtype]))
    result = estimate(graph, cluster, config, batch=args.batch, seq=args.seq,
                      memory_headroom=headroom, state_layout=args.state_layout)
    if args.plot:
        from fxplan.report.timeline_plot import plot_timeline

        plot_timeline(result.timeline(), args.plot, title=f"{args.model} · {result.config.summary()}")
    data = result.to_dict()
    if args.json:
        json.dump(data, sys.stdout, indent=2)
        print()
    else:
        _print(data, args.model, args.cluster)
        if args.plot:
            print(f"timeline written to {args.plot}")
    return 0
