"""Expert parallelism at run time: experts sharded over the EP group, tokens by all-to-all.

**Layout** (:mod:`fxplan.cost_model.parallel.expert_parallel`; ``ep | dp``). The plan's ``pp × dp × tp``
mesh is read as ``pp × (dp/ep) × ep × tp`` (:func:`expert_mesh`): the ``dp`` ranks
``d_0 … d_{dp−1}`` of a stage form ``dp/ep`` *EP groups* of ``ep`` consecutive ranks
(axis ``ep``) and ``ep`` *expert-data-parallel* groups ``{d_j, d_{j+ep}, …}`` of ``dp/ep`` ranks
(axis ``edp``). EP rank ``j`` holds experts ``j·E/ep … (j+1)·E/ep − 1`` of every
mixture-of-experts layer: each batched expert weight ``[E, ·, ·]`` becomes a DTensor on the
``(edp, ep)`` sub-mesh with placements ``(Replicate(), Shard(0))``, under the user's parameter
name, so ``state_dict`` keys stay the user's and a DCP checkpoint records the global shape (it
loads back into the unsharded model, and an unsharded one loads into this layout).

**Routing, as one process routes the global batch.** A layer of ``T`` local tokens (``T_g =
dp·T`` over the replicas) computes its router and top-``k`` locally, then all-gathers the
choices ``[T, k]`` (integers) over ``dp``: the capacity ``C = ⌈k·c·T_g/E⌉`` and every
assignment's queue position are those of the one-process model on the global batch (choice-
major, tokens in batch order, replica ``d``'s tokens at ``d·T …``), so the same assignments are
dropped. Under context parallelism (``cp > 1``) a rank's ``T`` tokens are its two chunks of
each of its samples' sequences: the gathered rows are put in the one-process order first
(sample by sample, each sequence whole: :func:`~fxplan.runtime.styles.context_parallel.gathered_order`),
and each rank reads its own tokens' slots back from their places there.

**Dispatch and combine, sized by the real counts** (:meth:`_Exchange.run_experts`;
``all_to_all_single_autograd`` of ``torch.distributed._functional_collectives`` with split
sizes: gloo and NCCL, out of place). Each rank sorts its ``S`` routed rows (its kept
assignments; without capacity all ``T·k``) by the EP rank holding their expert, sends the
per-expert counts by a small all-to-all of integers, then the rows, sorted by expert, by one
all-to-all whose split sizes are those counts: a rank sends ``S·h``
values and receives what its experts were routed, not the global ``[E, C, h]`` buffer of
``E·C ≈ k·c·dp·T`` rows (about ``c·dp`` times its own ``k·T``, mostly zeros) each rank sent
before. The owner runs its
``E/ep`` experts on the received rows, and the combine all-to-all (the counts reversed)
brings each output row back to its token; the backward runs both in reverse. For a
:class:`MoELayer` the owner packs the rows into a compact ``[E/ep, C', h]`` buffer (``C'``: the
most rows one of its experts received, ``≤ C``) for the layer's batched experts, and the
layer's own ``combine`` reads the returned rows as a ``[S, 1, h]`` buffer: an expert's output
row depends on its input row only, so the values are the one-process ones. A routed experts
module (below) runs its own forward on the received rows, one choice each with weight 1, and
the routing weights are applied and summed over the ``k`` choices on the token's rank.

**Gradients.** With each replica's loss the mean over its tokens, the one-process gradient is
``(1/dp) Σ_d ∇loss_d``. The dense parameters get it from DDP/FSDP's average over ``dp``. An
expert weight on EP rank ``j`` receives ``Σ_{d ∈ EP group} ∇_W loss_d`` through the all-to-all
backward; :class:`ExpertGradSync` sums it over the expert-data-parallel group and divides by
``dp``. The auxiliary loss ``aux = E·Σ_i f_i·P_i`` (Switch) uses the global ``f_i`` (from the
gathered choices) and the local mean probabilities ``P_i^d``; since ``aux`` is linear in ``P``,
``(1/dp) Σ_d aux_d`` is the global ``aux`` and DDP's average gives its one-process router
gradient; the reported ``last_aux_loss`` is that average (an all-reduce of one scalar).

**ZeRO.** ZeRO-0 runs the dense parameters under DDP, ZeRO-2/3 under FSDP2, ZeRO-1 as FSDP2
without resharding (as with tp > 1; ``ZeroRedundancyOptimizer`` would broadcast one rank's
experts over the others); both wrappers leave the expert weights alone. With ZeRO ≥ 1 and
``dp/ep > 1`` the expert weights, their gradients and optimizer state are sharded over their
expert-data-parallel group by FSDP2 on the ``(edp, ep)`` mesh
(:mod:`fxplan.runtime.styles.expert_zero`: its reduce-scatter gives the gradient above), else they
are whole on each rank and :class:`ExpertGradSync` reduces them. The expert holders are
called as modules (a :class:`MoELayer`'s ``experts`` through :func:`_batched_local`), so that
FSDP2's hooks gather their weights first. Selective recompute of a block holding an
expert-parallel layer checkpoints its fused attention call alone, the experts untouched
(blocks with attention written out are refused at module level:
:func:`fxplan.runtime.apply.module.module_level_plan`).

**Which layers.** (1) A module with a child ``experts`` whose parameters are all 3-D with
the same leading ``E`` (divisible by ``ep``) and the step methods ``route``, ``capacity``,
``slots``, ``dispatch``, ``combine`` and ``finish`` of ``fxplan.examples.models.moe.MoELayer``
(whose forward is their composition). (2) A *routed experts module*: ``forward(hidden_states
[T, h], top_k_index [T, k], top_k_weights [T, k]) → [T, h]`` with an integer ``num_experts``
and every own parameter ``[E, …]`` — how ``transformers`` ≥ 5 writes the experts of Mixtral
(``gate_up_proj [E, 2f, h]``, ``down_proj [E, h, f]``), Qwen2-MoE and their kin, whatever the
experts implementation (eager, ``grouped_mm``, ``batched_mm``). Its block's router (top-``k``
softmax, no capacity: nothing is dropped, so each token's output is the one-process one) and
a shared expert (Qwen2-MoE's gated ``shared_expert``) stay dense, under DDP/FSDP; the
router-logit auxiliary loss ``transformers`` adds at the model level (``output_router_logits``)
is, as under plain data parallelism, each replica's on its own tokens. A model with 3-D
expert weights in neither form is refused before any collective
(:func:`check_expert_layers`), as are ``tp > 1`` with sequence parallelism and the
graph-rewrite path; the plan is still priced and exported.

**Tensor parallelism** (``tp > 1``, sequence parallelism off; :mod:`fxplan.runtime.styles.expert_tp`):
the ``tp`` ranks of a group hold the same tokens and route them alike; each dispatches its
``1/tp`` chunk of the routed rows over its EP group (the ``ep`` ranks of its tp coordinate)
and the outputs are all-gathered over tp before the combine, so no expert row is computed
twice; :class:`ExpertGradSync` also sums the expert gradients over tp.
"""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from fxplan.runtime.styles.expert_tp import chunk_bounds, gather_rows, split_rows
from fxplan.runtime.apply.offload import RuntimeSupportError

