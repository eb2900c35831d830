"""The cost model's prices for the intra-op solver, on a :class:`~cost_model.comm.mesh.LogicalMesh`.

Node ``v`` under strategy ``s`` (``split_a``: the op's work is divided over axis ``a``):

    compute_s = t_fwd(v, 1/f) + t_bwd(v, 1/f)            f = Π_{a: split_a} n_a
                (``cost_model.compute.op_time.node_time_s``; no backward for a node no gradient
                reaches, such as index or mask arithmetic)
    comm_s    = Σ_a Σ_{c ∈ comms_a} t_c                  the op's own collectives
              + Σ_{params p} t(grad_p → placement_p)     gradient sync: a parameter replicated
                over an axis its op is split on gets a partial gradient there, all-reduced;
                bucketed, so each parameter pays its bytes' share and no latency
    memory    = Σ_{params p} |p_local| · state_factor    weight + gradient + optimizer state
              + saved_bytes(v) · (local / global size of v's activations)
              + |x_local|                                 for a graph input or buffer x

Edge ``u → v`` carrying tensor ``x`` from placements ``src`` to ``dst``:

    price = reshard(src → dst)                                           forward
          + reshard(grad(dst) → grad(src))        when x needs a gradient, backward

    with, per axis, grad(dst) = P if dst is R and v is split on the axis (each rank's share of
    v's work yields a partial gradient of a replicated input), R if dst is P, else dst; and
    grad(src) = R if src is P, else src (:func:`cost_model.comm.edge_reshard.gradient_placements`,
    the rule :func:`cost_model.step.estimate.estimate` prices explicit placements with). This is how
    Megatron's f/g operators arise: the replicated input of a column-parallel linear
    all-reduces its gradient.

Reshards and collectives are priced by ``cost_model.comm.reshard.reshard_cost`` (a collective of
kind k on axis a is the reshard that performs it: P→R all-reduce, P→S reduce-scatter, S→R
all-gather), so every axis is priced over its slowest group. An edge into ``P`` from a
placement that is not ``P`` is forbidden (infinite): ``reshard_cost`` calls R→P and S→P free
by convention, but a partial sum is something an op produces (a row-parallel matmul, a
vocab-parallel lookup), and taking it for free on an edge would let every view "reshard" to P
and hand the real reduction to a later edge.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, Sequence

import torch

from fxplan.cost_model.compute.op_time import node_time_s
from fxplan.cost_model.comm.edge_reshard import gradient_placements
from fxplan.cost_model.comm.mesh import LogicalMesh
from fxplan.core.placements import Partial, Placements, Replicate, local_shape
from fxplan.cost_model.comm.reshard import reshard_cost
from fxplan.intra_op.costs import NodePrice
from fxplan.sharding.api import NodeStrategies
from fxplan.sharding.context import Operand, tensor_shape
from fxplan.sharding.strategy import Comm, OpStrategy, P, R, S

__all__ = ["MeshCost", "ADAM_STATE_FACTOR"]

#: Bytes resident per byte of an fp32 parameter under Adam: weight, gradient, two moments.
ADAM_STATE_FACTOR = 4.0

_COLLECTIVE_AS_RESHARD = {"all_reduce": (P, R), "reduce_scatter": (P, S(0)), "all_gather": (S(0), R)}


class MeshCost:
    """:class:`~fxplan.intra_op.costs.CostModel` from ``cost_model`` (module docstring).

    ``training``: price backward passes and gradients; ``param_grad_sync``: include the
    all-reduce of partial parameter gradients (turn off when the caller prices data-parallel
    gradient sync itself); ``state_factor``: resident bytes per parameter byte; ``dtype``:
    the compute dtype override passed to the compute model.
    """

    def __init__(self, mesh: LogicalMesh, *, training: bool = True, param_grad_sync: bool = True,
                 state_factor: float = ADAM_STATE_FACTOR, dtype: Any = None, database: Any = "auto") -> None:
        self.mesh = mesh
        self.device = mesh.cluster.device(mesh.ranks[0])
        self.training = training
        self.param_grad_sync = param_grad_sync
        self.state_factor = state_factor
        self.dtype = dtype
        self.database = database
        self._reshard = lru_cache(maxsize=1 << 16)(self._reshard_uncached)

    # -- pieces --------------------------------------------------------------------------
    def _reshard_uncached(self, src: Placements, dst: Placements, shape: tuple[int, ...], nbytes: int) -> float:
        if src == dst:
            return 0.0
        return reshard_cost(src, dst, shape, nbytes, self.mesh).time_s

    def collective_s(self, kind: str, nbytes: float, axis: int) -> float:
        """One collective of ``kind`` over mesh axis ``axis`` whose local buffer before it is
        ``nbytes`` bytes, priced as the reshard that performs it."""
        src, dst = _COLLECTIVE_AS_RESHARD[kind]
        elements = max(1, math.ceil(nbytes)) * (self.mesh.shape[axis] if kind == "all_gather" else 1)
        rest = [R] * self.mesh.ndim
        before, after = list(rest), list(rest)
        before[axis], after[axis] = src, dst
        return self._reshard(tuple(before), tuple(after), (elements,), 1)

    def _comm_s(self, comm: Comm, axis: int, op: NodeStrategies, strategy: OpStrategy) -> float:
        if comm.operand >= 0:
            shape, placements = op.ctx.operands[comm.operand].shape, strategy.inputs[comm.operand]
        else:
            shape, placements = _first_shape(op.ctx.out), strategy.output
        local = local_shape(shape, placements, self.mesh.shape)
        elements = math.prod(s for d, s in enumerate(local) if d not in comm.drop_dims)
        seconds = comm.count * self.collective_s(comm.kind, elements * comm.dtype_bytes, axis)
        return seconds * (2 if comm.backward and self.training else 1)

    def _grad_sync_s(self, operand: Operand, placements: Placements, split: Sequence[bool]) -> float:
        """Marginal seconds of reducing this parameter's partial gradient: gradients travel in
        buckets (DDP, FSDP), so a parameter pays for its bytes, not for a collective's latency
        (the same reshard of a one-element tensor is subtracted)."""
        grad = tuple(P if isinstance(p, Replicate) and s else p for p, s in zip(placements, split))
        if grad == tuple(placements):
            return 0.0
        full = self._reshard(grad, placements, operand.shape, operand.dtype_bytes)
        return max(0.0, full - self._reshard(grad, placements, (1,) * len(operand.shape), operand.dtype_bytes))

    # -- the protocol ------------------------------------------------------------------------
    def node_price(self, op: NodeStrategies, strategy: OpStrategy, *, requires_grad: bool,
                   owned_params: Sequence[int]) -> NodePrice:
        info = op.ctx.node.meta["fxplan"]
        ways = math.prod(n for n, s in zip(self.mesh.shape, strategy.split) if s)
        compute = node_time_s(info, self.device, shard_factor=ways, dtype=self.dtype, database=self.database)
        if self.training and requires_grad:
            compute += node_time_s(info, self.device, shard_factor=ways, dtype=self.dtype,
                                   database=self.database, backward=True)
        comm = sum(self._comm_s(c, a, op, strategy) for a, comms in enumerate(strategy.comms) for c in comms)
        memory = info.saved_bytes * self._activation_fraction(op, strategy) if self.training else 0.0
        for i in owned_params:
            operand, placements = op.ctx.operands[i], strategy.inputs[i]
            memory += _local_bytes(operand.shape, operand.dtype_bytes, placements, self.mesh.shape) * self.state_factor
            if self.training and self.param_grad_sync:
                comm += self._grad_sync_s(operand, placements, strategy.split)
        if op.ctx.node.op in ("get_attr", "placeholder"):  # stored inputs, buffers, parameters
            factor = self.state_factor if op.ctx.param else 1.0
            shape, dtype_bytes = _first_shape(op.ctx.out), _dtype_bytes(info.dtype)
            memory += _local_bytes(shape, dtype_bytes, strategy.output, self.mesh.shape) * factor
        return NodePrice(compute, comm, memory)

    def _activation_fraction(self, op: NodeStrategies, strategy: OpStrategy) -> float:
        local = total = 0
        pairs = [(o.shape, p) for o, p in zip(op.ctx.operands, strategy.inputs) if o.param is None and p is not None]
        pairs.append((_first_shape(op.ctx.out), strategy.output))
        for shape, placements in pairs:
            total += math.prod(shape)
            local += math.prod(local_shape(shape, placements, self.mesh.shape))
        return local / total if total else 1.0

    def edge_price(self, tensor: Operand, src: Placements, dst: Placements,
                   consumer_split: Sequence[bool], requires_grad: bool) -> float:
        if any(isinstance(d, Partial) and not isinstance(s, Partial) for s, d in zip(src, dst)):
            return math.inf  # a partial sum is made by an op, never by a reshard
        price = self._reshard(src, dst, tensor.shape, tensor.dtype_bytes)
        if self.training and requires_grad:
            grad_dst, grad_src = gradient_placements(src, dst, consumer_split)
            price += self._reshard(grad_dst, grad_src, tensor.shape, tensor.dtype_bytes)
        return price


def _first_shape(out: Any) -> tuple[int, ...]:
    return tensor_shape(out) if tensor_shape(out) is not None else out[0]


def _dtype_bytes(dtype: Any) -> int:
    dtype = dtype[0] if isinstance(dtype, tuple) else dtype
    return torch.empty((), dtype=dtype).element_size() if isinstance(dtype, torch.dtype) else 4


def _local_bytes(shape: Sequence[int], dtype_bytes: int, placements: Placements, mesh_shape: Sequence[int]) -> float:
    return math.prod(local_shape(shape, placements, mesh_shape)) * dtype_bytes

