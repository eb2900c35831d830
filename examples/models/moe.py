"""A mixture-of-experts GPT: the GPT decoder with some feed-forward layers replaced by experts.

Layer ``i`` (0-based) is a mixture of experts when ``(i + 1) mod moe_every = 0`` (every layer
for ``moe_every=1``; every other one, as GShard and the Switch Transformer place them, for
``moe_every=2``); the other layers keep the dense MLP of width ``ffn_mult·h``. An MoE layer
over the ``T = b·t`` tokens of its input ``x`` (``h`` wide), with ``E`` experts, top ``k`` and
capacity factor ``c``:

1. **Router** (softmax gating): ``p = softmax(x·W_g)`` (``W_g``: ``h × E``, no bias, in fp32 as
   GShard/Switch do); the ``k`` largest ``p_e`` of each token, renormalised to sum to 1
   (``g = top_p / Σ top_p``, as Mixtral and GShard's top-2 gate).
2. **Capacity** (GShard; Switch Transformer): each expert takes at most
   ``C = ⌈k · c · T / E⌉`` tokens (:func:`expert_capacity`). Assignments queue choice-major
   (every token's first choice before any second choice, GShard's priority), tokens in order;
   an assignment whose position in its expert's queue is ``≥ C`` is **dropped**: it
   contributes nothing (the token keeps its residual, ``g`` of the dropped choice is lost).
3. **Dispatch**: kept assignments are copied into a buffer ``[E, C, h]`` (slot
   ``e·C + position``; dropped ones to a spare row that is cut off), the experts run as one
   batched product over the expert dimension, ``[E, C, h] @ [E, h, f] → GeLU → @ [E, f, h]``
   (expert weights ``w1: [E, h, f]``, ``w2: [E, f, h]`` and biases, one tensor each), and
   **combine** gathers each assignment's output row and sums ``g · y`` over the ``k`` choices.
   Expert FLOPs are those of the capacity, ``2 · 2·E·C·h·f``, whatever the routing, as on a
   device (padding rows are computed).
4. **Auxiliary load-balancing loss** (Switch Transformer, Fedus et al. 2021, eq. 4):
   ``aux = E · Σ_i f_i · P_i`` with ``f_i`` the fraction of the ``k·T`` assignments routed to
   expert ``i`` (before dropping) and ``P_i`` the mean router probability of expert ``i``;
   ``aux = 1`` for uniform routing, up to ``E`` when everything goes to one expert. It is
   added to the training loss with weight ``aux_loss_coef`` (Switch: 0.01): the layer passes
   ``x`` on unchanged and :class:`_AddAuxiliaryGrad` gives ``aux`` the gradient
   ``aux_loss_coef`` in the backward pass (so ``∇θ`` is that of ``loss + coef·Σ aux``, and the
   auxiliary term needs no edge of its own from every layer to the loss, which keeps the layers
   one-tensor-in, one-tensor-out for pipeline stages). The value of each layer's ``aux`` is
   kept in ``MoELayer.last_aux_loss`` (eager runs only).

The experts are one batched weight rather than a ``ModuleList``: fx and ``torch.export`` see
four parameters and two ``bmm`` nodes whatever ``E``, and expert parallelism shards them on
dim 0 (``E/ep`` experts per rank). All shapes are static given the input shape: ``C`` comes
from the token count through a ``torch.fx.wrap``-ped function, so symbolic tracing records it
as one node and the fake run computes it.

Parameters per MoE layer: router ``h·E`` plus ``E·(2·f·h + f + h)``; see
:mod:`examples.param_counts`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F

from fxplan.examples.models.gpt import GPT, MLP, Block, GPTConfig
from fxplan.examples.models.validation import (require_positive, require_positive_float)


@dataclass
class MoEConfig(GPTConfig):
    """GPT shape plus the mixture: ``experts`` per MoE layer, ``top_k`` chosen per token,
    ``capacity_factor``, ``moe_every`` (which layers are MoE), ``ffn_mult`` (expert and dense
    feed-forward width ``ffn_mult·hidden``) and ``aux_loss_coef``."""

    experts: int = 8
    top_k: int = 2
    capacity_factor: float = 1.25
    moe_every: int = 1
    ffn_mult: int = 4
    aux_loss_coef: float = 0.01

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(self, "experts", "top_k", "moe_every", "ffn_mult")
        require_positive_float(self, "capacity_factor")
        if self.top_k > self.experts:
            raise ValueError(f"MoEConfig: top_k={self.top_k} exceeds experts={self.experts}")
        if (isinstance(self.aux_loss_coef, bool) or not isinstance(self.aux_loss_coef, (int, float))
                or not math.isfinite(self.aux_loss_coef) or self.aux_loss_coef < 0):
            raise ValueError(f"MoEConfig.aux_loss_coef must be a finite number ≥ 0, got "
                             f"{self.aux_loss_coef!r}")

    def is_moe(self, index: int) -> bool:
        """Whether layer ``index`` (0-based) is a mixture of experts."""
        return (index + 1) % self.moe_every == 0

    @property
    def moe_layers(self) -> int:
        return self.layers // self.moe_every

    @property
    def ffn_hidden(self) -> int:
        return self.ffn_mult * self.hidden


def expert_capacity(tokens: int, experts: int, top_k: int, factor: float) -> int:
    """``C = ⌈k · c · T / E⌉``, at least 1 and at most ``T`` (an expert never needs more slots
    than there are tokens: a token picks an expert once)."""
    return max(1, min(tokens, math.ceil(top_k * factor * tokens / experts)))


torch.fx.wrap("expert_capacity")


class _AddAuxiliaryGrad(torch.autograd.Function):
    """Forward: ``x`` unchanged. Backward: ``x``'s gradient passes, ``aux`` gets ``coef`` —
    the gradient ``aux`` would get were ``coef · aux`` added to the loss."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, aux: torch.Tensor, coef: float) -> torch.Tensor:  # type: ignore[override]
        ctx.coef = coef
        ctx.aux_dtype = aux.dtype
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        return grad, torch.full((), ctx.coef, dtype=ctx.aux_dtype, device=grad.device), None


