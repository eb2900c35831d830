"""Why this plan and not that one: an alternative priced under the same cost model, term by term.

``fxplan explain plan.json --vs "tp=8,pp=2"`` (or ``--vs other.json``). Both sides are priced
now, by :func:`fxplan.cost_model.step.estimate` on the plan's model (re-captured from its spec at
its sequence length, in its cluster's training dtype, and checked against the plan's graph
fingerprint), cluster and global batch:

* the plan with the configuration its step time priced
  (:func:`fxplan.inter_op.pricing.priced_config`: its placements when the solver's won);
* the alternative: another plan file for the same model, cluster and batch (priced the same
  way), or the plan's configuration changed as the text asks (:func:`alternative_config`).

The difference is reported term by term, with ``T = Σ_k t_k`` on each side's critical stage
(``breakdown``: compute, exposed tensor-parallel, ZeRO and data-parallel communication,
pipeline send/recv, schedule bubble, stage imbalance, optimizer), ``Δ_k = t_k(alt) − t_k(plan)``; the stage imbalance
``max_s T_s / mean_s T_s − 1`` over the pipeline ranks' busy times ``T_s``; and per pipeline
rank the peak memory against the capacity. One sentence says what decided (:func:`verdict`):
the alternative is invalid (the cost model's refusal, with its arithmetic), does not fit (the
rank that overflows, by how much, and its largest part), or is slower (by how much, and the
term that grew most).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from fxplan.core.units import gib, seconds
from fxplan.core.config import ParallelConfig
from fxplan.core.config_error import CostModelError
from fxplan.core.schedule import Schedule
from fxplan.core.errors import UserError
from fxplan.core.plan import Plan, PlanError
from fxplan.core.zero_bubble_dp import after_step_refusal
from fxplan.cost_model.memory.breakdown import MEMORY_ROWS

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster
    from fxplan.cost_model.step.estimate import Estimate
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["TERMS", "Comparison", "Side", "alternative_config", "compare", "recapture",
           "verdict"]

#: Breakdown keys of :class:`~fxplan.cost_model.step.estimate.Estimate` → words for people.
TERMS: dict[str, str] = {
    "compute": "compute",
    "tp_comm": "tensor-parallel communication (exposed)",
    "zero_comm": "ZeRO gathers and reduce-scatters (exposed)",
    "p2p": "pipeline send/recv",
    "bubble": "pipeline bubble (schedule: a balanced pipeline idles as much)",
    "stage_imbalance": "stage imbalance (idle waiting for slower stages)",
    "dp_comm": "data-parallel gradient reduction (exposed)",
    "optimizer": "optimizer step",
    "offload": "offload: host↔device copies and CPU optimizer step (exposed)",
}


class ExplainError(UserError):
    """An alternative that cannot be compared with the plan (another model, cluster or batch;
    a constraint text with alternatives)."""


def recapture(plan: Plan) -> tuple["CapturedGraph", "Cluster"]:
    """The plan's graph and cluster, rebuilt from its model spec and cluster spec; refused when
    the graph is not the one the plan was made for (fingerprints differ)."""
    from fxplan.api import capture_for_search
    from fxplan.cluster_specs import Cluster, training_dtype

    cluster = Cluster.load(plan.cluster)
    graph = capture_for_search(plan.model, seq=plan.seq, dtype=training_dtype(cluster))
    try:
        plan.check_matches(graph_fingerprint=graph.fingerprint(),
                           cluster_fingerprint=cluster.fingerprint(), source="the plan")
    except PlanError as err:
        raise ExplainError(f"{err} (the plan's model spec {plan.model!r} captured now is not the "
                           "graph it was planned for; a plan made with --leaf or --method "
                           "cannot be re-captured from its spec alone)") from None
    return graph, cluster


def _largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, min(n, at_most) + 1) if n % d == 0)


def alternative_config(plan: Plan, changes: Mapping[str, Any]) -> tuple[ParallelConfig, list[str]]:
    """The plan's configuration with ``changes`` (parsed ``--constrain`` text: ``tp``, ``pp``,
    ``dp``, ``microbatch_size``, ``schedule``, ``recompute``, ``sequence_parallel``,
    ``zero_stage``, ``offload``, ``fp8``, one value each) applied, and notes on what had to
    follow.

    What follows, in order: the degree not given (``dp = N/(tp·pp)``, or ``pp = N/(dp·tp)``
    when ``dp`` is given without ``pp``); the microbatch size (the plan's, else the largest
    divisor of ``batch/dp`` below it) and ``m = batch/(dp·b)``; the schedule (``1f1b`` without
    a pipeline, ``gpipe`` when ``m < pp``, an interleaved one only when ``m mod pp = 0``,
    ``dualpipev`` only when ``m ≥ 2·pp``); ZeRO
    0 without data parallelism; sequence parallelism off without tensor parallelism; the
    plan's stage split only when ``pp`` and the schedule stay (else an even split); the plan's
    placements only when ``dp``, ``tp`` and ``sp`` stay (else the default Megatron layout)."""
    from fxplan.inter_op.pricing import priced_config

    many = [k for k, v in changes.items() if isinstance(v, (list, tuple, set, frozenset))]
    if many:
        raise ExplainError(f"--vs gives alternatives for {', '.join(many)}: explain compares "
                           "one configuration, give one value per key")
    base, world, notes = priced_config(plan), plan.world_size, []
    tp, pp = changes.get("tp", base.tp), changes.get("pp", base.pp)
    if "dp" in changes and "pp" not in changes:
        dp = changes["dp"]
        if world % (dp * tp):
            raise ExplainError(f"dp·tp = {dp}·{tp} does not divide the plan's {world} devices")
        pp = world // (dp * tp)
        if pp != base.pp:
            notes.append(f"pp follows: {world} devices / (dp·tp) = {pp}")
    else:
        if world % (tp * pp):
            raise ExplainError(f"tp·pp = {tp}·{pp} does not divide the plan's {world} devices")
        dp = changes.get("dp", world // (tp * pp))
        if dp != base.dp and "dp" not in changes:
            notes.append(f"dp follows: {world} devices / (tp·pp) = {dp}")
    if dp * tp * pp != world:
        raise ExplainError(f"pp·dp·tp = {pp}·{dp}·{tp} = {pp * dp * tp}, but the plan runs on "
                           f"{world} devices")
    cp = changes.get("cp", base.cp)
    if dp % cp:
        if "cp" in changes:
            raise ExplainError(f"cp={cp} does not divide dp={dp}")
        notes.append(f"context parallelism follows: cp=1 (the plan's cp={cp} does not divide "
                     f"dp={dp})")
        cp = 1
    replicas, who = dp // cp, ("dp" if cp == 1 else "dp/cp")
    if plan.batch % replicas:
        raise ExplainError(f"the global batch {plan.batch} is not divisible by {who}={replicas}")
    per_replica = plan.batch // replicas
    mb = changes.get("microbatch_size", base.microbatch_size)
    if per_replica % mb:
        if "microbatch_size" in changes:
            raise ExplainError(f"microbatch {mb} does not divide batch/{who} = {per_replica}")
        mb = _largest_divisor(per_replica, base.microbatch_size)
        notes.append(f"microbatch follows: {mb}, the largest divisor of batch/{who} = "
                     f"{per_replica} up to the plan's {base.microbatch_size}")
    m = per_replica // mb
    schedule = (Schedule.parse(changes["schedule"]) if "schedule" in changes
                else base.schedule)
    if "schedule" not in changes:
        wanted = schedule
        if pp == 1:
            schedule = Schedule("1f1b")
        elif schedule.needs_round_microbatches and m % pp:
            schedule = Schedule("1f1b")
        elif m < schedule.min_microbatches(pp):   # dualpipev: m ≥ 2·pp
            schedule = Schedule("1f1b")
        if schedule.kind == "1f1b" and pp > 1 and m < pp:
            schedule = Schedule("gpipe")
        if schedule != wanted:
            notes.append(f"schedule follows: {schedule} (m={m}, pp={pp})")
    zero = changes.get("zero_stage", base.zero_stage if dp > 1 else 0)
    if zero != base.zero_stage and "zero_stage" not in changes:
        notes.append("ZeRO follows: 0 without data parallelism")
    offload = changes.get("offload", base.offload)
    if offload == "optimizer+params" and zero != 3:
        if "offload" in changes:
            raise ExplainError(f"offload=optimizer+params needs zero=3 (the alternative has "
                               f"zero={zero})")
        offload = "optimizer"
        notes.append("offload follows: optimizer (parameters are offloaded only under ZeRO-3)")
    if "schedule" not in changes and schedule.split_backward and dp > 1 and pp > 1 and \
            after_step_refusal(ParallelConfig(dp=dp, tp=tp, pp=pp, schedule=schedule,
                                              zero_stage=zero, ep=base.ep, offload=offload)):
        # zero-bubble beside dp where FSDP2 would run (runtime.pipeline.zero_bubble_refusal)
        schedule = Schedule("1f1b" if m >= pp else "gpipe")
        notes.append(f"schedule follows: {schedule} (a zero-bubble schedule beside dp={dp} "
                     f"runs at ZeRO-0/1 only)")
    sp = changes.get("sequence_parallel", base.sequence_parallel and tp > 1)
    if sp != base.sequence_parallel and "sequence_parallel" not in changes:
        notes.append("sequence parallelism follows: off without tensor parallelism")
    keep_split = pp == base.pp and schedule == base.schedule
    keep_layout = (dp, tp, sp) == (base.dp, base.tp, base.sequence_parallel)
    recompute = changes.get("recompute", base.recompute)
    # the plan's recomputed layers per stage hold for its own split and policy only
    per_stage = changes.get("recompute_layers", base.recompute_layers
                            if keep_split and "recompute" not in changes else None)
    if base.recompute_layers is not None and per_stage is None:
        notes.append(f"the plan's recompute per stage ({base.recompute_text}) is dropped: "
                     f"every layer runs recompute={recompute}")
    # the plan's ZeRO stage per pipeline rank holds for its own pipeline depth only
    zero_stages = (base.zero_stages if pp == base.pp and dp > 1 and "zero_stage" not in changes
                   else None)
    if base.zero_stages is not None and zero_stages is None:
        notes.append(f"the plan's ZeRO per stage ({base.zero_text}) is dropped: every pipeline "
                     f"rank runs zero={zero}")
    # and its offload per pipeline rank, for its own pipeline depth and highest offload only
    offload_stages = (base.offload_stages if pp == base.pp and offload == base.offload
                      and "offload" not in changes else None)
    if base.offload_stages is not None and offload_stages is None:
        notes.append(f"the plan's offload per stage ({base.offload_text}) is dropped: every "
                     f"pipeline rank runs offload={offload}")
    config = base.replace(
        dp=dp, tp=tp, pp=pp, cp=cp, microbatch_size=mb, num_microbatches=m, schedule=schedule,
        zero_stage=zero, zero_stages=zero_stages, offload=offload,
        offload_stages=offload_stages, fp8=changes.get("fp8", base.fp8),
        recompute=recompute, recompute_layers=per_stage,
        sequence_parallel=sp, stage_layers=base.stage_layers if keep_split else None,
        placements=base.placements if keep_layout else None)
    if base.placements is not None and not keep_layout:
        notes.append("priced with the default Megatron layout (the plan's placements are for "
                     f"dp={base.dp}, tp={base.tp}, sp={'on' if base.sequence_parallel else 'off'})")
    if not keep_split and base.stage_layers is not None and pp > 1:
        notes.append("layers split evenly over the stages")
    return config, notes


@dataclass
class Side:
    """One priced configuration: its estimate, or the cost model's refusal."""

    label: str
    config: ParallelConfig
    est: "Estimate | None" = None
    error: str = ""

    @property
    def layout(self) -> str:
        return "intra-op placements" if self.config.placements is not None else \
            "default Megatron layout"

    def imbalance(self) -> float:
        """``max_s T_s / mean_s T_s − 1`` over the pipeline ranks' busy times (0 for one)."""
        times = self.est.stage_time_s if self.est else ()
        mean = sum(times) / len(times) if times else 0.0
        return max(times) / mean - 1 if mean > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"label": self.label, "summary": self.config.summary(),
                               "config": self.config.to_string(), "layout": self.layout}
        if self.est is None:
            return {**out, "valid": False, "error": self.error}
        e = self.est
        return {**out, "valid": True, "step_time_s": e.step_time_s, "mfu": e.mfu,
                "tflops_per_device": e.tflops_per_device, "tokens_per_s": e.tokens_per_s,
                "breakdown": dict(e.breakdown), "critical_stage": e.critical_stage,
                "stage_time_s": list(e.stage_time_s), "stage_imbalance": self.imbalance(),
                "memory_gib": [m.to_gib() for m in e.memory], "fits": e.fits}


