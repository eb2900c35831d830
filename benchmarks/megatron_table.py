"""Cost model vs Megatron-LM SC'21 Table 1: predicted vs published step time, every row.

    python benchmarks/megatron_table.py            # print the table
    python benchmarks/megatron_table.py --write    # print it and rewrite its section of
                                                   # docs/benchmarks.md
    python benchmarks/megatron_table.py --speed    # time estimates of GPT 1T on 3072 GPUs

Published: ``benchmarks/data/megatron_sc21_table1.csv`` (Narayanan et al., 2021, Table 1:
GPT weak scaling on DGX A100 80GB, mixed precision, s = 2048, V = 51200, activation
recompute, interleaved schedule). The measured X TFLOP/s per GPU implies the step time
``T = F / (n·X)`` with ``F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))``.

Predicted: :func:`cost_model.step.estimate` of the published configuration — tensor parallel
``t``, pipeline ``p``, data parallel ``d = n/(t·p)``, global batch ``B``, ``n/8`` DGX A100
80GB nodes, full recompute, bf16, ZeRO-0, no sequence parallelism (SC'21 predates it). Not
published, so chosen by a fixed rule, the same for every row:

- interleaving ``v``: each ``v ≤ 4`` with ``l`` divisible by ``p·v`` (``p = 1``: no
  pipeline); for a microbatch size whose count ``B/(d·mb)`` is not a multiple of ``p``
  (Megatron's interleaved schedule requires it) the plain 1F1B schedule (``v = 1``);
- microbatch size and interleaving: the fastest of 1, 2, 4, 8, 16 and those ``v`` that fits
  in memory.

No constant is tuned per row: all efficiencies come from ``cluster_specs/builtin/
dgx-a100-80g.yaml`` and ``cost_model/data/efficiency.json`` (see ``docs/cost_model.md``).
``tests/cost_model/test_megatron.py`` asserts every row within ±10 %.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared driver, by file path too
import published_table  # noqa: E402
from published_table import Prediction  # noqa: E402,F401  (re-exported for the tests)

REPO = Path(__file__).resolve().parents[1]
TABLE1 = REPO / "benchmarks" / "data" / "megatron_sc21_table1.csv"
DOC = REPO / "docs" / "benchmarks.md"
SEQ, VOCAB = 2048, 51200
MICROBATCHES = (1, 2, 4, 8, 16)
MAX_CHUNKS = 4
START, END = "<!-- megatron-table:start -->", "<!-- megatron-table:end -->"


@dataclass(frozen=True)
class Row:
    """One published run."""

    params_billion: float
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    gpus: int
    batch: int
    tflops_per_gpu: float

    @property
    def preset(self) -> str:
        return "gpt-1t" if self.params_billion >= 1000 else f"gpt-{self.params_billion:g}b"

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp)

    @property
    def flops_per_step(self) -> float:
        """F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))."""
        l, h = self.layers, self.hidden
        return 96 * self.batch * SEQ * l * h * h * (1 + SEQ / (6 * h) + VOCAB / (16 * l * h))

    @property
    def implied_step_time_s(self) -> float:
        """T = F / (n·X)."""
        return self.flops_per_step / (self.gpus * self.tflops_per_gpu * 1e12)


def load_rows(path: Path = TABLE1) -> list[Row]:
    return published_table.read_rows(path, lambda r: Row(
        float(r["params_billion"]), int(r["heads"]), int(r["hidden"]), int(r["layers"]),
        int(r["tensor_parallel"]), int(r["pipeline_parallel"]), int(r["gpus"]),
        int(r["global_batch"]), float(r["tflops_per_gpu"])))


def chunk_choices(row: Row, microbatches: int) -> tuple[int, ...]:
    """The interleavings ``v`` the rule of the module docstring tries."""
    return published_table.chunk_choices(row, microbatches, MAX_CHUNKS)


def predict(row: Row, graph: Any, cluster: Any = None) -> Prediction:
    """Estimate ``row``'s published configuration (module docstring) on ``graph``."""
    from fxplan.cluster_specs import Cluster
    from fxplan.cost_model import estimate

    cluster = cluster or Cluster.load(f"dgx-a100-80g:nodes={row.gpus // 8}")
    return published_table.fastest_fit(
        # Megatron-LM's layout of the model states (16-bit weights and gradients, fp32 masters)
        row, lambda config: estimate(graph, cluster, config, batch=row.batch, seq=SEQ,
                                     state_layout="megatron"),
        microbatches=MICROBATCHES, max_chunks=MAX_CHUNKS, zero_stage=0)


