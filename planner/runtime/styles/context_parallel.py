"""Context parallelism (``cp > 1``) at run time: sequence chunks, global positions, all-gather KV.

Layout (fixed with the cost model, docs/architecture.md): the mesh stays ``(pp, dp, tp)`` and
``cp | dp``. The dp ranks ``d_0 … d_{dp−1}`` of a ``(pp, tp)`` coordinate form ``dp/cp`` CP
groups of ``cp`` *consecutive* ranks ``{d_{g·cp} … d_{g·cp+cp−1}}``. Every rank of group ``g``
reads the same samples, ``[g·B', (g+1)·B')`` with ``B' = B/(dp/cp)``, and keeps two chunks of
each sample's sequence: cut into ``2·cp`` chunks of ``c = s/(2·cp)`` tokens, CP rank ``r`` holds
chunks ``r`` and ``2·cp−1−r`` (the load-balanced causal split of Megatron-Core and torchtitan:
every rank does the same causal attention work), inputs and targets alike. Its tokens' global
positions are

    P_r = [r·c, (r+1)·c) ∪ [(2cp−1−r)·c, (2cp−r)·c)                      (2c = s/cp tokens)

**Positions.** Learned position embeddings (an ``nn.Embedding`` named ``wpe``,
``position_embeddings``, ``embed_positions`` or ``pos_emb``) and rotary embeddings (a module
named ``rotary_emb`` called with ``position_ids``, Hugging Face's Llama family) see the local
index ``i`` replaced by ``P_r[i]`` (forward pre-hooks), so each token is embedded at its place
in the whole sequence.

**Attention** (``cp_attention: allgather``). Every ``F.scaled_dot_product_attention(q, k, v,
is_causal=True)`` called inside a repeated block (a :class:`torch.overrides.TorchFunctionMode`
entered by the block's forward, so a recomputed block does the same) becomes

    [K; V] = all-gather_cp([k; v])                       (rank order: K = [k_0; k_1; …])
    M[i, j] = P_K[j] ≤ P_r[i]                            (P_K = [P_0; P_1; …], causal)
    o = softmax(q·Kᵀ/√d + log M)·V                       (SDPA with the boolean mask M)

K and V go in one collective (stacked on a new leading dim; two when their shapes differ), so a
layer issues one all-gather forward and one reduce-scatter backward, as the cost model prices it
(``cost_model/parallel/context_parallel.py``: ``t_AG(KV)`` forward, ``t_RS(KV)`` backward, per layer and
microbatch). The all-gather is an autograd function whose backward sums the K and V gradients
of the group and keeps this rank's rows (reduce-scatter with NCCL; all-reduce and slice with
gloo, which has no reduce-scatter). ``o`` is exact: each query sees exactly the keys at global positions ≤ its
own, as in one process; only the summation order differs.

**Loss.** Every rank holds ``B'·s/cp = B·s/dp`` tokens, so the mean loss over its tokens, with
the gradients averaged over all ``dp`` ranks (DDP / FSDP2, as without cp), is the gradient of the
mean over the global ``B·s`` tokens — the loss is normalised by the global token count. (A loss
that ignores some targets, e.g. ``ignore_index``, would need the global count of kept targets;
``lm_loss`` ignores none.)

**Why not PyTorch's ``torch.distributed.tensor.experimental.context_parallel``.** Tried here
(torch 2.13, CPU, gloo): it intercepts the fused SDPA kernels of GPUs
(``_scaled_dot_product_flash_attention`` / ``_efficient_`` / ``_cudnn_``) and CPU's SDPA
dispatches to ``_scaled_dot_product_flash_attention_for_cpu``, which it does not handle: a
causal SDPA inside ``context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2])`` on 2
gloo ranks raises ``NotImplementedError: Operator
aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding strategy
registered``, so it cannot run on ``local-cpu``; it also shards given
buffers in place (not a per-sample split of a pipeline's microbatches) and needs the model's
attention to be SDPA with ``is_causal`` exactly as here. The all-gather variant above runs on
every backend.

**Refusals** (:class:`~fxplan.runtime.apply.offload.RuntimeSupportError`, before any process group):
a plan with ``cp > 1`` runs at module level only (the graph rewrite has no CP pass); the
sequence must divide into ``2·cp`` chunks; every repeated block must call causal SDPA —
``is_causal=True``, or a ``t × t`` mask that is checked to be the causal one when it runs (an
attention spelled out with its own masking, or a non-causal one, cannot be reached: named by
block); the model needs a position site above (else its chunks would not get their positions).
The examples' GPT with ``attention="math"`` runs its blocks' attention as SDPA under cp (the
same function; logged as a fallback). Its pp and tp plans run at module level under cp as
without it: the pipeline cut skips its position embedding on later stages (:class:`fxplan.runtime.apply.stages.NoPositions`) and its fused QKV runs head-parallel
(:mod:`fxplan.runtime.styles.tp_fused_qkv`); with sequence parallelism its replicated position
embedding runs :class:`~fxplan.runtime.styles.tp_positions.PositionShard` (each tp rank embeds its
shard of its cp chunk's global positions: the CP hook maps the index first, the style then
cuts it to the rank's ``s/(cp·tp)`` positions).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from fxplan.core.fallbacks import record_fallback
from fxplan.runtime.apply.offload import RuntimeSupportError

if TYPE_CHECKING:  # pragma: no cover
    from torch.distributed.device_mesh import DeviceMesh

    from fxplan.core.plan import Plan

__all__ = ["ContextParallel", "check_context_parallel", "cp_degree", "gathered_order",
           "local_positions", "build_context_parallel", "block_attention_calls", "install"]

#: Names of learned position embeddings whose index the runtime maps to global positions.
POSITION_EMBEDDINGS = ("wpe", "position_embeddings", "embed_positions", "pos_emb")
#: Name of a rotary embedding module called with ``position_ids``.
ROTARY = "rotary_emb"


def cp_degree(plan: "Plan") -> int:
    """The plan's context-parallel degree (1 when unused)."""
    return int(getattr(plan.config, "cp", 1) or 1)


