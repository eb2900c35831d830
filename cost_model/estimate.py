"""``estimate(graph, cluster, config, batch=…)``: step time, throughput and memory of a plan.

Pipeline: validate the configuration against the graph and the cluster
(:meth:`ParallelConfig.check`); price each segment once (:mod:`cost_model.layer_costs`,
cached); assemble per-stage costs (:mod:`cost_model.stage_costs`); simulate the step
(:mod:`cost_model.simulator`); add up memory per stage (:mod:`cost_model.memory`).

Throughput, with ``T`` the step time, ``n`` devices, ``B`` the global batch (sequences), ``s``
the sequence, ``M`` the forward matrix-product FLOPs of the global batch, ``M_r`` those the
backward recomputes (all layers under ``full``, the attention cores under ``selective``, none
under ``none``)::

    samples/s             = B / T
    tokens/s              = B·s / T                        None when the graph has no token input (s unknown)
    tflops_per_device     = (3·M + M_r) / (n·T)            Megatron's convention (counts recompute)
    mfu                   = 3·M / (n·T·P)                  P: the device's dense peak for the dtype

For a GPT, ``3·M + M_r`` under full recompute is ``96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fxplan.core.config import CostModelError, ParallelConfig
from fxplan.cost_model.efficiency import dtype_key
from fxplan.cost_model.layer_costs import GraphSegments, graph_segments
from fxplan.cost_model.memory import MemoryBreakdown, OptimizerSpec, adam_for
from fxplan.cost_model.pipeline_schedules import schedule_order
from fxplan.cost_model.simulator import StepSimulation, TimelineEvent, simulate_step
from fxplan.cost_model.stage_costs import StagePlan, build_stages, stage_memory

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["Estimate", "estimate"]


@dataclass(frozen=True, eq=False)
class Estimate:
    """The predicted step of one configuration (module docstring for the formulas).

    ``breakdown`` (seconds, critical stage, sums to ``step_time_s``): ``compute``,
    ``tp_comm``, ``zero_comm``, ``p2p``, ``bubble``, ``dp_comm``, ``optimizer``.
    ``memory`` has one :class:`MemoryBreakdown` per pipeline stage.
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

    @property
    def peak_memory_gib(self) -> list[float]:
        """Peak per rank of each stage, GiB (reserve included)."""
        return [m.total_gib for m in self.memory]

    @property
    def fits(self) -> bool:
        return all(m.fits for m in self.memory)

    def timeline(self) -> list[TimelineEvent]:
        """``(stage, "F"|"B", microbatch, chunk, start, end)`` of every pipeline op."""
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
            "model_flops": self.model_flops,
            "hardware_flops": self.hardware_flops,
        }


def _check(graph: CapturedGraph, cluster: Cluster, config: ParallelConfig, batch: int,
           seq: int | None) -> tuple[GraphSegments, ParallelConfig]:
    segments = graph_segments(graph)
    _check_precision(graph, cluster)
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
    config.check(world_size=cluster.num_devices, layers=counted, heads=segments.heads,
                 seq=segments.seq, batch=batch,
                 tp_widths=segments.tp_widths if config.tp > 1 else None)
    return segments, config.resolve(batch)


def _graph_dtype(graph: CapturedGraph) -> object:
    """The graph's training dtype (its own, else its first matrix product's, else fp32)."""
    dtype = graph.dtype
    if dtype is None:
        dtype = next((i.dtype for _, i in graph.nodes() if i.op_class == "matmul"), "fp32")
    return dtype


def _check_precision(graph: CapturedGraph, cluster: Cluster) -> None:
    """Every device group lists a peak for the graph's precision (else nothing can be priced)."""
    dtype = _graph_dtype(graph)
    key = dtype_key(dtype)
    for group in cluster.device_groups:
        if key not in group.peak_tflops:
            raise CostModelError(
                f"{group.model} lists no peak for {key!r} (it lists "
                f"{', '.join(group.peak_tflops)}) but the graph was captured in {dtype}; "
                "capture it in a precision the devices have "
                f"(fxplan.cluster_specs.training_dtype(cluster) picks one)")


def _peak_flops(plan: StagePlan, graph: CapturedGraph) -> float:
    dtype = _graph_dtype(graph)
    device = plan.devices[0]
    return device.peak(dtype_key(dtype)) * 1e12


def estimate(graph: CapturedGraph, cluster: Cluster, config: ParallelConfig, *, batch: int,
             seq: int | None = None, optimizer: OptimizerSpec | None = None) -> Estimate:
    """Predict one training step of ``graph`` on ``cluster`` under ``config``.

    ``optimizer`` defaults to Adam in the graph's precision (:func:`cost_model.memory.adam_for`:
    fp32 weights and gradients for an fp32 graph, mixed precision otherwise): it sets the
    bytes that ZeRO's collectives and the gradient all-reduce move.

    ``batch`` is the global batch in samples; ``seq`` (optional) must equal the captured
    sequence length. Raises :class:`CostModelError` for a configuration that does not fit
    the model or the cluster, with the arithmetic.
    """
    segments, config = _check(graph, cluster, config, batch, seq)
    if optimizer is None:
        optimizer = adam_for(dtype_key(_graph_dtype(graph)))
    plan = build_stages(graph, segments, cluster, config, optimizer)
    m = config.num_microbatches or 1
    sim = simulate_step(plan.costs, config.schedule.kind, m)
    order = schedule_order(config.schedule.kind, config.pp, config.virtual_stages, m)
    memory = stage_memory(plan, order, config, optimizer)
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
        mfu=model_flops / (n * step * _peak_flops(plan, graph)),
        model_flops=model_flops, hardware_flops=hardware_flops,
        memory=tuple(memory), simulation=sim, stage_plan=plan,
    )
