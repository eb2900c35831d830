"""What-if probes of the H100 table's gap (``benchmarks/h100_table.py``): not predictions.

    python benchmarks/h100_table_probe.py                            # r per row
    python benchmarks/h100_table_probe.py --matmul-half-flops 6e10   # a later GEMM knee
    python benchmarks/h100_table_probe.py --no-tp-overlap            # tp comm fully exposed
    python benchmarks/h100_table_probe.py --dp-exposed               # dp comm fully exposed
    python benchmarks/h100_table_probe.py --param-gather-hidden      # r without the ZeRO all-gather
    python benchmarks/h100_table_probe.py --param-gather-hidden --comm-sms 32   # + SMs held by NCCL
    python benchmarks/h100_table_probe.py --waves                    # GEMM tail waves on 132 SMs

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
what the data-parallel reduction can add; the bf16 parameter all-gather after the step is on
the critical path in both (the model does not overlap it with the next forward, as
Megatron's ``--overlap-param-gather`` does). ``--param-gather-hidden``: ``r`` also printed as
``r_hidden``, with the critical stage's communication after the backward (``post``: the
ZeRO-1 parameter all-gather, or the per-tensor broadcasts fxplan's runtime issues at
``t = 1``) taken out of ``T_other`` — the published runs hide the all-gather behind the next
step's forward (``--overlap-param-gather``); the lower bound of what it adds.
``--comm-sms N`` (with ``--param-gather-hidden``): the time the overlapped data-parallel
collectives would take from the compute running beside them if each holds ``N`` of the
H100's 132 SMs (one CTA per NCCL channel) for its whole duration,
``(Σ dp transfers + post)·N/(132 − N)``, against the time still missing, and the ``N`` that
would explain all of it. ``--waves``: the layer GEMMs of each row as one tp rank runs them
(``M = mb·4096`` tokens; QKV ``3h/t × h``, projection ``h × h/t``, FC1 ``4h/t × h``, FC2
``h × 4h/t``; ``mb`` the table's choice) cut into 128×256 output tiles (an assumption: the
Hopper bf16 GEMM tile; cuBLAS picks per shape) on 132 SMs: the waves each needs and the
fraction of its last wave that works, ``w/⌈w⌉``, FLOP-weighted over the layer — what the
smooth efficiency curve of ``cost_model/data/efficiency.json`` leaves out.
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


def wave_efficiency(row, microbatch: int, sms: int = 132) -> float:  # type: ignore[no-untyped-def]
    """FLOP-weighted ``w/⌈w⌉`` of the row's layer GEMMs in 128×256 tiles (``--waves``)."""
    import math

    h, t, m = row.hidden, row.tp, microbatch * 4096
    work = busy = 0.0
    for n, k in ((3 * h // t, h), (h, h // t), (4 * h // t, h), (h, 4 * h // t)):
        waves = math.ceil(m / 128) * math.ceil(n / 256) / sms
        flops = 2.0 * m * n * k
        work += flops
        busy += flops * math.ceil(waves) / waves
    return work / busy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--matmul-half-flops", type=float, default=None)
    parser.add_argument("--no-tp-overlap", action="store_true")
    parser.add_argument("--dp-exposed", action="store_true")
    parser.add_argument("--param-gather-hidden", action="store_true")
    parser.add_argument("--comm-sms", type=int, default=None)
    parser.add_argument("--waves", action="store_true")
    args = parser.parse_args()
    table = _table()
    if args.matmul_half_flops is not None:
        from fxplan.cost_model.efficiency import load_efficiency

        load_efficiency().devices["h100"]["matmul"]["half_flops"] = args.matmul_half_flops
    for row in table.load_rows():
        cluster = None
        if args.dp_exposed:
            from fxplan.cluster_specs import Cluster

            cluster = Cluster.load(f"dgx-h100:nodes={row.gpus // 8},h100.comm_overlap=0")
        pr = table.predict(row, table.capture_row(row), cluster,
                           tp_overlap=not args.no_tp_overlap)
        e = pr.estimate
        compute = e.breakdown["compute"] + e.breakdown["bubble"]
        r = (row.implied_step_time_s - (e.step_time_s - compute)) / compute
        tail = ""
        if args.param_gather_hidden:
            post = float(e.stage_plan.costs.post[e.critical_stage])
            hidden = (row.implied_step_time_s - (e.step_time_s - compute - post)) / compute
            tail = f", post {post:.3f} s, r_hidden = {hidden:.2f}"
            if args.comm_sms is not None:
                sms = 132  # H100 SXM5
                beside = sum(b - a for a, b in e.simulation.dp_transfers[e.critical_stage]) + post
                missing = row.implied_step_time_s - (e.step_time_s - post)
                tail += (f"; dp collectives beside compute {beside:.3f} s, at {args.comm_sms} SMs "
                         f"{beside * args.comm_sms / (sms - args.comm_sms):.3f} s of "
                         f"{missing:.3f} s missing (all of it: "
                         f"{sms * missing / (beside + missing):.0f} SMs)")
        if args.waves:
            tail += f"; layer GEMMs' last-wave efficiency {wave_efficiency(row, pr.microbatch):.3f}"
        print(f"{row.name:>10}  published MFU {row.mfu * 100:5.1f} %  predicted "
              f"{e.mfu * 100:5.1f} %  ({pr.error_points:+5.1f} points; mb={pr.microbatch}, "
              f"recompute={pr.recompute}; dp_comm {e.breakdown['dp_comm']:.3f} s, optimizer "
              f"{e.breakdown['optimizer'] * 1e3:.1f} ms)  r = {r:.2f}{tail}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