def local_positions(seq: int, cp: int, rank: int) -> torch.Tensor:
    """``P_r``: the global positions of CP rank ``rank``'s tokens (module docstring)."""
    if seq % (2 * cp):
        raise RuntimeSupportError(f"seq={seq} does not split into 2·cp = {2 * cp} equal chunks "
                                  "(context parallelism's load-balanced causal split)")
    c = seq // (2 * cp)
    first, second = rank * c, (2 * cp - 1 - rank) * c
    return torch.cat([torch.arange(first, first + c), torch.arange(second, second + c)])


def gathered_order(batch: int, local_len: int, cp: int, dp: int) -> torch.Tensor:
    """Where each row of an all-gather over the ``dp`` ranks (rank order) of every rank's
    ``batch × local_len`` tokens (flattened, ``local_len = s/cp``) stands in the one-process
    token order of the ``dp/cp`` replicas' ``batch`` samples: dp rank ``d = g·cp + r`` (CP
    group ``g``, CP rank ``r``), sample ``b``, local token ``j`` →
    ``(g·batch + b)·s + P_r[j]``. Without cp (``cp = 1``) it is the identity."""
    seq = local_len * cp
    parts = []
    for d in range(dp):
        group, rank = divmod(d, cp)
        samples = (group * batch + torch.arange(batch)) * seq
        parts.append((samples.view(-1, 1) + local_positions(seq, cp, rank).view(1, -1)).reshape(-1))
    return torch.cat(parts)


class _AllGather(torch.autograd.Function):
    """All-gather along ``dim`` over ``group`` (rank order); backward: the summed gradient's
    rows of this rank (reduce-scatter; all-reduce + slice on backends without it)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.dim, ctx.group = dim, group
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        size, rank = dist.get_world_size(ctx.group), dist.get_rank(ctx.group)
        if dist.get_backend(ctx.group) == dist.Backend.NCCL:
            parts = [p.contiguous() for p in grad.chunk(size, dim=ctx.dim)]
            out = torch.empty_like(parts[rank])
            dist.reduce_scatter(out, parts, group=ctx.group)
            return out, None, None
        total = grad.contiguous().clone()
        dist.all_reduce(total, group=ctx.group)
        return total.chunk(size, dim=ctx.dim)[rank].contiguous(), None, None


@dataclass
class ContextParallel:
    """This rank's CP group and coordinate: splits batches and runs the attention."""

    group: dist.ProcessGroup
    cp: int
    rank: int

    def positions(self, local_len: int, device: torch.device) -> torch.Tensor:
        """``P_r`` for a local sequence of ``local_len = s/cp`` tokens."""
        return local_positions(local_len * self.cp, self.cp, self.rank).to(device)

    def gathered_order(self, batch: int, local_len: int, dp: int) -> torch.Tensor:
        """:func:`gathered_order` of an all-gather over the ``dp`` ranks of ``batch × local_len``
        tokens each."""
        return gathered_order(batch, local_len, self.cp, dp)

    def split(self, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's two chunks of ``tensor``'s sequence (dim 1)."""
        index = local_positions(tensor.size(1), self.cp, self.rank).to(tensor.device)
        return tensor.index_select(1, index)

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                  scale: float | None = None, enable_gqa: bool = False) -> torch.Tensor:
        """Causal attention of the local queries over the group's keys (module docstring)."""
        seq_dim = q.dim() - 2
        if k.shape == v.shape and k.dtype == v.dtype:  # one collective for both (docstring)
            keys, values = _AllGather.apply(torch.stack((k, v)), seq_dim + 1, self.group)
        else:
            keys = _AllGather.apply(k, seq_dim, self.group)
            values = _AllGather.apply(v, seq_dim, self.group)
        local = q.size(seq_dim)
        mine = self.positions(local, q.device)
        every = torch.cat([local_positions(local * self.cp, self.cp, r) for r in range(self.cp)])
        mask = every.to(q.device).view(1, -1) <= mine.view(-1, 1)
        kwargs = {"enable_gqa": True} if enable_gqa else {}
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask,
                                              dropout_p=dropout_p, scale=scale, **kwargs)


