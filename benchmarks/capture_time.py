"""Time ``passes.capture.capture`` on GPT-3 175B and a 1T-parameter GPT (fake tensors, bf16).

    .venv/bin/python benchmarks/capture_time.py [--batch B] [--repeat N] [MODEL ...]

Prints one row per model: parameters, graph nodes, repeated blocks, and the best and median
wall time over ``--repeat`` captures (after one warm-up capture of ``gpt-tiny``, which pays
torch's one-time imports). Nothing is allocated: parameters stay on ``meta``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fxplan.api import capture


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["gpt3-175b", "gpt-1t"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    capture("gpt-tiny")  # warm-up: torch imports fake-tensor machinery on first use
    print(f"{'model':<12} {'params':>18} {'nodes':>6} {'blocks':>14} {'best s':>7} {'median s':>9}")
    for name in args.models:
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            graph = capture(name, batch=args.batch, dtype=torch.bfloat16)
            times.append(time.perf_counter() - start)
        blocks = " + ".join(f"{b.count}×{len(b.nodes_per_layer[0])}" for b in graph.blocks)
        print(f"{name:<12} {graph.num_params:>18,} {len(graph.gm.graph.nodes):>6} {blocks:>14} "
              f"{min(times):>7.2f} {statistics.median(times):>9.2f}")


if __name__ == "__main__":
    main()
