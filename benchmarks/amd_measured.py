"""MI300X and MI325X: the cost model against AMD's measured training throughput.

    python benchmarks/new_devices_table.py --rows amd-measured [--write]

Published: ``benchmarks/data/amd_pytorch_training_2025_table.csv``, the "Reference
Performance" rows of AMD's README for the ``rocm/pytorch-training:v25.2`` container: Llama 3.1
8B pre-trained on one node of 8 MI300X or 8 MI325X by AMD's ``train_fsdp.py``
(AMD-AIG-AIMA/pytorch-training-benchmark), in BF16 (``torch.compile``) or FP8 (Transformer
Engine layers, delayed scaling), at s = 8192 and 4096, each with its microbatch per GPU. The
script fixes the rest: PyTorch FSDP with full sharding (ZeRO-3) over the 8 GPUs, gradients
reduced in every microbatch, 8 microbatches per optimizer step (AdamW, fused), no activation
checkpointing, random tokens. What it reports is measured: the TFLOP/s per GPU of rank 0,
``F·b·s / t̄`` with ``t̄`` the mean time of microbatch iterations 33–63 of 64 (an optimizer step
every 8th), and ``F`` its own FLOPs per token (``llama.py``, ``estimate_flops_per_token``)::

    F = 3·[l·(6·h·f + 2·h·(a + 2·g)·d + 2·h²) + 2·h·V] + 12·l·s·a·d

(``d = h/a``; every matmul ×3 for forward and backward, the attention square counted whole).
The published TF/s ``X`` is therefore ``X/F`` tokens/s per GPU, whatever the count's merits.

Predicted: :func:`new_devices_table.predict` of that configuration — the zoo's ``llama`` at
Llama 3 8B's shape, ``dp = 8``, ZeRO-3, the published microbatch, the global batch of 8
microbatches on each GPU, the published recompute (none) and FP8 on the FP8 rows only — on
``mi300x`` / ``mi325x``. No constant is fitted to these rows (the specs' matmul efficiencies
come from the rule of ``benchmarks/data/hardware.md``).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import new_devices_table  # noqa: E402
import published_table  # noqa: E402

TABLE = new_devices_table.REPO / "benchmarks" / "data" / "amd_pytorch_training_2025_table.csv"
START, END = "<!-- amd-measured-table:start -->", "<!-- amd-measured-table:end -->"
#: The CSV's ``precision`` column → FP8 matmuls.
FP8 = {"BF16": False, "FP8": True}


def flops_per_token(model: str, seq: int) -> float:
    """``F`` of the module docstring at Llama shape ``model`` and sequence length ``seq``."""
    l, h, a, g, f, v = new_devices_table.SHAPES[model]
    d = h // a
    weights = l * (6 * h * f + 2 * h * (a + 2 * g) * d + 2 * h * h) + 2 * h * v
    return 3 * weights + 12 * l * seq * a * d


def load_rows(path: Path = TABLE) -> list[new_devices_table.Row]:
    """Every CSV row as a :class:`new_devices_table.Row`: tokens/s per GPU = X / F."""
    def make(r: dict[str, str]) -> new_devices_table.Row:
        if r["precision"] not in FP8 or r["recompute"] != "0":
            raise ValueError(f"{path.name}: precision {r['precision']!r} / recompute "
                             f"{r['recompute']!r}: expected BF16 or FP8 and no recompute")
        seq = int(r["seq"])
        tokens = float(r["measured_tflops_per_gpu"]) * 1e12 / flops_per_token(r["model"], seq)
        return new_devices_table.Row(
            r["system"], r["cluster"], r["model"], int(r["gpus"]), int(r["global_batch"]),
            int(r["micro_batch"]), seq, r["fsdp"] == "1", int(r["tp"]), int(r["pp"]),
            tokens, "none", FP8[r["precision"]])
    return published_table.read_rows(path, make)


def table(rows: list[new_devices_table.Row]) -> str:
    """The markdown table of the docs section, one priced row per published row."""
    from fxplan.api import capture_for_search

    lines = ["| system | precision | s | mb × accumulation | published TF/s/GPU | "
             "published tok/s/GPU | predicted tok/s/GPU | predicted / published | recompute | "
             "fits | peak GiB |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    graphs: dict[tuple[str, int], object] = {}
    for row in rows:
        key = (row.model, row.seq)
        if key not in graphs:
            graphs[key] = capture_for_search(row.spec, dtype="bfloat16")
        result, policy, fits = new_devices_table.predict(row, graphs[key])
        tokens = result.tokens_per_s / row.gpus
        published_tf = row.tokens_per_s_per_gpu * flops_per_token(row.model, row.seq) / 1e12
        lines.append(
            f"| {row.system} | {'FP8' if row.fp8 else 'BF16'} | {row.seq} | {row.microbatch} × "
            f"{row.batch // (row.dp * row.microbatch)} | {published_tf:.2f} | "
            f"{row.tokens_per_s_per_gpu:,.0f} | {tokens:,.0f} | "
            f"{tokens / row.tokens_per_s_per_gpu:.2f} | {policy} | {'yes' if fits else 'no'} | "
            f"{max(result.peak_memory_gib):.1f} |")
        print(lines[-1], flush=True)
    return "\n".join(lines)
