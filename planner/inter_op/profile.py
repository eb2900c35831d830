"""Per-segment prices the inter-op search needs, from the cost model, in seconds and bytes.

The search never prices an op itself. For one *shape key* ``(tp, sp, recompute, microbatch)``
it asks :func:`cost_model.step.layer_costs.segment_cost` for every segment (``pre`` = embeddings,
each repeated layer, ``post`` = final norm, head, loss) and adds the tensor-parallel
collectives of the segment, priced by :func:`cost_model.comm.collectives.collective_time_s` over
the tp group of the mesh (ranks ``0 … tp−1``; a tp group larger than a node straddles the
network and the collective model prices that). Per microbatch and tp rank:

    f_i = forward_s                       c^f_i = Σ_{(k, S) ∈ tp_forward}  t_k(S)
    b_i = backward_s + recompute_s        c^b_i = Σ_{(k, S) ∈ tp_backward} t_k(S)

(compute and exposed tp communication kept apart for the breakdown; Megatron does not overlap
them, so a layer's time is ``t_i = f_i + b_i + c^f_i + c^b_i``)
and the segment keeps ``ψ_i`` parameters (locally, tied weights counted once per segment),
``a_i`` saved activation bytes, ``w_i`` working bytes while it is recomputed, ``h_i`` what
it holds beyond ``a_i`` while a split backward keeps its recompute
(:attr:`~fxplan.cost_model.memory.activations.ActivationBytes.kept`) and ``o_i`` output
(pipeline message) bytes (``pre``/``post`` likewise: their ``w``, ``h`` and ``o`` in
``end_working``, ``end_kept`` and ``end_out_bytes``).

With expert parallelism (``ep > 1``, :mod:`cost_model.parallel.expert_parallel`) a mixture of experts'
layer keeps ``1/ep`` of its expert parameters (``ψ^e_i``, the expert part of ``ψ_i``) and its
dispatch and combine all-to-alls over the EP group of the first replica (dp ranks
``0, tp, …, (ep−1)·tp``) join ``c^f_i`` and ``c^b_i``.

With context parallelism (``cp > 1``, :mod:`cost_model.parallel.context_parallel`) every segment runs
``1/cp`` of each microbatch's tokens (its ``f, b, a, o`` and tp collectives ÷ ``cp``; the
parameters unchanged), a layer with attention holds the gathered ``K, V`` (``a``, ``w``), and
its K/V all-gather (forward) and reduce-scatter (backward) over the CP group of the first
replica (dp ranks ``0, tp, …, (cp−1)·tp``) join ``c^f_i`` and ``c^b_i``.

Profiles are cached per shape key: the thousands of candidates the search visits share a few
dozen of them. A candidate that recomputes only some layers (``recompute_layers``) reads each
layer's row from the profile of its own policy (:func:`mixed_profile`): layer ``i`` takes
``(f, b, c^f, c^b, a, w)`` of policy ``ρ`` where it recomputes and of ``none`` elsewhere
(``ψ``, ``o`` and ``pre``/``post``, never recomputed, are the same in both).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from fxplan.cost_model.comm.collectives import collective_time_s
from fxplan.cost_model.memory.breakdown import ADAM_MIXED, OptimizerSpec
from fxplan.cost_model.parallel.context_parallel import cp_layers, cp_segment, kv_bytes, layer_exchange
from fxplan.cost_model.parallel.expert_parallel import (alltoall_seconds, ep_segment, expert_work,
                                               moe_layers)
from fxplan.cost_model.step.estimate import training_adam
from fxplan.cost_model.step.layer_costs import SegmentCost, graph_segments, segment_cost

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster, DeviceGroup
    from fxplan.core.config import ParallelConfig
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["ShapeKey", "SegmentProfile", "ModelProfile", "mixed_profile"]

#: ``(tp, sequence_parallel, recompute, microbatch, fp8, ep, cp, device group name)``.
ShapeKey = tuple[int, bool, str, int, bool, int, int, str]


@dataclass(frozen=True)
class SegmentProfile:
    """Arrays over the ``L`` layers plus the ``pre``/``post`` scalars (module docstring)."""

    fwd: np.ndarray
    bwd: np.ndarray
    tp_fwd: np.ndarray
    tp_bwd: np.ndarray
    params: np.ndarray
    acts: np.ndarray
    working: np.ndarray
    kept: np.ndarray                          # h_i
    out_bytes: np.ndarray
    pre: tuple[float, float, float, float]   # (f + c^f, b + c^b, ψ, a)
    post: tuple[float, float, float, float]
    tied_params: float                        # ψ of weights shared by pre and post
    end_working: tuple[float, float]          # w of pre, post
    end_kept: tuple[float, float]             # h of pre, post
    end_out_bytes: tuple[float, float]        # o of pre, post
    expert_params: np.ndarray | None = None   # ψ^e_i (ep > 1; None: no expert parallelism)
    ep: int = 1
    cp: int = 1
    tensors: np.ndarray | None = None         # n_i: parameter tensors of each layer
    end_tensors: tuple[int, int, int] = (0, 0, 0)  # of pre, post, and tied between them
    optimizer: OptimizerSpec = ADAM_MIXED     # the model states' layout, bytes per parameter

    @property
    def layers(self) -> int:
        return len(self.fwd)

    @cached_property
    def layer_time(self) -> np.ndarray:
        """``t_i = f_i + b_i + c^f_i + c^b_i`` (computed once: the search reads it for every
        candidate of the profile; not to be written)."""
        return self.fwd + self.bwd + self.tp_fwd + self.tp_bwd

    @cached_property
    def prefix(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """``(P_ψ, P_a, P_e)``: prefix sums of the layers' parameters, saved bytes and expert
        parameters from 0 (``P[i] = Σ_{k < i}``; ``P_e`` is ``None`` without experts), computed
        once: the memory formula reads a span of them for every split of every candidate."""
        def of(values: np.ndarray) -> np.ndarray:
            return np.concatenate([[0.0], np.cumsum(values)])

        return (of(self.params), of(self.acts),
                None if self.expert_params is None else of(self.expert_params))

    @cached_property
    def kept_prefix(self) -> np.ndarray:
        """``P_h[i] = Σ_{k < i} h_k`` (:attr:`kept`: each layer's
        :attr:`~fxplan.cost_model.memory.activations.ActivationBytes.kept`, what a recomputed
        layer holds beyond its saved bytes from a split backward's ``B`` to its ``W``)."""
        return np.concatenate([[0.0], np.cumsum(self.kept)])

    @cached_property
    def total_work(self) -> float:
        """``W = Σ_i t_i + pre + post`` seconds per microbatch, whole model."""
        return float(self.layer_time.sum() + sum(self.pre[:2]) + sum(self.post[:2]))

    @property
    def total_params(self) -> float:
        return float(self.params.sum() + self.pre[2] + self.post[2] - self.tied_params)


def mixed_profile(none: SegmentProfile, policy: SegmentProfile,
                  recomputed: np.ndarray) -> SegmentProfile:
    """The profile of a candidate whose layers ``recomputed`` (a boolean mask over the ``L``
    layers) run ``policy``'s recompute and the others none (module docstring)."""
    def pick(name: str) -> np.ndarray:
        return np.where(recomputed, getattr(policy, name), getattr(none, name))

    return replace(none, fwd=pick("fwd"), bwd=pick("bwd"), tp_fwd=pick("tp_fwd"),
                   tp_bwd=pick("tp_bwd"), acts=pick("acts"), working=pick("working"),
                   kept=pick("kept"))


class ModelProfile:
    """The graph's segments priced on ``cluster`` for each shape key (cached)."""

    def __init__(self, graph: CapturedGraph, cluster: Cluster,
                 optimizer: OptimizerSpec | None = None) -> None:
        self.graph = graph
        self.cluster = cluster
        #: Adam in the graph's precision and the runtime's layout unless given
        self.optimizer = optimizer or training_adam(graph)
        self.device = cluster.device(0)
        self.segments = graph_segments(graph)
        self.keys = [key for key, _ in self.segments.layers]
        self._cache: dict[ShapeKey, SegmentProfile] = {}
        self._mixed: dict[tuple, SegmentProfile] = {}

    @property
    def num_layers(self) -> int:
        return len(self.keys)

    @property
    def heads(self) -> int | None:
        return self.segments.heads

    def tp_widths(self) -> dict[str, int]:
        return dict(self.segments.tp_widths)

    @property
    def tied_ends(self) -> bool:
        """Whether the first and the last segment share a weight (a tied embedding and head),
        which every split puts on the first and the last pipeline stage."""
        return bool(self.get(1, False, "none", 1).end_tensors[2])

    def get(self, tp: int, sp: bool, recompute: str, microbatch: int,
            fp8: bool = False, ep: int = 1, cp: int = 1,
            device: DeviceGroup | None = None) -> SegmentProfile:
        """The profile of one shape key on ``device``'s group (default: rank 0's); ``fp8``
        prices the linear layers in FP8, ``ep`` splits a mixture of experts' experts, ``cp``
        the sequence (module docstring)."""
        group = device or self.device
        key = (tp, bool(sp and tp > 1), recompute, microbatch, fp8, ep, cp, group.name)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._build(*key[:7], group)
        return hit

    def _comm(self, items: tuple[tuple[str, float], ...], tp: int, group: DeviceGroup) -> float:
        ranks = tuple(range(group.first_rank, group.first_rank + tp))
        return sum(collective_time_s(kind, nbytes, ranks, self.cluster) for kind, nbytes in items)

    def _segment(self, key: str, tp: int, sp: bool, recompute: str, mb: int,
                 fp8: bool, group: DeviceGroup) -> SegmentCost:
        return segment_cost(self.graph, key, tp=tp, sequence_parallel=sp, recompute=recompute,
                            microbatch=mb, device=group, fp8=fp8)

    def of(self, c: "ParallelConfig", device: DeviceGroup | None = None,
           recompute: str | None = None) -> SegmentProfile:
        """The profile of candidate ``c``'s shape key (on ``device``'s group); with
        ``recompute_layers``, each layer's row from its own policy's (:func:`mixed_profile`);
        ``recompute``: another policy on every layer instead."""
        prof = self.get(c.tp, c.sequence_parallel, recompute or c.recompute,
                        c.microbatch_size, c.fp8, c.ep, c.cp, device)
        if c.recompute_layers is None or recompute is not None:
            return prof
        policies = c.layer_recompute(self.num_layers)
        key = (c.tp, c.sequence_parallel, c.recompute, c.microbatch_size, c.fp8, c.ep, c.cp,
               (device or self.device).name, policies)
        hit = self._mixed.get(key)
        if hit is None:
            none = self.get(c.tp, c.sequence_parallel, "none", c.microbatch_size, c.fp8,
                            c.ep, c.cp, device)
            hit = self._mixed[key] = mixed_profile(none, prof,
                                                   np.array([p != "none" for p in policies]))
        return hit

    def _build(self, tp: int, sp: bool, recompute: str, mb: int, fp8: bool, ep: int, cp: int,
               group: DeviceGroup) -> SegmentProfile:
        per_key: dict[str, tuple[float, ...]] = {}
        tensors_of: dict[str, int] = {}
        moe = moe_layers(self.graph) if ep > 1 else {}
        attn = cp_layers(self.graph) if cp > 1 else {}
        ep_ranks = tuple(group.first_rank + j * tp for j in range(ep))
        cp_ranks = tuple(group.first_rank + j * tp for j in range(cp))
        scale = mb / self.segments.batch
        tp_ranks = tuple(range(group.first_rank, group.first_rank + tp))
        for key in dict.fromkeys(self.keys):
            work = (expert_work(self.graph, moe[key], tp=tp, sequence_parallel=sp,
                                microbatch=mb, device=group) if key in moe else None)
            c = ep_segment(self._segment(key, tp, sp, recompute, mb, fp8, group), moe.get(key),
                           ep, work, recompute)
            c = cp_segment(c, cp, kv_bytes(attn.get(key), scale=scale, tp=tp), recompute)
            tensors_of[key] = len(c.params)
            a2a = (alltoall_seconds(moe[key], scale=scale, tp=tp,
                                    ep_group=ep_ranks, cluster=self.cluster,
                                    recompute_full=recompute == "full", tp_group=tp_ranks)
                   if key in moe else (0.0, 0.0))
            kv = layer_exchange(self.graph, key, group=cp_ranks, tp=tp, sequence_parallel=sp,
                                microbatch=mb, recompute=recompute, device=group,
                                cluster=self.cluster).priced
            experts = sum(n for k, n in c.params.items()
                          if key in moe and k in moe[key].expert_params)
            per_key[key] = (c.forward_s, c.backward_s + c.recompute_s,
                            self._comm(c.tp_forward, tp, group) + a2a[0] + kv[0],
                            self._comm(c.tp_backward, tp, group) + a2a[1] + kv[1],
                            c.param_count, c.activations.saved, c.activations.working,
                            c.activations.kept, c.output_bytes, experts)
        rows = np.array([per_key[k] for k in self.keys], dtype=float).reshape(-1, 10)
        ends = [cp_segment(self._segment(key, tp, sp, recompute, mb, fp8, group), cp, 0.0,
                           recompute) for key in ("pre", "post")]
        pre, post = ((c.forward_s + self._comm(c.tp_forward, tp, group),
                      c.backward_s + c.recompute_s + self._comm(c.tp_backward, tp, group),
                      c.param_count, c.activations.saved) for c in ends)
        tied = sum(v for k, v in ends[0].params.items() if k in ends[1].params)
        tensors = np.array([tensors_of[k] for k in self.keys], dtype=float)
        end_tensors = (len(ends[0].params), len(ends[1].params),
                       sum(1 for k in ends[0].params if k in ends[1].params))
        return SegmentProfile(*(rows[:, i] for i in range(9)), pre, post, float(tied),
                              (ends[0].activations.working, ends[1].activations.working),
                              (ends[0].activations.kept, ends[1].activations.kept),
                              (ends[0].output_bytes, ends[1].output_bytes),
                              rows[:, 9] if ep > 1 else None, ep, cp, tensors, end_tensors,
                              self.optimizer)
