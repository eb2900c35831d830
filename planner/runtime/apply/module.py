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
on one microbatch when the model holds values).

Tied weights (one Parameter ``W`` under several names, e.g. ``model.embed_tokens.weight`` and
``lm_head.weight``) go by their first name (:func:`tied_aliases`), as in the plan:

* tp: ``W`` takes one layout for all its users (:func:`tied_layout`), so the vocabulary-parallel
  embedding (``RowwiseParallel``, ``W`` ``Shard(0)``) and the column-parallel LM head
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

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from fxplan.runtime.apply.build import materialize
from fxplan.runtime.styles.context_parallel import install
from fxplan.runtime.styles.data_parallel import apply_data_parallel, rank_plan
from fxplan.runtime.apply.block_replay import block_structure, call_signature
from fxplan.runtime.apply.probe import ModuleProbe, ReplayMemo, model_output, probe_module
from fxplan.runtime.apply.recompute import apply_recompute
from fxplan.runtime.apply.stages import (NoPositions, check_splittable, stage_module,
                                          token_embedding)
from fxplan.runtime.styles.tp_fused_qkv import FusedQKVAttention
from fxplan.runtime.styles.tp_styles import NotExpressible, tp_styles, tp_token

if TYPE_CHECKING:  # pragma: no cover
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel.style import ParallelStyle

    from fxplan.core.plan import Plan
    from fxplan.core.stage_io import StageIO
    from fxplan.runtime.styles.context_parallel import ContextParallel
    from fxplan.runtime.apply.precision import Precision
    from fxplan.runtime.apply.sharded_module import LocalStage

__all__ = ["ModuleLevel", "module_level_plan", "build_module_stages", "replicated_tp_note"]

#: Relative error allowed between the chain of stages and the whole model (one microbatch).
SPLIT_TOLERANCE = 1e-4


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


def tied_aliases(model: nn.Module) -> dict[str, str]:
    """Each name of a parameter reachable under several names → its first name (the one
    ``named_parameters()`` keeps, the plan's and the checkpoint's)."""
    names: dict[int, list[str]] = defaultdict(list)
    for fqn, param in model.named_parameters(remove_duplicate=False):
        names[id(param)].append(fqn)
    return {alias: group[0] for group in names.values() if len(group) > 1 for alias in group}


