"""Pipeline stages cut from the user's module at block boundaries (torchtitan's way).

Stage ``k`` with blocks ``[a_k, b_k)`` is a deep copy of the model (free on ``meta``) in which

* the layer container keeps only blocks ``a_k … b_k-1``, *under their original indices*
  (:class:`StageBlocks`: a ``ModuleList`` whose children are named ``"a_k"…``, so parameter
  names stay ``model.layers.5.mlp.up_proj.weight``; iteration and slicing see the kept blocks,
  so a forward that runs ``self.layers[: config.num_hidden_layers]`` runs exactly them; a
  ``ModuleDict`` of layers, torchtitan's ``layers["5"]``, stays a ``ModuleDict`` of the kept
  ones, so ``self.layers.values()`` runs exactly them);
* on every stage but the first, the *pre* module (the input embedding) becomes ``Identity``:
  the stage's input is the previous stage's hidden state, passed where the token ids were; a
  learned position embedding beside it (GPT-2's ``wpe``, named as in
  :data:`fxplan.runtime.styles.context_parallel.POSITION_EMBEDDINGS`) becomes :class:`NoPositions`,
  which adds nothing (``x + 0``) whatever it is called with (OPT's ``embed_positions(mask,
  past, position_ids=…)``), and an ``nn.Dropout`` that ran before the first block (the
  embedding dropout) becomes ``Identity``, so a later stage does not drop its input again;
* on every stage but the first, a forward that takes ``inputs_embeds`` (every Hugging Face
  model) is called with the received hidden state, passed through the module in the token
  embedding's place (:class:`Received`, and so through the styles put on it), as
  ``inputs_embeds`` (:class:`_Embedded`), so code that reads the token ids' shape (OPT's
  ``input_ids.view(-1, input_ids.shape[-1])``) never sees a hidden state in their place; any
  other forward is called with zero token ids of the hidden state's ``(b, t)`` while the
  token embedding's place returns the hidden state (:class:`_Injected`), so code that reads
  the token ids' shape (nanoGPT's ``b, t = idx.size()``, positions from ``t``) sees token ids;
* on every stage but the last, the *post* modules (final norm, LM head) become ``Identity``:
  the stage returns the hidden state after its last block.

So the user's forward, unchanged, computes ``x_{k+1} = f_{b_k-1} ∘ … ∘ f_{a_k}(x_k)`` on stage ``k``
and the chain of stages computes the model. This holds when the forward does nothing between the
embedding and the first block but what it also does to a hidden state (position ids, masks,
rotary tables computed from shapes), which is not decidable from the structure: the runtime
checks the split numerically (the chain against the whole model on one microbatch) whenever
values are at hand.

The *prologue* (the modules with parameters that run before the first block) a later stage
can skip is one token ``nn.Embedding``, any learned position embeddings beside it (the zoo
GPT's and GPT-2's ``x = drop(wte(tokens) + wpe(positions))``) and norms of the embeddings
(BLOOM's ``word_embeddings_layernorm``; the chain is checked numerically where the model
holds values), under every plan: pp alone, with dp/ZeRO, with tp (the stage keeps the styles
of the modules it holds), with tp and sequence parallelism (the first stage's ``wpe`` takes
:class:`~fxplan.runtime.styles.tp_positions.PositionShard`; a later stage takes the received
sequence shard at the token embedding's place: :func:`token_embedding`) and with context
parallelism. Refused here (the runtime then falls back to the graph rewrite, or refuses a
``cp > 1`` plan, which has none): more than one layer container, a module with parameters
between blocks, any other prologue (a second token embedding or a projection before the first
block: replacing it by ``Identity`` on a later stage is right for some forwards and wrong for
others, and a model on ``meta`` has no values to check the cut with), a stage without blocks.
"""

from __future__ import annotations

import copy
import inspect
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch
from torch import nn

