"""Step simulator: per-stage timelines of a pipeline schedule, then the step around them.

**Pipeline timeline.** Each stage ``s`` runs its ops in the schedule's order
(:mod:`cost_model.step.pipeline_schedules`); an op starts when the stage is free and the op it
depends on (on a neighbouring stage) has ended::

    end[s, k] = max(end[s, k−1], end[dep(s, k)]) + d[s, k]

so bubbles fall out of the dependencies; nothing is discounted in closed form. Under a
zero-bubble schedule (``zb``, ``zbv``, ``dualpipev``) the backward is two ops: ``B``, the
input gradient (what the previous stage waits for: the recompute, the backward's
communication and the compute less the weight-gradient GEMMs), and ``W``, the weight
gradient (:attr:`StageCosts.weight`), which nothing waits for and which the schedule places
in what would otherwise be a bubble (``dualpipev`` runs most of its backwards whole: ``B``
then ``W`` at once, the input gradient sent after both). Sends are
blocking, as in Megatron's ``send_forward_recv_backward``: ``d`` includes the send of the
op's output, and the receiver may start when the send ends. For one stage, with
``C_k = Σ_{j≤k} d_j`` and ``r_k`` the end of ``dep(s, k)`` (0 if none), the recursion
unrolls to a running maximum::

    end[s, k] = C_k + max_{j≤k} (r_j − C_{j−1})

which numpy evaluates for a whole stage at once. The stages are solved Gauss–Seidel
style, sweeping up (forward dependencies) and down (backward ones) and re-solving only the
suffix of a stage after the first dependency that changed, until nothing changes; the
dependency graph is acyclic, so the fixed point is its longest-path solution — exactly what
an event-driven simulation gives (``tests/cost_model/test_simulator.py`` checks both).

**The step.** After its last backward a stage finishes its data-parallel gradient sync and
runs the optimizer::

    T_s    = end_s + exposed_dp_s + post_s + optimizer_s + offload_s,      T = max_s T_s

Gradient buckets become ready as the backward (its ``W`` under a split backward) of the
*last* microbatch of each model chunk passes their layers (bucket ``i`` of a chunk is ready
at ``start + f_i·(end − start)`` of that op); one communication stream reduces them first
come, first served, so only the part that cannot hide behind the remaining backward is
exposed: ``exposed_dp_s = max(0, comm_end_s − end_s)``. Where the runtime reduces after the
backward and waits (``StageCosts.dp_blocking``: torch's ``REDUCE_GRAD`` under the multi-stage
schedules with FSDP2, the pass after a zero-bubble schedule's step beside dp,
:mod:`cost_model.step.overlap`) all of it is exposed, ``Σ t_i``. ``post_s``
is communication that must follow the whole backward (tied-embedding gradient sync, ZeRO-1/2
parameter all-gather). The breakdown of the critical stage ``c`` sums to ``T``: compute,
exposed TP comm, ZeRO comm, p2p, idle time ``end_c − busy_c`` split in two, exposed DP comm,
optimizer, and ``offload``
(the host↔device copies and CPU optimizer step that are not hidden, :mod:`cost_model.memory.offload`)
when the configuration offloads.

**Bubble versus stage imbalance.** The idle time of the critical stage has two causes: the
schedule itself (a balanced pipeline idles while it fills and drains: ``(p−1)/m`` of the
busy time for 1F1B, ``(p−1)/(m·v)`` interleaved) and unequal stages (a stage waits for a
slower neighbour). The reference is the same schedule with every stage running the critical
stage's own op durations, ``d'[s] = d[c]`` for all ``s`` — a perfectly balanced pipeline
with the same per-stage work — whose idle ``I_bal = end'_c − busy_c`` is the schedule's::

    bubble          = min(I, I_bal)            I = end_c − busy_c
    stage_imbalance = I − bubble               (≥ 0; 0 for a balanced pipeline)

so ``bubble + stage_imbalance = I`` and the breakdown still sums to ``T``. (A critical stage
whose neighbours are faster than itself can idle *less* than ``I_bal``; then all of ``I`` is
bubble.)
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import NamedTuple, Sequence

import numpy as np

from fxplan.cost_model.step.pipeline_schedules import (FORWARD, SPLIT_BACKWARD, ScheduleOrder,
                                                   schedule_order)

__all__ = ["PipelineTimeline", "StageCosts", "StepSimulation", "TimelineEvent",
           "balanced_idle", "comm_stream", "comm_stream_end", "simulate_pipeline", "simulate_step"]

#: Components of an op's duration, in :class:`StageCosts` field order.
COMPONENTS: tuple[str, ...] = ("compute", "tp_comm", "zero_comm", "p2p")


class TimelineEvent(NamedTuple):
    """One op of the timeline: stage, ``"F"``/``"B"``/``"W"``, microbatch, model chunk, start,
    end (s)."""

    stage: int
    kind: str
    microbatch: int
    chunk: int
    start: float
    end: float


@dataclass(frozen=True, eq=False)
class PipelineTimeline:
    """End of every op, ``(p, K)`` arrays in each stage's order; ``durations[s, c, kind]``
    the op durations, ``busy`` each stage's total."""

    order: ScheduleOrder
    end: np.ndarray
    durations: np.ndarray
    busy: np.ndarray

    @cached_property
    def start(self) -> np.ndarray:
        """``(p, K)`` start of every op."""
        o = self.order
        return self.end - self.durations[np.arange(o.stages)[:, None], o.chunk, o.kind]

    @property
    def stage_end(self) -> np.ndarray:
        """When each stage runs its last op."""
        return self.end[:, -1]

    @property
    def makespan(self) -> float:
        return float(self.end[:, -1].max())

    def bubble_fraction(self, stage: int = 0) -> float:
        """Idle over busy time of ``stage``: ``(p−1)/m`` for uniform 1F1B, ``(p−1)/(m·v)``
        for uniform interleaved."""
        return float((self.stage_end[stage] - self.busy[stage]) / self.busy[stage])

    def last_backward(self) -> tuple[np.ndarray, np.ndarray]:
        """``(p, v)`` start and end of each chunk's last backward on each stage."""
        pos = _last_backward_pos(self.order)
        rows = np.arange(self.order.stages)[:, None]
        end = self.end[rows, pos]
        kind = self.order.release_kind
        return end - self.durations[:, :, kind][rows, np.arange(self.order.chunks)], end

    def events(self) -> list[TimelineEvent]:
        """All ops, stage by stage, for plots and reports."""
        o = self.order
        return [TimelineEvent(s, "FBW"[o.kind[s, k]], int(o.microbatch[s, k]),
                              int(o.chunk[s, k]), float(self.start[s, k]), float(self.end[s, k]))
                for s in range(o.stages) for k in range(o.ops_per_stage)]