_SDPA = F.scaled_dot_product_attention


def _causal_call(args: tuple, kwargs: dict) -> dict[str, Any] | None:
    """The arguments of an SDPA call that may be causal self-attention: ``is_causal=True``
    without a mask, or a mask over the local ``t × t`` queries and keys (Hugging Face builds
    one when it cannot prove it may skip it, e.g. on fake tensors; checked to be the causal
    mask when the call runs, :func:`_require_causal`). ``None`` for any other call."""
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
             "enable_gqa")
    bound = dict(zip(names, args), **kwargs)
    mask = bound.get("attn_mask")
    if mask is None:
        return bound if bound.get("is_causal", False) else None
    square = (bound["query"].size(-2),) * 2
    return bound if not bound.get("is_causal", False) and tuple(mask.shape[-2:]) == square \
        else None


def _require_causal(mask: torch.Tensor) -> None:
    """Refuse a mask that is not the plain causal one (boolean ``True`` = attend, or additive
    ``0`` = attend and a large negative value = masked) on every batch row and head."""
    t = mask.size(-1)
    causal = torch.ones(t, t, dtype=torch.bool, device=mask.device).tril()
    keep = mask if mask.dtype == torch.bool else mask == 0
    masked_ok = mask.dtype == torch.bool or bool((mask.masked_select(~causal.expand_as(mask))
                                                  <= torch.finfo(mask.dtype).min / 2).all())
    if not (bool((keep == causal).all()) and masked_ok):
        raise RuntimeSupportError("context parallelism runs causal self-attention only: an "
                                  "attention mask given to scaled_dot_product_attention is not the "
                                  "causal mask (padding or a custom pattern); re-plan with "
                                  "--constrain cp=1")


class _CPAttentionMode(TorchFunctionMode):
    """Causal SDPA calls run as :meth:`ContextParallel.attention`; others are refused."""

    def __init__(self, context: ContextParallel) -> None:
        super().__init__()
        self.context = context

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is _SDPA:
            bound = _causal_call(args, kwargs)
            if bound is None:
                raise RuntimeSupportError("context parallelism reaches causal "
                                          "scaled_dot_product_attention only (this call has "
                                          "is_causal=False and no t × t mask); re-plan with "
                                          "--constrain cp=1")
            if bound.get("attn_mask") is not None:
                _require_causal(bound["attn_mask"])
            return self.context.attention(bound["query"], bound["key"], bound["value"],
                                          bound.get("dropout_p", 0.0), bound.get("scale"),
                                          bool(bound.get("enable_gqa", False)))
        return func(*args, **kwargs)


class _CountMode(TorchFunctionMode):
    """Counts the causal and the other SDPA calls of each block (``current``: the block running)."""

    def __init__(self) -> None:
        super().__init__()
        self.current: str | None = None
        self.calls: dict[str, list[int]] = {}

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is _SDPA and self.current is not None:
            counts = self.calls.setdefault(self.current, [0, 0])
            counts[_causal_call(args, kwargs) is None] += 1
        return func(*args, **kwargs)


def _sdpa_math_off(model: nn.Module) -> list[str]:
    """Switch the examples' GPT attention (``attention="math"``) to its SDPA branch."""
    switched = []
    for name, module in model.named_modules():
        if type(module).__name__ == "CausalSelfAttention" and getattr(module, "math", False):
            module.math = False
            switched.append(name)
    return switched


def block_attention_calls(model: nn.Module, microbatch: Sequence[torch.Tensor],
                          blocks: Sequence[str]) -> dict[str, tuple[int, int]]:
    """``{block: (causal, other)}``: the SDPA calls each block makes in one forward of
    ``model`` on ``microbatch`` (fake tensors: :func:`fxplan.runtime.apply.probe.probe_module`)."""
    from fxplan.runtime.apply.probe import probe_module

    mode = _CountMode()
    handles = []
    for name in blocks:
        module = model.get_submodule(name)
        handles.append(module.register_forward_pre_hook(
            lambda m, args, _name=name: setattr(mode, "current", _name)))
        handles.append(module.register_forward_hook(
            lambda m, args, out: setattr(mode, "current", None)))
    try:
        with mode:
            probe_module(model, microbatch)
    finally:
        for handle in handles:
            handle.remove()
    return {name: tuple(mode.calls.get(name, (0, 0))) for name in blocks}


