"""A learned position embedding under sequence parallelism: each tp rank embeds its own shard.

With sequence parallelism (``plan.sequence_parallel``, ``tp > 1``) the residual stream between
the tensor-parallel regions is sequence-sharded: the vocabulary-parallel token embedding
reduce-scatters its output to ``Shard(1)`` of ``(b, t, h)`` (:mod:`fxplan.runtime.styles.tp_styles`).
A learned position embedding (``x = wte(tokens) + wpe(positions)``, the zoo GPT's ``wpe``) is
replicated over tp (its table is small, the plan keeps it ``R``); on its own its output would be
the whole ``(t, h)`` table rows, a plain tensor that cannot be added to the sharded stream. The
:class:`PositionShard` style makes it take the same layout, with no collective forward:

    idx   = positions (length t on the last dim; under context parallelism already the global
            positions P_r of the rank's cp chunk: the CP pre-hook runs first)
    idx_r = idx[..., r·t/tp : (r+1)·t/tp]          (tp rank r: Replicate → Shard, a local slice)
    e_r   = W[idx_r]                               (W replicated over tp; output Shard on the
                                                    sequence dim, e.g. Shard(0) of (t, h))
    x     = wte(tokens) + e                        (Shard(1) + broadcast Shard(0) → Shard(1))

Backward: rank ``r`` gets ``∂L/∂W`` of its ``t/tp`` positions only; DTensor leaves the gradient
``Partial(sum)`` and :mod:`fxplan.runtime.apply.partial_grads` all-reduces it over tp with the layer
norms' (one flattened all-reduce) — the term the cost model prices for every replicated
parameter applied to the split stream (:mod:`fxplan.cost_model.comm.partial_grads`, which counts
the position embedding among them). Needs ``t`` divisible by tp, as the split stream does.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import SequenceParallel

__all__ = ["PositionShard"]


class PositionShard(SequenceParallel):
    """:class:`SequenceParallel` for an ``nn.Embedding`` of positions (module docstring): the
    table replicated, the index cut to this tp rank's sequence shard, the output a ``Shard``
    DTensor on the index's last dim."""

    def __init__(self) -> None:
        super().__init__(sequence_dim=0, use_local_output=False)

    @staticmethod
    def _prepare_input_fn(sequence_sharding: Any, mod: nn.Module, inputs: tuple,
                          device_mesh: Any) -> tuple:
        index = inputs[0]
        if isinstance(index, DTensor):
            return inputs
        whole = DTensor.from_local(index, device_mesh, [Replicate()], run_check=False)
        return (whole.redistribute(device_mesh, [Shard(index.dim() - 1)]), *inputs[1:])

    def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
        if not isinstance(module, nn.Embedding):
            raise TypeError(f"PositionShard applies to an nn.Embedding, not "
                            f"{type(module).__name__}")
        return super()._apply(module, device_mesh)