def capture_row(row: Row) -> Any:
    import torch

    from fxplan.api import capture

    return capture(row.preset, batch=1, seq=SEQ, dtype=torch.bfloat16)


def markdown(predictions: list[Prediction]) -> str:
    lines = [
        "| model | t | p | d | GPUs | batch | v | mb | published TF/s | predicted TF/s | "
        "published step (s) | predicted step (s) | error | peak GiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for pr in predictions:
        r, e = pr.row, pr.estimate
        lines.append(
            f"| {r.preset} | {r.tp} | {r.pp} | {r.dp} | {r.gpus} | {r.batch} | {pr.chunks} | "
            f"{pr.microbatch} | {r.tflops_per_gpu:.0f} | {e.tflops_per_device:.1f} | "
            f"{r.implied_step_time_s:.2f} | {e.step_time_s:.2f} | {pr.error * 100:+.1f} % | "
            f"{max(e.peak_memory_gib):.1f} |")
    worst = max(abs(p.error) for p in predictions)
    lines.append("")
    lines.append(f"Worst row: {worst * 100:.1f} % (bound ±10 %). Reproduce with "
                 "`python benchmarks/megatron_table.py` (`--write` updates this section).")
    return "\n".join(lines)


def write_section(table: str, path: Path = DOC) -> None:
    """Replace this benchmark's section of ``docs/benchmarks.md`` (others keep theirs)."""
    section = ("## Cost model vs Megatron-LM SC'21 Table 1\n\n"
               "Predicted step time of each published configuration by `cost_model.step.estimate` "
               "against the step time implied by the published TFLOP/s per GPU "
               "(`F/(n·X)`); `v` and `mb` by the rule in `benchmarks/megatron_table.py`. "
               "TF/s counts the recompute forward (Megatron's convention).\n\n"
               f"{table}")
    from doc_sections import replace_section  # benchmarks/, on sys.path when run as a script

    replace_section(path, START, END, section)


def speed(repeats: int = 8) -> None:
    """Time ``estimate`` of GPT 1T on 3072 GPUs once its profiles are cached, with timelines
    not seen before (four configuration variants in turn, the timeline memo cleared)."""
    import statistics

    import fxplan.cost_model.step.simulator as simulator
    from fxplan.cluster_specs import Cluster
    from fxplan.cost_model import ParallelConfig, estimate

    row = load_rows()[-1]
    graph, cluster = capture_row(row), Cluster.load(f"dgx-a100-80g:nodes={row.gpus // 8}")
    base = ParallelConfig.parse("dp=6,tp=8,pp=64,mb=1,schedule=interleaved:2,zero=0,recompute=full")
    variants = [base, base.replace(recompute="selective"), base.replace(sequence_parallel=True),
                base.replace(zero_stage=3)]
    start = time.perf_counter()
    for config in variants:
        estimate(graph, cluster, config, batch=row.batch)
    print(f"first estimates (profiles, schedule): {time.perf_counter() - start:.2f} s")
    for label, clear in (("new timeline", True), ("timeline seen before", False)):
        times = []
        for _ in range(repeats):
            for config in variants:
                if clear:
                    simulator._TIMELINES.clear()
                start = time.perf_counter()
                estimate(graph, cluster, config, batch=row.batch)
                times.append(time.perf_counter() - start)
        print(f"{label:>21}: min {min(times) * 1e3:.1f} ms, median "
              f"{statistics.median(times) * 1e3:.1f} ms over {len(times)} estimates")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true",
                        help="rewrite the table's section of docs/benchmarks.md (default: print only)")
    parser.add_argument("--no-write", action="store_true",
                        help="print only (the default; kept for old command lines)")
    parser.add_argument("--speed", action="store_true",
                        help="time estimates of GPT 1T on 3072 GPUs instead of the table")
    args = parser.parse_args()
    if args.speed:
        speed()
        return 0
    predictions = []
    for row in load_rows():
        pr = predict(row, capture_row(row))
        predictions.append(pr)
        print(f"{row.preset:>11}  published {row.implied_step_time_s:8.2f} s  predicted "
              f"{pr.estimate.step_time_s:8.2f} s  error {pr.error * 100:+5.1f} %  "
              f"(v={pr.chunks}, mb={pr.microbatch}, {pr.seconds * 1e3:.0f} ms for "
              f"{pr.estimates} estimates)", flush=True)
    table = markdown(predictions)
    print()
    print(table)
    if args.write and not args.no_write:
        write_section(table)
        print(f"\nwritten to {DOC.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