def tied_layout(plan: "Plan", aliases: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """Which name's planned placement each name of a tied weight takes (all of a weight's
    names the same one), and a fallback line per weight whose uses were planned apart.

    Only the names the plan places count (an alias absent from it follows the others). They
    agree on the tp axis → the first name. Otherwise the one sharded layout among them
    (replicated uses then run sharded too: one Parameter has one layout); two different
    sharded layouts → :class:`NotExpressible`."""
    groups: dict[str, list[str]] = defaultdict(list)
    for alias, first in aliases.items():
        groups[first].append(alias)
    read_as: dict[str, str] = {}
    notes: list[str] = []
    for first, names in groups.items():
        tokens = {n: tp_token(plan, n, 2) for n in names if n in plan.placements.params}
        sharded = sorted({t for t in tokens.values() if t != "R"})
        chosen = next(iter(tokens), first)
        if len(set(tokens.values())) > 1:
            if len(sharded) > 1:
                raise NotExpressible(f"tied weight {first!r} is planned {tokens} over tp: one "
                                     "Parameter cannot take two sharded layouts")
            chosen = next(n for n in tokens if tokens[n] == sharded[0])
            notes.append(f"[module-apply] tied weight {first!r} is planned "
                         + ", ".join(f"{t} for {n!r}" for n, t in tokens.items())
                         + f" over tp; one Parameter has one layout: every use runs "
                         f"{sharded[0]}")
        read_as.update({n: chosen for n in names})
    return read_as, notes


def _tied_users(plan: "Plan", probe: ModuleProbe, aliases: Mapping[str, str]
                ) -> dict[str, list[int]]:
    """First name of each tied weight → the stages whose cut keeps a user of it: a user in
    the pre part lives on stage 0, in the post part on the last stage; one in a block is
    refused (a stage copy per block would need its own group)."""
    last = len(plan.stages) - 1
    users: dict[str, set[int]] = defaultdict(set)
    for alias, first in aliases.items():
        owner = alias.rpartition(".")[0]
        if any(owner == m or owner.startswith(f"{m}.") for m in probe.pre):
            users[first].add(0)
        elif any(owner == m or owner.startswith(f"{m}.") for m in probe.post):
            users[first].add(last)
        else:
            raise NotExpressible(f"tied weight {alias!r} is used by {owner!r}, neither the "
                                 "embedding nor the head: a pipeline cut cannot keep it tied")
    return {k: sorted(v) for k, v in users.items()}


def _local_shapes(model: nn.Module, plan: "Plan", probe: ModuleProbe,
                  styles: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Local shard shapes of the block Linears that tp splits (col: rows ÷ tp, row: cols ÷ tp)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    shapes: dict[str, tuple[int, ...]] = {}
    fused = [n for n, style in styles.items() if isinstance(style, FusedQKVAttention)]
    for name, style in styles.items():
        module = model.get_submodule(name)
        if probe.block_of(name) is None or not isinstance(module, nn.Linear) or \
                name.rpartition(".")[0] in fused:
            continue  # a fused-QKV attention's proj: its style sets the local head count
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


def _check_stages_run(model: nn.Module, plan: "Plan", probe: ModuleProbe, memo: ReplayMemo,
                      microbatch: Sequence[torch.Tensor]) -> None:
    """Every stage's forward runs on fake tensors of its input, and the last returns the
    model's output shape: a forward that reads the token ids' shape (``b, t = idx.size()``
    on a later stage, which receives ``(b, t, h)``), iterates its layer container in a way
    the cut does not keep, or calls a replaced module with arguments it does not take,
    fails here, on one process and before any launch, not on every rank after it. (The
    values are checked by :func:`_check_chain` when the model holds them.)

    A stage that repeats one already run — the same ends (embedding, head), blocks of the
    same structure (:func:`~fxplan.runtime.apply.block_replay.block_structure`) and an input
    of the same metadata — returns what that one returned, unprobed: the middle stages of an
    interleaved pipeline over identical layers are probed once."""
    named = dict(model.named_modules())
    outputs: dict[Any, torch.Tensor] = {}   # stage signature -> its output (meta)
    out: tuple[torch.Tensor, ...] = tuple(microbatch)
    for k, stage in enumerate(plan.stages):
        key = (stage.has_embedding, stage.has_head, call_signature(out, {}),
               tuple(block_structure(named[b], b, {}) for b in
                     probe.blocks[stage.layers[0]:stage.layers[1]]))
        if key not in outputs:
            try:
                ran = probe_module(stage_module(model, plan, k, probe, share_blocks=True), out,
                                   memo=memo)
            except NotExpressible:
                raise
            except Exception as err:  # noqa: BLE001 - any failure is the reason, named
                text = (str(err).strip().splitlines() or [""])[0]
                raise NotExpressible(f"pipeline stage {k} (blocks {stage.layers[0]}-"
                                     f"{stage.layers[1] - 1}) does not run on its input "
                                     f"{tuple(out[0].shape)} ({type(err).__name__}: "
                                     f"{text})") from err
            if ran.output is None:
                raise NotExpressible(f"pipeline stage {k} returns no tensor")
            outputs[key] = ran.output
        out = (torch.empty(outputs[key].shape, dtype=outputs[key].dtype),)
    if probe.output is not None and out[0].shape != probe.output.shape:
        raise NotExpressible(f"the last pipeline stage returns {tuple(out[0].shape)} where the "
                             f"model returns {tuple(probe.output.shape)}")


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


def fused_attention_calls(plan: "Plan", probe: ModuleProbe) -> bool:
    """Whether every block calls ``F.scaled_dot_product_attention`` when ``plan`` runs: as the
    probe saw, or under context parallelism, whose style switches the examples' written-out
    attention to that call and refuses blocks that make none
    (:func:`~fxplan.runtime.styles.context_parallel.check_context_parallel`, after this
    decision)."""
    return probe.fused_attention or plan.config.cp > 1


def _check_attention_checkpoint(plan: "Plan", probe: ModuleProbe) -> None:
    """Selective recompute at module level checkpoints each call of
    ``F.scaled_dot_product_attention`` in a block alone
    (:class:`~fxplan.runtime.apply.recompute.AttentionCheckpoint`): :class:`NotExpressible`
    where the blocks make fewer such calls than there are blocks (an attention written out as
    products and a softmax, :func:`fused_attention_calls`), whose core only the graph rewrite
    outlines (torch's selective checkpoint over such a block would keep every other op's
    output for its replay and free none of the scores the plan prices as freed); and beside a
    split backward under context parallelism, whose attention gathers K and V around that
    call (not run with it)."""
    split = plan.config.splits_backward
    head = (f"schedule {plan.schedule} with selective recompute: beside a split backward the "
            "module level checkpoints each call of F.scaled_dot_product_attention alone, and "
            if split else "selective recompute: the module level checkpoints each call of "
            "F.scaled_dot_product_attention in a block alone, and ")
    if split and plan.config.cp > 1:
        raise NotExpressible(head + f"beside context parallelism (cp={plan.config.cp}), whose "
                             "attention gathers K and V around that call, this is not run")
    if not fused_attention_calls(plan, probe):
        raise NotExpressible(head + f"the model's {len(probe.blocks)} blocks make "
                             f"{len(probe.attention)} such calls (an attention written out as "
                             "matrix products and a softmax); the graph rewrite outlines that "
                             "attention core")


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
        _check_attention_checkpoint(plan, probe)
    if plan.stages and sum(s.num_layers for s in plan.stages) != len(probe.blocks):
        raise NotExpressible(f"the plan's stages hold {sum(s.num_layers for s in plan.stages)} "
                             f"blocks, the module has {len(probe.blocks)}")
    aliases = tied_aliases(model)
    pipelined = plan.pp * plan.virtual_stages > 1
    tied_users: dict[str, list[int]] = {}
    if pipelined:
        from fxplan.runtime.styles.router_aux import pipeline_refusal

        refusal = pipeline_refusal(model)
        if refusal:
            raise NotExpressible(refusal)
        check_splittable(probe, model)
        tied_users = _tied_users(plan, probe, aliases)
        if plan.sequence_parallel and plan.tp > 1:
            _check_sequence_boundary(plan, probe)
    read_as, notes = tied_layout(plan, aliases) if plan.tp > 1 else ({}, [])
    styles = tp_styles(model, plan, probe, read_as) if plan.tp > 1 else {}
    if plan.tp > 1 and not styles:
        notes.append(replicated_tp_note(plan.tp))
    shapes = _local_shapes(model, plan, probe, styles)
    head_counts: dict[str, dict[str, int]] = {}
    if shapes:
        try:
            _check_local_run(model, plan, probe, microbatch, shapes, memo)
        except NotExpressible as why:   # reshaped by counts on the module: set them locally
            head_counts = _with_local_head_counts(model, plan, probe, microbatch, shapes, styles,
                                                  why)
    if pipelined:
        _check_stages_run(model, plan, probe, memo, microbatch)
    if pipelined and not any(t.is_meta for t in model.parameters()):
        _check_chain(model, plan, probe, microbatch)
    return ModuleLevel(probe, styles, _stage_io(plan, probe, microbatch), aliases, tied_users,
                       notes, head_counts)


def _check_local_run(model: nn.Module, plan: "Plan", probe: ModuleProbe,
                     microbatch: Sequence[torch.Tensor], shapes: Mapping[str, tuple[int, ...]],
                     memo: ReplayMemo | None) -> None:
    """The forward runs with the tensor-parallel local shapes and attends over the model's
    positions (:func:`check_local_attention`); :class:`NotExpressible` otherwise."""
    try:
        local = probe_module(model, microbatch, shapes, memo=memo)
    except Exception as err:  # noqa: BLE001
        raise NotExpressible(f"the forward fails with the tensor-parallel local shapes "
                             f"({type(err).__name__}: {err}); a fused projection or a "
                             "head count fixed in the code needs the graph rewrite") from err
    check_local_attention(probe, local, plan.tp)


def _with_local_head_counts(model: nn.Module, plan: "Plan", probe: ModuleProbe,
                            microbatch: Sequence[torch.Tensor],
                            shapes: Mapping[str, tuple[int, ...]],
                            styles: Mapping[str, Any], why: NotExpressible
                            ) -> dict[str, dict[str, int]]:
    """The local head counts under which the forward runs head-parallel
    (:mod:`fxplan.runtime.styles.tp_head_counts`), checked as :func:`_check_local_run` checks
    the forward without them (a fresh replay memo: the attributes change what a block does);
    :class:`NotExpressible` with both reasons when there are none or they do not help."""
    from fxplan.runtime.styles.tp_head_counts import local_head_counts, set_head_counts

    try:
        counts = local_head_counts(model, styles, plan.tp)
    except NotExpressible as cannot:
        raise NotExpressible(f"{why}; nor can its head counts be set per rank: {cannot}") from why
    if not counts:
        raise why
    try:
        with set_head_counts(model, counts):
            _check_local_run(model, plan, probe, microbatch, shapes, None)
    except NotExpressible as still:
        named = ", ".join(f"{n}.{a}" for n, attrs in counts.items() for a in attrs)
        raise NotExpressible(f"{still} (with the local head counts {named} set: the forward "
                             "reshapes by a count fixed in the code)") from why
    return counts


def check_local_attention(full: ModuleProbe, local: ModuleProbe, tp: int) -> None:
    """Every attention of the tensor-parallel forward attends over the model's positions:
    the local run's query and key shapes are the full run's with the heads divided by ``tp``
    (or, for a key/value head count below ``tp``, kept). A forward that reshapes its local
    projections by the model's head count (``view(b, -1, self.num_heads, d)``) runs without
    error but attends over ``L / tp`` positions: :class:`NotExpressible`, never a wrong loss."""
    if len(full.attention) != len(local.attention):
        raise NotExpressible(f"the tensor-parallel forward calls attention "
                             f"{len(local.attention)} times where the model calls it "
                             f"{len(full.attention)} times")
    for (q, k), (lq, lk) in zip(full.attention, local.attention):
        for what, whole, part in (("query", q, lq), ("key", k, lk)):
            fine = len(whole) == len(part) == 4 and whole[0] == part[0] and \
                whole[2:] == part[2:] and part[1] in (whole[1] // tp, whole[1])
            if not fine:
                raise NotExpressible(
                    f"with the tensor-parallel shards the attention's {what} is "
                    f"{tuple(part)} where the model's is {tuple(whole)} (expected its heads "
                    f"÷ {tp}, the same positions): the forward reshapes its projections by a "
                    "head count fixed at build time, so a head-parallel split would attend "
                    "over the wrong positions")


def replicated_tp_note(tp: int) -> str:
    """The line shown when a plan with ``tp > 1`` splits no parameter over tp (the search may
    find every placement ``R`` cheapest, e.g. where a tp collective costs more than the
    matmuls it splits): the ``tp`` ranks of a group then each run the whole model on the same
    microbatch, the step of one rank, as planned. Not a fallback: said so that ``tp`` in the
    plan's summary is not read as a split model."""
    return (f"[module-apply] the plan's tp={tp} splits no parameter (every placement is "
            f"replicated over tp, as planned): each of the {tp} tp ranks runs the whole model "
            "on the same microbatch")


def _check_sequence_boundary(plan: "Plan", probe: ModuleProbe) -> None:
    """Under sp with pp the boundary is the ``Shard(1)`` hidden state: it must be ``(b, s, h)``
    with ``s`` divisible by tp."""
    for stage in plan.stages[1:]:
        inputs = probe.calls[probe.blocks[stage.layers[0]]].inputs
        if len(inputs) != 1 or inputs[0].ndim != 3 or inputs[0].shape[1] % plan.tp:
            shapes = [tuple(x.shape) for x in inputs]
            raise NotExpressible(f"sequence parallelism across pipeline stages needs one "
                                 f"(batch, seq, hidden) input per stage with seq divisible by "
                                 f"tp={plan.tp}; block {probe.blocks[stage.layers[0]]!r} takes "
                                 f"{shapes}")


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
            _retie(inner, decided.aliases)
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


def _retie(module: nn.Module, aliases: Mapping[str, str]) -> None:
    """Point every alias of a tied weight in ``module`` at the parameter of the first of its
    names present here (``parallelize_module`` gave each user its own; module docstring)."""
    kept: dict[str, nn.Parameter] = {}
    for name in aliases:  # in named_parameters order: the first name comes first
        owner, _, leaf = name.rpartition(".")
        try:
            holder = module.get_submodule(owner) if owner else module
        except AttributeError:
            continue
        param = holder._parameters.get(leaf)
        if param is None:
            continue
        shared = kept.setdefault(aliases[name], param)
        if shared is not param:
            if getattr(shared, "placements", None) != getattr(param, "placements", None):
                raise RuntimeError(f"tied weight {name!r} is laid out {param.placements} by "
                                     f"its style, its first name {aliases[name]!r} "
                                     f"{shared.placements}")
            holder._parameters[leaf] = shared


def _present(module: nn.Module, name: str) -> bool:
    """Whether ``name`` is a real submodule of the stage (not cut, not an ``Identity`` or a
    later stage's :class:`NoPositions`)."""
    try:
        return not isinstance(module.get_submodule(name), (nn.Identity, NoPositions))
    except AttributeError:
        return False
