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
reason and :func:`fxplan.runtime.apply.graph.apply_plan` falls back to the graph rewrite. Refused:
no repeated blocks in the module hierarchy or a different count than the plan's, placements
without a style (:mod:`fxplan.runtime.styles.tp_styles`), a forward that fails with the
tensor-parallel local shapes (a head count fixed in the code, a fused QKV split by size), a
pipeline cut the model does not allow (:mod:`fxplan.runtime.apply.stages`), a tied weight used
inside a block under pp, and a cut whose chain of stages does not compute the model (checked
on one microbatch when the model holds values); the checks are in
:mod:`fxplan.runtime.apply.module_checks`.

Tied weights (one Parameter ``W`` under several names, e.g. ``model.embed_tokens.weight`` and
``lm_head.weight``) go by their first name
(:func:`~fxplan.runtime.apply.module_tied.tied_aliases`), as in the plan:

* tp: ``W`` takes one layout for all its users
  (:func:`~fxplan.runtime.apply.module_tied.tied_layout`), so the vocabulary-parallel embedding
  (``RowwiseParallel``, ``W`` ``Shard(0)``) and the column-parallel LM head
  (``ColwiseParallel``, ``W`` ``Shard(0)``) agree; after ``parallelize_module`` (which gives each
  user its own DTensor) every alias is pointed back at the first one's DTensor, so autograd sums
  both uses, ``∂L/∂W = ∂L/∂W|_embed + ∂L/∂W|_head``, as in one process. The search may plan
  the uses apart (``W`` stored replicated for the embedding and resharded to ``Shard(0)`` for
  the head, a priced tie edge the graph rewrite realises); one Parameter has one layout, so
  the sharded use's placement is taken for all, a fallback line saying so;
* pp: the embedding (first stage) and the head (last stage) each hold a copy, initialised
  equal; :class:`~fxplan.runtime.apply.tied.TiedGradSync` sums their gradients over the pipeline
  ranks that hold ``W`` each step (Megatron's embedding group), so both take the same step.

Sequence parallelism with pp: the stage boundary carries the sequence-sharded activation, as
the cost model prices it (``cost_model.step.cross_stage.p2p_sends``: under sp each tp rank sends its
``1/tp`` sequence shard, no all-gather at the receiver). A stage's output DTensor ``Shard(1)``
leaves as its local shard (``to_local``), and the next stage's input is taken back as
``Shard(1)`` before its blocks (``PrepareModuleInput`` on the ``Identity`` in the embedding's
place), so the forward sees the global sequence length; ``stage_io`` holds the local shapes
``(b, s/tp, h)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from fxplan.runtime.apply.build import materialize
from fxplan.runtime.styles.context_parallel import install
from fxplan.runtime.styles.data_parallel import apply_data_parallel, rank_plan
from fxplan.runtime.apply.module_checks import (check_attention_checkpoint, check_chain,
                                                check_local_run, check_sequence_boundary,
                                                check_stages_run, local_shapes,
                                                with_local_head_counts)
from fxplan.runtime.apply.module_tied import retie, tied_aliases, tied_layout, tied_users
from fxplan.runtime.apply.probe import ModuleProbe, ReplayMemo, model_output, probe_module
from fxplan.runtime.apply.recompute import apply_recompute
from fxplan.runtime.apply.stages import NoPositions, check_splittable, stage_module, token_embedding
from fxplan.runtime.styles.tp_styles import NotExpressible, tp_styles

if TYPE_CHECKING:  # pragma: no cover
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel.style import ParallelStyle

    from fxplan.core.plan import Plan
    from fxplan.core.stage_io import StageIO
    from fxplan.runtime.styles.context_parallel import ContextParallel
    from fxplan.runtime.apply.precision import Precision
    from fxplan.runtime.apply.sharded_module import LocalStage

__all__ = ["ModuleLevel", "module_level_plan", "build_module_stages", "replicated_tp_note"]

def _output_tensor(module: nn.Module, args: Any, out: Any) -> torch.Tensor:
    """Forward hook: the stage returns its output tensor (``.logits`` of an HF model output),
    as ``PipelineStage`` needs; registered before DDP/FSDP so that they see the tensor and the
    pipeline sees them (gradient sync once per step, not per microbatch)."""
    return model_output(out)


def _boundary_output(module: nn.Module, args: Any, out: Any) -> torch.Tensor:
    """:func:`_output_tensor` of a stage before the last: a sequence-sharded hidden state
    leaves as this rank's local shard (module docstring)."""
    out = model_output(out)
    return out.to_local() if isinstance(out, DTensor) else out


@dataclass
class ModuleLevel:
    """The decision that the plan runs at module level, and what building it needs.

    ``aliases``: every name of a tied weight → its first name; ``tied_users``: first name →
    the stages that hold a copy (for :class:`~fxplan.runtime.apply.tied.TiedGradSync`);
    ``head_counts``: the local head counts set on attention modules under tp
    (:mod:`fxplan.runtime.styles.tp_head_counts`)."""

    probe: ModuleProbe
    styles: dict[str, "ParallelStyle"]
    stage_io: list["StageIO"]
    aliases: dict[str, str] = field(default_factory=dict)
    tied_users: dict[str, list[int]] = field(default_factory=dict)
    fallbacks: list[str] = field(default_factory=list)
    head_counts: dict[str, dict[str, int]] = field(default_factory=dict)


def _meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype, device="meta")