def add_auxiliary_loss(x: torch.Tensor, aux: torch.Tensor, coef: float) -> torch.Tensor:
    """``x``, with ``coef · aux`` joining the loss's gradient (:class:`_AddAuxiliaryGrad`)."""
    return _AddAuxiliaryGrad.apply(x, aux, coef)


torch.fx.wrap("add_auxiliary_loss")


def one_hot(index: torch.Tensor, classes: int) -> torch.Tensor:
    """``F.one_hot(index, classes)`` (int64) as an out-of-place comparison with
    ``arange(classes)``: ``one_hot`` fills a zeros tensor in place, which a selective activation
    checkpoint that keeps the zeros refuses to replay ("cached tensor has been mutated")."""
    return (index.unsqueeze(-1) == torch.arange(classes, device=index.device)).to(torch.int64)


def load_balancing_loss(probs: torch.Tensor, choices: torch.Tensor, experts: int) -> torch.Tensor:
    """Switch Transformer's ``E · Σ_i f_i · P_i`` for router probabilities ``probs [T, E]``
    and the chosen experts ``choices [T, k]`` (``f_i`` over all ``k·T`` assignments)."""
    counts = one_hot(choices, experts).to(probs.dtype).sum(dim=(0, 1))     # [E]
    f = counts / counts.sum()
    return experts * (f * probs.mean(dim=0)).sum()


