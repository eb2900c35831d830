"""Cost model vs published training throughput on B200 and GB200 (and H100 beside them), and
vs AMD's expected throughput on MI300X and MI325X.

    python benchmarks/new_devices_table.py            # print the table
    python benchmarks/new_devices_table.py --write    # and rewrite its section of docs/benchmarks.md
    python benchmarks/new_devices_table.py --rows amd [--write]     # the MI300X/MI325X table
    python benchmarks/new_devices_table.py --rows amd-measured [--write]  # measured MI300X/MI325X

Published: ``benchmarks/data/megatron_bridge_2025_table.csv``, rows of NVIDIA's Megatron-Bridge
performance summary (NeMo container 25.11; ``docs/performance-summary.md`` of
NVIDIA-NeMo/Megatron-Bridge): Llama 3 8B and 70B pre-training at s = 8192 in FP8 with current
scaling (Transformer Engine), tokens/s per GPU. Dense BF16 rows are not published for these
systems (``benchmarks/data/hardware.md``, "Devices of 2025").

Predicted: :func:`fxplan.cost_model.step.estimate` of the published configuration — the zoo's
``llama`` family at the row's shape, ``fp8=on`` (the cost model's FP8 recipe is torchao's,
:mod:`cost_model.compute.fp8`: dynamic per-tensor scales, activations saved in 16 bits), the row's
tensor/pipeline degrees, microbatch and global batch, ZeRO-3 where the row uses FSDP and
ZeRO-1 (the distributed optimizer) otherwise, sequence parallelism with ``tp > 1`` — on the
row's spec (``dgx-h100``, ``dgx-b200``, ``gb200-nvl72``). Not published, so chosen by one rule
for every row: the recompute policy, the fastest of none, selective, full that fits in memory
(the fastest of all when none fits, marked), and the interleaving of a pipelined row as the
shared driver chooses it (:mod:`published_table`). No constant is fitted to these rows: the
specs' efficiencies come from the rule of ``hardware.md``.

``--rows amd``: ``benchmarks/data/amd_cvs_2025_table.csv``, the Megatron-LM rows of AMD's
cluster validation suite (ROCm/cvs, ``singlenode_megatron_llama.json``; container
``rocm/megatron-lm:v25.5_py310``): Llama 3.1 8B and 70B on one node of 8 MI300X or MI325X,
s = 8192, Transformer Engine FP8, each with its degrees, microbatch, global batch and
recompute (none) published, and the tokens/s and TFLOP/s per GPU a run is expected to reach
(the suite's pass thresholds, set by AMD; not one measured run). Priced as above on
``mi300x`` / ``mi325x``, with the published recompute.

``--rows amd-measured``: AMD's measured FSDP runs of Llama 3.1 8B on 8 MI300X or MI325X
(``benchmarks/data/amd_pytorch_training_2025_table.csv``), priced by the same :func:`predict`
with each row's precision (:mod:`amd_measured`).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import published_table  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "benchmarks" / "data" / "megatron_bridge_2025_table.csv"
AMD_TABLE = REPO / "benchmarks" / "data" / "amd_cvs_2025_table.csv"
DOC = REPO / "docs" / "benchmarks.md"
START, END = "<!-- new-devices-table:start -->", "<!-- new-devices-table:end -->"
#: ``--rows``: the published table and the markers of its section of docs/benchmarks.md.
SOURCES = {"nvidia": (TABLE, START, END),
           "amd": (AMD_TABLE, "<!-- amd-devices-table:start -->",
                   "<!-- amd-devices-table:end -->")}
#: The CSV's ``recompute`` column (where published): 0 none, 1 full.
PUBLISHED_RECOMPUTE = {"0": "none", "1": "full"}
#: Llama 3 shapes (Meta's configs): layers, hidden, heads, kv heads, FFN, vocabulary.
SHAPES = {"llama3-8b": (32, 4096, 32, 8, 14336, 128256),
          "llama3-70b": (80, 8192, 64, 8, 28672, 128256)}
RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class Row:
    system: str
    cluster: str
    model: str
    gpus: int
    batch: int
    microbatch: int
    seq: int
    fsdp: bool
    tp: int
    pp: int
    tokens_per_s_per_gpu: float
    recompute: str | None = None     # the published policy; None: not published
    fp8: bool = True                 # FP8 matmuls (every Megatron row); False: BF16

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp)

    @property
    def layers(self) -> int:
        return SHAPES[self.model][0]

    @property
    def spec(self) -> str:
        l, h, a, kv, ffn, v = SHAPES[self.model]
        return (f"llama:layers={l},hidden={h},heads={a},kv_heads={kv},ffn_hidden={ffn},"
                f"vocab={v},seq={self.seq}")

    @property
    def implied_step_time_s(self) -> float:
        return self.batch * self.seq / (self.tokens_per_s_per_gpu * self.gpus)


def load_rows(path: Path = TABLE) -> list[Row]:
    return published_table.read_rows(path, lambda r: Row(
        r["system"], r["cluster"], r["model"], int(r["gpus"]), int(r["global_batch"]),
        int(r["micro_batch"]), int(r["seq"]), r["fsdp"] == "1", int(r["tp"]), int(r["pp"]),
        float(r["tokens_per_s_per_gpu"]), PUBLISHED_RECOMPUTE.get(r.get("recompute") or "")))


def predict(row: Row, graph) -> tuple[object, str, bool]:
    """The estimate kept by the module docstring's rule (the published recompute where there
    is one), its recompute policy, whether it fits."""
    from fxplan.cluster_specs import Cluster
    from fxplan.core.schedule import Schedule
    from fxplan.cost_model import ParallelConfig, estimate

    cluster = Cluster.load(row.cluster)
    best = None
    for policy in (row.recompute,) if row.recompute else RECOMPUTE:
        for v in published_table.chunk_choices(row, row.batch // (row.dp * row.microbatch), 8):
            config = ParallelConfig(
                dp=row.dp, tp=row.tp, pp=row.pp, microbatch_size=row.microbatch,
                schedule=Schedule("interleaved", v) if v > 1 else Schedule("1f1b"),
                recompute=policy, zero_stage=3 if row.fsdp else 1, fp8=row.fp8,
                sequence_parallel=row.tp > 1)
            # the published systems' layout of the model states (Megatron's)
            result = estimate(graph, cluster, config, batch=row.batch, seq=row.seq,
                              state_layout="megatron")
            key = (not result.fits, result.step_time_s)
            if best is None or key < best[0]:
                best = (key, result, policy)
    assert best is not None
    return best[1], best[2], not best[0][0]


def table(rows: list[Row]) -> str:
    from fxplan.api import capture_for_search

    lines = ["| system | model | GPUs | tp·pp·dp | mb | published tok/s/GPU | predicted | "
             "predicted / published | recompute | fits |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        graph = capture_for_search(row.spec, dtype="bfloat16")
        result, policy, fits = predict(row, graph)
        tokens = result.tokens_per_s / row.gpus
        lines.append(f"| {row.system} | {row.model} | {row.gpus} | {row.tp}·{row.pp}·{row.dp} | "
                     f"{row.microbatch} | {row.tokens_per_s_per_gpu:,.0f} | {tokens:,.0f} | "
                     f"{tokens / row.tokens_per_s_per_gpu:.2f} | {policy} | "
                     f"{'yes' if fits else 'no'} |")
        print(lines[-1], flush=True)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the docs section")
    parser.add_argument("--rows", choices=sorted([*SOURCES, "amd-measured"]), default="nvidia",
                        help="the published table to price (module docstring)")
    args = parser.parse_args()
    if args.rows == "amd-measured":
        import amd_measured
        start, end = amd_measured.START, amd_measured.END
        text = amd_measured.table(amd_measured.load_rows())
    else:
        path, start, end = SOURCES[args.rows]
        text = table(load_rows(path))
    if args.write:
        doc = DOC.read_text(encoding="utf-8")
        head, _, rest = doc.partition(start)
        _, _, tail = rest.partition(end)
        DOC.write_text(f"{head}{start}\n{text}\n{end}{tail}", encoding="utf-8")
        print(f"wrote {DOC}")


if __name__ == "__main__":
    main()
