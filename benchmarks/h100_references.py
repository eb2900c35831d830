"""Cost model vs llm-foundry's published MPT throughput (H100 and A100 80GB, bf16, FSDP).

    python benchmarks/h100_references.py            # price the rows, print the table
    python benchmarks/h100_references.py --write    # and rewrite its section of
                                                    # docs/benchmarks.md

Published: ``benchmarks/data/llm_foundry_mpt_tables.csv`` (mosaicml/llm-foundry,
``scripts/train/benchmarking/README.md`` at commit ``5e85bd62d``, "Shashank/new benchmarks",
2024-01-06; the tables "H100 80GB BF16 (Large Scale, >= 128 GPUs)", "H100 80GB BF16" and
"A100 80GB with 1600 Gbps node-node interconnect (RoCE)"; see ``benchmarks/data/README.md``).
Every row publishes its whole configuration: model, sequence ``s``, GPUs ``n``, microbatch
``mb``, gradient accumulation ``a``, global batch ``B = mb·a·n``, the FSDP sharding
(``FULL_SHARD`` = ZeRO-3, ``SHARD_GRAD_OP`` = ZeRO-2; no tensor or pipeline parallelism) and
whether every block's activations are checkpointed (full recompute) — the two things the
Megatron-Core H100 table (``benchmarks/h100_table.py``) leaves out. The measured throughput
``X`` tokens/s/GPU implies the step time ``T = B·s / (n·X)``.

llm-foundry's MFU counts ``6·N + 12·l·h·s`` FLOPs per token (``N`` the parameter count
including embeddings; ``collect_results.py``), against 989.5 TF/s on H100 SXM and 312 on
A100; HFU counts ``8·N + 16·l·h·s`` with checkpointing. :meth:`Row.foundry_mfu` recomputes the
published MFU from ``X`` (a check of the transcription). The prediction is compared by
throughput, so the two FLOP conventions never mix: the predicted MFU column is the published
one scaled by predicted / published throughput.

Predicted: :func:`cost_model.step.estimate` of each row on ``dgx-h100`` or ``dgx-a100-80g`` with
``n/8`` nodes and attention priced as the fused (flash) kernel on both (``dgx-a100-80g``
says op by op, for its 2021 table: the llm-foundry runs used a flash-attention kernel):
``dp = n``, ZeRO stage by the sharding, recompute ``full`` where checkpointed
(else ``none``), microbatch ``mb``, ``a`` microbatches, bf16 (``amp_bf16``). The model is
this repository's ``gpt`` family at the MPT shape of ``scripts/train/yamls/pretrain/
mpt-<size>.yaml`` (``d_model``, ``n_layers``, ``n_heads``, vocabulary 50368, GELU MLP of
``4h``, biases, learned positions, tied head: its parameter count is the published ``N`` to
the parameter). Not modelled: the runs' attention kernel (the yamls' ``attn_impl: triton``,
the Triton flash-attention kernel, priced as the spec's fused kernel), their LionW optimizer
(priced as Adam; the step is 0.1–1 % of a step) and Composer's fp32 gradient reduction
(FSDP's collectives are priced hidden at ZeRO-3).

Rows priced: the models of 1B and more at s = 2048, 4096 and 8192 (``PRICED_*``). No constant
is tuned per row or per table.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # doc_sections / published_table
import published_table  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "benchmarks" / "data" / "llm_foundry_mpt_tables.csv"
DOC = REPO / "docs" / "benchmarks.md"
VOCAB = 50368
#: ``(n_layers, d_model, n_heads)`` of llm-foundry's ``mpt-<size>.yaml`` at commit 5e85bd62d.
SHAPES = {"1b": (24, 2048, 16), "3b": (32, 2560, 20), "7b": (32, 4096, 32),
          "13b": (40, 5120, 40), "30b": (48, 7168, 56), "70b": (80, 8192, 64)}
PRICED_SEQ = (2048, 4096, 8192)
#: The cluster each published GPU type is priced on, its device group, and the peak
#: llm-foundry's MFU divides by (Composer's ``GPU_AVAILABLE_FLOPS``, ``amp_bf16``).
CLUSTERS = {"h100_80gb": ("dgx-h100", "h100", 989.5e12),
            "a100_80gb": ("dgx-a100-80g", "a100", 312e12)}
START, END = "<!-- h100-references:start -->", "<!-- h100-references:end -->"


@dataclass(frozen=True)
class Row:
    """One published llm-foundry run."""

    table: str
    model: str
    seq: int
    gpus: int
    gpu: str
    mfu_percent: float
    microbatch: int
    grad_accum: int
    batch: int
    tokens_per_s: float
    sharding: str
    checkpointing: bool
    num_params: int

    @property
    def name(self) -> str:
        return f"mpt-{self.model}"

    @property
    def shape(self) -> tuple[int, int, int]:
        return SHAPES[self.model]

    @property
    def spec(self) -> str:
        layers, hidden, heads = self.shape
        return (f"gpt:layers={layers},hidden={hidden},heads={heads},vocab={VOCAB},"
                f"seq={self.seq}")

    @property
    def params(self) -> int:
        """The ``gpt`` family's parameter count at the row's shape: ``l·(12h² + 13h)``
        blocks, ``V·h`` tied embedding, ``s·h`` positions, ``2h`` final LayerNorm."""
        layers, h, _ = self.shape
        return layers * (12 * h * h + 13 * h) + VOCAB * h + self.seq * h + 2 * h

    @property
    def tokens_per_s_per_gpu(self) -> float:
        """``X``: the published total tokens/s over the GPUs (the published per-GPU column
        is the same, truncated to an integer)."""
        return self.tokens_per_s / self.gpus

    @property
    def implied_step_time_s(self) -> float:
        """T = B·s / (n·X)."""
        return self.batch * self.seq / (self.gpus * self.tokens_per_s_per_gpu)

    def foundry_mfu(self) -> float:
        """llm-foundry's MFU from the published throughput: ``(6·N + 12·l·h·s)·X / peak``."""
        layers, h, _ = self.shape
        per_token = 6 * self.num_params + 12 * layers * h * self.seq
        return per_token * self.tokens_per_s_per_gpu / CLUSTERS[self.gpu][2]

    @property
    def priced(self) -> bool:
        return self.model in SHAPES and self.seq in PRICED_SEQ and self.gpu in CLUSTERS


