"""FSDP2's host work per ``fully_shard`` group: the unshard/reshard hooks and the copies around
its collectives, on the rank's main thread.

The runtime shards the parameters over dp with FSDP2 (ZeRO-2/3, and ZeRO-1 with ``tp > 1``;
``ParallelConfig.shards_params_with_fsdp``) by calling ``fully_shard`` on every repeated
block and then on the stage's root module (:mod:`fxplan.runtime.styles.data_parallel`): one
*group* per layer of the chunk, holding that layer's parameter tensors, and one for the root,
holding the rest (embeddings, final norm, head; a tied weight once). Each group's hooks run
on the main thread around its collectives: before its forward the unshard (all-gather
copy-in of the group's shards into one flat buffer, the all-gather, copy-out into the
unsharded parameters), after its backward the reduce (copy-in of the gradients, the
reduce-scatter, the divide by the dp size, copy-out into the sharded gradients) — which run
on each microbatch whose gradients are synchronised (``set_requires_gradient_sync``: the last,
or every one under ZeRO-2/3 with ``m > 1``, ``ParallelConfig.reduces_every_microbatch``;
ZeRO-2 then keeps its blocks gathered from the step's first forward to its last backward, so
its unshard runs once per step) — and under ZeRO-3 (``reshard_after_forward=True``) the reshard after the
forward and a second unshard before the backward, on every group, the root's included (FSDP2
keeps the root gathered only when ``reshard_after_forward`` is left at its default, and the
runtime passes ``True``; counted: 6 all-gathers per step for 3 groups, 3 with ``False``).

For a group of ``k`` parameter tensors, with per-group and per-tensor costs measured on a
loopback gloo group (``benchmarks/local_cpu_calibration.py``, line "FSDP2 host work"; the
spec fields ``fsdp_gather_us``, ``fsdp_gather_tensor_us`` and so on)::

    A(k) = fsdp_gather_us   + k · fsdp_gather_tensor_us     per microbatch (forward)
    B(k) = fsdp_regather_us + k · fsdp_regather_tensor_us   per microbatch (backward), ZeRO-3
    R(k) = fsdp_reduce_us   + k · fsdp_reduce_tensor_us     per step (after the last backward)

and over a chunk's groups ``g``::

    t_fwd += Σ_g A(k_g)        t_bwd += [ZeRO-3]·Σ_g B(k_g)        t_post += Σ_g R(k_g)

— with the reduction in every backward (``every``) ``Σ_g R(k_g)`` joins ``t_bwd`` instead of
``t_post``, and with the blocks kept gathered (``gathered``) ``Σ_g A(k_g)`` joins ``t_post``
(once per step) instead of ``t_fwd``.

The collectives' own time (their latency and bytes) is not here: gloo runs them on its own
threads, and the ZeRO/dp communication terms price them (:mod:`cost_model.step.stage_costs`).
Every field is 0 on the GPU specs: there the host issues these copies and collectives as
asynchronous kernels and runs ahead of them, so their host work hides behind the device's
unless the host is the bottleneck (the per-op dispatch of a small model), which those specs
do not model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import HostCosts

__all__ = ["FsdpHost", "fsdp_host_s", "fsdp_groups"]


@dataclass(frozen=True)
class FsdpHost:
    """Seconds of FSDP2 host work of one chunk: per microbatch forward and backward, and
    once per step after the last backward (module docstring)."""

    forward: float = 0.0
    backward: float = 0.0
    post: float = 0.0


def fsdp_groups(segments: Iterable[tuple[str, Iterable[str]]]) -> tuple[int, ...]:
    """Tensor counts ``(k_0, k_1, …)`` of a chunk's ``fully_shard`` groups from its segments
    ``(label, parameter names)`` in order (labels as :mod:`cost_model.step.stage_costs` names
    them: ``L<i>`` a layer, ``pre``/``post`` the rest): the root first — every parameter
    outside the layers, a name held by two segments (a tied weight) once — then one group
    per layer."""
    root: set[str] = set()
    layers: list[int] = []
    for label, names in segments:
        if label.startswith("L"):
            layers.append(len(list(names)))
        else:
            root.update(names)
    return (len(root), *layers)


def fsdp_host_s(groups: Sequence[int], host: HostCosts | None, *, zero3: bool,
                every: bool = False, gathered: bool = False) -> FsdpHost:
    """FSDP2's host work of a chunk whose groups hold ``groups`` tensors (root first,
    :func:`fsdp_groups`) on a device group with host costs ``host`` (``None``: none);
    ``zero3``: parameters resharded after the forward; ``every``: gradients reduced in every
    microbatch's backward; ``gathered``: blocks gathered once per step (module docstring)."""
    if not host:
        return FsdpHost()

    def cost(per_group_us: float, per_tensor_us: float, counts: Sequence[int]) -> float:
        return sum(per_group_us + k * per_tensor_us for k in counts) * 1e-6

    gather = cost(host.fsdp_gather_us, host.fsdp_gather_tensor_us, groups)
    regather = cost(host.fsdp_regather_us, host.fsdp_regather_tensor_us, groups) if zero3 else 0.0
    reduce = cost(host.fsdp_reduce_us, host.fsdp_reduce_tensor_us, groups)
    return FsdpHost(forward=0.0 if gathered else gather,
                    backward=regather + (reduce if every else 0.0),
                    post=(0.0 if every else reduce) + (gather if gathered else 0.0))
