"""Rank-pool jobs for expert parallelism: moe-tiny trained under an ``ep > 1`` plan against one
process (same dropped tokens, auxiliary loss, losses and parameters), and its sharded
checkpoint loaded into the unsharded model."""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.distributed as dist

from fxplan.core.config import ParallelConfig
from fxplan.core.placements import PlacementMap, parse_placements
from fxplan.core.plan import Plan, StageAssignment
from fxplan.examples.models.lm import lm_loss
from fxplan.runtime.apply.graph import apply_plan
from fxplan.runtime.train.optim import global_grad_norm
from torch.distributed.tensor import DTensor
from rt_cases import LR, relative_error
from rt_plans import param_placements

SEQ, VOCAB = 16, 512
#: SGD with momentum: the optimizer has a state (a buffer per parameter) whose layout is checked
MOMENTUM = 0.9
#: capacity factor 0.5: every expert has room for half its fair share, so tokens are dropped
MODEL = f"moe-tiny:dropout=0,seq={SEQ},capacity_factor=0.5"


def build_moe(seed: int = 0, meta: bool = False, attention: str = "math") -> torch.nn.Module:
    """moe-tiny, seeded; ``meta``: parameters on meta (the launch worker's per-stage build);
    ``attention``: written out (``math``) or one ``F.scaled_dot_product_attention`` call."""
    import contextlib

    from fxplan.examples.model_spec import resolve_model
    from fxplan.runtime.apply.build import meta_parameters

    torch.manual_seed(seed)
    with meta_parameters() if meta else contextlib.nullcontext():
        return resolve_model(f"{MODEL},attention={attention}").build("cpu")


def make_ep_plan(*, dp: int, ep: int, zero: int = 0, tp: int = 1, microbatch_size: int = 2,
                 recompute: str = "none", sp: bool = False, cp: int = 1,
                 offload: str = "none") -> Plan:
    """An ``ep > 1`` plan for moe-tiny; ``tp > 1``: attention Megatron-style (QKV
    column-parallel, projection row-parallel, embedding vocabulary-parallel), experts whole
    (:mod:`fxplan.runtime.styles.expert_tp`); ``sp``: sequence parallelism; ``cp``: context
    parallelism too (the ``dp/cp`` replicas read ``dp/cp · mb`` samples); ``offload``: the
    plan's offload."""
    config = ParallelConfig(dp=dp, tp=tp, ep=ep, cp=cp, microbatch_size=microbatch_size,
                            num_microbatches=1, zero_stage=zero, recompute=recompute,
                            sequence_parallel=sp, offload=offload)
    params = ({name: parse_placements(text) for name, text in
               param_placements(build_moe(meta=True), tp).items()} if tp > 1 else {})
    return Plan(model=MODEL, cluster="local-cpu", graph_fingerprint="test",
                cluster_fingerprint="test", batch=dp // cp * microbatch_size, seq=SEQ,
                config=config,
                stages=(StageAssignment(0, (0, 2), has_embedding=True, has_head=True),),
                placements=PlacementMap(nodes={}, params=params))


def _batch(plan: Plan) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (plan.batch, SEQ + 1), generator=generator)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def _moe_layers(model: torch.nn.Module) -> list[Any]:
    return [m for m in model.modules() if hasattr(m, "last_aux_loss")]


def _reference(plan: Plan, steps: int, attention: str = "math") -> dict[str, Any]:
    """One process: losses, auxiliary losses and gradient norm of the first step, dropped
    assignments, params."""
    model = build_moe(attention=attention)
    tokens, targets = _batch(plan)
    layer = _moe_layers(model)[0]
    slots = layer.slots
    dropped: list[int] = []
    layer.slots = lambda c, cap: _count(slots(c, cap), dropped)  # type: ignore[method-assign]
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    losses, aux = [], []
    for step in range(steps):
        loss = lm_loss(model(tokens), targets)
        if step == 0:
            aux = [float(m.last_aux_loss) for m in _moe_layers(model)]
        loss.backward()
        if step == 0:
            norm = float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]))
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    return dict(losses=losses, aux=aux, dropped=dropped[0], params=params, norm=norm)


