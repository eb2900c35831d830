"""``estimate(graph, cluster, config, batch=…)``: step time, throughput and memory of a plan.

Pipeline: validate the configuration against the graph and the cluster
(:meth:`ParallelConfig.check`); price each segment once (:mod:`cost_model.step.layer_costs`,
cached); assemble per-stage costs (:mod:`cost_model.step.stage_costs`); simulate the step
(:mod:`cost_model.step.simulator`); add up memory per stage (:mod:`cost_model.memory.breakdown`).

Throughput, with ``T`` the step time, ``n`` devices, ``B`` the global batch (sequences), ``s``
the sequence, ``M`` the forward matrix-product FLOPs of the global batch, ``M_r`` those the
backward recomputes (all layers under ``full``, the attention cores under ``selective``, none
under ``none``)::

    samples/s             = B / T
    tokens/s              = B·s / T                        None when the graph has no token input (s unknown)
    tflops_per_device     = (3·M + M_r) / (n·T)            Megatron's convention (counts recompute)
    mfu                   = 3·M / (T·Σ_d P_d)              P_d: device d's dense peak in the precision
                                                           its group trains in (n·P on one kind of device)

The MFU is weighted by each device's own peak: on a V100 + A100 cluster ``Σ_d P_d`` counts
125 TFLOP/s (fp16) per V100 and 312 (bf16) per A100, so the useful FLOPs are measured against
what the whole park could do, not against the first device's peak.

For a GPT, ``3·M + M_r`` under full recompute is ``96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fxplan.cluster_specs.precision import group_precisions
from fxplan.core.config import ParallelConfig
from fxplan.core.config_error import CostModelError
from fxplan.cost_model.compute.efficiency import dtype_key
from fxplan.cost_model.parallel.context_parallel import check_cp
from fxplan.cost_model.parallel.expert_parallel import check_ep
from fxplan.cost_model.compute.fp8 import check_fp8
from fxplan.cost_model.step.layer_costs import GraphSegments, graph_segments
from fxplan.cost_model.memory.breakdown import GIB, MemoryBreakdown, OptimizerSpec, adam_for
from fxplan.cost_model.memory.headroom import MemoryHeadroom, parse_headroom
from fxplan.cost_model.step.pipeline_schedules import schedule_order
from fxplan.cost_model.step.overlap import Overlap, relied_overlaps
from fxplan.cost_model.step.simulator import StepSimulation, TimelineEvent, simulate_step
from fxplan.cost_model.memory.rank_memory import stage_memory
from fxplan.cost_model.step.stage_costs import build_stages
from fxplan.cost_model.step.stage_plan import StagePlan

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["Estimate", "estimate", "peak_flops"]


@dataclass(frozen=True, eq=False)
class Estimate:
    """The predicted step of one configuration (module docstring for the formulas).

    ``breakdown`` (seconds, critical stage, sums to ``step_time_s``): ``compute``,
    ``tp_comm``, ``zero_comm``, ``p2p``, ``bubble`` (the schedule's: what a balanced pipeline
    would idle), ``stage_imbalance`` (idle beyond it, waiting for slower stages;
    :mod:`cost_model.step.simulator`), ``dp_comm``, ``optimizer`` (and ``offload`` when the
    configuration offloads).
    ``memory`` has one :class:`MemoryBreakdown` per pipeline stage; ``fits`` when each leaves
    ``memory_headroom`` free.
    """

    config: ParallelConfig
    batch: int
    seq: int | None
    num_devices: int
    step_time_s: float
    breakdown: dict[str, float]
    stage_time_s: tuple[float, ...]
    critical_stage: int
    samples_per_s: float
    tokens_per_s: float | None
    tflops_per_device: float
    mfu: float
    model_flops: float
    hardware_flops: float
    memory: tuple[MemoryBreakdown, ...]
    simulation: StepSimulation
    #: the per-stage costs the simulation ran on (segments per chunk, op components)
    stage_plan: StagePlan | None = None
    memory_headroom: MemoryHeadroom | None = None
    #: device group name → the precision it trains in (``peak_tflops`` key)
    precisions: dict[str, str] | None = None
    #: the communication the estimate hides behind compute (:mod:`cost_model.step.overlap`)
    overlaps: tuple[Overlap, ...] = ()
    #: the layout of the model states priced (:data:`~cost_model.memory.breakdown.STATE_LAYOUTS`)
    #: and the optimizer's bytes per parameter in it
    state_layout: str = "runtime"
    optimizer: OptimizerSpec | None = None

    @property
    def peak_memory_gib(self) -> list[float]:
        """Peak per rank of each stage, GiB (reserve included)."""
        return [m.total_gib for m in self.memory]

    @property
    def fits(self) -> bool:
        return all(m.fits for m in self.memory)

    def timeline(self) -> list[TimelineEvent]:
        """``(stage, "F"|"B"|"W", microbatch, chunk, start, end)`` of every pipeline op (``W``: a
        split backward's weight gradient)."""
        return self.simulation.timeline.events()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (what ``fxplan estimate --json`` prints)."""
        return {
            "config": self.config.to_string(),
            "summary": self.config.summary(),
            "batch": self.batch,
            "seq": self.seq,
            "num_devices": self.num_devices,
            "step_time_s": self.step_time_s,
            "samples_per_s": self.samples_per_s,
            "tokens_per_s": self.tokens_per_s,
            "tflops_per_device": self.tflops_per_device,
            "mfu": self.mfu,
            "peak_memory_gib": self.peak_memory_gib,
            "fits": self.fits,
            "breakdown": dict(self.breakdown),
            "stage_time_s": list(self.stage_time_s),
            "critical_stage": self.critical_stage,
            "memory_breakdown_gib": [m.to_gib() for m in self.memory],
            "bubble_fraction": self.breakdown["bubble"] / self.step_time_s,
            "stage_imbalance_fraction": self.breakdown.get("stage_imbalance", 0.0) / self.step_time_s,
            "memory_headroom": (self.memory_headroom.to_json()
                                if self.memory_headroom is not None else None),
            "min_free_gib": min(m.free for m in self.memory) / GIB,
            "model_flops": self.model_flops,
            "hardware_flops": self.hardware_flops,
            "precision_per_group": dict(self.precisions or {}),
            "overlaps": [o.to_dict() for o in self.overlaps],
            "state_layout": self.state_layout,
            "optimizer": self.optimizer.name if self.optimizer is not None else None,
        }


def _check(graph: CapturedGraph, cluster: Cluster, config: ParallelConfig, batch: int,
           seq: int | None) -> tuple[GraphSegments, ParallelConfig]:
    segments = graph_segments(graph)
    if config.fp8:
        check_fp8(cluster)
    if seq is not None and segments.seq is not None and seq != segments.seq:
        raise CostModelError(
            f"seq={seq} but the graph was captured at seq={segments.seq}; capture it at the "
            "sequence length to estimate (attention cost grows with s²)"
        )
    layers = len(segments.layers)
    if config.pp > 1 and layers == 0:
        raise CostModelError(f"pp={config.pp} needs repeated layers to split; the graph has none")
    # A model without repeated layers runs as one stage: stages=0 (as the search sets it) or none.
    counted = layers if config.stage_layers is not None else max(layers, 1)
    check_ep(graph, config.ep)
    check_cp(graph, config.cp)
    config.check(world_size=cluster.num_devices, layers=counted, heads=segments.heads,
                 seq=segments.seq, batch=batch,
                 tp_widths=segments.tp_widths if config.tp > 1 else None)
    return segments, config.resolve(batch)


def training_adam(graph: CapturedGraph, state_layout: str = "runtime") -> OptimizerSpec:
    """Adam in the graph's training precision, its model states kept in ``state_layout``
    (:func:`cost_model.memory.breakdown.adam_for`: ``runtime``, fxplan's runtime; ``megatron``,
    Megatron-LM's and DeepSpeed's)."""
    return adam_for(dtype_key(_graph_dtype(graph)), state_layout)


def _graph_dtype(graph: CapturedGraph) -> object:
    """The graph's training dtype (its own, else its first matrix product's, else fp32)."""
    dtype = graph.dtype
    if dtype is None:
        dtype = next((i.dtype for _, i in graph.nodes() if i.op_class == "matmul"), "fp32")
    return dtype


def _check_precision(graph: CapturedGraph, cluster: Cluster) -> dict[str, str]:
    """The precision each device group trains the graph in
    (:func:`fxplan.cluster_specs.group_precision`: the graph's own, or on a group that lacks
    it its 16-bit twin — fp16 on the V100s of a V100 + A100 cluster); some group must list the
    graph's precision itself and every group must be able to train it."""
    dtype = _graph_dtype(graph)
    key = dtype_key(dtype)
    per_group = group_precisions(cluster, key)
    native = any(key in group.peak_tflops for group in cluster.device_groups)
    for group in cluster.device_groups:
        if not native or per_group[group.name] is None:
            raise CostModelError(
                f"{group.model} lists no peak for {key!r} (it lists "
                f"{', '.join(group.peak_tflops)}) but the graph was captured in {dtype}; "
                "capture it in a precision the devices have "
                f"(fxplan.cluster_specs.training_dtype(cluster) picks one)")
    return {name: str(value) for name, value in per_group.items()}