def load_rows(path: Path = TABLE) -> list[Row]:
    return published_table.read_rows(path, lambda r: Row(
        r["table"], r["model"], int(r["seq"]), int(r["gpus"]), r["gpu"],
        float(r["mfu_percent"]), int(r["microbatch"]), int(r["grad_accum"]),
        int(r["global_batch"]), float(r["tokens_per_s"]), r["sharding"],
        r["activation_checkpointing"] == "True", int(r["num_params"])))


@dataclass(frozen=True)
class Priced:
    """One row's estimate."""

    row: Row
    estimate: Any

    @property
    def tokens_per_s_per_gpu(self) -> float:
        r = self.row
        return r.batch * r.seq / (r.gpus * self.estimate.step_time_s)

    @property
    def ratio(self) -> float:
        """Predicted / published throughput (> 1: the model is optimistic)."""
        return self.tokens_per_s_per_gpu / self.row.tokens_per_s_per_gpu

    @property
    def predicted_mfu_percent(self) -> float:
        """The published MFU scaled by predicted / published throughput."""
        return self.row.mfu_percent * self.ratio


def config_for(row: Row) -> Any:
    """The published configuration as a :class:`ParallelConfig`."""
    from fxplan.cost_model import ParallelConfig

    return ParallelConfig(dp=row.gpus, microbatch_size=row.microbatch,
                          num_microbatches=row.grad_accum,
                          zero_stage=3 if row.sharding == "FULL_SHARD" else 2,
                          recompute="full" if row.checkpointing else "none")


