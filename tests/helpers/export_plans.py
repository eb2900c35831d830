"""Tiny plans for the export tests: ``gpt-tiny:layers=8`` on one DGX A100 node, each shape
the formats write differently (data, tensor, pipeline, context and expert parallelism, ZeRO
stages, offload, FP8, overlaps, uneven stages)."""

from __future__ import annotations

from fxplan.core.config import ParallelConfig
from fxplan.core.plan import Plan, StageAssignment

CLUSTER = "dgx-a100-80g:nodes=1"  # 8 devices with a bf16 peak: the plans train in bfloat16


def make_plan(config: str, *, batch: int, layers: tuple[int, ...],
              block_recompute: tuple[str, ...] | None = None,
              cluster: str = CLUSTER) -> Plan:
    """A plan for ``config`` (text form) with ``layers`` repeated blocks per virtual stage,
    priced (as a search prices today) in the runtime's layout of the model states."""
    starts = [sum(layers[:i]) for i in range(len(layers))]
    stages = tuple(StageAssignment(i, (start, start + n), i == 0, i == len(layers) - 1)
                   for i, (start, n) in enumerate(zip(starts, layers)))
    return Plan(model="gpt-tiny:layers=8", cluster=cluster, graph_fingerprint="a" * 64,
                cluster_fingerprint="b" * 64, batch=batch, seq=64,
                config=ParallelConfig.parse(config).resolve(batch), stages=stages,
                block_recompute=block_recompute, estimate={"state_layout": "runtime"})


#: The round-trip plans: data parallel only, tp+sp, interleaved pipeline, ZeRO-3, uneven stages.
PLANS = {
    "dp-only": make_plan("dp=8,tp=1,pp=1,mb=2,schedule=1f1b,zero=0,recompute=none,sp=off",
                         batch=32, layers=(8,)),
    "tp-sp": make_plan("dp=2,tp=4,pp=1,mb=1,schedule=1f1b,zero=1,recompute=selective,sp=on",
                       batch=16, layers=(8,)),
    "tp-overlap": make_plan("dp=2,tp=4,pp=1,mb=1,schedule=1f1b,zero=1,recompute=none,sp=on,"
                            "tp_overlap=on", batch=16, layers=(8,)),
    "pp-interleaved": make_plan("dp=2,tp=2,pp=2,mb=1,schedule=interleaved:2,zero=1,"
                                "recompute=full,sp=on", batch=16, layers=(2, 2, 2, 2)),
    "zero3": make_plan("dp=4,tp=2,pp=1,mb=2,schedule=1f1b,zero=3,recompute=full,sp=on",
                       batch=16, layers=(8,)),
    "pp-uneven": make_plan("dp=2,tp=1,pp=4,mb=1,schedule=1f1b,zero=0,recompute=none,sp=off,"
                           "stages=1/3/3/1", batch=8, layers=(1, 3, 3, 1)),
    "offload-fp8": make_plan("dp=8,tp=1,pp=1,mb=1,schedule=1f1b,zero=3,recompute=full,sp=off,"
                             "offload=optimizer+params,fp8=on", batch=16, layers=(8,)),
    "offload-optimizer": make_plan("dp=4,tp=2,pp=1,mb=1,schedule=1f1b,zero=1,recompute=none,"
                                   "sp=on,offload=optimizer", batch=16, layers=(8,)),
    "context-parallel": make_plan("dp=4,tp=2,pp=1,mb=1,schedule=1f1b,zero=3,recompute=selective,"
                                  "sp=on,cp=2", batch=8, layers=(8,)),
}

#: More plans than the round trip: the shapes the frameworks refuse or run differently.
MORE = {
    "zero0-tp-pp": make_plan("dp=2,tp=2,pp=2,mb=1,schedule=1f1b,zero=0,recompute=none,sp=on",
                             batch=8, layers=(4, 4)),
    "zero2-pp": make_plan("dp=2,tp=1,pp=4,mb=1,schedule=1f1b,zero=2,recompute=none,sp=off",
                          batch=8, layers=(2, 2, 2, 2)),
    "zero3-pp": make_plan("dp=2,tp=2,pp=2,mb=1,schedule=1f1b,zero=3,recompute=full,sp=on",
                          batch=8, layers=(4, 4)),
    "zero2-dp": make_plan("dp=8,tp=1,pp=1,mb=1,schedule=1f1b,zero=2,recompute=none,sp=off",
                          batch=16, layers=(8,)),
    "pg-overlap": make_plan("dp=2,tp=4,pp=1,mb=1,schedule=1f1b,zero=1,recompute=none,sp=on,"
                            "pg_overlap=on", batch=16, layers=(8,)),
    "gpipe": make_plan("dp=2,tp=1,pp=4,mb=1,schedule=gpipe,zero=0,recompute=none,sp=off",
                       batch=8, layers=(2, 2, 2, 2)),
    "tp-no-sp": make_plan("dp=2,tp=4,pp=1,mb=1,schedule=1f1b,zero=1,recompute=none,sp=off",
                          batch=16, layers=(8,)),
    "offload-zero0": make_plan("dp=8,tp=1,pp=1,mb=1,schedule=1f1b,zero=0,recompute=none,"
                               "sp=off,offload=optimizer", batch=16, layers=(8,)),
    "offload-zero1": make_plan("dp=8,tp=1,pp=1,mb=1,schedule=1f1b,zero=1,recompute=none,"
                               "sp=off,offload=optimizer", batch=16, layers=(8,)),
    "zbv": make_plan("dp=1,tp=4,pp=4,mb=1,schedule=zbv,zero=0,recompute=none,sp=on",
                     batch=8, layers=(1,) * 8),
    "zb": make_plan("dp=1,tp=4,pp=4,mb=1,schedule=zb,zero=0,recompute=none,sp=on",
                    batch=8, layers=(2, 2, 2, 2)),
    "dualpipev": make_plan("dp=1,tp=4,pp=4,mb=1,schedule=dualpipev,zero=0,recompute=none,"
                           "sp=on", batch=8, layers=(1,) * 8),
}