@dataclass
class Comparison:
    """The plan and the alternative, priced; ``notes`` on how the alternative was built."""

    plan: Side
    alternative: Side
    notes: list[str] = field(default_factory=list)
    recorded_step_s: float | None = None

    def deltas(self) -> dict[str, float]:
        """``Δ_k = t_k(alt) − t_k(plan)`` per breakdown term, seconds (both sides priced)."""
        a, b = self.plan.est, self.alternative.est
        if a is None or b is None:
            return {}
        return {k: b.breakdown.get(k, 0.0) - a.breakdown.get(k, 0.0)
                for k in dict.fromkeys([*a.breakdown, *b.breakdown])}

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"plan": self.plan.to_dict(),
                                "alternative": self.alternative.to_dict(),
                                "notes": list(self.notes), "verdict": verdict(self)}
        if self.plan.est is not None and self.alternative.est is not None:
            t = self.plan.est.step_time_s
            delta = self.alternative.est.step_time_s - t
            data["delta"] = {"step_time_s": delta, "step_time_pct": 100 * delta / t,
                             "breakdown": self.deltas(),
                             "stage_imbalance": self.alternative.imbalance()
                             - self.plan.imbalance()}
        if self.recorded_step_s is not None:
            data["plan"]["recorded_step_time_s"] = self.recorded_step_s
        return data


