"""``HostCosts``: what a device group's *host* (its CPU) pays per step beyond the kernels.

On a GPU the host runs ahead of the kernels: its dispatch, autograd bookkeeping, hooks and
optimizer loop hide behind the device's work, and no GPU spec gives these costs. On CPU ranks
(``local-cpu``: one thread per rank, gloo over loopback) the host *is* the device, and every
one of them lands on the step. A device group holds them as one optional object,
``DeviceGroup.host`` (``None``: a GPU group, priced without any host term); the YAML schema
keeps them as keys of the device group (``dtensor_op_us: 34.7``, …), which
:func:`split_host` gathers into this object when a spec is loaded.

All times are µs on one core of the group's devices; :mod:`fxplan.cost_model.host.host_overhead`,
:mod:`fxplan.cost_model.host.fsdp_host` and :mod:`fxplan.cost_model.host.dtensor_dispatch` price them:

- ``step_overhead_us``: the training loop's fixed host work per step (clipping, the
  partial-gradient pass, ``zero_grad``).
- ``dtensor_op_us`` / ``dtensor_backward_op_us``: DTensor's dispatch per op over a plain
  tensor's, forward / backward; ``dtensor_view_op_us`` that of a view op (``view``, ``t``).
- ``dtensor_redistribute_us``: DTensor's host work per tensor-parallel collective issued by
  ``redistribute`` beyond the same collective issued directly;
  ``dtensor_local_redistribute_us`` that of a redistribution that communicates nothing (each
  rank keeps its slice).
- ``dtensor_from_local_us`` / ``dtensor_to_local_backward_us``: a tensor-parallel style's
  boundary (a local tensor wrapped as a DTensor in the forward; the backward of a DTensor
  handed on as a local tensor).
- ``optimizer_tensor_us`` / ``dtensor_optimizer_tensor_us``: the optimizer's loop per plain /
  DTensor parameter tensor, beyond its memory traffic.
- ``queued_collective_us``: each further collective of a batch issued asynchronously and then
  waited, beyond its bandwidth term (0: each priced as a full collective).
- ``ddp_step_us`` + ``ddp_tensor_us`` per parameter tensor: PyTorch DDP's hooks and bucket
  copies per step, where the runtime runs DDP.
- ``pipeline_step_us`` / ``pipeline_microbatch_us``: the pipeline runtime's host work
  (``torch.distributed.pipelining``'s schedule) per step and per microbatch of each stage
  where ``pp > 1``.
- ``fsdp_gather_us``, ``fsdp_reduce_us``, ``fsdp_regather_us`` (each with a ``…_tensor_us``
  part per parameter tensor of the group): FSDP2's unshard and hooks per microbatch, its
  post-backward reduce per step, ZeRO-3's reshard and re-gather per microbatch, per
  ``fully_shard`` group.
- ``first_touch_us_per_mib``: a microbatch's saved activations faulted in again, per MiB
  (the allocator gave the pages back between steps).
- ``switch_refill_us``: a rank's caches refilled after another rank ran on its core, per
  blocking wait that hands the core over (0 where ranks do not time-share cores).
- ``view_op_us`` / ``view_backward_op_us``: a view node's dispatch and autograd (no kernel),
  forward / backward.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

__all__ = ["HOST_FIELDS", "HostCosts", "split_host"]


@dataclass(frozen=True, kw_only=True)
class HostCosts:
    """A device group's CPU host costs, µs (module docstring for each)."""

    step_overhead_us: float = 0.0
    dtensor_op_us: float = 0.0
    dtensor_backward_op_us: float = 0.0
    dtensor_view_op_us: float = 0.0
    dtensor_redistribute_us: float = 0.0
    dtensor_local_redistribute_us: float = 0.0
    dtensor_from_local_us: float = 0.0
    dtensor_to_local_backward_us: float = 0.0
    optimizer_tensor_us: float = 0.0
    dtensor_optimizer_tensor_us: float = 0.0
    queued_collective_us: float = 0.0
    ddp_step_us: float = 0.0
    ddp_tensor_us: float = 0.0
    pipeline_step_us: float = 0.0
    pipeline_microbatch_us: float = 0.0
    fsdp_gather_us: float = 0.0
    fsdp_gather_tensor_us: float = 0.0
    fsdp_reduce_us: float = 0.0
    fsdp_reduce_tensor_us: float = 0.0
    fsdp_regather_us: float = 0.0
    fsdp_regather_tensor_us: float = 0.0
    first_touch_us_per_mib: float = 0.0
    switch_refill_us: float = 0.0
    view_op_us: float = 0.0
    view_backward_op_us: float = 0.0


#: The device-group keys of the schema that are host costs (the fields of :class:`HostCosts`).
HOST_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(HostCosts))


def split_host(entry: Mapping[str, Any]) -> tuple[dict[str, Any], HostCosts | None]:
    """A validated device-group entry as ``(its other keys, its host costs)``: the host costs
    are ``None`` where the entry gives none, or gives every one as 0 (the GPU specs)."""
    rest = {k: v for k, v in entry.items() if k not in HOST_FIELDS}
    given = {k: float(v) for k, v in entry.items() if k in HOST_FIELDS}
    return rest, (HostCosts(**given) if any(given.values()) else None)
