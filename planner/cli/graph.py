"""``fxplan graph MODEL``: capture a model and describe its graph.

    fxplan graph gpt-1.7b                       summary and per-layer table
    fxplan graph gpt:layers=4,hidden=1024 --batch 8 --seq 512
    fxplan graph path/to/model.py:build --leaf MyBlock
    fxplan graph gpt3-175b --json               the same as JSON
    fxplan graph hf:llama:num_hidden_layers=2   a Hugging Face model from its config
    fxplan graph model.py:build --method export torch.export instead of symbolic_trace

Prints how the graph was obtained (``symbolic_trace``, or ``export`` with the reason when
tracing failed first), parameters (tied weights counted once), FLOPs per step (forward; training with and
without activation recompute, Megatron's convention), the activation bytes autograd saves,
the repeated blocks, the leaf modules kept opaque, ops priced by measurement, the ops whose
sharding options come from DTensor's registered strategies or from no rule (replicated), and a
per-layer table in which runs of identical layers are folded into one row.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fxplan.cli.arguments import (DTYPES, add_capture_arguments, add_dtype_argument,
                                  add_model_argument, add_workload_arguments)
from fxplan.core.units import binary_bytes, seconds, si


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "graph", help="capture a model and describe its graph",
        description="Capture MODEL (a preset such as gpt-1.7b, family:key=value,... such as "
        "gpt:layers=48,hidden=6144,heads=64, or path/to/model.py:build) on fake tensors and "
        "print parameters, FLOPs per step, activation bytes, repeated blocks, leaf modules and "
        "a per-layer table.")
    add_model_argument(parser)
    add_workload_arguments(parser, batch_default=1)
    add_dtype_argument(parser, what="parameter and activation precision")
    add_capture_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.set_defaults(func=run)
    return parser


def _folded(rows: list[dict[str, Any]]) -> list[tuple[str, int, dict[str, Any]]]:
    """Consecutive layer rows with equal signature and numbers → (label, count, row)."""
    keys = ("signature", "nodes", "params", "flops", "saved_bytes")
    out: list[tuple[str, int, dict[str, Any]]] = []
    for row in rows:
        last = out[-1] if out else None
        if (last and row["layer"] is not None and last[2]["layer"] is not None
                and all(last[2][k] == row[k] for k in keys)):
            first = last[0].split(" … ")[0]
            out[-1] = (f"{first} … {row['name']}", last[1] + 1, last[2])
        else:
            out.append((row["name"], 1, row))
    return out


def _print(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 140, highlight=False, emoji=False)
    s = summary
    inputs = ", ".join(f"{k} {'×'.join(map(str, v['shape']))} {v['dtype']}"
                       for k, v in s["inputs"].items())
    tied = ", ".join(f"{a} → {b}" for a, b in s["tied_params"].items()) or "none"
    train = s["training_flops"]
    acts = s["saved_activation_bytes"]
    console.print(f"[bold]{s['model']}[/bold]  {s['dtype'] or 'model dtype'} · inputs {inputs} · "
                  f"{s['nodes']} nodes · captured in {seconds(s['capture_seconds'])}")
    console.print(f"capture method  {s['method']}"
                  + (f" ({s['method_note']})" if s["method_note"] else ""), markup=False)
    console.print(f"parameters      {s['num_params']:,} ({binary_bytes(s['param_bytes'])}); "
                  f"tied: {tied}")
    console.print(f"FLOPs per step  forward {si(s['forward_flops'], 'FLOP')} (matrix products "
                  f"{si(s['forward_matmul_flops'], 'FLOP')}); training "
                  f"{si(train['recompute'], 'FLOP')} with recompute, "
                  f"{si(train['no_recompute'], 'FLOP')} without")
    console.print(f"activations     {binary_bytes(acts['total'])} saved for backward "
                  f"({binary_bytes(acts['outside_layers'])} outside the layers)")
    blocks = "; ".join(f"{b['signature']} × {len(b['layers'])} layers "
                       f"({b['nodes_per_layer']} nodes each)" for b in s["blocks"]) or "none"
    found = s.get("block_method")
    console.print(f"repeated blocks {blocks}" + (f" (found by {found})" if found and s["blocks"]
                                                 else ""), markup=False)
    leaves = ", ".join(f"{p} ({c})" for p, c in s["leaf_modules"].items()) or "none"
    console.print(f"leaf modules    {leaves}")
    if s["unpriced_ops"]:
        console.print("priced by measurement (no FLOP rule): " +
                      ", ".join(f"{k} ×{n}" for k, n in s["unpriced_ops"].items()))
    rules = s.get("sharding_rules")
    if rules and (rules["dtensor"] or rules["fallback"]):
        console.print("sharding rules  " + "; ".join(
            f"{label}: " + ", ".join(f"{k} ×{n}" if n > 1 else k for k, n in rules[key].items())
            for key, label in (("dtensor", "from DTensor's strategies"),
                               ("fallback", "none (replicated)")) if rules[key]), markup=False)
    table = Table(title="per layer (forward; params: distinct elements used)",
                  title_justify="left")
    for column in ("layers", "×", "signature", "nodes", "params", "FLOPs", "matmul FLOPs",
                   "saved bytes"):
        table.add_column(column, justify="left" if column in ("layers", "signature") else "right")
    for label, count, row in _folded(s["per_layer"]):
        table.add_row(label, str(count), row["signature"] or "–", str(row["nodes"]),
                      f"{row['params']:,}", si(row["flops"]), si(row["matmul_flops"]),
                      binary_bytes(row["saved_bytes"]))
    console.print(table)


def run(args: argparse.Namespace) -> int:
    import torch

    from fxplan.api import capture
    from fxplan.sharding.api import rule_sources

    graph = capture(args.model, batch=args.batch, seq=args.seq, leaf_modules=args.leaf,
                    dtype=getattr(torch, DTYPES[args.dtype]), method=args.method)
    summary = graph.summary()
    summary["sharding_rules"] = rule_sources(graph.gm)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print(summary)
    return 0
