"""Pool jobs for checkpoints with optimizer state: train under plan A, save, load under plan B
(built on meta, filled from the checkpoint alone), keep training, compare with one process."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from fxplan.runtime.apply.graph import apply_plan
from fxplan.runtime.checkpoint.optim_state import full_optimizer_state, local_optimizer
from rt_cases import OPTIMIZERS, reference, relative_error, train_steps
from rt_plans import build_model, fixed_batch, make_plan



def _differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Keys whose values are not exactly equal (tensors bit for bit)."""
    if sorted(a) != sorted(b):
        return sorted(set(a) ^ set(b))
    return [k for k in a if (not torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor)
                             else a[k] != b[k])]


def optimizer_state_reshards(save_plan: dict[str, Any], load_plan: dict[str, Any], path: str,
                             optimizer: str = "momentum", before: int = 2, after: int = 1
                             ) -> dict[str, Any] | None:
    """``before`` steps under ``save_plan``, save (parameters + optimizer state); load under
    ``load_plan`` into a meta-built model, ``after`` more steps; rank 0 reports the exactness of
    the loaded state and the error against ``before + after`` uninterrupted steps in one process."""
    optimizer_class, kwargs = OPTIMIZERS[optimizer]
    plan_a, plan_b = make_plan(**save_plan), make_plan(**load_plan)
    assert plan_a.batch == plan_b.batch, "both plans must train on the same global batch"
    layers = save_plan.get("layers", 2)
    batch = fixed_batch(plan_a)
    sharded = apply_plan(build_model(layers), plan_a, batch[0])
    saved: dict[str, Any] = {}
    kinds = []
    if sharded is not None:
        opt = sharded.optimizer(optimizer_class, **kwargs)
        kinds.append(type(local_optimizer(opt)).__name__)
        losses = train_steps(sharded, opt, batch, before)
        sharded.save(path, opt)
        saved = dict(params=sharded.full_parameters(), optim=full_optimizer_state(sharded, opt))
    dist.barrier()
    loaded = apply_plan(build_model(layers, meta=True), plan_b, batch[0], checkpoint=path)
    if loaded is None:
        return None
    opt = loaded.optimizer(optimizer_class, **kwargs)
    kinds.append(type(local_optimizer(opt)).__name__)
    loaded.load(path, opt)
    params, state = loaded.full_parameters(), full_optimizer_state(loaded, opt)
    losses += train_steps(loaded, opt, batch, after)
    final = loaded.full_parameters()
    if not saved:
        return None
    ref_losses, ref_params = reference(plan_a, layers, before + after, optimizer)
    return dict(
        param_diffs=_differences(params, saved["params"]),
        optim_diffs=_differences(state, saved["optim"]),
        optim_keys=len(state), optim_keys_list=sorted(state), losses=losses, ref_losses=ref_losses,
        optimizers=kinds,   # this rank's local optimizer class, saving then loading
        loss_error=max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses)),
        param_error=max(relative_error(final[k], ref_params[k]) for k in ref_params),
    )