@lru_cache(maxsize=256)
def _last_backward_pos(order: ScheduleOrder) -> np.ndarray:
    return order.last_backward_pos()


@dataclass(frozen=True, eq=False)
class _Solver:
    """Per-schedule index arrays for the Gauss–Seidel sweeps (built once, cached)."""

    flat: np.ndarray                   # (p, K) flat index of each op's dependency in end (p, K+1)
    dependents: tuple[tuple[tuple[int, np.ndarray], ...], ...]  # per stage: (stage, first_pos[f])


@lru_cache(maxsize=64)
def _solver(order: ScheduleOrder) -> _Solver:
    p, K = order.kind.shape
    has = order.dep_pos >= 0
    flat = np.where(has, order.dep_stage * (K + 1) + np.maximum(order.dep_pos, 0), K)
    dependents: list[list[tuple[int, np.ndarray]]] = [[] for _ in range(p)]
    positions = np.arange(K)
    for s in range(p):
        for t in np.unique(order.dep_stage[s][has[s]]).tolist():
            mask = has[s] & (order.dep_stage[s] == t)
            # first_pos[f] = the first op of s whose dependency sits at position ≥ f of t
            best = np.full(K + 1, K, dtype=np.int64)
            np.minimum.at(best, order.dep_pos[s][mask], positions[mask])
            dependents[t].append((s, np.minimum.accumulate(best[::-1])[::-1]))
    return _Solver(flat, tuple(tuple(d) for d in dependents))


def _solve(order: ScheduleOrder, durations: np.ndarray) -> np.ndarray:
    """Longest-path end times ``(p, K)`` of ops with durations ``(p, K)`` (module docstring).

    The sweeps start from the lower bound "no waiting" (``end = C``) and only raise values, so
    they converge in a few sweeps. (Starting from an earlier solution instead was tried: a
    start above the solution in places makes neighbouring stages lower each other slowly,
    over hundreds of sweeps.) ``end = running + C`` holds throughout.
    """
    solver = _solver(order)
    p, K = durations.shape
    C = np.cumsum(durations, axis=1)
    C_prev = np.zeros_like(C)
    C_prev[:, 1:] = C[:, :-1]
    running = np.zeros((p, K))        # max_{j≤k}(r_j − C_{j−1}), kept to re-solve suffixes exactly
    end = np.zeros((p, K + 1))        # column K stays 0: the "no dependency" slot
    end[:, :K] = C
    flat_end = end.reshape(-1)
    pending = [0] * p
    sweeps = (range(p), range(p - 1, -1, -1))
    changed = True
    while changed:
        changed = False
        for sweep in sweeps:
            for s in sweep:
                j = pending[s]
                if j >= K:
                    continue
                pending[s] = K
                m = flat_end.take(solver.flat[s, j:])
                m -= C_prev[s, j:]
                if j and m[0] < running[s, j - 1]:
                    m[0] = running[s, j - 1]
                np.maximum.accumulate(m, out=m)
                old = running[s, j:]
                differs = m != old
                first = int(differs.argmax())
                if not differs[first]:
                    continue
                old[first:] = m[first:]
                np.add(m[first:], C[s, j + first:], out=end[s, j + first:K])
                changed = True
                first += j
                for dependent, first_pos in solver.dependents[s]:
                    if first_pos[first] < pending[dependent]:
                        pending[dependent] = int(first_pos[first])
    return end[:, :K]


