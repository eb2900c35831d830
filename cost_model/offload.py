"""Offload: optimizer states (and parameters) in host memory, priced over the host link and
the host's memory bandwidth.

Follows DeepSpeed ZeRO-Offload's design (Ren et al., 2021) for ``offload=optimizer``: the
gradients go to the host as the backward produces them, the optimizer (Adam) steps on the CPU
over fp32 master weights and moments kept in host memory, and the updated 16-bit weights come
back to the device. For ``offload=optimizer+params`` (ZeRO-3 only), FSDP2's CPU offload
(``CPUOffloadPolicy``): the fp32 parameter shards live on the host, each all-gather first copies
the rank's shard to the device, each reduce-scatter's result is copied back to the host, and the
optimizer steps on the CPU.

With ``Ψ_o`` the parameters this rank's optimizer updates (``Ψ_s/N`` under ZeRO ≥ 1, else
``Ψ_s``), ``L`` the host↔device bandwidth of one device (``host_link_gb_per_s``, per direction,
every device of the node copying at once), ``H`` the node's host memory bandwidth,
``η_h`` = :data:`HOST_STREAM_EFFICIENCY`, ``r`` the devices of the node (their CPU steps run
at once and share ``H``) and ``B_last`` the backward of one microbatch on the stage::

    offload=optimizer (per step)
      d2h   = k_g·Ψ_o / L                 gradients to the host, overlapping the last
                                          microbatch's backward (gradients are final only
                                          then): exposed max(0, d2h − B_last)
      cpu   = r · step_bytes·Ψ_o / (η_h·H) Adam on the CPU, memory-bound (28 B per parameter)
      h2d   = k_p·Ψ_o / L                 updated 16-bit weights back (not overlapped: the
                                          next forward needs them)
      T_off = max(0, d2h − B_last) + cpu + h2d

    offload=optimizer+params, per segment and microbatch (added to the ZeRO-3 prefetch term)
      h2d_seg = 4·ψ_seg/N / L   the fp32 shard before each all-gather (forward and backward)
      d2h_seg = 4·ψ_seg/N / L   the fp32 reduce-scattered gradient after the backward
    and per step T_off = cpu (the parameters stay on the host: nothing comes back).

The CPU step and the copies back are not overlapped with compute: ZeRO-Offload's one-step
delayed parameter update would hide them but changes the numerics (the step uses the previous
step's gradients), so it is not priced. The device's optimizer time is then only its fixed
``step_overhead_us``.

**Host memory** per node: the sum over the node's ranks of their host bytes
(:func:`cost_model.memory.model_state_bytes`), at most ``host_memory_gib``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from fxplan.core.config import CostModelError, ParallelConfig
from fxplan.cost_model.memory import GIB, MemoryBreakdown, OptimizerSpec

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster, DeviceGroup

__all__ = ["HOST_STREAM_EFFICIENCY", "HostSide", "MASTER_BYTES", "host_bytes_per_node",
           "offload_segment_s", "offload_step_s", "with_host_check"]

#: Fraction of the host's memory bandwidth a CPU Adam step reaches. Assumption: not measured
#: here; vectorised CPU Adam (DeepSpeed's) is memory-bound and streams five fp32 arrays.
HOST_STREAM_EFFICIENCY = 0.5

#: Bytes per parameter of what FSDP2's CPU offload copies each way: the fp32 shard and gradient.
MASTER_BYTES = 4.0


@dataclass(frozen=True)
class HostSide:
    """The host facts of one device group: bytes, bytes per second."""

    memory: float
    memory_bandwidth: float
    link: float
    devices_per_node: int

    @classmethod
    def of(cls, device: DeviceGroup) -> "HostSide":
        """The group's host side; :class:`CostModelError` naming the missing keys."""
        missing = [k for k in ("host_memory_gib", "host_memory_bandwidth_gb_per_s",
                               "host_link_gb_per_s") if getattr(device, k, None) is None]
        if missing:
            raise CostModelError(
                f"offload needs the host side of {device.model} ({device.name}): the cluster "
                f"spec does not give {', '.join(missing)} (host memory per node in GiB, its "
                "bandwidth and the host↔device bandwidth per device, GB/s; "
                "docs/cluster_specs.md)")
        return cls(device.host_memory_gib * GIB, device.host_memory_bandwidth_gb_per_s * 1e9,
                   device.host_link_gb_per_s * 1e9, device.devices_per_node)


def _updated(config: ParallelConfig, params: float) -> float:
    return params / config.dp if config.zero_stage >= 1 else params


def offload_step_s(config: ParallelConfig, params: float, backward_s: float, device: DeviceGroup,
                   optimizer: OptimizerSpec) -> float:
    """``T_off`` of one pipeline rank holding ``params`` parameters (module docstring);
    ``backward_s`` is one microbatch's backward on the rank. 0 without offload."""
    if config.offload == "none":
        return 0.0
    host = HostSide.of(device)
    psi = _updated(config, params)
    cpu = host.devices_per_node * optimizer.step_bytes * psi / (HOST_STREAM_EFFICIENCY
                                                               * host.memory_bandwidth)
    if config.offload == "optimizer+params":
        return cpu
    d2h = optimizer.grad_bytes * psi / host.link
    h2d = optimizer.param_bytes * psi / host.link
    return max(0.0, d2h - backward_s) + cpu + h2d


def offload_segment_s(config: ParallelConfig, segment_params: float,
                      device: DeviceGroup) -> tuple[float, float]:
    """``(before each all-gather, after the reduce-scatter)`` seconds of one segment's copies
    under ``offload=optimizer+params`` (module docstring); ``(0, 0)`` otherwise."""
    if config.offload != "optimizer+params":
        return 0.0, 0.0
    seconds = MASTER_BYTES * segment_params / config.dp / HostSide.of(device).link
    return seconds, seconds


def host_bytes_per_node(config: ParallelConfig, host_per_stage: Sequence[float],
                        cluster: Cluster) -> dict[int, float]:
    """Node → the host bytes its ranks keep: rank ``r`` runs stage ``r // (dp·tp)`` (the
    ``pp × dp × tp`` row-major mesh) and keeps ``host_per_stage`` of it."""
    per_stage = config.dp * config.tp
    out: dict[int, float] = {}
    for rank in range(cluster.num_devices):
        node = cluster.node_of(rank)
        out[node] = out.get(node, 0.0) + float(host_per_stage[rank // per_stage])
    return out


def with_host_check(memory: Sequence[MemoryBreakdown], config: ParallelConfig,
                    cluster: Cluster) -> list[MemoryBreakdown]:
    """``memory`` (one breakdown per pipeline stage, ``host`` filled) with each stage's
    ``host_node_total`` (its fullest node's host bytes, over every rank on that node) and that
    node's ``host_capacity``; :class:`CostModelError` when a node gives no host side."""
    nodes = host_bytes_per_node(config, [m.host for m in memory], cluster)
    per_stage = config.dp * config.tp
    out = []
    for s, m in enumerate(memory):
        worst = max(range(s * per_stage, (s + 1) * per_stage), key=lambda r: nodes[cluster.node_of(r)])
        node = cluster.node_of(worst)
        host = HostSide.of(cluster.device(worst))
        out.append(dataclasses.replace(m, host_capacity=host.memory, host_node_total=nodes[node]))
    return out
