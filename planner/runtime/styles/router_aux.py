"""The router's auxiliary (load-balancing) loss of a Hugging Face mixture of experts, in the
training loss, computed from the global routing.

``transformers``' Mixtral, Qwen2-MoE and their kin, with ``config.output_router_logits =
True``, return each sparse layer's router logits ``z_l [T, E]`` and the Switch Transformer
loss pooled over the ``L`` layers (``load_balancing_loss_func``, no attention mask)::

    f_i = (1/(L·T)) Σ_l #{t : i ∈ top-k(softmax z_l,t)}      (assignments to expert i)
    P_i = (1/(L·T)) Σ_l Σ_t softmax(z_l,t)_i                  (mean router probability)
    aux = E · Σ_i f_i · P_i

and their own training loss (with ``labels``) is ``CE + router_aux_loss_coef · aux``. The
runtime takes the logits as the model's output for the user's loss (:func:`model_output`),
which left ``aux`` out; with this module the loss a step minimises and reports is
``loss_fn(logits, targets) + coef · aux``, as ``transformers`` trains the model, whenever the
model's config asks for the router logits (off: no auxiliary loss, as in ``transformers``).

**Global routing.** One process computes ``f`` and ``P`` over the whole batch of ``T_g =
dp·T`` tokens. ``f`` needs the counts of every replica: this rank's counts and rows are
summed over ``dp`` (one all-reduce of ``E + 1`` numbers per microbatch; ``f`` has no
gradient). ``P`` is linear in the probabilities, so each replica uses its own ``P^d``::

    aux_d = E · Σ_i f_i · P_i^d,        (1/dp) Σ_d aux_d = E · Σ_i f_i · P_i = aux

(equal ``T`` per replica): the replicas' mean loss — the reported value — and DDP/FSDP's mean
gradient are those of one process on the global batch, with or without expert parallelism
(the router runs on each rank's own tokens either way). A pipelined plan (``pp > 1``) runs
the layers on several stages, whose router logits the last stage does not see: leaving the
auxiliary loss out would train another loss than one process, so such a plan is refused
(:func:`pipeline_refusal`, asked before launch) rather than run.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["RouterAux", "install_router_aux", "pipeline_refusal", "with_router_aux"]


class RouterAux:
    """The auxiliary loss of one model's forward (module docstring): a forward hook computes
    ``aux_d`` from the model output's ``router_logits``; :meth:`take` hands it to the loss
    (:func:`with_router_aux` finds the hook on the stage module)."""

    def __init__(self, experts: int, top_k: int, coef: float,
                 group: dist.ProcessGroup | None) -> None:
        self.experts, self.top_k, self.coef, self.group = experts, top_k, coef, group
        self.value: torch.Tensor | None = None

    def __call__(self, module: nn.Module, args: Any, out: Any) -> None:
        logits = getattr(out, "router_logits", None)
        if isinstance(logits, (tuple, list)) and logits:
            self.value = self.local_aux([z.reshape(-1, z.size(-1)) for z in logits])

    def local_aux(self, logits: Sequence[torch.Tensor]) -> torch.Tensor:
        """``aux_d = E · Σ_i f_i · P_i^d`` of this rank's router logits ``[T, E]`` per layer,
        ``f`` from the counts summed over the group (module docstring)."""
        probs = [torch.softmax(z, dim=-1) for z in logits]
        rows = float(sum(p.size(0) for p in probs))
        with torch.no_grad():
            counts = torch.zeros(self.experts + 1, dtype=torch.float32, device=probs[0].device)
            for p in probs:
                chosen = torch.topk(p, self.top_k, dim=-1).indices.reshape(-1)
                counts[:-1] += torch.bincount(chosen, minlength=self.experts)[:self.experts]
            counts[-1] = rows
            if self.group is not None:
                dist.all_reduce(counts, group=self.group)
            share = counts[:-1] / counts[-1]                      # f_i, global
        mean_prob = sum(p.float().sum(dim=0) for p in probs) / rows   # P_i^d, this rank's
        return self.experts * (share * mean_prob).sum()

    def take(self) -> torch.Tensor:
        """The last forward's ``aux_d`` (cleared: each microbatch's loss takes its own)."""
        value, self.value = self.value, None
        if value is None:
            raise RuntimeError("the model's forward returned no router_logits for the "
                               "auxiliary loss (config.output_router_logits was set)")
        return value


def _asks_router_aux(model: nn.Module) -> bool:
    """Whether ``model``'s config asks for the router logits and it names
    ``router_aux_loss_coef`` (non-zero), ``num_experts`` and ``num_experts_per_tok``
    (``transformers``' MoE causal LMs)."""
    config = getattr(model, "config", None)
    if not getattr(config, "output_router_logits", False):
        return False
    names = ("router_aux_loss_coef", "num_experts", "num_experts_per_tok")
    return all(isinstance(getattr(model, n, None), (int, float)) for n in names) and \
        bool(model.router_aux_loss_coef)


def pipeline_refusal(model: nn.Module) -> str | None:
    """Why a pipelined plan cannot train ``model`` as one process does (its router's
    auxiliary loss needs every stage's router logits), or ``None``."""
    if not _asks_router_aux(model):
        return None
    return ("the router's auxiliary loss (config.output_router_logits) needs the router logits "
            "of every layer, which under pipeline parallelism no stage sees: the loss would "
            "differ from one process's; re-plan with --constrain pp=1, or set "
            "output_router_logits=False")


def install_router_aux(model: nn.Module, group: dist.ProcessGroup | None, pipelined: bool,
                       fallbacks: list[str]) -> RouterAux | None:
    """Hook :class:`RouterAux` on ``model`` (the whole model, before DDP/FSDP wrap it) when its
    config asks for the router logits (:func:`_asks_router_aux`); ``None`` otherwise. Under
    pipelining such a model is a :class:`~fxplan.runtime.apply.offload.RuntimeSupportError`
    (:func:`pipeline_refusal`; the module level refuses the plan before this). ``group``: the
    dp group (``None`` for one replica). ``fallbacks``: kept for the callers' signature."""
    if not _asks_router_aux(model):
        return None
    if pipelined:
        from fxplan.runtime.apply.offload import RuntimeSupportError

        raise RuntimeSupportError(str(pipeline_refusal(model)))
    aux = RouterAux(int(model.num_experts), int(model.num_experts_per_tok),
                    float(model.router_aux_loss_coef), group)
    model.register_forward_hook(aux)
    return aux


def with_router_aux(loss_fn: Callable[[Any, torch.Tensor], torch.Tensor],
                    modules: Sequence[nn.Module]) -> Callable[[Any, torch.Tensor], torch.Tensor]:
    """``loss_fn``, plus ``coef · aux_d`` of the forward that made its output when one of
    ``modules`` (a step's stage modules) has a :class:`RouterAux` hook."""
    aux = next((h for m in modules for h in m._forward_hooks.values()
                if isinstance(h, RouterAux)), None)
    if aux is None:
        return loss_fn

    def loss(output: Any, target: torch.Tensor) -> torch.Tensor:
        return loss_fn(output, target) + aux.coef * aux.take().to(output.dtype)

    return loss
