"""Jobs the rank pool runs: train a plan for a few SGD steps and compare with one process."""

from __future__ import annotations

from typing import Any

import torch

from fxplan.examples.models.lm import lm_loss
from fxplan.core.plan import Plan
from fxplan.runtime.apply.graph import apply_plan, staged_program
from fxplan.runtime.train.pipeline import local_stage_indices
from torch.distributed.tensor import DTensor
from rt_plans import build_model, fixed_batch, make_plan

LR = 0.1
OPTIMIZERS: dict[str, tuple[type[torch.optim.Optimizer], dict[str, Any]]] = {
    "sgd": (torch.optim.SGD, dict(lr=LR)),
    "momentum": (torch.optim.SGD, dict(lr=LR, momentum=0.9)),
    "adam": (torch.optim.Adam, dict(lr=1e-3)),
}



def train_steps(sharded: Any, optimizer: torch.optim.Optimizer, batch: Any, steps: int,
                loss_fn: Any = lm_loss) -> list[float]:
    """``steps`` training steps of ``sharded`` on the same ``batch``; the loss of each."""
    losses = []
    for _ in range(steps):
        losses.append(float(sharded.train_step(batch, loss_fn)))
        optimizer.step()
        optimizer.zero_grad()
    return losses

def _plan(plan_kwargs: dict[str, Any] | None, plan_json: str | None) -> Plan:
    return Plan.from_json(plan_json) if plan_json else make_plan(**(plan_kwargs or {}))


def reference(plan: Plan, layers: int, steps: int, optimizer: str = "sgd"
              ) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Losses and parameters of one process after ``steps`` steps of ``optimizer``."""
    model = build_model(layers)
    tokens, targets = fixed_batch(plan)
    optimizer_class, kwargs = OPTIMIZERS[optimizer]
    optimizer = optimizer_class(model.parameters(), **kwargs)
    losses = []
    for _ in range(steps):
        loss = lm_loss(model(tokens), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, {k: v.detach().clone() for k, v in model.named_parameters()}


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def local_bytes(sharded: Any) -> int:
    """Bytes of the parameter storage this rank holds (its shards of DTensors)."""
    locals_ = [p.to_local() if isinstance(p, DTensor) else p for p in sharded.parameters()]
    return sum(t.numel() * t.element_size() for t in locals_)


def stage_bytes(plan: Plan, layers: int, tokens: torch.Tensor, pp_rank: int) -> int:
    """Bytes of the parameters of the stages pipeline rank ``pp_rank`` runs (one process)."""
    program = staged_program(build_model(layers), plan, tokens)
    params = {id(p): p for k in local_stage_indices(plan, pp_rank)
              for p in program.stage(k).parameters()}
    return sum(p.numel() * p.element_size() for p in params.values())


def train_matches_reference(plan_kwargs: dict[str, Any] | None = None, plan_json: str | None = None,
                            steps: int = 3, ranks: list[int] | None = None, meta: bool = False,
                            path: str = "auto") -> dict[str, Any] | None:
    """Train ``steps`` SGD steps under the plan (hand-made from ``plan_kwargs`` or a JSON plan);
    errors against one process (rank 0 reports). ``meta``: build the model on meta, each rank
    materialising its stages from the reference builder; also reports parameter bytes.
    ``path``: :func:`~fxplan.runtime.apply.graph.apply_plan`'s."""
    plan = _plan(plan_kwargs, plan_json)
    layers = (plan_kwargs or {}).get("layers", 2)
    model = build_model(layers, meta=meta)
    batch = fixed_batch(plan)
    init = (lambda: build_model(layers)) if meta else None
    sharded = apply_plan(model, plan, batch[0], ranks=ranks, debug=True, init=init,
                         path=path)
    if sharded is None:
        return None
    held = local_bytes(sharded)
    losses = train_steps(sharded, sharded.optimizer(torch.optim.SGD, lr=LR), batch, steps)
    params = sharded.full_parameters()
    ref_losses, ref_params = reference(plan, layers, steps)
    param_errors = {k: relative_error(params[k], ref_params[k]) for k in ref_params}
    worst = max(param_errors, key=param_errors.get)
    return dict(
        losses=losses, ref_losses=ref_losses, local_bytes=held,
        stage_bytes=stage_bytes(plan, layers, batch[0], sharded.coordinate["pp"]),
        total_bytes=sum(p.numel() * p.element_size() for p in build_model(layers).parameters()),
        loss_error=max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses)),
        param_error=param_errors[worst], worst=worst,
        missing=sorted(set(ref_params) - set(params)), fallbacks=sharded.fallbacks,
        path=sharded.path,
    )