def capture_row(row: Row) -> Any:
    """The row's model, captured in bf16 at its sequence length."""
    import torch

    from fxplan.api import capture
    from fxplan.examples.model_spec import resolve_model

    bundle = resolve_model(row.spec)
    return capture(bundle.build(), inputs=bundle.example_inputs(1, row.seq),
                   dtype=torch.bfloat16)


def cluster_for(row: Row, matmul: float | None = None) -> Any:
    """The row's cluster (fused attention); ``matmul`` replaces the spec's matmul efficiency."""
    from fxplan.cluster_specs import Cluster

    name, group, _ = CLUSTERS[row.gpu]
    cluster = Cluster.load(f"{name}:devices={row.gpus},{group}.fused_attention=true")
    return cluster if matmul is None else published_table.with_matmul_efficiency(cluster, matmul)


def predict(row: Row, graph: Any, cluster: Any = None) -> Priced:
    """Estimate ``row``'s published configuration on ``graph``."""
    from fxplan.cost_model import estimate

    return Priced(row, estimate(graph, cluster or cluster_for(row), config_for(row),
                                # PURE mixed precision reduces in bf16, as Megatron-LM's layout
                                batch=row.batch, seq=row.seq, state_layout="megatron"))


def pairs(rows: list[Row]) -> list[tuple[Row, Row]]:
    """``(H100 row, A100 row)`` of the same published configuration: model, ``s``, GPUs,
    microbatch, accumulation, sharding and checkpointing all equal."""
    def key(r: Row) -> tuple[Any, ...]:
        return (r.model, r.seq, r.gpus, r.microbatch, r.grad_accum, r.sharding,
                r.checkpointing)

    a100 = {key(r): r for r in rows if r.gpu == "a100_80gb"}
    return [(r, a100[key(r)]) for r in rows if r.gpu == "h100_80gb" and key(r) in a100]


def matched_matmul(h100: Row, a100: Row, graphs: dict[str, Any]) -> tuple[float, ...]:
    """The H100 matmul efficiency ``E*`` at which the model is as far from the published H100
    throughput as it is from the A100 one on the same configuration (A100 at its spec):
    ``T_H(E*) = T_H,published · T_A,predicted / T_A,published``, with the H100 step time
    taken as ``T(E) = a + b/E`` through the spec's efficiency ``E₀`` and ``0.75·E₀`` (two
    estimates; the compute leg of every GEMM scales as ``1/E``). Returns ``(E*, A100 predicted / published throughput, the same on H100 at
    E₀, published H100 / A100 throughput)``."""
    if h100.spec not in graphs:
        graphs[h100.spec] = capture_row(h100)
    graph = graphs[h100.spec]
    on_a100 = predict(a100, graph)
    e0 = cluster_for(h100).device_groups[0].compute_efficiency["matmul"]
    t0 = predict(h100, graph).estimate.step_time_s
    low = 0.75 * e0
    t1 = predict(h100, graph, cluster_for(h100, low)).estimate.step_time_s
    b = (t1 - t0) / (1 / low - 1 / e0)
    a = t0 - b / e0
    target = h100.implied_step_time_s / on_a100.ratio
    return (b / (target - a), on_a100.ratio, h100.implied_step_time_s / t0,
            h100.tokens_per_s_per_gpu / a100.tokens_per_s_per_gpu)