from fxplan.runtime.styles.context_parallel import POSITION_EMBEDDINGS
from fxplan.runtime.apply.probe import ModuleProbe
from fxplan.runtime.styles.tp_styles import NotExpressible

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.plan import Plan

__all__ = ["StageBlocks", "NoPositions", "Received", "check_splittable", "stage_module",
           "token_embedding"]


class StageBlocks(nn.ModuleList):
    """A ``ModuleList`` of some blocks under their original indices (module docstring):
    integer indexing, slicing, ``len`` and iteration are positional over the kept blocks."""

    def __init__(self, blocks: dict[str, nn.Module]) -> None:
        super().__init__()
        for key, block in blocks.items():
            self.add_module(key, block)

    def __getitem__(self, idx: int | slice) -> nn.Module | nn.ModuleList:  # type: ignore[override]
        values = list(self._modules.values())
        if isinstance(idx, slice):
            return nn.ModuleList(values[idx])
        return values[idx]

    def __iter__(self) -> Iterator[nn.Module]:
        return iter(list(self._modules.values()))

    def __len__(self) -> int:
        return len(self._modules)


class NoPositions(nn.Module):
    """A later stage's position embedding: a zero scalar, so ``x + wpe(positions)`` is ``x``
    (the positions were added on the first stage; module docstring)."""

    def forward(self, index: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        return torch.zeros((), device=index.device)


class Received(nn.Identity):
    """A later stage's module in the token embedding's place: the received hidden state
    passes through it (and through the styles put on it), and, while :attr:`stash` holds
    that state, a call with token ids returns the stash instead (:class:`_Injected`)."""

    def __init__(self) -> None:
        super().__init__()
        self.stash: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.stash is None else self.stash


class _Injected:
    """A later stage's forward for a model that takes token ids only: the hidden state goes
    through the embedding's place, then the user's forward runs on zero token ids of its
    ``(b, t)``, their embedding being that hidden state (module docstring)."""

    def __init__(self, forward: Callable[..., Any], embedding: Received) -> None:
        self.inner, self.embedding = forward, embedding

    def __call__(self, hidden: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        received = self.embedding(hidden)
        tokens = torch.zeros(tuple(received.shape[:2]), dtype=torch.long, device=hidden.device)
        self.embedding.stash = received
        try:
            return self.inner(tokens, *args, **kwargs)
        finally:
            self.embedding.stash = None


class _Embedded:
    """A later stage's forward: the hidden state it receives goes in as ``inputs_embeds``
    (an instance attribute over the class's ``forward``: names and hooks are the model's)."""

    def __init__(self, forward: Callable[..., Any], embedding: nn.Module) -> None:
        self.inner, self.embedding = forward, embedding

    def __call__(self, hidden: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return self.inner(None, *args, inputs_embeds=self.embedding(hidden), **kwargs)


def _is_norm(module: nn.Module) -> bool:
    """A normalisation leaf (``nn.LayerNorm``, ``nn.RMSNorm``, a model's own ``…Norm``):
    in the prologue it normalises the embeddings (BLOOM's ``word_embeddings_layernorm``), so
    a later stage, which receives the normalised hidden state, skips it."""
    return isinstance(module, (nn.LayerNorm, nn.RMSNorm)) or (
        type(module).__name__.endswith("Norm") and next(module.children(), None) is None)


def _is_position_embedding(name: str, module: nn.Module) -> bool:
    return isinstance(module, nn.Embedding) and name.rpartition(".")[2] in POSITION_EMBEDDINGS


def check_splittable(probe: ModuleProbe, model: nn.Module) -> None:
    """Raise :class:`NotExpressible` when the model cannot be cut at block boundaries (module
    docstring: one layer container, nothing with parameters between blocks, a prologue of one
    token embedding and learned position embeddings)."""
    if len(probe.containers) != 1:
        raise NotExpressible(f"pipeline split needs one layer container, found "
                             f"{probe.containers or 'none'}")
    if probe.containers[0] == "":
        raise NotExpressible("the model itself is the layer container: no embedding or head "
                             "to keep around a cut")
    if probe.between:
        raise NotExpressible(f"module(s) {', '.join(probe.between)} with parameters run between "
                             "blocks")
    token_embedding(probe, model)


def token_embedding(probe: ModuleProbe, model: nn.Module) -> str:
    """The prologue's token embedding: its one ``nn.Embedding`` that is not a learned position
    embedding (named as in :data:`~fxplan.runtime.styles.context_parallel.POSITION_EMBEDDINGS`), with
    norms of the embeddings beside it (:func:`_is_norm`);
    :class:`NotExpressible` naming what a later stage could not skip when the prologue is
    anything else (module docstring)."""
    named = dict(model.named_modules())
    tokens = [n for n in probe.pre if not _is_position_embedding(n, named[n])
              and not _is_norm(named[n])]
    if len(tokens) == 1 and isinstance(named[tokens[0]], nn.Embedding):
        return tokens[0]
    found = ", ".join(f"{type(named[n]).__name__} {n!r}" for n in probe.pre) or "nothing"
    raise NotExpressible(f"the part before the first block must be one token nn.Embedding, "
                         f"with learned position embeddings ({', '.join(POSITION_EMBEDDINGS)}) "
                         f"and norms of the embeddings beside it; found {found}: a later stage "
                         "could not skip it")


def _set(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, module)


def stage_module(model: nn.Module, plan: "Plan", index: int, probe: ModuleProbe,
                 copy_model: bool = True, share_blocks: bool = False) -> nn.Module:
    """Stage ``index`` of ``plan`` cut from ``model`` (a deep copy unless ``copy_model`` is
    false: then ``model`` itself is cut). ``share_blocks``: the copy holds ``model``'s own
    blocks instead of copies of them (the cut replaces the container and the modules outside
    the blocks, never a block): for a check that only runs the stage, so that cutting each of
    ``pp·v`` stages does not copy the whole model ``pp·v`` times."""
    stage = plan.stages[index]
    first, last = stage.layers
    if first >= last:
        raise NotExpressible(f"stage {index} holds no block")
    if copy_model and share_blocks:
        named = dict(model.named_modules())
        shared = {id(named[b]): named[b] for b in probe.blocks if b in named}
        module = copy.deepcopy(model, shared)
    else:
        module = copy.deepcopy(model) if copy_model else model
    container = probe.containers[0]
    holder = module.get_submodule(container)
    kept = {f"{container}.{key}" if container else key: child
            for key, child in holder.named_children()}
    keep = set(probe.blocks[first:last])
    blocks = {n.rpartition(".")[2]: m for n, m in kept.items() if n in keep}
    _set(module, container, nn.ModuleDict(blocks) if isinstance(holder, nn.ModuleDict)
         else StageBlocks(blocks))
    if not stage.has_embedding:
        embedding = token_embedding(probe, model)
        named = dict(module.named_modules())
        for name in probe.pre:
            _set(module, name, NoPositions() if _is_position_embedding(name, named[name])
                 else Received() if name == embedding else nn.Identity())
        for name in _embedding_dropouts(probe, named):
            _set(module, name, nn.Identity())
        kind = _Embedded if "inputs_embeds" in inspect.signature(module.forward).parameters \
            else _Injected
        module.forward = kind(module.forward,  # type: ignore[method-assign]
                              module.get_submodule(embedding))
    if not stage.has_head:
        for name in probe.post:
            _set(module, name, nn.Identity())
    return module


def _embedding_dropouts(probe: ModuleProbe, named: dict[str, nn.Module]) -> list[str]:
    """The ``nn.Dropout`` modules outside the blocks that ran before the first block."""
    first = probe.calls[probe.blocks[0]].order
    return [name for name, call in probe.calls.items()
            if call.order < first and probe.block_of(name) is None
            and isinstance(named.get(name), nn.Dropout)]