def checkpoint_reshards(save_plan: dict[str, Any], load_plan: dict[str, Any], path: str
                        ) -> dict[str, Any] | None:
    """Train one step under ``save_plan``, save; load under ``load_plan`` into a model with other
    initial weights; report the largest parameter difference (rank 0)."""
    import torch.distributed as dist

    plan = make_plan(**save_plan)
    batch = fixed_batch(plan)
    sharded = apply_plan(build_model(save_plan.get("layers", 2)), plan, batch[0])
    saved = None
    if sharded is not None:
        optimizer = sharded.optimizer(torch.optim.SGD, lr=LR)
        sharded.train_step(batch, lm_loss)
        optimizer.step()
        sharded.save(path)
        saved = sharded.full_parameters()
    dist.barrier()
    other = make_plan(**load_plan)
    loaded = apply_plan(build_model(load_plan.get("layers", 2), seed=7), other, batch[0])
    if loaded is None:
        return None
    before = loaded.full_parameters()
    loaded.load(path)
    after = loaded.full_parameters()
    if saved is None:
        return None
    return dict(
        error=max(relative_error(after[k], saved[k]) for k in saved),
        changed=max(relative_error(before[k], saved[k]) for k in saved),
        keys_match=sorted(after) == sorted(saved),
    )


def tp_passes_alone() -> dict[str, Any] | None:
    """distribute-parameters + insert-reshards on a 2-rank tp mesh, nothing else: same logits."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.experimental import implicit_replication

    from fxplan.passes.rewrite.base import PassManager
    from fxplan.passes.rewrite.distribute import DistributeParameters
    from fxplan.passes.rewrite.reshard import InsertReshards
    from fxplan.passes.tracer import trace_model

    mesh = DeviceMesh("cpu", torch.tensor([0, 1]), mesh_dim_names=("tp",))
    if mesh.get_coordinate() is None:
        return None
    plan = make_plan(tp=2, sp=True)
    model = build_model(2)
    names = {id(p): n for n, p in model.named_parameters(remove_duplicate=False)}
    tokens, _ = fixed_batch(plan)
    expected = build_model(2)(tokens)
    reshards = InsertReshards(mesh, debug=True)
    gm = PassManager([DistributeParameters(mesh, names), reshards]).run(
        trace_model(model, 1), plan).module
    with implicit_replication():
        logits = gm(tokens)
    qkv = dict(gm.named_parameters())["h.0.attn.qkv.weight"]
    return dict(
        error=relative_error(logits, expected.detach()),
        plain_output=not isinstance(logits, DTensor),
        qkv_sharded=isinstance(qkv, DTensor) and qkv.placements == (Shard(0),),
        reshards=len(reshards.inserted),
    )


def api_applies_plan(path: str = "auto") -> dict[str, Any] | None:
    """``fxplan.plan(..., plan=…, path=…)`` under an initialised process group, on ranks 0
    and 1."""
    from fxplan.api import plan as plan_api

    plan = make_plan(dp=2, zero=2)
    tokens, targets = fixed_batch(plan)
    result = plan_api(build_model(2), "local-cpu:devices=2", inputs=(tokens,),
                      batch=plan.batch, plan=plan, ranks=[0, 1], path=path)
    if result.module is None:
        assert result.status == "not-a-member", result
        return None
    assert result.status == "applied"
    sharded = result.module
    loss = sharded.train_step((tokens, targets), lm_loss)
    return dict(type=type(sharded).__name__, plan=sharded.plan.summary, loss=float(loss),
                path=sharded.path)


def unknown_node_is_a_fallback() -> dict[str, Any]:
    """A tp=2 plan naming a node the program lacks: the fallback is logged, listed by the
    ShardedModule, and printed once by the launch worker's rank 0 (gathered over all ranks)."""
    import contextlib
    import dataclasses
    import io
    import logging
    from types import SimpleNamespace

    from fxplan.core.placements import Replicate, Shard
    from fxplan.rank.steps import print_fallbacks

    plan = make_plan(tp=2)
    placements = plan.placements
    plan = dataclasses.replace(plan, placements=dataclasses.replace(
        placements, nodes={**placements.nodes, "no_such_node": (Shard(0), Replicate())}))
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("fxplan.runtime")
    logger.addHandler(handler)
    try:
        # the graph rewrite's pass (the zoo GPT's tp plans run at module level by default)
        sharded = apply_plan(build_model(2), plan, fixed_batch(plan)[0], ranks=[0, 1],
                             path="graph")
    finally:
        logger.removeHandler(handler)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        import torch.distributed as dist

        print_fallbacks(sharded or SimpleNamespace(fallbacks=[]), dist.get_rank(), [])
    if sharded is None:
        return dict(printed=printed.getvalue())
    return dict(fallbacks=sharded.fallbacks, logged=records, printed=printed.getvalue())