def markdown(priced: list[Priced]) -> str:
    """The table and a summary per GPU type."""
    lines = [
        "| table | model | s | GPUs | mb × a | sharding | recompute | published tok/s/GPU | "
        "predicted tok/s/GPU | predicted / published | published MFU | predicted MFU | "
        "peak GiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in priced:
        r, e = p.row, p.estimate
        lines.append(
            f"| {r.table} | {r.name} | {r.seq} | {r.gpus} | {r.microbatch} × {r.grad_accum} | "
            f"{r.sharding} | {'full' if r.checkpointing else 'none'} | "
            f"{r.tokens_per_s_per_gpu:,.0f} | {p.tokens_per_s_per_gpu:,.0f} | {p.ratio:.2f} | "
            f"{r.mfu_percent:.1f} % | {p.predicted_mfu_percent:.1f} % | "
            f"{max(e.peak_memory_gib):.1f}{'' if e.fits else ' (does not fit)'} |")
    lines.append("")
    lines.extend(summary(priced))
    return "\n".join(lines)


def summary(priced: list[Priced]) -> list[str]:
    """Per GPU type: rows, predicted / published throughput (median, range), rows within ±10 %."""
    import statistics

    out = []
    for gpu in CLUSTERS:
        ratios = sorted(p.ratio for p in priced if p.row.gpu == gpu)
        if not ratios:
            continue
        inside = sum(abs(x - 1) <= 0.10 for x in ratios)
        out.append(f"- {gpu} ({CLUSTERS[gpu][0]}): {len(ratios)} rows, predicted / published "
                   f"throughput median {statistics.median(ratios):.2f} (range {ratios[0]:.2f}–"
                   f"{ratios[-1]:.2f}), {inside} within ±10 %.")
    return out


def write_section(text: str, path: Path = DOC) -> None:
    """Replace this benchmark's section of ``docs/benchmarks.md``."""
    from doc_sections import replace_section

    replace_section(path, START, END, text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true",
                        help="rewrite the table's part of docs/benchmarks.md (default: print)")
    parser.add_argument("--gpu", choices=sorted(CLUSTERS), default=None,
                        help="price only this GPU type's rows")
    parser.add_argument("--matmul", type=float, default=None,
                        help="what-if: the matmul efficiency of every priced device")
    parser.add_argument("--pairs", action="store_true",
                        help="the H100 matmul efficiency matched to each A100 pair "
                             "(matched_matmul), instead of the table")
    args = parser.parse_args()
    rows = [r for r in load_rows() if r.priced and args.gpu in (None, r.gpu)]
    graphs: dict[str, Any] = {}
    if args.pairs:
        import statistics

        found = []
        for h100, a100 in pairs(rows):
            e, ratio_a, ratio_h, published = matched_matmul(h100, a100, graphs)
            found.append(e)
            print(f"{h100.name:>8} s={h100.seq:<5} n={h100.gpus:<3} mb={h100.microbatch} "
                  f"a={h100.grad_accum} {'full' if h100.checkpointing else 'none':>4}: "
                  f"published H100/A100 {published:.2f}, predicted / published throughput A100 "
                  f"{ratio_a:.2f}, H100 {ratio_h:.2f}, matched H100 matmul {e:.3f}",
                  flush=True)
        print(f"median {statistics.median(found):.3f} over {len(found)} pairs "
              f"(range {min(found):.3f}–{max(found):.3f})")
        return 0
    priced = []
    for row in rows:
        if row.spec not in graphs:
            graphs[row.spec] = capture_row(row)
        p = predict(row, graphs[row.spec], cluster_for(row, args.matmul))
        priced.append(p)
        b = p.estimate.breakdown
        print(f"{row.table:>22} {row.name:>8} s={row.seq:<5} n={row.gpus:<4} published "
              f"{row.tokens_per_s_per_gpu:8,.0f} predicted {p.tokens_per_s_per_gpu:8,.0f} "
              f"tok/s/GPU ({p.ratio:.2f}; "
              + ", ".join(f"{k} {v:.3f}" for k, v in b.items() if v > 0) + " s)", flush=True)
    table = markdown(priced)
    print()
    print(table)
    if args.write:
        write_section(PROSE.replace("{table}", table))
        print(f"\nwritten to {DOC.relative_to(REPO)}")
    return 0


#: The section's prose around ``{table}``.
PROSE = """\
## Cost model vs llm-foundry's H100 and A100 tables (every argument published)

Public H100 training results whose whole configuration is published, priced by \
`cost_model.step.estimate`: MosaicML llm-foundry's MPT throughput tables \
(`benchmarks/data/llm_foundry_mpt_tables.csv`, source in `benchmarks/data/README.md`), the \
rows of 1B–70B at s = 2048, 4096, 8192 on H100 80GB and, as the control, the same software on \
A100 80GB. Each row publishes microbatch, gradient accumulation, FSDP sharding (ZeRO-3 or -2, \
no tensor or pipeline parallelism) and whether every block is checkpointed (full recompute): \
the recompute and microbatch question of the Megatron-Core table does not arise. Compared by \
throughput (llm-foundry's MFU counts `6·N + 12·l·h·s` FLOPs per token; the predicted MFU is \
the published one scaled by predicted / published throughput). Attention priced as a fused \
kernel on both GPUs (the runs used llm-foundry's Triton flash attention). Reproduce with \
`python benchmarks/h100_references.py` (`--write` updates this section).

{table}

**The same runs on both GPUs locate the gap on the H100.** At the spec's former matmul \
efficiency 0.69 the 44 H100 rows were predicted 1.11–1.67× faster than published (median \
1.35, none within ±10 %), while the 17 A100 rows, at the spec validated by the SC'21 table, \
read 0.94–1.40 (median 1.09, 9 within ±10 %; full-checkpointing rows 0.94–1.12 up to \
s = 4096). The 12 configurations run identically on both (`python benchmarks/\
h100_references.py --pairs`) ran 2.11–2.53× faster on the H100 than on the A100, where the \
spec priced about 2.9× for GEMMs; the H100 matmul efficiency at which the model's H100 error \
equals its A100 error is 0.607 and 0.566 on the 70B pairs, 0.520–0.561 on 30B, 0.536 on 13B, \
0.478 and 0.548 on 7B, 0.458–0.512 on 3B, 0.437–0.493 on 1B: median 0.521, which \
`dgx-h100.yaml` now takes (0.52; the rule and the other sources in `benchmarks/data/\
hardware.md`, "Sustained H100 matmul rate in training"). It moved the Megatron-Core table \
above from 1 to 8 of 9 rows within ±5 points, with nothing fitted to that table.

What the table above still shows: `E*` falls with model size, so a single matmul rate leaves \
the 1B–3B rows optimistic and the 70B rows pessimistic, i.e. part of what 0.52 absorbs is not \
GEMM time (memory-bound kernels, launches, FSDP's per-module work). Rows without \
checkpointing at small microbatches (13B, `mb` 2) are the most optimistic: the published 13B \
ran more tokens/s per GPU checkpointed at `mb` 16 (128–512 GPUs) than without checkpointing at \
`mb` 2 (8–64 GPUs), which the model (4/3 the compute for the former) does not reproduce. At s = 8192 both GPUs' rows are optimistic (A100 \
30B 1.40): these runs' Triton flash-attention kernel was slower than the fused kernel priced.

Other H100 results looked at and not priced: NVIDIA's NeMo / Megatron-Bridge performance \
summaries (`docs/performance-summary*.md`, NVIDIA-NeMo/Megatron-Bridge; NeMo 24.07's in \
NVIDIA/NeMo) publish TP/PP/CP/VP/MBS/GBS for GPT-3 175B and Llama 2/3 on DGX H100, but every \
dense H100 row is FP8 (its BF16 H100 rows are all GPT-OSS 120B, a mixture of experts); \
torchtitan's Llama 3.1 results (`benchmarks/llama3_h100_202412_torchtitan.md`: 8B FSDP on 8 \
GPUs, local batch 2, selective checkpointing, 5,762 tokens/s/GPU eager) ran on 96 GB HBM2e \
H100s at a 500 W limit, not a DGX H100; Meta's Llama 3 405B (16K H100s at 700 W, 380–430 \
TF/s per GPU) does not publish microbatch or recompute. How the Megatron-Core table's runs \
were configured is not published anywhere found: NVIDIA/Megatron-LM#1571 ("parameters to \
reproduce the performance in readme", 2025) asks for the scripts and is open, with no answer \
in the thread as stored; its author reports an out-of-memory error on the 70B row's parallel \
sizes with his own arguments.
"""


if __name__ == "__main__":
    raise SystemExit(main())
