"""Per-op-class efficiencies of this CPU on a model's own nodes (the ``local-cpu`` spec's
``compute_efficiency``), and the rates they are relative to.

    python benchmarks/op_class_calibration.py [--model gpt-tiny] [--batches 4,16] [--rounds 3]

One thread. Each round: the model's captured graph run node by node at every microbatch size
of ``--batches`` (:func:`fxplan.cost_model.compute.class_efficiency.time_graph_nodes`: thread CPU
time of each node's forward and backward, autograd recording as in training), with the rate
probe of ``benchmarks/local_cpu_calibration.py`` (1024³ fp32 matmul ``R``, eager op ``e``:
the definitions of the spec's constants) before and after each batch size; the round's ``R``
and ``e`` are the medians of its probes. Per op class the efficiency is the ratio of sums of
:func:`~fxplan.cost_model.compute.class_efficiency.fit_class_efficiency` over the nodes of every
batch size: relative to ``R`` for compute-bound classes, and for memory-bound ones relative
to the bandwidth ``M₀ · V / V₀`` (the spec's constants ``M₀``, ``V₀``; ``V`` the probe's
in-cache vector rate). The model's tensors are in cache (gpt-tiny at batch 16: 0.25–2 MiB),
where an op runs at the speed of the core's vector units, not at that of DRAM: the probe's
128 MiB copy varies with the neighbours' memory traffic (13–29 GB/s in 2026-11-24 (`6803fb5`)'s runs),
and the matmul rate with the core's matrix units (2026-11-24 (`c352b19`)'s host: matmul 2.2× the first
host's, gpt-tiny's memory-bound nodes 1.25×). The table
gives each round's value and the median, the figure the spec stores. ``--out FILE`` writes
every round as JSON.

Out of cache (``--out-of-cache``, informational): the memory-bound classes' representative
ops on 64 MiB tensors, their GB/s over ``M``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from local_cpu_lines.rates import rate_probe  # noqa: E402

from fxplan.api import capture_for_search  # noqa: E402
from fxplan.cluster_specs.local_cpu import (EAGER_OP_US,  # noqa: E402
                                            memory_bound_reference_gb_per_s)
from fxplan.cost_model.compute.class_efficiency import (NodeSample, fit_class_efficiency,  # noqa: E402
                                                time_graph_nodes)
from fxplan.examples.model_spec import resolve_model  # noqa: E402


def _runnable_graph(model: str, seq: int) -> tuple[object, object]:
    """The captured graph with the real model's weights (capture runs on the meta device) and
    its buffers rebuilt (positions, causal masks), and its node annotations."""
    graph = capture_for_search(model, seq=seq, dtype="float32")
    gm = graph.gm.to_empty(device="cpu")
    gm.load_state_dict(resolve_model(model).build("cpu").state_dict(), strict=False)
    for name, buf in gm.named_buffers():
        if name.endswith("positions"):
            buf.copy_(torch.arange(buf.numel()).reshape(buf.shape))
        elif buf.dtype == torch.bool:
            n = buf.shape[-1]
            buf.copy_(torch.ones(n, n, dtype=torch.bool).triu(1).expand(buf.shape))
    return gm, graph


def measure_round(gm: object, graph: object, batches: list[int], seq: int, vocab: int,
                  repeats: int) -> dict:
    """One round: the probe, every node at every batch size, the per-class fit."""
    probes = [rate_probe()]
    samples: dict[str, list[NodeSample]] = {"forward": [], "backward": []}
    views = {"forward": 0.0, "backward": 0.0}
    view_nodes = 0          # view nodes run, over the batch sizes (each once per pass)
    for b in batches:
        tokens = torch.randint(0, vocab, (b, seq))
        times = time_graph_nodes(gm, (tokens, torch.randint(0, vocab, (b, seq))),
                                 repeats=repeats)
        probes.append(rate_probe())
        for node in graph.gm.graph.nodes:
            info = node.meta.get("fxplan")
            if info is None:
                continue
            view_nodes += info.op_class == "view" and node.name in times[0]
            for phase, measured in zip(("forward", "backward"), times):
                if node.name not in measured:
                    continue
                if info.op_class == "view":
                    views[phase] += measured[node.name]
                samples[phase].append(NodeSample(info.op_class, float(info.flops) * b,
                                                 float(info.bytes_read + info.bytes_written) * b,
                                                 measured[node.name]))
    probe = {key: statistics.median(p[key] for p in probes) for key in probes[0]}
    # In-cache memory-bound ops run at the core's vector speed, not at the DRAM copy's: their
    # bandwidth is the spec's constant scaled as the probe's vector rate is (module docstring).
    bandwidth = memory_bound_reference_gb_per_s(vector_gb_per_s=probe["vector_gb_per_s"])
    fits = {phase: fit_class_efficiency(samples[phase],
                                        peak_flops=probe["matmul_tflops"] * 1e12,
                                        bandwidth_bytes_s=bandwidth * 1e9,
                                        launch_s=probe["eager_op_us"] * 1e-6,
                                        backward=phase == "backward")
            for phase in samples}
    totals = {phase: sum(s.time_s for s in samples[phase]) for phase in samples}
    # per view node, forward and backward (a view's backward may run no kernel: the mean over
    # every view node, as the cost model charges them), at the spec's eager op
    scale = EAGER_OP_US / probe["eager_op_us"]
    view_us = {phase: views[phase] / max(1, view_nodes) * 1e6 * scale for phase in views}
    return {"probe": probe, "classes": fits, "views_s": views, "view_us": view_us,
            "total_s": totals, "load": os.getloadavg()[0]}


def out_of_cache(memory_gb_per_s: float, mib: int = 64) -> dict[str, float]:
    """GB/s over ``M`` of the memory-bound classes' ops on ``mib`` MiB fp32 tensors."""
    import torch.nn.functional as F

    from local_cpu_lines.rates import median_thread_time

    x = torch.randn(mib * 2**18)
    y = torch.randn(mib * 2**18)
    rows = x.view(-1, 256)
    ops = {"elementwise (add)": (lambda: x + y, 3), "elementwise (gelu)": (lambda: F.gelu(x), 2),
           "softmax": (lambda: torch.softmax(rows, -1), 2),
           "norm": (lambda: F.layer_norm(rows, (256,)), 2),
           "dropout": (lambda: F.dropout(x, 0.1, True), 2)}
    return {name: passes * x.numel() * 4 / median_thread_time(fn, repeats=5) / 1e9
            / memory_gb_per_s for name, (fn, passes) in ops.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt-tiny")
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batches", default="4,16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--out-of-cache", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    batches = [int(b) for b in args.batches.split(",")]
    gm, graph = _runnable_graph(args.model, args.seq)
    # token ids index the first embedding table the graph holds (the token embedding)
    vocab = next(m.num_embeddings for m in gm.modules() if isinstance(m, torch.nn.Embedding))
    rounds = [measure_round(gm, graph, batches, args.seq, vocab, args.repeats)
              for _ in range(args.rounds)]
    print(f"torch {torch.__version__}, {args.model} s={args.seq}, batches {batches}, "
          f"{args.rounds} rounds, load average {[round(r['load'], 1) for r in rounds]}")
    print("probe per round: " + "; ".join(
        f"R {r['probe']['matmul_tflops']:.4f} TFLOP/s, M {r['probe']['memory_gb_per_s']:.2f} "
        f"GB/s, V {r['probe']['vector_gb_per_s']:.2f} GB/s, e {r['probe']['eager_op_us']:.2f} µs"
        for r in rounds))
    print("measured Σ over nodes, ms per round: " + "; ".join(
        f"forward {r['total_s']['forward'] * 1e3:.2f} (views {r['views_s']['forward'] * 1e3:.2f}), "
        f"backward {r['total_s']['backward'] * 1e3:.2f} (views {r['views_s']['backward'] * 1e3:.2f})"
        for r in rounds))
    print("view node, µs at the spec's eager op, per round: " + "; ".join(
        f"forward {r['view_us']['forward']:.2f}, backward {r['view_us']['backward']:.2f}"
        for r in rounds) + " (median forward "
        f"{statistics.median(r['view_us']['forward'] for r in rounds):.2f}, backward "
        f"{statistics.median(r['view_us']['backward'] for r in rounds):.2f})")
    print("\n| phase | class | nodes | measured ms (Σ, first round) | efficiency per round | median |")
    print("|---|---|---|---|---|---|")
    for phase in ("forward", "backward"):
        for c in sorted({c for r in rounds for c in r["classes"][phase]}):
            effs = [r["classes"][phase][c]["efficiency"] for r in rounds
                    if c in r["classes"][phase]]
            first = rounds[0]["classes"][phase].get(c, {})
            print(f"| {phase} | {c} | {int(first.get('nodes', 0))} | "
                  f"{first.get('measured_s', 0) * 1e3:.3f} | "
                  f"{', '.join(f'{e:.3f}' for e in effs)} | {statistics.median(effs):.3f} |")
    if args.out_of_cache:
        ooc = out_of_cache(rounds[-1]["probe"]["memory_gb_per_s"])
        print("\n| op, 64 MiB (out of cache) | GB/s over M |\n|---|---|")
        for name, value in ooc.items():
            print(f"| {name} | {value:.3f} |")
    if args.out is not None:
        args.out.write_text(json.dumps({"model": args.model, "batches": batches,
                                        "rounds": rounds}, indent=1) + "\n")


if __name__ == "__main__":
    main()