class Experts(nn.Module):
    """``E`` feed-forward experts as batched weights: ``[E, C, h] → [E, C, h]``."""

    def __init__(self, experts: int, hidden: int, width: int) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(experts, hidden, width))
        self.b1 = nn.Parameter(torch.zeros(experts, 1, width))
        self.w2 = nn.Parameter(torch.empty(experts, width, hidden))
        self.b2 = nn.Parameter(torch.zeros(experts, 1, hidden))
        nn.init.normal_(self.w1, std=0.02)
        nn.init.normal_(self.w2, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.bmm(F.gelu(torch.bmm(x, self.w1) + self.b1), self.w2) + self.b2


class MoELayer(nn.Module):
    """Router, capacity, dispatch, experts, combine and auxiliary loss (module docstring)."""

    def __init__(self, config: MoEConfig) -> None:
        super().__init__()
        self.experts_n, self.k = config.experts, config.top_k
        self.capacity_factor, self.aux_coef = config.capacity_factor, config.aux_loss_coef
        self.router = nn.Linear(config.hidden, config.experts, bias=False)
        self.experts = Experts(config.experts, config.hidden, config.ffn_hidden)
        self.drop = nn.Dropout(config.dropout)
        self.last_aux_loss: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.size(0), x.size(1), x.size(2)
        tokens = x.reshape(b * t, h)                                        # [T, h]
        probs, choice, gate = self.route(tokens)
        capacity = self.capacity(b * t)
        slot, kept = self.slots(choice, capacity)
        expert_out = self.experts(self.dispatch(tokens, slot, capacity))   # [E, C, h]
        y = self.combine(expert_out, slot, gate, kept)
        return self.finish(y, probs, choice, x)

    # The steps of :meth:`forward`, separate so that expert parallelism
    # (:mod:`fxplan.runtime.styles.expert_parallel`) runs the same math with the routing of every
    # data-parallel replica and the experts on their EP ranks.
    def route(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Router probabilities ``p [T, E]`` (fp32), top-``k`` choices ``[T, k]`` and their
        renormalised gates ``g [T, k]`` (step 1 of the module docstring)."""
        probs = F.softmax(self.router(tokens).float(), dim=-1)              # [T, E]
        top_p, choice = probs.topk(self.k, dim=-1)                          # [T, k]
        gate = (top_p / top_p.sum(dim=-1, keepdim=True)).to(tokens.dtype)
        return probs, choice, gate

    def capacity(self, tokens: int) -> int:
        """``C = ⌈k · c · T / E⌉`` for ``T = tokens`` (:func:`expert_capacity`)."""
        return expert_capacity(tokens, self.experts_n, self.k, self.capacity_factor)

    def slots(self, choice: torch.Tensor, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Buffer slot ``e·C + position`` of each assignment, choice-major ``[k·T]`` (all first
        choices, then all second choices, …), and whether it is kept (``position < C``);
        dropped ones point at the spare slot ``E·C`` (step 2)."""
        e = self.experts_n
        choice_major = choice.t().reshape(choice.size(0) * choice.size(1))  # [kT]
        onehot = one_hot(choice_major, e)                                   # [kT, E]
        position = ((onehot.cumsum(dim=0) - 1) * onehot).sum(dim=-1)        # [kT]
        kept = position < capacity
        slot = torch.where(kept, choice_major * capacity + position,
                           torch.full_like(position, e * capacity))
        return slot, kept

    def dispatch(self, tokens: torch.Tensor, slot: torch.Tensor, capacity: int) -> torch.Tensor:
        """The experts' input ``[E, C, h]``: each token copied to its ``k`` slots (step 3)."""
        h, spare = tokens.size(1), self.experts_n * capacity
        routed = tokens.repeat(self.k, 1)                                   # [kT, h]
        buffer = tokens.new_zeros(spare + 1, h).index_copy(0, slot, routed)
        return buffer.narrow(0, 0, spare).view(self.experts_n, capacity, h)

    def combine(self, expert_out: torch.Tensor, slot: torch.Tensor, gate: torch.Tensor,
                kept: torch.Tensor) -> torch.Tensor:
        """``y [T, h] = Σ_k g · expert output`` of each kept assignment (step 3)."""
        e, c, h = expert_out.size(0), expert_out.size(1), expert_out.size(2)
        tokens, k = gate.size(0), gate.size(1)
        flat = F.pad(expert_out.reshape(e * c, h), (0, 0, 0, 1))           # spare row: zeros
        weight = gate.t().reshape(k * tokens, 1) * kept.unsqueeze(-1).to(gate.dtype)
        return (flat.index_select(0, slot) * weight).view(k, tokens, h).sum(dim=0)

    def finish(self, y: torch.Tensor, probs: torch.Tensor, choice: torch.Tensor,
               x: torch.Tensor) -> torch.Tensor:
        """``y`` shaped as ``x``, with the auxiliary loss of ``probs`` and ``choice`` joining
        the gradient (step 4) and dropout."""
        aux = load_balancing_loss(probs, choice, self.experts_n)
        if not isinstance(aux, torch.fx.Proxy):
            self.last_aux_loss = aux.detach()
        y = add_auxiliary_loss(y, aux, self.aux_coef)
        return self.drop(y.view(x.size(0), x.size(1), x.size(2)))


class MoEGPT(GPT):
    """:class:`~examples.models.gpt.GPT` whose MoE layers (``config.is_moe``) route."""

    config: MoEConfig

    def block(self, config: GPTConfig, index: int) -> nn.Module:
        assert isinstance(config, MoEConfig)
        if config.is_moe(index):
            return Block(config, MoELayer(config))
        return Block(config, MLP(config, config.ffn_hidden))