def check_context_parallel(model: nn.Module, plan: "Plan", microbatch: Sequence[torch.Tensor],
                           blocks: Sequence[str], fallbacks: list[str]) -> None:
    """Refuse a ``cp > 1`` plan the runtime cannot run (module docstring), before launch:
    ``blocks`` are the model's repeated blocks, ``microbatch`` one local microbatch (``s/cp``
    tokens). The GPT math attention switch is recorded in ``fallbacks``."""
    cp = cp_degree(plan)
    if plan.dp % cp:
        raise RuntimeSupportError(f"cp={cp} does not divide dp={plan.dp}: context-parallel ranks "
                                  "are taken from the data-parallel ones")
    local_positions(plan.seq, cp, 0)  # the sequence splits into 2·cp chunks
    sites = [name for name, m in model.named_modules() if _position_site(name, m)]
    if not sites:
        raise RuntimeSupportError(
            f"cp={cp}: {type(model).__name__} has no position site the runtime knows (an "
            f"nn.Embedding named {', '.join(POSITION_EMBEDDINGS)}, or a {ROTARY!r} module called "
            "with position_ids), so its sequence chunks would not get their global positions; "
            "re-plan with --constrain cp=1")
    switched = _sdpa_math_off(model)
    if switched:
        record_fallback(fallbacks, f"[context-parallel] the attention of {switched[0]}… (math) "
                        "runs as scaled_dot_product_attention under cp (all-gathered K/V, causal "
                        "mask by global position)")
    for name, (causal, other) in block_attention_calls(model, microbatch, blocks).items():
        if other or not causal:
            kind = type(model.get_submodule(name)).__name__
            raise RuntimeSupportError(
                f"cp={cp}: the attention of block {name!r} ({kind}) cannot be reached: context "
                "parallelism replaces causal F.scaled_dot_product_attention(q, k, v, "
                f"is_causal=True) calls, and this block makes {causal} such call(s) and {other} "
                "other SDPA call(s) (an attention spelled out, or a non-causal SDPA); "
                "re-plan with --constrain cp=1")


def _position_site(name: str, module: nn.Module) -> bool:
    leaf = name.rsplit(".", 1)[-1]
    return (leaf in POSITION_EMBEDDINGS and isinstance(module, nn.Embedding)) or leaf == ROTARY


def build_context_parallel(plan: "Plan", mesh: "DeviceMesh") -> ContextParallel | None:
    """This rank's :class:`ContextParallel` (``None`` when ``cp = 1`` or outside the mesh).
    Collective over the default group: every process creates every CP group, in order."""
    cp = cp_degree(plan)
    if cp == 1:
        return None
    layout = mesh.mesh                       # (pp, dp, tp)
    me, mine = dist.get_rank(), None
    for p in range(layout.size(0)):
        for t in range(layout.size(2)):
            for g in range(plan.dp // cp):
                ranks = [int(r) for r in layout[p, g * cp:(g + 1) * cp, t].tolist()]
                group = dist.new_group(ranks)
                if me in ranks:
                    mine = ContextParallel(group, cp, ranks.index(me))
    return mine


def _map_index(context: ContextParallel, index: torch.Tensor) -> torch.Tensor:
    """Local token index ``i`` → global position ``P_r[i]`` (the last dim is the sequence)."""
    positions = context.positions(index.size(-1), index.device)
    return positions[index.long()].to(index.dtype)


def install(context: ContextParallel, stage: nn.Module, blocks: Sequence[nn.Module]) -> None:
    """Hook the stage's position sites and run its blocks' attention as all-gather KV."""
    for name, module in stage.named_modules():
        if not _position_site(name, module):
            continue
        if isinstance(module, nn.Embedding):
            module.register_forward_pre_hook(  # first: before a tp style's input hook
                lambda m, args: (_map_index(context, args[0]), *args[1:]), prepend=True)
        else:
            module.register_forward_pre_hook(functools.partial(_rotary_hook, context),
                                             with_kwargs=True)
    for block in blocks:
        forward = block.forward

        @functools.wraps(forward)
        def run(*args: Any, _forward: Callable = forward, **kwargs: Any) -> Any:
            with _CPAttentionMode(context):
                return _forward(*args, **kwargs)

        block.forward = run


def _rotary_hook(context: ContextParallel, module: nn.Module, args: tuple, kwargs: dict
                 ) -> tuple[tuple, dict]:
    """``rotary_emb(x, position_ids)``: ``position_ids`` → global positions."""
    if "position_ids" in kwargs:
        kwargs = {**kwargs, "position_ids": _map_index(context, kwargs["position_ids"])}
    elif len(args) > 1:
        args = (args[0], _map_index(context, args[1]), *args[2:])
    return args, kwargs