def peak_flops(cluster: Cluster, precisions: dict[str, str]) -> float:
    """``Σ_d P_d`` FLOP/s: every device's dense peak in the precision its group trains in
    (``precisions``, group name → ``peak_tflops`` key), the denominator of the MFU."""
    return sum(group.num_devices * group.peak(precisions[group.name]) * 1e12
               for group in cluster.device_groups)


def estimate(graph: CapturedGraph, cluster: Cluster, config: ParallelConfig, *, batch: int,
             seq: int | None = None, optimizer: OptimizerSpec | None = None,
             memory_headroom: "MemoryHeadroom | str | float | None" = None,
             state_layout: str = "runtime") -> Estimate:
    """Predict one training step of ``graph`` on ``cluster`` under ``config``.

    ``optimizer`` defaults to Adam in the graph's precision with its states in
    ``state_layout`` (:func:`training_adam`: fp32 weights and gradients for an fp32 graph;
    in 16 bits, fxplan's runtime's fp32 parameters and gradients beside two moments, or
    Megatron-LM's 16-bit weights and gradients beside fp32 masters): it sets the model
    states' bytes and those that ZeRO's collectives and the gradient reductions move.

    ``batch`` is the global batch in samples; ``seq`` (optional) must equal the captured
    sequence length. ``memory_headroom``: what each device must leave free for ``fits``
    (:func:`cost_model.memory.headroom.parse_headroom`; ``None``: the default 5 %). Raises
    :class:`CostModelError` for a configuration that does not fit
    the model or the cluster, with the arithmetic.
    """
    headroom = parse_headroom(memory_headroom)
    segments, config = _check(graph, cluster, config, batch, seq)
    precisions = _check_precision(graph, cluster)
    if optimizer is None:
        optimizer = training_adam(graph, state_layout)
    plan = build_stages(graph, segments, cluster, config, optimizer)
    m = config.num_microbatches or 1
    sim = simulate_step(plan.costs, config.schedule.kind, m)
    order = schedule_order(config.schedule.kind, config.pp, config.virtual_stages, m)
    memory = stage_memory(plan, order, config, optimizer, cluster=cluster, headroom=headroom)
    forward = sum(seg.matmul_flops for row in plan.chunks for segs in row for seg in segs)
    recomputed = sum(seg.recompute_flops for row in plan.chunks for segs in row for seg in segs)
    pipelines = m * config.dp
    model_flops = 3 * forward * pipelines
    hardware_flops = model_flops + recomputed * pipelines
    step = sim.step_time_s
    n = cluster.num_devices
    return Estimate(
        config=config, batch=batch, seq=segments.seq, num_devices=n, step_time_s=step,
        breakdown=dict(sim.breakdown), stage_time_s=tuple(float(t) for t in sim.stage_time),
        critical_stage=sim.critical_stage,
        samples_per_s=batch / step,
        tokens_per_s=batch * segments.seq / step if segments.seq is not None else None,
        tflops_per_device=hardware_flops / (n * step) / 1e12,
        mfu=model_flops / (step * peak_flops(cluster, precisions)),
        model_flops=model_flops, hardware_flops=hardware_flops,
        memory=tuple(memory), simulation=sim, stage_plan=plan, memory_headroom=headroom,
        precisions=precisions,
        overlaps=relied_overlaps(config, min(g.comm_overlap for g in cluster.device_groups)),
        state_layout=state_layout, optimizer=optimizer,
    )
