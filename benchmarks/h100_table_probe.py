"""What-if probes of the H100 table's gap (``benchmarks/h100_table.py``): not predictions.

    python benchmarks/h100_table_probe.py                            # r per row
    python benchmarks/h100_table_probe.py --matmul-half-flops 6e10   # a later GEMM knee
    python benchmarks/h100_table_probe.py --no-tp-overlap            # tp comm fully exposed
    python benchmarks/h100_table_probe.py --no-pg-overlap            # param gather after the step
    python benchmarks/h100_table_probe.py --dp-exposed               # dp comm fully exposed
    python benchmarks/h100_table_probe.py --param-gather-hidden      # r without the ZeRO all-gather
    python benchmarks/h100_table_probe.py --param-gather-hidden --comm-sms 32   # + SMs held by NCCL
    python benchmarks/h100_table_probe.py --waves                    # GEMM tail waves on the SMs
    python benchmarks/h100_table_probe.py --flops                    # the table's own FLOP count
    python benchmarks/h100_table_probe.py --param-gather-hidden --recompute full   # all rows recomputed
    python benchmarks/h100_table_probe.py --matmul 0.6               # another H100 matmul rate

Each row prints ``r = (T_published − T_other) / (compute + bubble)``, the factor by which the
published run is slower than the predicted compute (``T_other``: the predicted step time less
compute and bubble, i.e. exposed communication, imbalance, optimizer), from the estimate's
breakdown. ``--matmul-half-flops F``: the H100 matmul efficiency curve's ``half_flops`` set
to ``F`` (``cost_model/data/efficiency.json`` has 6e9; the parsed data of this process only)
— does a GEMM-size effect explain the small rows? ``--no-tp-overlap``: the published
configurations priced without ``tp_overlap`` (``h100_table.predict(..., tp_overlap=False)``),
the tensor-parallel collectives fully on the critical path. ``--dp-exposed``: the H100's
``comm_overlap`` set to 0 (``h100.comm_overlap=0``), so every data-parallel gradient bucket
(4-byte, Megatron's fp32 reduction) waits for the end of the backward — the upper bound of
what the data-parallel reduction can add. ``--no-pg-overlap``: the distributed optimizer's
parameter all-gather charged in full after the step (``h100_table.predict(...,
param_gather_overlap=False)``), where the table hides it behind the next step's forward as
``--overlap-param-gather`` does (``pg_overlap=on``: only what exceeds the stage's forward of
one microbatch is charged). ``--param-gather-hidden``: ``r`` also printed as ``r_hidden``,
with all the critical stage's communication after the backward (``post``: the loss and
norm scalars, the sequence-parallel partial-gradient all-reduce, and the parameter
all-gather — with ``--no-pg-overlap`` in full, or the per-tensor broadcasts fxplan's runtime
issues at ``t = 1``) taken out of ``T_other``.
``--comm-sms N`` (with ``--param-gather-hidden``): the time the overlapped data-parallel
collectives would take from the compute running beside them if each holds ``N`` of the
H100's SMs (``sm_count`` of the spec, 132; one CTA per NCCL channel) for its whole duration,
``(Σ dp transfers + post)·N/(sm_count − N)``, against the time still missing, and the ``N`` that
would explain all of it. ``--waves``: the layer GEMMs of each row as one tp rank runs them
(``M = mb·4096`` tokens; QKV ``3h/t × h``, projection ``h × h/t``, FC1 ``4h/t × h``, FC2
``h × 4h/t``; ``mb`` the table's choice) cut into 128×256 output tiles (an assumption: the
Hopper bf16 GEMM tile; cuBLAS picks per shape) on the spec's ``sm_count`` SMs: the waves each
needs and the fraction of its last wave that works, ``w/⌈w⌉``, FLOP-weighted over the layer
— what the smooth efficiency curve of ``cost_model/data/efficiency.json`` leaves out.
``--flops``: the definitional check, each row's published numbers against each other and
against the model — the parameter count of the shape (GELU MLP of ``4h``, separate input
embedding and output layer, no GQA: ``12·l·h² + 2·V·h``) against the published size, ``X·n``
against the published aggregate, Megatron's ``F`` (``num_floating_point_operations``) against
the FLOPs the estimate counts for its MFU (``model_flops``, three times the captured
forward), so a mismatch of definitions would show as a ratio other than 1.
``--recompute P``: every row priced with recompute policy ``P`` (``none``, ``selective``,
``full``) instead of the fastest that fits — the recompute of the published runs is not
published. ``--matmul E``: the H100's matmul efficiency set to ``E`` (``dgx-h100.yaml`` has
0.52; ``published_table.with_matmul_efficiency``).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "h100_table.py"


def _table():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("h100_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules.setdefault("h100_table", module)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def wave_efficiency(row, microbatch: int, sms: int) -> float:  # type: ignore[no-untyped-def]
    """FLOP-weighted ``w/⌈w⌉`` of the row's layer GEMMs in 128×256 tiles on ``sms``
    streaming multiprocessors (``--waves``)."""
    import math

    h, t, m = row.hidden, row.tp, microbatch * 4096
    work = busy = 0.0
    for n, k in ((3 * h // t, h), (h, h // t), (4 * h // t, h), (h, 4 * h // t)):
        waves = math.ceil(m / 128) * math.ceil(n / 256) / sms
        flops = 2.0 * m * n * k
        work += flops
        busy += flops * math.ceil(waves) / waves
    return work / busy


def _published_columns(table) -> dict[str, tuple[float, float]]:  # type: ignore[no-untyped-def]
    """Each row's published size (billions) and aggregate PFLOP/s, from the CSV."""
    import csv

    with table.TABLE.open() as handle:
        return {f"gpt-{float(r['params_billion']):g}b":
                (float(r["params_billion"]), float(r["aggregate_pflops"]))
                for r in csv.DictReader(handle)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--matmul-half-flops", type=float, default=None)
    parser.add_argument("--no-tp-overlap", action="store_true")
    parser.add_argument("--dp-exposed", action="store_true")
    parser.add_argument("--no-pg-overlap", action="store_true")
    parser.add_argument("--param-gather-hidden", action="store_true")
    parser.add_argument("--comm-sms", type=int, default=None)
    parser.add_argument("--waves", action="store_true")
    parser.add_argument("--flops", action="store_true")
    parser.add_argument("--recompute", choices=("none", "selective", "full"), default=None)
    parser.add_argument("--matmul", type=float, default=None)
    args = parser.parse_args()
    table = _table()
    if args.matmul_half_flops is not None:
        from fxplan.cost_model.compute.efficiency import load_efficiency

        load_efficiency().devices["h100"]["matmul"]["half_flops"] = args.matmul_half_flops
    from fxplan.cluster_specs import Cluster

    published = _published_columns(table)
    for row in table.load_rows():
        cluster = Cluster.load(f"dgx-h100:nodes={row.gpus // 8}"
                               + (",h100.comm_overlap=0" if args.dp_exposed else ""))
        if args.matmul is not None:
            import published_table  # on sys.path: h100_table put its folder there

            cluster = published_table.with_matmul_efficiency(cluster, args.matmul)
        sms = cluster.device_groups[0].sm_count
        policies = (args.recompute,) if args.recompute else table.RECOMPUTE
        pr = table.predict(row, table.capture_row(row), cluster,
                           tp_overlap=not args.no_tp_overlap,
                           param_gather_overlap=not args.no_pg_overlap, recompute=policies)
        e = pr.estimate
        compute = e.breakdown["compute"] + e.breakdown["bubble"]
        r = (row.implied_step_time_s - (e.step_time_s - compute)) / compute
        tail = ""
        if args.param_gather_hidden:
            post = float(e.stage_plan.costs.post[e.critical_stage])
            hidden = (row.implied_step_time_s - (e.step_time_s - compute - post)) / compute
            tail = f", post {post:.3f} s, r_hidden = {hidden:.2f}"
            if args.comm_sms is not None:
                beside = sum(b - a for a, b in e.simulation.dp_transfers[e.critical_stage]) + post
                missing = row.implied_step_time_s - (e.step_time_s - post)
                tail += (f"; dp collectives beside compute {beside:.3f} s, at {args.comm_sms} SMs "
                         f"{beside * args.comm_sms / (sms - args.comm_sms):.3f} s of "
                         f"{missing:.3f} s missing (all of it: "
                         f"{sms * missing / (beside + missing):.0f} SMs)")
        if args.waves:
            tail += (f"; layer GEMMs' last-wave efficiency "
                     f"{wave_efficiency(row, pr.microbatch, sms):.3f} on {sms} SMs")
        if args.flops:
            size, aggregate = published[row.name]
            params = 12 * row.layers * row.hidden ** 2 + 2 * table.VOCAB * row.hidden
            tail += (f"; params {params / 1e9:.2f} B (published {size:g} B), X·n "
                     f"{row.tflops_per_gpu * row.gpus / 1e3:.1f} PF/s (published {aggregate:g}), "
                     f"model_flops / F = {e.model_flops / row.flops_per_step:.4f}")
        print(f"{row.name:>10}  published MFU {row.mfu * 100:5.1f} %  predicted "
              f"{e.mfu * 100:5.1f} %  ({pr.error_points:+5.1f} points; mb={pr.microbatch}, "
              f"recompute={pr.recompute}; dp_comm {e.breakdown['dp_comm']:.3f} s, optimizer "
              f"{e.breakdown['optimizer'] * 1e3:.1f} ms)  r = {r:.2f}{tail}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
