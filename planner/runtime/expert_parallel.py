"""Expert parallelism at run time: experts sharded over the EP group, tokens by all-to-all.

**Layout** (:mod:`fxplan.cost_model.expert_parallel`; ``ep | dp``). The plan's ``pp × dp × tp``
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
dropped. Each rank fills its own kept assignments into a ``[E, C, h]`` buffer at their global
slots (the others' slots stay zero).

**Dispatch and combine** (``all_to_all_single_autograd`` of
``torch.distributed._functional_collectives``: gloo and NCCL, out of place). Dispatch: the
buffer's ``ep`` expert chunks ``[E/ep, C, h]`` go to the EP ranks holding them; the owner
sums the ``ep`` chunks it receives (their kept slots are disjoint, so the sum is the
one-process expert input restricted to the EP group's tokens), runs
its ``E/ep`` experts, and combine sends the output chunk back to every EP rank, each of which
reassembles ``[E, C, h]`` and gathers its own slots. The backward runs the two all-to-alls in
reverse (the expand's gradient sums what each member returns for its own slots).

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
experts over the others); the expert weights are ignored by both wrappers and held whole
(``E/ep`` experts) with their gradients and optimizer state on each of the ``dp/ep``
expert-data-parallel ranks — a fallback line for ZeRO ≥ 1 (the plan priced them sharded over
``dp/ep``). Selective recompute of a block holding an expert-parallel layer runs as full
recompute (:func:`recompute_policies`, a fallback line).

**Which layers.** A module takes part when it has a child ``experts`` whose parameters are all
3-D with the same leading ``E`` (divisible by ``ep``) and the step methods ``route``,
``capacity``, ``slots``, ``dispatch``, ``combine`` and ``finish`` of
``fxplan.examples.models.moe.MoELayer`` (whose forward is their composition). A model with
expert weights but no such layer (Hugging Face Mixtral/Qwen-MoE) is refused, as are ``tp > 1``
and the graph-rewrite path; the plan is still priced and exported.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Sequence

import torch
import torch.distributed as dist
from torch import nn

from fxplan.runtime.offload import RuntimeSupportError

if TYPE_CHECKING:  # pragma: no cover
    from torch.distributed.device_mesh import DeviceMesh

    from fxplan.core.plan import Plan

__all__ = ["check_expert_parallel", "expert_mesh", "shard_experts", "expert_params",
           "ExpertGradSync", "recompute_policies",
           "experts_fallback", "STEPS"]

#: The step methods an expert-parallel layer exposes (module docstring).
STEPS = ("route", "capacity", "slots", "dispatch", "combine", "finish")


def check_expert_parallel(plan: "Plan") -> None:
    """Raise :class:`RuntimeSupportError` for an ``ep > 1`` plan this runtime cannot run
    (``tp > 1``), before any process starts."""
    ep = plan.config.ep
    if ep > 1 and plan.tp > 1:
        raise RuntimeSupportError(
            f"ep={ep} with tp={plan.tp}: fxplan's runtime runs expert parallelism without "
            f"tensor parallelism only (the plan is priced, and exported by `fxplan export PLAN "
            f"--to megatron|torchtitan|deepspeed`); re-plan with --constrain tp=1 (or ep=1) "
            f"to train it here")


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


def _expert_layers(module: nn.Module, ep: int) -> list[nn.Module]:
    """The modules of ``module`` that take part (module docstring)."""
    found = []
    for layer in module.modules():
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


def shard_experts(module: nn.Module, plan: "Plan", mesh: "DeviceMesh", ep_mesh: "DeviceMesh"
                  ) -> None:
    """Shard the expert weights of ``module``'s expert-parallel layers over ``ep`` and route
    their forward through :func:`_ep_forward`, in place. Parameters on ``meta`` stay there
    (materialised later, like tp DTensors); :func:`expert_params` lists them afterwards."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    ep = plan.config.ep
    layers = _expert_layers(module, ep)
    if not layers and any(p.dim() == 3 for p in module.parameters()):
        raise RuntimeSupportError(
            f"ep={ep}: the model's expert weights are not in a layer fxplan's runtime can "
            f"split (one with an `experts` child and the step methods {', '.join(STEPS)}, "
            "as fxplan.examples.models.moe.MoELayer); re-plan with --constrain ep=1")
    sub = ep_mesh["edp", "ep"]
    exchange = _Exchange(mesh["dp"], ep_mesh["ep"], plan.dp)
    for layer in layers:
        for name, param in list(layer.experts.named_parameters(recurse=False)):
            local = distribute_tensor(param.detach(), sub, [Replicate(), Shard(0)],
                                      src_data_rank=None)
            setattr(layer.experts, name, nn.Parameter(local, requires_grad=param.requires_grad))
        layer.forward = functools.partial(  # type: ignore[method-assign]
            _ep_forward, layer, exchange)


def expert_params(module: nn.Module) -> list[nn.Parameter]:
    """The expert weights :func:`shard_experts` sharded in ``module``, in module order (the
    same on every rank: :class:`ExpertGradSync` reduces their gradients in that order)."""
    out: list[nn.Parameter] = []
    for layer in module.modules():
        forward = layer.__dict__.get("forward")
        if isinstance(forward, functools.partial) and forward.func is _ep_forward:
            out.extend(layer.experts.parameters(recurse=False))
    return out