def _count(result: tuple[torch.Tensor, torch.Tensor], into: list[int]
           ) -> tuple[torch.Tensor, torch.Tensor]:
    into.append(int((~result[1]).sum()))
    return result


def train_ep_matches_reference(plan_kwargs: dict[str, Any], steps: int = 3,
                               checkpoint: str | None = None, meta: bool = False,
                               attention: str = "math") -> dict[str, Any] | None:
    """Train ``steps`` SGD steps of moe-tiny under an ``ep > 1`` plan; rank 0 reports the
    errors against one process. ``checkpoint``: also save sharded there and load it into the
    unsharded model (rank 0, no process group). ``meta``: the model built on meta, each rank
    materialising its part from the seeded builder (as ``fxplan launch``'s worker does).
    ``attention``: moe-tiny's (:func:`build_moe`)."""
    plan = make_ep_plan(**plan_kwargs)
    tokens, targets = _batch(plan)
    init = functools.partial(build_moe, attention=attention) if meta else None
    sharded = apply_plan(build_moe(meta=meta, attention=attention), plan, tokens,
                         ranks=list(range(plan.world_size)), init=init)
    if sharded is None:
        return None
    experts = {k: p for k, p in sharded.named_parameters().items()
               if isinstance(p, DTensor) and "ep" in (p.device_mesh.mesh_dim_names or ())}
    optimizer = sharded.optimizer(torch.optim.SGD, lr=LR, momentum=MOMENTUM)
    losses, aux = [], []
    for step in range(steps):
        losses.append(float(sharded.train_step((tokens, targets), lm_loss)))
        if step == 0:
            aux = [float(m.last_aux_loss) for s in sharded.stages for m in _moe_layers(s.inner)]
            norm = float(global_grad_norm(sharded))   # the experts' shards counted once each
        optimizer.step()
        optimizer.zero_grad()
    params = sharded.full_parameters()
    loaded_error = None
    if checkpoint is not None:
        sharded.save(checkpoint)
        dist.barrier(group=sharded.group)
        if dist.get_rank() == 0:
            loaded_error = _load_unsharded(checkpoint, params)
    if dist.get_rank() != 0:
        return None
    ref = _reference(plan, steps, attention)
    errors = {k: relative_error(params[k], ref["params"][k]) for k in ref["params"]}
    worst = max(errors, key=errors.get)
    return dict(
        losses=losses, ref_losses=ref["losses"], path=sharded.path,
        loss_error=max(abs(a - b) / abs(b) for a, b in zip(losses, ref["losses"])),
        param_error=errors[worst], worst=worst,
        aux_error=max(abs(a - b) / abs(b) for a, b in zip(aux, ref["aux"])),
        aux=aux, dropped=ref["dropped"], norm_error=abs(norm - ref["norm"]) / ref["norm"], missing=sorted(set(ref["params"]) - set(params)),
        expert_shapes={k: tuple(p.to_local().shape) for k, p in experts.items()},
        expert_global={k: tuple(p.shape) for k, p in experts.items()},
        tp_split=tp_split_names(sharded),
        expert_state={k: tuple(optimizer.state[p]["momentum_buffer"].to_local().shape)
                      for k, p in experts.items()},
        fallbacks=sharded.fallbacks, loaded_error=loaded_error)


def tp_split_names(sharded: Any) -> list[str]:
    """The parameters of ``sharded`` that are split over its ``tp`` mesh axis."""
    return sorted(k for k, p in sharded.named_parameters().items()
                  if isinstance(p, DTensor) and "tp" in (p.device_mesh.mesh_dim_names or ())
                  and p.to_local().shape != p.shape)


def _load_unsharded(path: str, saved: dict[str, torch.Tensor]) -> float:
    """Load the sharded checkpoint into a fresh unsharded moe-tiny with other initial weights
    (DCP without a process group); the largest relative error against ``saved``."""
    import torch.distributed.checkpoint as dcp

    model = build_moe(seed=7)
    state = {"model": {k: v.detach() for k, v in model.named_parameters()}}
    dcp.load(state, checkpoint_id=path, no_dist=True)
    loaded = dict(model.named_parameters())
    return max(relative_error(loaded[k].detach(), saved[k]) for k in saved)