_TIMELINES: "OrderedDict[tuple, PipelineTimeline]" = OrderedDict()


def simulate_pipeline(schedule: str, stages: int, chunks: int, microbatches: int,
                      durations: np.ndarray) -> PipelineTimeline:
    """Timeline of ``schedule`` (``gpipe``/``1f1b``/``interleaved``/``zb``/``zbv``/
    ``dualpipev``) with op durations ``durations[s, c, kind]`` (seconds; ``kind`` 0 forward,
    1 backward, 2 a split backward's weight gradient), shape ``(p, v, 2)``, or ``(p, v, 3)``
    for ``zb``/``zbv``/``dualpipev``.

    Results are memoised on the exact durations (the planner re-prices the same candidates).
    """
    durations = np.ascontiguousarray(durations, dtype=float)
    key = (schedule, stages, chunks, microbatches, durations.tobytes())
    hit = _TIMELINES.get(key)
    if hit is not None:
        _TIMELINES.move_to_end(key)
        return hit
    order = schedule_order(schedule, stages, chunks, microbatches)
    per_op = durations[np.arange(stages)[:, None], order.chunk, order.kind]
    end = _solve(order, per_op)
    timeline = PipelineTimeline(order, end, durations, microbatches * durations.sum(axis=(1, 2)))
    _TIMELINES[key] = timeline
    if len(_TIMELINES) > 512:
        _TIMELINES.popitem(last=False)
    return timeline


def comm_stream(ready: Sequence[float], seconds: Sequence[float],
                start: float = 0.0) -> list[tuple[float, float]]:
    """``(start, end)`` of each transfer of a first-come-first-served stream of transfers
    ready at ``ready`` taking ``seconds`` each, in the order they run:
    ``b_i = max(e_{i−1}, ready_i)``, ``e_i = b_i + t_i`` over transfers sorted by readiness."""
    end = start
    spans = []
    for r, t in sorted(zip(ready, seconds)):
        begin = max(end, r)
        end = begin + t
        spans.append((begin, end))
    return spans


def comm_stream_end(ready: Sequence[float], seconds: Sequence[float], start: float = 0.0) -> float:
    """End of the stream :func:`comm_stream` runs (``start`` when it is empty)."""
    spans = comm_stream(ready, seconds, start)
    return spans[-1][1] if spans else start


@dataclass(frozen=True, eq=False)
class StageCosts:
    """Per-microbatch op costs of each (stage, chunk) and the per-stage step overheads.

    ``forward``/``backward`` are ``(4, p, v)`` arrays of seconds, rows in
    :data:`COMPONENTS` order (compute incl. recompute, exposed TP comm, exposed ZeRO-3 comm,
    blocking p2p send). ``weight`` (``(p, v)``, or ``None``: 0) is the part of the backward's
    compute that is weight-gradient work, which a split backward runs as its own op
    (:func:`cost_model.step.layer_costs`'s ``weight_grad_share``). ``grad_buckets[s][c]``
    lists ``(f, seconds)``: a bucket ready after fraction ``f`` of the last backward of
    chunk ``c`` on stage ``s`` and the time its data-parallel reduction takes. ``post``,
    ``optimizer`` and ``offload`` (``None``: no offload) are ``(p,)`` seconds.
    """

    forward: np.ndarray
    backward: np.ndarray
    grad_buckets: tuple[tuple[tuple[tuple[float, float], ...], ...], ...]
    post: np.ndarray
    optimizer: np.ndarray
    offload: np.ndarray | None = None
    weight: np.ndarray | None = None
    #: the reductions run after each chunk's last backward and block the stage (torch's
    #: ``REDUCE_GRAD``: :func:`cost_model.step.overlap.dp_reduce_blocks`) instead of hiding
    #: behind it; one flag for every stage, or one per stage (a ZeRO stage per pipeline rank)
    dp_blocking: bool | tuple[bool, ...] = False

    def blocks(self, stage: int) -> bool:
        """Whether stage ``stage``'s reductions block after its last backward
        (:attr:`dp_blocking`)."""
        return (self.dp_blocking if isinstance(self.dp_blocking, bool)
                else self.dp_blocking[stage])

    @property
    def stages(self) -> int:
        return self.forward.shape[1]

    @property
    def chunks(self) -> int:
        return self.forward.shape[2]

    def durations(self, split: bool = False) -> np.ndarray:
        """``(p, v, 2)`` op durations for :func:`simulate_pipeline`; with ``split`` ``(p, v,
        3)``: the backward less its weight-gradient work, then that work."""
        backward = self.backward.sum(axis=0)
        if not split:
            return np.stack([self.forward.sum(axis=0), backward], axis=-1)
        weight = np.zeros_like(backward) if self.weight is None else self.weight
        return np.stack([self.forward.sum(axis=0), backward - weight, weight], axis=-1)