class _Exchange:
    """The collectives of an expert-parallel layer: the choices' all-gather over ``dp``, the
    dispatch and combine all-to-alls over ``ep``, the auxiliary loss's average over ``dp``."""

    def __init__(self, dp_mesh: "DeviceMesh", ep_mesh: "DeviceMesh", dp: int) -> None:
        self.dp, self.dp_group, self.dp_rank = dp, dp_mesh.get_group(), dp_mesh.get_local_rank()
        self.ep, self.ep_group = ep_mesh.size(), ep_mesh.get_group()

    def gather(self, choice: torch.Tensor) -> torch.Tensor:
        """Every replica's ``[T, k]`` choices, in replica order: ``[dp·T, k]``."""
        from torch.distributed._functional_collectives import all_gather_tensor

        return _wait(all_gather_tensor(choice.contiguous(), 0, self.dp_group))

    def run_experts(self, experts: nn.Module, buffer: torch.Tensor) -> torch.Tensor:
        """``[E, C, h]`` (this rank's slots filled) → the experts' output ``[E, C, h]`` for
        them: dispatch all-to-all, this rank's ``E/ep`` experts, combine all-to-all."""
        from torch.distributed._functional_collectives import all_to_all_single_autograd
        from torch.distributed.tensor import DTensor

        ep, rows = self.ep, buffer.shape[1:]
        send = buffer.reshape(ep, -1)
        received = _wait(all_to_all_single_autograd(send, None, None, self.ep_group))
        local_in = received.view(ep, buffer.size(0) // ep, *rows).sum(dim=0)
        weights = {n: (p.to_local() if isinstance(p, DTensor) else p).to(buffer.dtype)
                   for n, p in experts.named_parameters()}
        out = torch.func.functional_call(experts, weights, (local_in,))
        back = out.reshape(1, -1).expand(ep, -1).contiguous()
        returned = _wait(all_to_all_single_autograd(back, None, None, self.ep_group))
        return returned.view(buffer.size(0), *out.shape[1:])

    def mean_over_dp(self, value: torch.Tensor) -> torch.Tensor:
        out = value.detach().clone()
        dist.all_reduce(out, group=self.dp_group)
        return out / self.dp


def _wait(tensor: torch.Tensor) -> torch.Tensor:
    """The value of a functional collective's result (waits for it)."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    return tensor.wait() if isinstance(tensor, AsyncCollectiveTensor) else tensor


def _ep_forward(layer: Any, exchange: _Exchange, x: torch.Tensor) -> torch.Tensor:
    """The layer's forward (its step methods) with global routing and sharded experts
    (module docstring)."""
    tokens = x.reshape(-1, x.size(-1))                                  # [T, h]
    count = tokens.size(0)
    probs, choice, gate = layer.route(tokens)
    everyone = exchange.gather(choice)                                 # [dp·T, k]
    total = everyone.size(0)
    capacity = layer.capacity(total)
    slot, kept = layer.slots(everyone, capacity)                       # [k·dp·T]
    mine = slice(exchange.dp_rank * count, (exchange.dp_rank + 1) * count)
    slot = slot.view(-1, total)[:, mine].reshape(-1)
    kept = kept.view(-1, total)[:, mine].reshape(-1)
    expert_out = exchange.run_experts(layer.experts, layer.dispatch(tokens, slot, capacity))
    y = layer.combine(expert_out, slot, gate, kept)
    out = layer.finish(y, probs, everyone, x)
    if getattr(layer, "last_aux_loss", None) is not None:
        layer.last_aux_loss = exchange.mean_over_dp(layer.last_aux_loss)
    return out


class ExpertGradSync:
    """After the backward: each expert gradient summed over its expert-data-parallel group
    and divided by ``dp`` (module docstring: the one-process gradient)."""

    def __init__(self, params: Sequence[nn.Parameter], ep_mesh: "DeviceMesh", dp: int) -> None:
        self.params, self.dp = list(params), dp
        self.group = ep_mesh["edp"].get_group() if ep_mesh["edp"].size() > 1 else None

    def __call__(self) -> None:
        from torch.distributed.tensor import DTensor

        for param in self.params:
            if param.grad is None:
                continue
            grad = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
            if self.group is not None:
                dist.all_reduce(grad, group=self.group)
            grad.div_(self.dp)


def recompute_policies(blocks: Sequence[nn.Module], policies: Sequence[str],
                       fallbacks: list[str]) -> list[str]:
    """``policies`` with ``selective`` run as ``full`` for the blocks that hold an
    expert-parallel layer (a fallback, logged and listed): the selective checkpoint's replay of
    its kept results does not cover the experts' DTensor weights (their recompute sees other
    tensors), and full recompute re-runs the block as it ran, collectives included."""
    from fxplan.passes.rewrite.base import logger

    out = list(policies)
    for i, block in enumerate(blocks):
        if out[i] == "selective" and expert_params(block):
            out[i] = "full"
            line = ("[expert-parallel] selective recompute of a block with an expert-parallel "
                    "layer runs as full recompute (same values; more recompute time, less "
                    "memory than planned)")
            if line not in fallbacks:
                logger.warning("fxplan runtime fallback: %s", line)
                fallbacks.append(line)
    return out


def experts_fallback(plan: "Plan") -> str | None:
    """The fallback line for ZeRO ≥ 1 with ``ep > 1`` (experts not ZeRO-sharded), else None."""
    ep = plan.config.ep
    if ep == 1 or plan.zero_stage == 0 or plan.dp == 1:
        return None
    return (f"[expert-parallel] ZeRO-{plan.zero_stage} with ep={ep}: the expert weights, "
            f"their gradients and optimizer state are held whole ({'E'}/{ep} experts per rank) "
            f"on each of the {plan.dp // ep} expert-data-parallel ranks, not sharded over them "
            "as planned; the other parameters follow the plan's ZeRO over dp")
