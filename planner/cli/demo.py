"""``fxplan demo``: the main job on a built-in default model and cluster (what ``make demo`` runs).

Captures the model (GPT 1.7B by default) and prints its graph summary (as ``fxplan graph``),
the cluster (as ``fxplan clusters --show``), then plans it for the batch and prints the
report (as ``fxplan plan``). Runs in a few seconds.
"""

from __future__ import annotations

import argparse

from fxplan.cli.arguments import count
from fxplan.core.bounds import MAX_BATCH, MAX_SEQ

DEFAULT_MODEL = "gpt-1.7b"
DEFAULT_CLUSTER = "dgx-a100-80g:nodes=4"
DEFAULT_BATCH = 512
DEFAULT_SEQ = 2048


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("demo", help="describe and plan the default model on the default cluster")
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"model spec (default {DEFAULT_MODEL})")
    parser.add_argument("--cluster", default=DEFAULT_CLUSTER,
                        help=f"cluster spec (default {DEFAULT_CLUSTER})")
    parser.add_argument("--batch", type=count(1, MAX_BATCH), default=DEFAULT_BATCH,
                        help=f"global batch (default {DEFAULT_BATCH})")
    parser.add_argument("--seq", type=count(1, MAX_SEQ), default=DEFAULT_SEQ,
                        help=f"sequence length (default {DEFAULT_SEQ})")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    import logging
    import sys

    from rich.console import Console

    from fxplan.cluster_specs import Cluster
    from fxplan.cluster_specs.summary import renderable
    from fxplan.cli.graph import _print as print_graph
    from fxplan.report.terminal import render_report
    from fxplan.api import capture_for_search
    from fxplan.cluster_specs import training_dtype
    from fxplan.inter_op import search
    from fxplan.inter_op.progress import PhaseTimer

    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s", stream=sys.stderr)
    console = Console(width=None if sys.stdout.isatty() else 140, highlight=False)
    cluster = Cluster.load(args.cluster)
    timer = PhaseTimer()
    graph = capture_for_search(args.model, seq=args.seq, dtype=training_dtype(cluster), timer=timer)
    console.rule(f"model {args.model} (captured per sample: batch 1 × seq {args.seq})")
    print_graph(graph.summary())
    console.rule(f"cluster {args.cluster}")
    console.print(renderable(cluster))
    console.rule(f"plan for batch {args.batch}")
    plan = search(graph, cluster, batch=args.batch, seq=args.seq, model=args.model)
    render_report(plan, console)
    return 0