def _stage_io(plan: "Plan", probe: ModuleProbe, microbatch: Sequence[torch.Tensor]
              ) -> list["StageIO"]:
    from fxplan.core.stage_io import StageIO

    stages = plan.stages or ()
    if len(stages) <= 1:
        return [StageIO(tuple(_meta(x) for x in microbatch), (probe.output,))]
    split = plan.tp if plan.sequence_parallel and plan.tp > 1 else 1

    def boundary(t: torch.Tensor) -> torch.Tensor:  # (b, s, h) → this rank's (b, s/tp, h)
        return torch.empty((t.shape[0], t.shape[1] // split, *t.shape[2:]), dtype=t.dtype,
                           device="meta")

    io = []
    for k, stage in enumerate(stages):
        first, last = probe.blocks[stage.layers[0]], probe.blocks[stage.layers[1] - 1]
        inputs = tuple(_meta(x) for x in microbatch) if k == 0 else \
            tuple(boundary(x) for x in probe.calls[first].inputs)
        output = probe.output if k == len(stages) - 1 else boundary(probe.calls[last].output)
        io.append(StageIO(inputs, (output,)))
    return io


def module_level_plan(model: nn.Module, plan: "Plan",
                      inputs: torch.Tensor | Sequence[torch.Tensor]) -> ModuleLevel:
    """Decide (every process alike, no communication) whether ``plan`` runs on ``model`` at
    module level; :class:`NotExpressible` says why not (module docstring)."""
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    microbatch = tuple(x[: plan.microbatch_size] for x in inputs)
    memo = ReplayMemo()   # each kind of block runs once for all of this decision's probes
    try:
        probe = probe_module(model, microbatch, memo=memo)
    except Exception as err:  # noqa: BLE001 - any failure of the probe is a reason to fall back
        raise NotExpressible(f"the module does not run on fake tensors ({type(err).__name__}: "
                             f"{err})") from err
    if not probe.blocks:
        raise NotExpressible("no repeated blocks in the module hierarchy")
    if any(plan.recompute(i) == "selective" for i in range(len(probe.blocks))):
        check_attention_checkpoint(plan, probe)
    if plan.stages and sum(s.num_layers for s in plan.stages) != len(probe.blocks):
        raise NotExpressible(f"the plan's stages hold {sum(s.num_layers for s in plan.stages)} "
                             f"blocks, the module has {len(probe.blocks)}")
    aliases = tied_aliases(model)
    pipelined = plan.pp * plan.virtual_stages > 1
    users: dict[str, list[int]] = {}
    if pipelined:
        from fxplan.runtime.styles.router_aux import pipeline_refusal

        refusal = pipeline_refusal(model)
        if refusal:
            raise NotExpressible(refusal)
        check_splittable(probe, model)
        users = tied_users(plan, probe, aliases)
        if plan.sequence_parallel and plan.tp > 1:
            check_sequence_boundary(plan, probe)
    read_as, notes = tied_layout(plan, aliases) if plan.tp > 1 else ({}, [])
    styles = tp_styles(model, plan, probe, read_as) if plan.tp > 1 else {}
    if plan.tp > 1 and not styles:
        notes.append(replicated_tp_note(plan.tp))
    shapes = local_shapes(model, plan, probe, styles)
    head_counts: dict[str, dict[str, int]] = {}
    if shapes:
        try:
            check_local_run(model, plan, probe, microbatch, shapes, memo)
        except NotExpressible as why:   # reshaped by counts on the module: set them locally
            head_counts = with_local_head_counts(model, plan, probe, microbatch, shapes, styles,
                                                 why)
    if pipelined:
        check_stages_run(model, plan, probe, memo, microbatch)
    if pipelined and not any(t.is_meta for t in model.parameters()):
        check_chain(model, plan, probe, microbatch)
    return ModuleLevel(probe, styles, _stage_io(plan, probe, microbatch), aliases, users,
                       notes, head_counts)


def replicated_tp_note(tp: int) -> str:
    """The line shown when a plan with ``tp > 1`` splits no parameter over tp (the search may
    find every placement ``R`` cheapest, e.g. where a tp collective costs more than the
    matmuls it splits): the ``tp`` ranks of a group then each run the whole model on the same
    microbatch, the step of one rank, as planned. Not a fallback: said so that ``tp`` in the
    plan's summary is not read as a split model."""
    return (f"[module-apply] the plan's tp={tp} splits no parameter (every placement is "
            f"replicated over tp, as planned): each of the {tp} tp ranks runs the whole model "
            "on the same microbatch")


def build_module_stages(model: nn.Module, plan: "Plan", decided: ModuleLevel,
                        mesh: "DeviceMesh", indices: Sequence[int], device: torch.device,
                        values: Mapping[str, torch.Tensor] | None, fallbacks: list[str],
                        precision: "Precision | None" = None,
                        context: "ContextParallel | None" = None,
                        ep_mesh: "DeviceMesh | None" = None,
                        experts: list[nn.Parameter] | None = None) -> list["LocalStage"]:
    """This rank's stages ``indices``, each parallelized as planned (module docstring), in
    ``precision`` (:mod:`fxplan.runtime.apply.precision`; default fp32); ``context``: this rank's
    context-parallel group (positions and attention hooked: :mod:`fxplan.runtime.styles.context_parallel`).
    ``ep_mesh``: expert parallelism's mesh (:func:`fxplan.runtime.styles.expert_parallel.expert_mesh`);
    the expert weights it shards are added to ``experts``."""
    from fxplan.runtime.styles.expert_parallel import expert_params, shard_experts
    from fxplan.runtime.styles.expert_zero import shard_expert_states
    from fxplan.runtime.styles.router_aux import install_router_aux
    from torch.distributed.tensor.parallel import parallelize_module

    from fxplan.runtime.apply.sharded_module import LocalStage
    from fxplan.runtime.styles.tp_head_counts import apply_head_counts

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
            if pipelined and k > 0 and plan.sequence_parallel:
                styles.update(_sequence_entry(token_embedding(decided.probe, model)))
            parallelize_module(inner, mesh["tp"], styles,
                               src_data_rank=None if on_meta else 0)
            retie(inner, decided.aliases)
            apply_head_counts(inner, decided.head_counts)   # this rank's heads (tp_head_counts)
        if ep_mesh is not None:
            shard_experts(inner, plan, mesh, ep_mesh, context)
        if on_meta:
            names = {id(t): decided.aliases.get(n, n)
                     for n, t in [*inner.named_parameters(remove_duplicate=False),
                                  *inner.named_buffers(remove_duplicate=False)]}
            materialize(inner, names, device, values)
        if context is not None:  # before recompute: a recomputed block re-enters the CP attention
            install(context, inner, blocks)
        held = expert_params(inner)   # after materialize: the parameters that train
        apply_recompute(blocks, [plan.recompute(first_block + i) for i in range(len(blocks))],
                        split_backward=plan.config.splits_backward)
        # expert ZeRO: FSDP2 over edp reduces them; else ExpertGradSync, DDP/FSDP ignore them
        ignored = [] if shard_expert_states(inner, rank_plan(plan, mesh), precision) else held
        if experts is not None:
            experts.extend(ignored)
        before_last = pipelined and k < len(plan.stages) - 1
        # before _output_tensor: the router's auxiliary loss reads the model's router logits
        install_router_aux(inner, mesh["dp"].get_group() if plan.dp > 1 else None, pipelined,
                           fallbacks)
        inner.register_forward_hook(_boundary_output if before_last else _output_tensor)
        wrapped = apply_data_parallel(inner, plan, mesh, fallbacks, blocks=blocks,
                                      precision=precision, ignored=set(ignored))
        # a tied weight goes by its first name in the whole model, as in the graph path
        local_names = {n: decided.aliases.get(n, n)
                       for n in dict(inner.named_parameters(remove_duplicate=False))}
        stages.append(LocalStage(k, wrapped, inner, local_names))
    return stages


def _sequence_entry(entry: str) -> dict[str, "ParallelStyle"]:
    """On a stage after the first under sp: the ``Identity`` in the token embedding's place
    (``entry``) takes the received local shard as the ``Shard(1)`` DTensor the blocks expect
    (module docstring); a position embedding beside it is a :class:`NoPositions` there, whose
    zero scalar adds to the DTensor as a replicated scalar."""
    from torch.distributed.tensor.parallel import PrepareModuleInput

    return {entry: PrepareModuleInput(input_layouts=(Shard(1),),
                                      desired_input_layouts=(Shard(1),),
                                      use_local_output=False)}


def _present(module: nn.Module, name: str) -> bool:
    """Whether ``name`` is a real submodule of the stage (not cut, not an ``Identity`` or a
    later stage's :class:`NoPositions`)."""
    try:
        return not isinstance(module.get_submodule(name), (nn.Identity, NoPositions))
    except AttributeError:
        return False
