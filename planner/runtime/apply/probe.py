"""One forward of the user's module on fake tensors, recording what the module-level runtime
needs to know about its structure: which modules run, in which order, and with which arguments.

The repeated blocks are the children of the model's layer containers (``model.layers.N``,
``transformer.h.N``, ``encoder.layer.N``, ``nn.TransformerEncoder.layers.N``; found by
:func:`fxplan.passes.analyses.blocks.layer_containers`, the same rule capture uses). The probe
runs the model once on one microbatch of fake inputs (parameters on ``meta`` take part as fake
tensors, nothing is allocated) with a forward hook on every module and records, per module
(qualified name): its call order, where its floating-point tensor inputs of the hidden shape
``(…, H)`` sit (positional index or keyword name) and its output's shape. From that:

* a module with parameters that runs before the first block is *pre* (the input embedding),
  after the last block *post* (final norm, LM head); one that runs between blocks makes a
  block-boundary pipeline split impossible;
* a pipeline stage's input is its first block's hidden input, its output its last block's
  output (the static shapes :class:`~torch.distributed.pipelining.PipelineStage` needs);
* every fused attention call's query and key shapes ``(b, heads, L, d)`` and ``(b, heads, S,
  d)``, in call order (:attr:`ModuleProbe.attention`): under tensor parallelism the local run
  must see ``heads / tp`` heads of the same ``L`` and ``S``. A forward that splits its
  projections by a head count fixed at build time (``view(b, -1, self.num_heads, d)``) runs
  without error on the local shards but attends over ``L / tp`` positions of the wrong
  features; only these shapes tell.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily
from torch.nn.utils.stateless import _reparametrize_module
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from fxplan.core.model_output import model_output
from fxplan.runtime.apply.block_replay import BlockReplay, ReplayMemo, replaced_forwards
from fxplan.passes.analyses.blocks import layer_containers

__all__ = ["Call", "ModuleProbe", "ReplayMemo", "probe_module", "model_output"]


@dataclass
class Call:
    """One module's first call: its order, hidden-shaped float inputs and output."""

    order: int                           # when the call started, among all calls
    positional: tuple[int, ...]          # indices of positional float tensor inputs
    keywords: tuple[str, ...]            # names of keyword float tensor inputs
    num_args: int
    inputs: tuple[torch.Tensor, ...]     # the first float tensor input, as meta (if any)
    output: torch.Tensor | None          # the output tensor (first of a tuple), as meta


@dataclass
class ModuleProbe:
    """What :func:`probe_module` found (module docstring)."""

    containers: list[str]
    blocks: list[str]                    # block prefixes, in the order they run
    calls: dict[str, Call] = field(default_factory=dict)
    output: torch.Tensor | None = None   # the model output tensor, as meta
    pre: list[str] = field(default_factory=list)      # modules with params before block 0
    post: list[str] = field(default_factory=list)     # modules with params after the last block
    between: list[str] = field(default_factory=list)  # modules with params between blocks
    #: (query shape, key shape) of every fused attention call, in call order
    attention: list[tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)

    @property
    def fused_attention(self) -> bool:
        """Whether the forward made at least one fused attention call per repeated block
        (what selective recompute at module level checkpoints alone:
        :class:`~fxplan.runtime.apply.recompute.AttentionCheckpoint`)."""
        return len(self.attention) >= len(self.blocks)

    def block_of(self, name: str) -> str | None:
        """The block prefix ``name`` lies in, or ``None``."""
        return next((b for b in self.blocks if name == b or name.startswith(b + ".")), None)


def _meta(t: torch.Tensor) -> torch.Tensor:
    """A plain ``meta`` tensor of ``t``'s shape and dtype, made outside the probe's fake mode
    (inside it every hook's copy went through fake dispatch: a third of a probe's time)."""
    with unset_fake_temporarily():
        return torch.empty(t.shape, dtype=t.dtype, device="meta")


def _fake_empty(mode: FakeTensorMode, shape: Sequence[int], dtype: torch.dtype,
                device: torch.device) -> torch.Tensor:
    """``torch.empty(shape, dtype=dtype, device=device)`` under ``mode``, made without
    dispatch (a fake tensor over a contiguous ``meta`` tensor, as the dispatched call makes
    it): the probe makes one per parameter, a quarter of its time through dispatch."""
    with unset_fake_temporarily():
        elem = torch.empty(shape, dtype=dtype, device="meta")
    return FakeTensor(mode, elem, torch.device(device))


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor):
        return value[0]
    return None


def _has_direct_params(module: nn.Module) -> bool:
    return any(p is not None for p in module._parameters.values())


@contextlib.contextmanager
def _routed_experts_by_shape(model: nn.Module) -> Iterator[None]:
    """For the probe's run: each routed experts module of ``model``
    (:func:`fxplan.runtime.styles.expert_parallel.is_routed_experts`, ``transformers`` ≥ 5's Mixtral
    and Qwen2-MoE experts) returns a tensor of its input's shape ``[T, h]`` (its interface's
    output) without running its kernels: ``grouped_mm`` has no fake-tensor implementation
    for fp32 in torch 2.13 (its meta function asks for bf16; the CPU kernel runs fp32), and
    the eager loop's ``nonzero`` is data-dependent. The probe records shapes only."""
    from fxplan.runtime.styles.expert_parallel import is_routed_experts

    with replaced_forwards([(m, _same_shape) for m in model.modules() if is_routed_experts(m)]):
        yield