def _price(graph: "CapturedGraph", cluster: "Cluster", label: str, config: ParallelConfig,
           batch: int, headroom: Any = None, state_layout: str = "runtime") -> Side:
    from fxplan.cost_model import estimate

    try:
        return Side(label, config, estimate(graph, cluster, config, batch=batch,
                                            memory_headroom=headroom,
                                            state_layout=state_layout))
    except CostModelError as err:
        return Side(label, config, error=str(err))


def compare(plan: Plan, *, vs_plan: Plan | None = None, changes: Mapping[str, Any] | None = None,
            graph: "CapturedGraph | None" = None, cluster: "Cluster | None" = None) -> Comparison:
    """Price ``plan`` and its alternative (``vs_plan``, or ``plan`` with ``changes``) on the
    plan's re-captured graph (or ``graph``/``cluster`` when the caller has them)."""
    from fxplan.inter_op.pricing import priced_config

    if graph is None or cluster is None:
        graph, cluster = recapture(plan)
    notes: list[str] = []
    if vs_plan is not None:
        for what, mine, theirs in (("graph", plan.graph_fingerprint, vs_plan.graph_fingerprint),
                                   ("cluster", plan.cluster_fingerprint,
                                    vs_plan.cluster_fingerprint),
                                   ("global batch", plan.batch, vs_plan.batch)):
            if mine != theirs:
                raise ExplainError(
                    f"the plans differ in {what} ({plan.model} on {plan.cluster}, batch "
                    f"{plan.batch} against {vs_plan.model} on {vs_plan.cluster}, batch "
                    f"{vs_plan.batch}): explain compares configurations of one model, cluster "
                    "and batch (`fxplan diff` compares any two plans)")
        alt_config, label = priced_config(vs_plan), "other plan"
    else:
        alt_config, notes = alternative_config(plan, changes or {})
        label = "alternative"
    headroom = plan.estimate.get("memory_headroom")   # both sides against the plan's
    layout = plan.state_layout   # and in its layout
    mine = _price(graph, cluster, "plan", priced_config(plan), plan.batch, headroom, layout)
    if mine.est is None:
        raise ExplainError(f"the plan itself cannot be priced by this fxplan's cost model: "
                           f"{mine.error}")
    other = _price(graph, cluster, label, alt_config, plan.batch, headroom, layout)
    recorded = plan.estimate.get("step_time_s")
    return Comparison(mine, other, notes, recorded if isinstance(recorded, (int, float)) else None)