@dataclass(frozen=True, eq=False)
class StepSimulation:
    """One training step: the pipeline timeline and what follows it on each stage."""

    timeline: PipelineTimeline
    stage_time: np.ndarray            # (p,) T_s
    exposed_dp: np.ndarray            # (p,)
    critical_stage: int
    breakdown: dict[str, float] = field(default_factory=dict)
    #: per stage, ``(start, end)`` of each data-parallel gradient-bucket reduction on the
    #: communication stream (hidden behind the backward or exposed after it)
    dp_transfers: tuple[tuple[tuple[float, float], ...], ...] = ()

    @property
    def step_time_s(self) -> float:
        return float(self.stage_time[self.critical_stage])


def balanced_idle(durations: np.ndarray, stage: int, schedule: str, microbatches: int) -> float:
    """Idle seconds of ``stage`` when every stage runs ``stage``'s op durations (the
    balanced reference of the module docstring, ``I_bal``); 0 without a pipeline."""
    p, v = durations.shape[0], durations.shape[1]
    if p == 1:
        return 0.0
    balanced = np.broadcast_to(durations[stage], durations.shape)
    timeline = simulate_pipeline(schedule, p, v, microbatches, balanced)
    return max(0.0, float(timeline.stage_end[stage] - timeline.busy[stage]))


def simulate_step(costs: StageCosts, schedule: str, microbatches: int) -> StepSimulation:
    """Simulate one step (module docstring) and break the critical stage's time down."""
    p, v, m = costs.stages, costs.chunks, microbatches
    durations = costs.durations(schedule in SPLIT_BACKWARD)
    timeline = simulate_pipeline(schedule, p, v, m, durations)
    lb_start, lb_end = timeline.last_backward()
    stage_end = timeline.stage_end
    exposed = np.zeros(p)
    transfers: list[tuple[tuple[float, float], ...]] = []
    for s in range(p):
        ready, seconds = [], []
        for c in range(v):
            span = lb_end[s, c] - lb_start[s, c]
            for fraction, t in costs.grad_buckets[s][c]:
                ready.append(lb_start[s, c] + fraction * span)
                seconds.append(t)
        blocking = costs.blocks(s)
        if blocking:   # each chunk's reductions start after its last backward
            ready = [float(lb_end[s].max())] * len(seconds)
        spans = comm_stream(ready, seconds)
        transfers.append(tuple((float(a), float(b)) for a, b in spans))
        if spans:
            exposed[s] = (float(sum(seconds)) if blocking
                          else max(0.0, spans[-1][1] - stage_end[s]))
    stage_time = stage_end + exposed + costs.post + costs.optimizer
    if costs.offload is not None:
        stage_time = stage_time + costs.offload
    critical = int(np.argmax(stage_time))
    breakdown = {name: float(m * (costs.forward[i, critical].sum() + costs.backward[i, critical].sum()))
                 for i, name in enumerate(COMPONENTS)}
    idle = max(0.0, float(stage_end[critical] - timeline.busy[critical]))
    breakdown["bubble"] = min(idle, balanced_idle(durations, critical, schedule, m))
    breakdown["stage_imbalance"] = idle - breakdown["bubble"]
    breakdown["dp_comm"] = float(exposed[critical] + costs.post[critical])
    breakdown["optimizer"] = float(costs.optimizer[critical])
    if costs.offload is not None:
        breakdown["offload"] = float(costs.offload[critical])
    return StepSimulation(timeline, stage_time, exposed, critical, breakdown, tuple(transfers))
