"""Time ``passes.capture.capture`` on GPT-3 175B, a 1T-parameter GPT and Hugging Face
Llama-2 70B (fake tensors, bf16).

    .venv/bin/python benchmarks/capture_time.py [--batch B] [--seq S] [--repeat N] [MODEL ...]
    .venv/bin/python benchmarks/capture_time.py hf:llama-2-70b hf:llama-3-70b --repeat 3

Prints one row per model: the capture method (``symbolic_trace`` or ``export``), parameters,
graph nodes, repeated blocks, and the best and median wall time over ``--repeat`` captures
(after one warm-up capture of ``gpt-tiny`` and, for ``hf:`` models, one of a 1-layer
version of the first, which pay the one-time imports of torch's fake-tensor and export
machinery and of ``transformers``). Nothing is allocated: parameters stay on ``meta``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fxplan.api import capture


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["gpt3-175b", "gpt-1t", "hf:llama-2-70b"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=None, help="default: the model's")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    capture("gpt-tiny")  # warm-up: torch imports fake-tensor machinery on first use
    hf = [m for m in args.models if m.startswith("hf:")]
    if hf:  # warm-up: transformers and torch.export imports
        capture(f"{hf[0]}{',' if hf[0].count(':') > 1 else ':'}num_hidden_layers=1", seq=16)
    print(f"{'model':<16} {'method':<14} {'params':>18} {'nodes':>6} {'blocks':>14} "
          f"{'best s':>7} {'median s':>9}")
    for name in args.models:
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            graph = capture(name, batch=args.batch, seq=args.seq, dtype=torch.bfloat16)
            times.append(time.perf_counter() - start)
        blocks = " + ".join(f"{b.count}×{len(b.nodes_per_layer[0])}" for b in graph.blocks)
        print(f"{name:<16} {graph.method:<14} {graph.num_params:>18,} "
              f"{len(graph.gm.graph.nodes):>6} {blocks:>14} "
              f"{min(times):>7.2f} {statistics.median(times):>9.2f}")


if __name__ == "__main__":
    main()