def _gib(x: float) -> str:
    return gib(x / 2 ** 30)


def _ms(x: float) -> str:
    return seconds(x, sign=True)


def verdict(c: Comparison) -> str:
    """The one sentence saying which constraint or cost decided (module docstring)."""
    alt, mine = c.alternative, c.plan
    if alt.est is None:
        return f"the alternative is not a valid configuration: {alt.error}"
    over = [(s, m) for s, m in enumerate(alt.est.memory) if not m.fits]
    if over:
        s, m = max(over, key=lambda sm: sm[1].total + sm[1].headroom - sm[1].capacity)
        part = max(MEMORY_ROWS, key=lambda k: getattr(m, k))
        room = f" + {_gib(m.headroom)} headroom" if m.headroom else ""
        return (f"the alternative does not fit: pipeline rank {s} needs {_gib(m.total)}{room} "
                f"of {_gib(m.capacity)} (+{_gib(m.total + m.headroom - m.capacity)}; its "
                f"largest part is "
                f"{part.replace('_', ' ')}, {_gib(getattr(m, part))})")
    assert mine.est is not None
    t, delta = mine.est.step_time_s, alt.est.step_time_s - mine.est.step_time_s
    deltas = c.deltas()
    if abs(delta) <= 1e-9 * t:
        return "the alternative prices the same step time under the cost model"
    if delta > 0:
        key = max(deltas, key=deltas.get)
        text = (f"the alternative is {100 * delta / t:.3g} % slower ({_ms(delta)} per step), "
                f"mostly {TERMS.get(key, key)} {_ms(deltas[key])}")
        gain = min(deltas, key=deltas.get)
        if deltas[gain] < -0.01 * delta:   # an offset worth naming: above 1 % of the loss
            text += f", partly offset by {TERMS.get(gain, gain)} {_ms(deltas[gain])}"
        if not mine.est.fits:
            text += " (the plan itself does not fit under this cost model)"
        return text
    key = min(deltas, key=deltas.get)
    return (f"the alternative is {100 * -delta / t:.3g} % faster ({_ms(delta)} per step, mostly "
            f"{TERMS.get(key, key)} {_ms(deltas[key])}) and fits: the search did not reach it "
            "(its candidate space or its bounds left it out; see the plan's pruning reasons)")