if TYPE_CHECKING:  # pragma: no cover
    from torch.distributed.device_mesh import DeviceMesh

    from fxplan.core.plan import Plan

__all__ = ["check_expert_parallel", "check_expert_layers", "is_routed_experts", "expert_mesh", "shard_experts",
           "expert_params",
           "expert_holders", "ExpertGradSync", "STEPS"]

#: The step methods an expert-parallel layer exposes (module docstring).
STEPS = ("route", "capacity", "slots", "dispatch", "combine", "finish")


def check_expert_parallel(plan: "Plan") -> None:
    """Raise :class:`RuntimeSupportError` for an ``ep > 1`` plan this runtime cannot run
    (``tp > 1`` with sequence parallelism: the tp ranks then hold different tokens, and the
    routing would have to be gathered over tp as well), before any process starts."""
    ep = plan.config.ep
    if ep > 1 and plan.tp > 1 and plan.sequence_parallel:
        raise RuntimeSupportError(
            f"ep={ep} with tp={plan.tp} and sequence parallelism: fxplan's runtime runs expert "
            f"parallelism beside tensor parallelism with a replicated residual stream only "
            f"(the plan is priced, and exported by `fxplan export PLAN --to "
            f"megatron|torchtitan|deepspeed`); re-plan with --constrain sp=off (or ep=1) to "
            f"train it here")


