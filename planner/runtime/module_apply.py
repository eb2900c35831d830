"""Apply a plan to the user's own module, with the pieces PyTorch has (the module-level path).

    model ─probe (fake tensors)─► blocks, pre/post modules, call signatures
        per local stage k:  cut at block boundaries (module_stages; pp > 1)
                            → parallelize_module with styles from the planned placements (tp)
                            → materialize (meta models) → checkpoint per block as planned
                              (full, or selective: the attention core; module_recompute)
                            → output hook (a tensor: ``.logits`` of an HF output)
                            → DDP / replicate / fully_shard per block + root (dp, ZeRO)
                            → PipelineStage + the plan's schedule (ShardedModule)

Parameter names and ``state_dict`` keys stay the user's (``model.layers.0.self_attn.q_proj.weight``;
DTensor-valued where sharded), so a checkpoint of the unsharded model loads into the stage and
``torch.distributed.checkpoint.state_dict.get_model_state_dict`` of a stage is the unsharded
model's keys.

:func:`module_level_plan` decides, on every process alike and before any process group is
created, whether the plan can run this way; if not it raises :class:`NotExpressible` with the
reason and :func:`fxplan.runtime.apply.apply_plan` falls back to the graph rewrite. Refused:
no repeated blocks in the module hierarchy or a different count than the plan's, tied weights
split by tp or pp, placements without a
style (:mod:`fxplan.runtime.tp_styles`), a forward that fails with the tensor-parallel local
shapes (a head count fixed in the code, a fused QKV split by size), a pipeline cut the model
does not allow (:mod:`fxplan.runtime.module_stages`), sequence parallelism across pipeline
stages (the stages would exchange DTensors), and a cut whose chain of stages does not compute
the model (checked on one microbatch when the model holds values).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import torch
from torch import nn

from fxplan.runtime.build import materialize
from fxplan.runtime.data_parallel import apply_data_parallel
from fxplan.runtime.module_probe import ModuleProbe, model_output, probe_module
from fxplan.runtime.module_recompute import apply_recompute
from fxplan.runtime.module_stages import check_splittable, stage_module
from fxplan.runtime.tp_styles import NotExpressible, tp_styles

if TYPE_CHECKING:  # pragma: no cover
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel.style import ParallelStyle

    from fxplan.core.plan import Plan
    from fxplan.passes.rewrite.stages import StageIO
    from fxplan.runtime.precision import Precision
    from fxplan.runtime.sharded_module import LocalStage

__all__ = ["ModuleLevel", "module_level_plan", "build_module_stages"]

#: Relative error allowed between the chain of stages and the whole model (one microbatch).
SPLIT_TOLERANCE = 1e-4


def _output_tensor(module: nn.Module, args: Any, out: Any) -> torch.Tensor:
    """Forward hook: the stage returns its output tensor (``.logits`` of an HF model output),
    as ``PipelineStage`` needs; registered before DDP/FSDP so that they see the tensor and the
    pipeline sees them (gradient sync once per step, not per microbatch)."""
    return model_output(out)


@dataclass
class ModuleLevel:
    """The decision that the plan runs at module level, and what building it needs."""

    probe: ModuleProbe
    styles: dict[str, "ParallelStyle"]
    stage_io: list["StageIO"]


def _tied(model: nn.Module) -> list[list[str]]:
    names: dict[int, list[str]] = defaultdict(list)
    for fqn, param in model.named_parameters(remove_duplicate=False):
        names[id(param)].append(fqn)
    return [n for n in names.values() if len(n) > 1]


def _local_shapes(model: nn.Module, plan: "Plan", probe: ModuleProbe,
                  styles: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Local shard shapes of the block Linears that tp splits (col: rows ÷ tp, row: cols ÷ tp)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    shapes: dict[str, tuple[int, ...]] = {}
    for name, style in styles.items():
        module = model.get_submodule(name)
        if probe.block_of(name) is None or not isinstance(module, nn.Linear):
            continue
        out_f, in_f = module.weight.shape
        if isinstance(style, ColwiseParallel):
            shapes[f"{name}.weight"] = (out_f // plan.tp, in_f)
            if module.bias is not None:
                shapes[f"{name}.bias"] = (out_f // plan.tp,)
        elif isinstance(style, RowwiseParallel):
            shapes[f"{name}.weight"] = (out_f, in_f // plan.tp)
    return shapes


def _meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype, device="meta")


def _stage_io(plan: "Plan", probe: ModuleProbe, microbatch: Sequence[torch.Tensor]
              ) -> list["StageIO"]:
    from fxplan.passes.rewrite.stages import StageIO

    stages = plan.stages or ()
    if len(stages) <= 1:
        return [StageIO(tuple(_meta(x) for x in microbatch), (probe.output,))]
    io = []
    for k, stage in enumerate(stages):
        first, last = probe.blocks[stage.layers[0]], probe.blocks[stage.layers[1] - 1]
        inputs = tuple(_meta(x) for x in microbatch) if k == 0 else probe.calls[first].inputs
        output = probe.output if k == len(stages) - 1 else probe.calls[last].output
        io.append(StageIO(inputs, (output,)))
    return io


def _check_chain(model: nn.Module, plan: "Plan", probe: ModuleProbe,
                 microbatch: Sequence[torch.Tensor]) -> None:
    """The chain of (unsharded) stages computes the model on one microbatch (eval mode)."""
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            expected = model_output(model(*microbatch))
            out: Any = tuple(microbatch)
            for k in range(len(plan.stages)):
                out = (model_output(stage_module(model, plan, k, probe)(*out)),)
    finally:
        model.train(training)
    error = float((out[0] - expected).abs().max() / expected.abs().max().clamp_min(1e-12))
    if out[0].shape != expected.shape or error > SPLIT_TOLERANCE:
        raise NotExpressible(f"the stages cut at block boundaries do not compute the model "
                             f"(relative error {error:.2e} on one microbatch): its forward does "
                             "more than embed before the first block")


def module_level_plan(model: nn.Module, plan: "Plan",
                      inputs: torch.Tensor | Sequence[torch.Tensor]) -> ModuleLevel:
    """Decide (every process alike, no communication) whether ``plan`` runs on ``model`` at
    module level; :class:`NotExpressible` says why not (module docstring)."""
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    microbatch = tuple(x[: plan.microbatch_size] for x in inputs)
    try:
        probe = probe_module(model, microbatch)
    except Exception as err:  # noqa: BLE001 - any failure of the probe is a reason to fall back
        raise NotExpressible(f"the module does not run on fake tensors ({type(err).__name__}: "
                             f"{err})") from err
    if not probe.blocks:
        raise NotExpressible("no repeated blocks in the module hierarchy")
    if plan.stages and sum(s.num_layers for s in plan.stages) != len(probe.blocks):
        raise NotExpressible(f"the plan's stages hold {sum(s.num_layers for s in plan.stages)} "
                             f"blocks, the module has {len(probe.blocks)}")
    tied = _tied(model)
    if tied and (plan.tp > 1 or plan.pp > 1):
        raise NotExpressible(f"tied weights {tied[0]} would be split into separate "
                             "parameters by tp/pp styles")
    pipelined = plan.pp * plan.virtual_stages > 1
    if pipelined:
        check_splittable(probe, model)
        if plan.sequence_parallel and plan.tp > 1:
            raise NotExpressible("sequence parallelism across pipeline stages (stages would "
                                 "exchange sequence-sharded DTensors)")
    styles = tp_styles(model, plan, probe) if plan.tp > 1 else {}
    shapes = _local_shapes(model, plan, probe, styles)
    if shapes:
        try:
            probe_module(model, microbatch, shapes)
        except Exception as err:  # noqa: BLE001
            raise NotExpressible(f"the forward fails with the tensor-parallel local shapes "
                                 f"({type(err).__name__}: {err}); a fused projection or a "
                                 "head count fixed in the code needs the graph rewrite") from err
    if pipelined and not any(t.is_meta for t in model.parameters()):
        _check_chain(model, plan, probe, microbatch)
    return ModuleLevel(probe, styles, _stage_io(plan, probe, microbatch))


def build_module_stages(model: nn.Module, plan: "Plan", decided: ModuleLevel,
                        mesh: "DeviceMesh", indices: Sequence[int], device: torch.device,
                        values: Mapping[str, torch.Tensor] | None, fallbacks: list[str],
                        precision: "Precision | None" = None,
                        ep_mesh: "DeviceMesh | None" = None,
                        experts: list[nn.Parameter] | None = None) -> list["LocalStage"]:
    """This rank's stages ``indices``, each parallelized as planned (module docstring), in
    ``precision`` (:mod:`fxplan.runtime.precision`; default fp32). ``ep_mesh``: expert
    parallelism's mesh (:func:`fxplan.runtime.expert_parallel.expert_mesh`); the expert
    weights it shards are added to ``experts``."""
    from fxplan.runtime.expert_parallel import expert_params, recompute_policies, shard_experts
    from torch.distributed.tensor.parallel import parallelize_module

    from fxplan.runtime.sharded_module import LocalStage

    on_meta = any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    pipelined = plan.pp * plan.virtual_stages > 1
    stages = []
    for k in indices:
        inner = stage_module(model, plan, k, decided.probe) if pipelined else model
        if not on_meta:
            inner = inner.to(device)
        first_block = plan.stages[k].layers[0] if pipelined else 0
        kept = decided.probe.blocks[slice(*plan.stages[k].layers)] if pipelined \
            else decided.probe.blocks
        modules = dict(inner.named_modules())
        blocks = [modules[n] for n in kept if n in modules]
        if decided.styles:
            styles = {n: s for n, s in decided.styles.items() if _present(inner, n)}
            parallelize_module(inner, mesh["tp"], styles,
                               src_data_rank=None if on_meta else 0)
        if ep_mesh is not None:
            shard_experts(inner, plan, mesh, ep_mesh)
        if on_meta:
            names = {id(t): n for n, t in [*inner.named_parameters(remove_duplicate=False),
                                           *inner.named_buffers(remove_duplicate=False)]}
            materialize(inner, names, device, values)
        ignored = expert_params(inner)   # after materialize: the parameters that train
        if experts is not None:
            experts.extend(ignored)
        policies = [plan.recompute(first_block + i) for i in range(len(blocks))]
        apply_recompute(blocks, recompute_policies(blocks, policies, fallbacks) if ignored
                        else policies)
        inner.register_forward_hook(_output_tensor)
        wrapped = apply_data_parallel(inner, plan, mesh, fallbacks, blocks=blocks,
                                      precision=precision, ignored=set(ignored))
        first: dict[int, str] = {}  # a tied weight goes by its first name, as in the graph path
        local_names = {n: first.setdefault(id(p), n)
                       for n, p in inner.named_parameters(remove_duplicate=False)}
        stages.append(LocalStage(k, wrapped, inner, local_names))
    return stages


def _present(module: nn.Module, name: str) -> bool:
    """Whether ``name`` is a real submodule of the stage (not cut, not an ``Identity``)."""
    try:
        return not isinstance(module.get_submodule(name), nn.Identity)
    except AttributeError:
        return False