def _same_shape(hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
    """A routed experts module's output shape and dtype, for the probe: ``hidden_states``'s."""
    return hidden_states.clone()


class _AttentionShapes(TorchFunctionMode):
    """Records the query and key shapes of every ``F.scaled_dot_product_attention`` call —
    the call itself, whichever kernel it then dispatches to (the CPU runs one with dropout as
    its composite, with no fused ATen op to see), as selective recompute checkpoints it
    (:class:`~fxplan.runtime.apply.recompute.AttentionCheckpoint`)."""

    def __init__(self, into: list[tuple[tuple[int, ...], tuple[int, ...]]]) -> None:
        super().__init__()
        self.into = into

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        if func is F.scaled_dot_product_attention and len(args) >= 2 and \
                all(isinstance(a, torch.Tensor) for a in args[:2]):
            self.into.append((tuple(args[0].shape), tuple(args[1].shape)))
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Fake tensors log every failed meta kernel with its traceback at ERROR; a probe's
    failure is a reason the caller words (a refusal), so those logs are held back."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _replayed(model: nn.Module, prefixes: Sequence[str], named: Mapping[str, nn.Module],
              shapes: Mapping[str, tuple[int, ...]], started: dict[str, int],
              probe: ModuleProbe, memo: ReplayMemo | None) -> contextlib.AbstractContextManager:
    """The probe's run with the shortcut through repeated blocks installed on ``prefixes``
    (:class:`~fxplan.runtime.apply.block_replay.BlockReplay`)."""
    blocks = {p: named[p] for p in prefixes if p in named}
    return BlockReplay(model, blocks, shapes, started, probe.calls, probe.attention,
                       lambda call, order: replace(call, order=order), memo).installed()


def probe_module(model: nn.Module, inputs: Sequence[torch.Tensor],
                 shapes: Mapping[str, tuple[int, ...]] | None = None, *,
                 replay: bool = True, memo: ReplayMemo | None = None) -> ModuleProbe:
    """Run ``model(*inputs)`` once on fake tensors and record its calls (module docstring).

    ``shapes``: parameters to give another shape for this run (their local shard shapes: a
    forward that hard-codes the global head count fails here, on one process, not later on
    all of them). ``replay``: a block that repeats one already run on arguments of the same
    metadata is replayed, not run (:mod:`fxplan.runtime.apply.block_replay`: the same
    answer, one layer's time); ``False`` runs every block, as does a probe run under a
    caller's own torch function or dispatch mode (it watches the ops each block runs: the
    context-parallel check counts each block's attention calls). ``memo``: the blocks already
    run by other probes of the same model, in the same decision (:class:`ReplayMemo`)."""
    containers = layer_containers(model)
    named = dict(model.named_modules())
    prefixes = [f"{c}.{k}" if c else k for c in containers for k, _ in named[c].named_children()]
    probe = ModuleProbe(containers, [])
    hooks = []
    started: dict[str, int] = {}

    def start(name: str):
        def hook(module: nn.Module, args: tuple) -> None:
            started.setdefault(name, len(started))
        return hook

    def record(name: str):
        def hook(module: nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
            if name in probe.calls:
                return
            floats = [(i, a) for i, a in enumerate(args)
                      if isinstance(a, torch.Tensor) and a.is_floating_point()]
            kw = [(k, v) for k, v in kwargs.items()
                  if isinstance(v, torch.Tensor) and v.is_floating_point()]
            first = next((a for _, a in floats), None)
            if first is None:
                first = next((v for _, v in kw), None)
            if first is None:
                first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            tensor = _first_tensor(out)
            probe.calls[name] = Call(started[name], tuple(i for i, _ in floats),
                                     tuple(k for k, _ in kw), len(args),
                                     (_meta(first),) if first is not None else (),
                                     _meta(tensor) if tensor is not None else None)
        return hook

    for name, module in named.items():
        if name:
            hooks.append(module.register_forward_pre_hook(start(name)))
            hooks.append(module.register_forward_hook(record(name), with_kwargs=True))
    device = inputs[0].device if inputs else torch.device("cpu")
    state = [*model.named_parameters(remove_duplicate=False),
             *model.named_buffers(remove_duplicate=False)]
    shapes = shapes or {}
    replay = replay and not (_get_current_dispatch_mode_stack()
                             or _get_current_function_mode_stack())
    try:
        with FakeTensorMode(allow_non_fake_inputs=True) as mode, torch.no_grad(), _quiet():
            fakes = {n: _fake_empty(mode, shapes.get(n, t.shape), t.dtype, device)
                     for n, t in state if t.is_meta or n in shapes}
            with _reparametrize_module(model, fakes) if fakes else contextlib.nullcontext(), \
                    _routed_experts_by_shape(model), \
                    _replayed(model, prefixes, named, shapes, started, probe, memo) if replay \
                    else contextlib.nullcontext(), _AttentionShapes(probe.attention):
                out = model(*(mode.from_tensor(x) for x in inputs))
            probe.output = _meta(model_output(out))
    finally:
        for hook in hooks:
            hook.remove()
    probe.blocks = sorted((b for b in prefixes if b in probe.calls),
                          key=lambda b: probe.calls[b].order)
    if probe.blocks:
        first, last = probe.calls[probe.blocks[0]].order, probe.calls[probe.blocks[-1]].order
        for name, call in probe.calls.items():
            if probe.block_of(name) is not None or not _has_direct_params(named[name]):
                continue
            side = probe.pre if call.order < first else probe.post if call.order > last \
                else probe.between
            side.append(name)
    return probe