def refuse_graph_path(plan: "Plan", reason: str) -> None:
    """An ``ep > 1`` plan needs the module-level path; ``reason``: why it was refused."""
    if plan.config.ep > 1:
        raise RuntimeSupportError(
            f"ep={plan.config.ep}: expert parallelism runs on the user's module only, and the "
            f"module level refused this plan ({reason}); re-plan with --constrain ep=1")


def expert_mesh(plan: "Plan", mesh: "DeviceMesh") -> "DeviceMesh | None":
    """The plan's mesh as ``pp × (dp/ep) × ep × tp`` named ``(pp, edp, ep, tp)``, or ``None``
    for ``ep = 1`` (collective: every process of the default group calls it)."""
    from torch.distributed.device_mesh import DeviceMesh

    ep = plan.config.ep
    if ep == 1:
        return None
    if plan.dp % ep:
        raise RuntimeSupportError(f"ep={ep} does not divide dp={plan.dp}")
    layout = mesh.mesh.reshape(plan.pp, plan.dp // ep, ep, plan.tp)
    return DeviceMesh(mesh.device_type, layout, mesh_dim_names=("pp", "edp", "ep", "tp"))


#: The arguments a routed experts module's forward takes (``transformers`` ≥ 5's interface).
ROUTED = ("hidden_states", "top_k_index", "top_k_weights")


def is_routed_experts(experts: nn.Module) -> bool:
    """Whether ``experts`` is a routed experts module: ``forward(hidden_states [T, h],
    top_k_index [T, k], top_k_weights [T, k]) → [T, h]`` and an integer ``num_experts``, as
    ``transformers`` ≥ 5 writes Mixtral's, Qwen2-MoE's and their kin's experts."""
    try:
        names = tuple(inspect.signature(experts.forward).parameters)
    except (TypeError, ValueError):
        return False
    return names[:3] == ROUTED and isinstance(getattr(experts, "num_experts", None), int)


def _expert_layers(module: nn.Module, ep: int) -> list[nn.Module]:
    """The modules of ``module`` whose experts are split (module docstring): layers with the
    step methods and a batched ``experts`` child (3-D weights), and routed experts modules
    (every own parameter ``[E, ·, …]``, ``E = num_experts``)."""
    found = []
    for layer in module.modules():
        if is_routed_experts(layer):
            params = list(layer.parameters(recurse=False))
            experts_n = int(layer.num_experts)
            if not params or any(p.dim() < 2 or int(p.shape[0]) != experts_n for p in params):
                continue
        else:
            experts = getattr(layer, "experts", None)
            if not isinstance(experts, nn.Module) or not all(callable(getattr(layer, s, None))
                                                             for s in STEPS):
                continue
            params = list(experts.parameters(recurse=False))
            if not params or any(p.dim() != 3 for p in params) or \
                    len({int(p.shape[0]) for p in params}) != 1:
                continue
            experts_n = int(params[0].shape[0])
        if experts_n % ep:
            raise RuntimeSupportError(f"ep={ep} does not divide the {experts_n} experts of "
                                      f"{type(layer).__name__}")
        found.append(layer)
    return found


def check_expert_layers(module: nn.Module, plan: "Plan") -> None:
    """Raise :class:`RuntimeSupportError` when an ``ep > 1`` plan's model has expert weights
    (3-D parameters) but no layer this runtime can split (module docstring), before any
    collective; ``module`` may be on ``meta``."""
    ep = plan.config.ep
    if ep > 1 and not _expert_layers(module, ep) and \
            any(p.dim() == 3 for p in module.parameters()):
        raise RuntimeSupportError(
            f"ep={ep}: the model's expert weights are not in a layer fxplan's runtime can "
            f"split (one with an `experts` child and the step methods {', '.join(STEPS)}, "
            "as fxplan.examples.models.moe.MoELayer, or a routed experts module "
            f"forward({', '.join(ROUTED)}) with num_experts, as transformers ≥ 5's Mixtral "
            "and Qwen2-MoE); re-plan with --constrain ep=1")


def shard_experts(module: nn.Module, plan: "Plan", mesh: "DeviceMesh", ep_mesh: "DeviceMesh",
                  context: Any = None) -> None:
    """Shard the expert weights of ``module``'s expert-parallel layers over ``ep`` and route
    their forward through :func:`_ep_forward` (:func:`_routed_forward` for a routed experts
    module), in place. Parameters on ``meta`` stay there (materialised later, like tp
    DTensors); :func:`expert_params` lists them afterwards. ``context``: this rank's
    :class:`~fxplan.runtime.styles.context_parallel.ContextParallel` under cp > 1, else ``None``."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    check_expert_layers(module, plan)
    sub = ep_mesh["edp", "ep"]
    exchange = _Exchange(mesh["dp"], ep_mesh["ep"], plan.dp, ep_mesh["tp"], context)
    for layer in _expert_layers(module, plan.config.ep):
        routed = is_routed_experts(layer)
        holder = layer if routed else layer.experts
        for name, param in list(holder.named_parameters(recurse=False)):
            local = distribute_tensor(param.detach(), sub, [Replicate(), Shard(0)],
                                      src_data_rank=None)
            setattr(holder, name, nn.Parameter(local, requires_grad=param.requires_grad))
        layer.forward = functools.partial(  # type: ignore[method-assign]
            _routed_forward if routed else _ep_forward, layer, exchange)
        if not routed:   # called as a module (expert ZeRO's hooks), computing on local experts
            holder.forward = functools.partial(_batched_local, holder)  # type: ignore[method-assign]


def expert_holders(module: nn.Module) -> list[nn.Module]:
    """The modules whose own parameters are the expert weights :func:`shard_experts` sharded
    in ``module`` (a :class:`MoELayer`'s ``experts``, a routed experts module), in module
    order (the same on every rank)."""
    out: list[nn.Module] = []
    for layer in module.modules():
        forward = layer.__dict__.get("forward")
        if isinstance(forward, functools.partial) and forward.func is _ep_forward:
            out.append(layer.experts)
        elif isinstance(forward, functools.partial) and forward.func is _routed_forward:
            out.append(layer)
    return out


def expert_params(module: nn.Module) -> list[nn.Parameter]:
    """The expert weights :func:`shard_experts` sharded in ``module``, in module order (the
    same on every rank: :class:`ExpertGradSync` reduces their gradients in that order)."""
    return [p for holder in expert_holders(module) for p in holder.parameters(recurse=False)]


class _Exchange:
    """The collectives of an expert-parallel layer: the choices' all-gather over ``dp``, the
    all-to-alls over ``ep`` that carry each routed row to the rank holding its expert and its
    output back (:meth:`run_experts`), the auxiliary loss's average over ``dp``."""

    def __init__(self, dp_mesh: "DeviceMesh", ep_mesh: "DeviceMesh", dp: int,
                 tp_mesh: "DeviceMesh", context: Any = None) -> None:
        self.dp, self.dp_group, self.dp_rank = dp, dp_mesh.get_group(), dp_mesh.get_local_rank()
        self.ep, self.ep_group = ep_mesh.size(), ep_mesh.get_group()
        self.tp = tp_mesh.size()
        self.tp_group = tp_mesh.get_group() if self.tp > 1 else None
        self.tp_rank = tp_mesh.get_local_rank()
        self.context = context   # ContextParallel under cp > 1 (not imported: no cycle)

    def global_order(self, x: torch.Tensor) -> torch.Tensor | None:
        """Under context parallelism (``x``: ``(b, s/cp, h)``, this rank's sequence chunks) the
        one-process token index of each gathered row (:func:`~fxplan.runtime.styles.context_parallel.
        gathered_order`); ``None`` without cp, where replica order is the one-process order."""
        if self.context is None:
            return None
        return self.context.gathered_order(x.size(0), x.size(1), self.dp).to(x.device)

    def run_experts(self, rows: torch.Tensor, expert: torch.Tensor, experts_n: int,
                    compute: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
                    ) -> torch.Tensor:
        """The expert outputs ``[S, h']`` of the ``S`` routed ``rows`` (:meth:`_dispatch`);
        with ``tp > 1`` this tp rank dispatches its chunk of them and the chunks' outputs are
        all-gathered over tp (:mod:`fxplan.runtime.styles.expert_tp`)."""
        if self.tp_group is None:
            return self._dispatch(rows, expert, experts_n, compute)
        bounds = chunk_bounds(rows.size(0), self.tp)
        lo, hi = bounds[self.tp_rank], bounds[self.tp_rank + 1]
        mine = split_rows(rows, self.tp_rank, bounds, self.tp_group)
        out = self._dispatch(mine, expert[lo:hi], experts_n, compute)
        return gather_rows(out, self.tp_rank, bounds, self.tp_group)

    def gather(self, choice: torch.Tensor) -> torch.Tensor:
        """Every replica's ``[T, k]`` choices, in replica order: ``[dp·T, k]``."""
        from torch.distributed._functional_collectives import all_gather_tensor

        return _wait(all_gather_tensor(choice.contiguous(), 0, self.dp_group))

    def _dispatch(self, rows: torch.Tensor, expert: torch.Tensor, experts_n: int,
                  compute: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
                  ) -> torch.Tensor:
        """The expert outputs ``[S, h']`` of the ``S`` routed ``rows [S, h]`` (row ``a`` for
        expert ``expert[a]`` of ``experts_n``), in their order. EP rank ``j`` holds experts
        ``j·E_l … (j+1)·E_l − 1`` (``E_l = experts_n/ep``): the rows are sorted by the rank
        holding their expert (by expert), the ``E`` per-expert counts exchanged (one small
        all-to-all: the owner learns how many rows of each of its experts every source
        sends, so which expert each arriving row is for), and the rows sent by an
        all-to-all sized by those counts (so each rank sends and
        receives only the rows that exist, ``Σ = S``, not a global-sized buffer). The owner
        runs ``compute(received [R, h], local expert index [R])`` and a second all-to-all
        with the counts reversed sends each output row back; autograd runs them in reverse."""
        from torch.distributed._functional_collectives import all_to_all_single_autograd

        local_n = experts_n // self.ep
        expert, order = torch.sort(expert, stable=True)     # by expert, so by owner
        sent = torch.bincount(expert, minlength=experts_n)  # [E]: rows to each expert
        received = torch.empty_like(sent)                   # [ep·E_l]: from each source
        dist.all_to_all_single(received, sent, group=self.ep_group)
        out_splits = sent.view(self.ep, local_n).sum(dim=1).tolist()
        in_splits = received.view(self.ep, local_n).sum(dim=1).tolist()
        # the rows arrive source by source, each source's sorted by expert
        local = torch.repeat_interleave(
            torch.arange(local_n, device=expert.device).repeat(self.ep), received)
        arrived = _wait(all_to_all_single_autograd(rows.index_select(0, order).contiguous(),
                                                   in_splits, out_splits, self.ep_group))
        out = compute(arrived, local)
        back = _wait(all_to_all_single_autograd(out.contiguous(), out_splits, in_splits,
                                                self.ep_group))
        return back.index_select(0, torch.argsort(order))

    def mean_over_dp(self, value: torch.Tensor) -> torch.Tensor:
        out = value.detach().clone()
        dist.all_reduce(out, group=self.dp_group)
        return out / self.dp


def _wait(tensor: torch.Tensor) -> torch.Tensor:
    """The value of a functional collective's result (waits for it)."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    return tensor.wait() if isinstance(tensor, AsyncCollectiveTensor) else tensor


def _local_weights(module: nn.Module, dtype: torch.dtype | None = None
                   ) -> dict[str, torch.Tensor]:
    """``module``'s own parameters as this rank's local tensors (its ``E/ep`` experts)."""
    from torch.distributed.tensor import DTensor

    out = {}
    for name, param in module.named_parameters(recurse=False):
        local = param.to_local() if isinstance(param, DTensor) else param
        out[name] = local if dtype is None else local.to(dtype)
    return out


def _batched_compute(experts: nn.Module, experts_n: int, rows: torch.Tensor,
                     local: torch.Tensor) -> torch.Tensor:
    """:class:`MoELayer`'s batched experts ``[E_l, C', h] → [E_l, C', h]`` on the received
    rows: row ``r`` goes to slot ``local[r]·C' + q_r`` (``q_r``: its rank among the rows of
    its expert in arrival order, from a stable sort by expert; ``C'`` the most rows any local
    expert received, at least 1); each expert's
    output row depends on its input row only, so the compact buffer gives the rows the
    capacity-sized one would (its empty slots are never read)."""
    counts = torch.bincount(local, minlength=experts_n)                # [E_l]
    width = max(1, int(counts.max())) if rows.size(0) else 1
    by_expert = torch.sort(local, stable=True).indices                 # arrival order kept
    start = counts.cumsum(dim=0) - counts                              # first row of each
    rank = torch.arange(local.numel(), device=local.device) - start.index_select(
        0, local.index_select(0, by_expert))
    queue = torch.empty_like(local).scatter(0, by_expert, rank)        # [R]
    slot = local * width + queue
    buffer = rows.new_zeros(experts_n * width, rows.size(1)).index_copy(0, slot, rows)
    out = experts(buffer.view(experts_n, width, rows.size(1)))   # hooks: expert ZeRO's gathers
    return out.reshape(experts_n * width, -1).index_select(0, slot)


def _on_local(experts: nn.Module, dtype: torch.dtype | None = None, **attrs: Any) -> nn.Module:
    """A shallow copy of ``experts`` holding this rank's local tensors of its parameters (its
    ``E/ep`` experts; after expert ZeRO's all-gather, the gathered ones) and ``attrs``, whose
    class forward computes on them (the copy has no hooks and no forward override)."""
    shadow = object.__new__(type(experts))   # not copy.copy: an FSDP2 module's __new__ inits
    shadow.__dict__.update(experts.__dict__)
    shadow.__dict__.pop("forward", None)
    shadow.__dict__["_parameters"] = _local_weights(experts, dtype)
    shadow.__dict__.update(attrs)
    return shadow


def _batched_local(experts: nn.Module, buffer: torch.Tensor) -> torch.Tensor:
    """The forward of :class:`MoELayer`'s batched experts under expert parallelism: the
    class's own forward on this rank's ``E/ep`` experts (``buffer [E/ep, C', h]``)."""
    return type(experts).forward(_on_local(experts, buffer.dtype), buffer)


def _ep_forward(layer: Any, exchange: _Exchange, x: torch.Tensor) -> torch.Tensor:
    """The layer's forward (its step methods) with global routing and sharded experts
    (module docstring): the kept assignments' rows go to their experts' ranks, and the
    layer's ``combine`` reads their outputs from a ``[S_kept, 1, h]`` buffer (slot ``a`` for
    the ``a``-th kept assignment, the spare slot ``S_kept`` for the dropped ones)."""
    tokens = x.reshape(-1, x.size(-1))                                  # [T, h]
    count = tokens.size(0)
    probs, choice, gate = layer.route(tokens)
    everyone = exchange.gather(choice)                                 # [dp·T, k]
    total = everyone.size(0)
    mine: slice | torch.Tensor = slice(exchange.dp_rank * count, (exchange.dp_rank + 1) * count)
    order = exchange.global_order(x)   # cp > 1: the gathered rows into one-process order
    if order is not None:
        everyone = torch.empty_like(everyone).index_copy_(0, order, everyone)
        mine = order[mine]
    capacity = layer.capacity(total)
    slot, kept = layer.slots(everyone, capacity)                       # [k·dp·T]
    slot = slot.view(-1, total)[:, mine].reshape(-1)                   # [k·T], choice-major
    kept = kept.view(-1, total)[:, mine].reshape(-1)
    picked = kept.nonzero().squeeze(1)                                 # [S_kept]
    rows = tokens.index_select(0, picked % count)
    expert = torch.div(slot.index_select(0, picked), capacity, rounding_mode="floor")
    experts_n = int(layer.experts_n)
    local_n = experts_n // exchange.ep
    out = exchange.run_experts(rows, expert, experts_n, functools.partial(
        _batched_compute, layer.experts, local_n))                     # [S_kept, h]
    n = picked.numel()
    compact = torch.full_like(slot, n).index_copy(0, picked, torch.arange(n, device=slot.device))
    y = layer.combine(out.view(n, 1, out.size(-1)), compact, gate, kept)
    result = layer.finish(y, probs, everyone, x)
    if getattr(layer, "last_aux_loss", None) is not None:
        layer.last_aux_loss = exchange.mean_over_dp(layer.last_aux_loss)
    return result


def _routed_forward(experts: nn.Module, exchange: _Exchange, hidden_states: torch.Tensor,
                    top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
    """A routed experts module's forward (Hugging Face ``transformers`` ≥ 5: Mixtral,
    Qwen2-MoE, …) with its experts on their EP ranks: ``y_t = Σ_j w_{t,j} · f_{e_{t,j}}(x_t)``
    over the ``k`` choices, no capacity (nothing dropped). Each of the ``T·k`` assignments'
    row ``x_t`` goes to the rank holding ``e_{t,j}``, which runs the module's own forward
    (its experts implementation: eager, ``grouped_mm``, …) on its ``E/ep`` local experts with
    one choice per row and weight 1 (``f_e(x)`` exactly); the rows come back and are weighted
    and summed over the choices here, so the routing weights' gradient stays local."""
    tokens, k = hidden_states.size(0), top_k_index.size(-1)
    experts_n = int(experts.num_experts)
    rows = hidden_states.repeat_interleave(k, dim=0)                   # [T·k, h]
    out = exchange.run_experts(rows, top_k_index.reshape(-1), experts_n, functools.partial(
        _local_experts, experts, experts_n // exchange.ep))
    weights = top_k_weights.reshape(tokens, k, 1).to(out.dtype)
    return (out.view(tokens, k, -1) * weights).sum(dim=1).to(hidden_states.dtype)


def _local_experts(experts: nn.Module, local_n: int, rows: torch.Tensor,
                   local: torch.Tensor) -> torch.Tensor:
    """The class's own forward on a shallow copy of ``experts`` holding this rank's
    ``local_n`` experts (their local tensors; ``num_experts = local_n``), each row with one
    choice ``local[r]`` of weight 1."""
    shadow = _on_local(experts, num_experts=local_n)
    ones = torch.ones(rows.size(0), 1, dtype=rows.dtype, device=rows.device)
    out = type(experts).forward(shadow, rows, local.unsqueeze(1), ones)
    if rows.size(0) == 0:   # no row here: still a (zero) gradient for each weight, so the
        # expert-data-parallel reduction (ExpertGradSync, expert ZeRO's reduce-scatter) that
        # every rank of the group joins finds one on each (an eager loop touches no weight)
        out = out + sum(w.sum() for w in shadow.__dict__["_parameters"].values()) * 0
    return out


class ExpertGradSync:
    """After the backward: each expert gradient summed over its expert-data-parallel group
    and divided by ``dp`` (module docstring: the one-process gradient); with ``tp > 1`` also
    summed over the tp ranks, each of whose copies saw one chunk of the routed rows
    (:mod:`fxplan.runtime.styles.expert_tp`)."""

    def __init__(self, params: Sequence[nn.Parameter], ep_mesh: "DeviceMesh", dp: int) -> None:
        self.params, self.dp = list(params), dp
        self.groups = [ep_mesh[axis].get_group() for axis in ("edp", "tp")
                       if ep_mesh[axis].size() > 1]

    def __call__(self) -> None:
        from torch.distributed.tensor import DTensor

        for param in self.params:
            if param.grad is None:   # no row reached this rank's experts: a zero gradient
                param.grad = torch.zeros_like(param)
            grad = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
            for group in self.groups:
                dist.all_reduce(grad, group=group)
            grad.div_(self.dp)
