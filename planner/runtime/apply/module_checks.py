"""The checks by which the module level decides whether a plan runs on the user's module.

Each runs on one process, on fake tensors (or on one microbatch where the model holds values),
before any process group exists, and raises :class:`NotExpressible` with the reason; the
decision that calls them in order is :func:`fxplan.runtime.apply.module.module_level_plan`:

* selective recompute needs one ``F.scaled_dot_product_attention`` call per block
  (:func:`check_attention_checkpoint`);
* tensor parallelism: the forward runs with the local shard shapes (:func:`local_shapes`) and
  attends over the model's positions (:func:`check_local_run`, :func:`check_local_attention`),
  else with the attention modules' head counts set per rank (:func:`with_local_head_counts`);
* a pipeline: every stage runs on its input (:func:`check_stages_run`), the chain of stages
  computes the model (:func:`check_chain`), and under sequence parallelism the boundary is one
  ``(b, s, h)`` hidden state (:func:`check_sequence_boundary`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

import torch
from torch import nn

from fxplan.runtime.apply.block_replay import block_structure, call_signature
from fxplan.runtime.apply.probe import ModuleProbe, ReplayMemo, model_output, probe_module
from fxplan.runtime.apply.stages import stage_module
from fxplan.runtime.styles.tp_fused_qkv import FusedQKVAttention
from fxplan.runtime.styles.tp_styles import NotExpressible

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.plan import Plan

__all__ = ["SPLIT_TOLERANCE", "check_attention_checkpoint", "check_chain", "check_local_attention",
           "check_local_run", "check_sequence_boundary", "check_stages_run",
           "fused_attention_calls", "local_shapes", "with_local_head_counts"]

#: Relative error allowed between the chain of stages and the whole model (one microbatch).
SPLIT_TOLERANCE = 1e-4


def local_shapes(model: nn.Module, plan: "Plan", probe: ModuleProbe,
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


def check_stages_run(model: nn.Module, plan: "Plan", probe: ModuleProbe, memo: ReplayMemo,
                     microbatch: Sequence[torch.Tensor]) -> None:
    """Every stage's forward runs on fake tensors of its input, and the last returns the
    model's output shape: a forward that reads the token ids' shape (``b, t = idx.size()``
    on a later stage, which receives ``(b, t, h)``), iterates its layer container in a way
    the cut does not keep, or calls a replaced module with arguments it does not take,
    fails here, on one process and before any launch, not on every rank after it. (The
    values are checked by :func:`check_chain` when the model holds them.)

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


def check_chain(model: nn.Module, plan: "Plan", probe: ModuleProbe,
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


def check_attention_checkpoint(plan: "Plan", probe: ModuleProbe) -> None:
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


def check_local_run(model: nn.Module, plan: "Plan", probe: ModuleProbe,
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


def with_local_head_counts(model: nn.Module, plan: "Plan", probe: ModuleProbe,
                           microbatch: Sequence[torch.Tensor],
                           shapes: Mapping[str, tuple[int, ...]],
                           styles: Mapping[str, Any], why: NotExpressible
                           ) -> dict[str, dict[str, int]]:
    """The local head counts under which the forward runs head-parallel
    (:mod:`fxplan.runtime.styles.tp_head_counts`), checked as :func:`check_local_run` checks
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
            check_local_run(model, plan, probe, microbatch, shapes, None)
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


def check_sequence_boundary(plan: "Plan", probe: ModuleProbe) -> None:
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
