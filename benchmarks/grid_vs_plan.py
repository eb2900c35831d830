"""The planner's plan against the best configuration of the expert grid, under one cost model.

    python benchmarks/grid_vs_plan.py                  # every row
    python benchmarks/grid_vs_plan.py --only gpt3-175b # rows whose name starts so

The grid is what Megatron-LM users tune by hand: tensor parallel ``t ∈ {1, 2, 4, 8}``,
pipeline ``p`` (any degree the search allows), microbatch 1–8, recompute none / selective /
full, sequence parallelism on or off, 1F1B or interleaved (``v ∈ {2, 4}``), the distributed
optimizer or not (ZeRO-1 or 0); nothing else (no ZeRO-2/3, offload, FP8, context parallelism
or zero-bubble schedule). Its best is found by :func:`fxplan.search` held to the grid with
``constraints``, so it is the best grid point *under fxplan's cost model*, and it may take the
uneven stage split the search partitions (Megatron splits evenly): that only helps the grid.
For the mixture of experts both sides may use expert parallelism (Megatron-LM has it).

The plan is :func:`fxplan.search` unconstrained. Each row also prints the **ceiling**: the
step's compute alone, spread evenly over the ``N`` devices, with no pipeline bubble, no
communication, no recompute and no tensor-parallel split (whose smaller matmuls run no faster
per flop under the model), at the microbatch whose per-sample compute is cheapest:

    T_ceil = B / N · min_{b ∈ 1..8} W_b / b

with ``W_b`` the whole model's forward and backward per microbatch of ``b`` samples on one
device (:attr:`fxplan.inter_op.profile.SegmentProfile.total_work` at ``tp = 1``, in the
training dtype: neither side uses FP8, which the search offers only when asked). Every term
the model adds to a plan is ≥ 0, so ``grid / ceiling`` is what the best conceivable plan
could gain over the grid under this cost model; where the grid is already near its ceiling no
search can do much better, which bounds the mean any planner can reach on these rows.

 Each row prints both configurations, their
predicted step times, the ratio ``grid / plan`` (> 1: the plan is faster) and both search
times. The ratios are the cost model's: a gain that rests on terms the model prices but no
GPU run here has measured (ZeRO-3's prefetch, the zero-bubble weight-gradient split, context
parallelism's exchange) is a prediction until ``fxplan validate`` measures it on GPUs.

Both sides are priced with the model states in Megatron-LM's layout (16-bit weights and
gradients beside fp32 masters, ``--state-layout megatron``, the default here), the grid's own
system's; ``--state-layout runtime`` prices both as fxplan's runtime keeps them.

Rows: the Megatron-LM SC'21 Table 1 sizes (DGX A100 80GB, s = 2048), GPT-3 175B on 1024
GPUs, the 530B model on 2240 GPUs (MT-NLG's count), Llama-2 7B and 70B on DGX H100, Llama-2 7B
at 128k tokens of context, and Alpa's GShard MoE 27B on DGX H100.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

#: The expert grid as search constraints (module docstring).
GRID: dict[str, Any] = {
    "tp": [1, 2, 4, 8],
    "microbatch_size": list(range(1, 9)),
    "recompute": ["none", "selective", "full"],
    "sequence_parallel": [False, True],
    "schedule": ["1f1b", "interleaved:2", "interleaved:4"],
    "zero_stage": [0, 1],
    "offload": "none",
    "fp8": False,
    "cp": 1,
}

LLAMA_70B = "llama:layers=80,hidden=8192,heads=64,kv_heads=8,ffn_hidden=28672,vocab=32000,seq=4096"


@dataclass(frozen=True)
class Case:
    """One row: a model spec, a cluster spec, the global batch and the sequence length."""

    name: str
    model: str
    cluster: str
    batch: int
    seq: int
    moe: bool = False


CASES: tuple[Case, ...] = (
    Case("gpt-1.7b/32", "gpt-1.7b", "dgx-a100-80g:nodes=4", 512, 2048),
    Case("gpt-3.6b/64", "gpt-3.6b", "dgx-a100-80g:nodes=8", 512, 2048),
    Case("gpt-7.5b/128", "gpt-7.5b", "dgx-a100-80g:nodes=16", 512, 2048),
    Case("gpt-18.4b/256", "gpt-18.4b", "dgx-a100-80g:nodes=32", 1024, 2048),
    Case("gpt-39.1b/512", "gpt-39.1b", "dgx-a100-80g:nodes=64", 1536, 2048),
    Case("gpt-76.1b/1024", "gpt-76.1b", "dgx-a100-80g:nodes=128", 1792, 2048),
    Case("gpt-145.6b/1536", "gpt-145.6b", "dgx-a100-80g:nodes=192", 2304, 2048),
    Case("gpt-310.1b/1920", "gpt-310.1b", "dgx-a100-80g:nodes=240", 2160, 2048),
    Case("gpt-529.6b/2520", "gpt-529.6b", "dgx-a100-80g:nodes=315", 2520, 2048),
    Case("gpt-1t/3072", "gpt-1t", "dgx-a100-80g:nodes=384", 3072, 2048),
    Case("gpt3-175b/1024", "gpt3-175b", "dgx-a100-80g:nodes=128", 1536, 2048),
    Case("gpt-529.6b/2240", "gpt-529.6b", "dgx-a100-80g:nodes=280", 1920, 2048),
    Case("llama2-7b/32-h100", "llama-7b", "dgx-h100:nodes=4", 256, 4096),
    Case("llama2-70b/256-h100", LLAMA_70B, "dgx-h100:nodes=32", 512, 4096),
    Case("llama2-7b-128k/64-h100", "llama-7b:seq=131072", "dgx-h100:nodes=8", 16, 131072),
    Case("moe-27b/64-h100", "moe-27b", "dgx-h100:nodes=8", 512, 1024, moe=True),
)


def compute_ceiling(graph: Any, cluster: Any, batch: int, microbatches: range = range(1, 9)
                    ) -> float:
    """``T_ceil = B / N · min_b W_b / b`` seconds (module docstring)."""
    from fxplan.inter_op.profile import ModelProfile

    profile = ModelProfile(graph, cluster)
    per_sample = min(profile.get(1, False, "none", b).total_work / b for b in microbatches)
    return batch * per_sample / cluster.num_devices


def run(case: Case, state_layout: str = "megatron") -> dict[str, Any]:
    """Capture once, then the grid's best and the free plan, each timed, both with the model
    states priced in ``state_layout``."""
    from fxplan import search
    from fxplan.api import capture_for_search
    from fxplan.cluster_specs import Cluster, training_dtype

    cluster = Cluster.load(case.cluster)
    graph = capture_for_search(case.model, seq=case.seq, dtype=training_dtype(cluster))
    out: dict[str, Any] = {"case": case.name,
                           "ceiling_s": compute_ceiling(graph, cluster, case.batch)}
    for side, constraints in (("grid", GRID), ("plan", None)):
        start = time.perf_counter()
        try:
            plan = search(graph, cluster, batch=case.batch, progress=False,
                          constraints=constraints, state_layout=state_layout)
        except Exception as err:   # a side with no plan that fits: say so on the row
            out[side] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:160]}",
                         "search_s": time.perf_counter() - start}
            continue
        out[side] = {"summary": plan.summary, "step_s": plan.estimate["step_time_s"],
                     "mfu": plan.estimate["mfu"], "search_s": time.perf_counter() - start,
                     "overlaps": [o["name"] for o in plan.estimate.get("overlaps", [])]}
    if "step_s" in out["grid"] and "step_s" in out["plan"]:
        out["ratio"] = out["grid"]["step_s"] / out["plan"]["step_s"]
    return out


def print_row(row: dict[str, Any]) -> None:
    print(f"\n{row['case']}", flush=True)
    for side in ("grid", "plan"):
        r = row[side]
        if "error" in r:
            print(f"  {side:4}  no plan ({r['error']}), {r['search_s']:.1f} s", flush=True)
            continue
        print(f"  {side:4}  {r['step_s']:8.3f} s  MFU {100 * r['mfu']:5.1f} %  search "
              f"{r['search_s']:6.1f} s  {r['summary']}"
              + (f"  [overlaps: {', '.join(r['overlaps'])}]" if r["overlaps"] else ""),
              flush=True)
    print(f"  ceil  {row['ceiling_s']:8.3f} s  (compute alone, module docstring)", flush=True)
    if "ratio" in row:
        print(f"  grid / plan = {row['ratio']:.3f}×, grid / ceiling = "
              f"{row['grid']['step_s'] / row['ceiling_s']:.3f}×", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], metavar="PREFIX")
    parser.add_argument("--state-layout", choices=("megatron", "runtime"), default="megatron",
                        help="the model states' layout both sides are priced in (default "
                             "megatron, the grid's own system's)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    print(f"1-minute load average before the run: {os.getloadavg()[0]:.1f}")
    ratios, headroom = [], []
    for case in CASES:
        if args.only and not any(case.name.startswith(p) for p in args.only):
            continue
        row = run(case, args.state_layout)
        print_row(row)
        if "ratio" in row:
            ratios.append(row["ratio"])
            headroom.append(row["grid"]["step_s"] / row["ceiling_s"])
    if ratios:
        print(f"\n{len(ratios)} rows: mean {sum(ratios) / len(ratios):.3f}×, min "
              f"{min(ratios):.3f}×, max {max(ratios):.3f}×")
        print(f"grid / ceiling (the most any plan could gain): mean "
              f"{sum(headroom) / len(headroom):.3f}×, min {min(headroom):.3f}×, max "
              f"{max(headroom):.3f}×")


if __name__ == "__main__":
    main()
