"""Offload: optimizer states (and parameters) in host memory, priced over the host link and
the host's memory bandwidth, as fxplan's runtime runs it.

Follows DeepSpeed ZeRO-Offload's design (Ren et al., 2021) for ``offload=optimizer``: the
parameters and gradients stay on the device under the plan's ZeRO stage, the optimizer (Adam)
steps on the CPU over fp32 master weights and moments kept in host memory, and the updated
weights come back to the device (the runtime's :mod:`fxplan.runtime.train.host_optimizer`).
For ``offload=optimizer+params`` (ZeRO-3 only), FSDP2's CPU offload (``CPUOffloadPolicy``):
the fp32 parameter shards live on the host, each all-gather first copies the rank's shard to
the device, each reduce-scatter's result is copied back to the host, and the optimizer steps
on the CPU.

With ``Ψ_o`` the parameters this rank's optimizer updates (``Ψ_s`` without ZeRO; under
ZeRO ≥ 1 ``(Ψ_s − e_s)/N + e_s·ep/N``, the rank's expert parameters ``e_s`` sharded over their
``N/ep`` expert-data-parallel replicas only, as the memory's model states count them), ``L``
the host↔device bandwidth of one device (``host_link_gb_per_s``, per direction, every device
of the node copying at once), ``H`` the node's host memory bandwidth, ``r`` the
devices of the node and ``k`` = :data:`MASTER_BYTES` = 4 the bytes of every copy (the
runtime keeps parameters and gradients in fp32 on the device — its master weights; mixed
precision casts inside the forward, ``fxplan.runtime.apply.precision`` — so whatever the
compute dtype, what crosses the link is fp32)::

    offload=optimizer (per step, after the trainer's gradient clipping on the device)
      d2h   = k·Ψ_o / L                   the clipped gradients to the host (not overlapped:
                                          the clipping needs every gradient's final value)
      cpu   = Ψ_o · Q_o / (η_q · min(t·b_c, H/r))
                                          the host step (below), AdamW alone: Q_o = 80
      h2d   = k·Ψ_o / L                   the updated weights back (not overlapped: the next
                                          forward needs them)
      T_off = d2h + cpu + h2d

    offload=optimizer+params, per segment and microbatch (added to the ZeRO-3 prefetch term)
      h2d_seg = k·ψ_o,seg / L   the fp32 shard before each all-gather (forward and backward)
      d2h_seg = k·ψ_o,seg / L   the fp32 reduce-scattered gradient after the backward
                                (ψ_o,seg: the segment's shard, its experts' as in Ψ_o)
    and per step T_off = cpu with Q_p = 92: the gradients are on the host, so the clipping's
    norm and multiply run there too (the parameters stay on the host: nothing comes back).

**The host step is what the runtime runs, measured** (``benchmarks/host_adam_rate.py``;
figures in ``benchmarks/data/hardware.md``, "Host optimizer step"). Both offloads step
``torch.optim.AdamW`` without ``foreach`` or ``fused`` on CPU tensors (the host optimizer
passes ``foreach=False, fused=False``; FSDP2's offloaded shards get torch's default, which on
the CPU is the same): torch 2.13's single-tensor loop, eight eager elementwise kernels per
parameter tensor that move :data:`ADAM_HOST_BYTES` = ``80 B`` per parameter (the fused step's
``28``: the moments, ``v.sqrt()``, its division and ``+ε`` each make a pass of their own);
where the gradients sit on the host the clipping's norm and multiply add
:data:`CLIP_HOST_BYTES` = ``12 B`` (:func:`host_step_bytes`). Each kernel runs on
``torch.get_num_threads()`` threads, and ``fxplan launch`` starts every rank with
``OMP_NUM_THREADS=1``: ``t`` = :data:`RANK_THREADS` = 1 core per rank. One core streams at
most ``b_c`` = :data:`CORE_MEMORY_GB_PER_S` (the copy of a 512 MiB tensor on one core); the
node's ``r`` ranks stepping at once share ``H``; either chain reaches ``η_q`` =
:data:`HOST_STEP_EFFICIENCY` of the lesser. Measured on one core of an AMD EPYC (Zen 4):
``b_c`` = 21–23 GB/s; AdamW alone 0.151–0.160 G parameters/s, ``η = 80 B × rate / b_c`` =
0.53–0.61; clip + AdamW (32 M parameters) 0.143–0.145 G parameters/s, ``η = 92 B × rate /
b_c`` = 0.58–0.63; in the cost model's 28-byte unit that is 4.0 GB/s per core, 0.18 of the
core's copy bandwidth (the 0.5 of ``H/r`` priced before it was measured was 2.2× too fast on
a DGX-1 and 8.6× on a DGX H100, whose ``H/r`` a core cannot reach alone). ``b_c`` is this
machine's core; the DGX hosts' cores are not measured here (their per-core bandwidth is taken
as the same: an assumption, bounded by ``H/r``, which binds on the DGX-1: 136.5/8 = 17 GB/s).
Cross-check, public: DeepSpeed reports its vectorised CPU-Adam 5.1–6.5× faster than
``torch.optim.Adam`` on 1–10 B parameters and 56 s → 8.2 s for an 11.6 B GPT-2 (0.21 G
parameters/s for torch's, host not given; PR #735); torch's own one-pass kernel
(``fused=True``) measures 1.26–1.29 G parameters/s here, 8.9× the runtime's chain — an option
the runtime does not take.

Nothing of the offload step is overlapped with compute: ZeRO-Offload streams the gradients to
the host during the backward and its one-step delayed parameter update hides the CPU step and
the copies back, but the runtime copies after the clipping and does not delay the update
(that would change the numerics: the step would use the previous step's gradients), so
neither is priced. The ``optimizer`` row then keeps the per-tensor loop (the host steps the
tensors one at a time as the device would) and the fixed ``step_overhead_us``.

**Host memory** per node: the sum over the node's ranks of their host bytes
(:func:`cost_model.memory.breakdown.model_state_bytes`), at most ``host_memory_gib``. With an
offload per pipeline rank (``offload_stages``) every term here is priced on the rank's own view
(:meth:`~fxplan.core.config.ParallelConfig.at_pipeline_rank`): a rank that does not offload has
no offload row, no copies and 0 host bytes in its node's sum.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from fxplan.core.config import ParallelConfig
from fxplan.core.config_error import CostModelError
from fxplan.cost_model.memory.breakdown import GIB, MemoryBreakdown, OptimizerSpec

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from fxplan.cluster_specs import Cluster, DeviceGroup

__all__ = ["ADAM_HOST_BYTES", "CLIP_HOST_BYTES", "CORE_MEMORY_GB_PER_S", "HOST_STEP_EFFICIENCY",
           "HostSide", "MASTER_BYTES", "RANK_THREADS", "host_bytes_per_node", "host_step_bytes",
           "host_step_s", "offload_segment_s", "offload_step_s", "updated_params",
           "with_host_check"]

#: Bytes per parameter torch 2.13's single-tensor AdamW moves on CPU tensors (with weight
#: decay; module docstring): the host step of both offloads.
ADAM_HOST_BYTES = 80.0
#: Bytes per parameter of the gradient clipping's norm (4) and multiply (8), on the host where
#: the gradients sit there (``offload=optimizer+params``).
CLIP_HOST_BYTES = 12.0
#: ``η_q``: the fraction of the streaming bandwidth either chain reaches. Measured
#: (``benchmarks/host_adam_rate.py``, one core, 32 M parameters, two runs): AdamW alone
#: 0.607, 0.531; clip + AdamW 0.634, 0.579.
HOST_STEP_EFFICIENCY = 0.6
#: ``b_c``: what one host core streams, GB/s (bytes read + written), the one-thread copy of
#: a 512 MiB fp32 tensor. Measured on this machine's cores (AMD EPYC, Zen 4): 21.0, 22.8;
#: taken for every host (the DGX CPUs' cores are not measured: an assumption).
CORE_MEMORY_GB_PER_S = 21.9
#: ``t``: the threads each rank's host step runs on: ``fxplan launch`` sets
#: ``OMP_NUM_THREADS=1`` (``fxplan.cli.torchrun_command.launch_command``).
RANK_THREADS = 1

#: ``k``: bytes per parameter of every host↔device copy of both offloads: the runtime keeps
#: parameters and gradients in fp32 (FSDP2's shard and gradient; the host optimizer's clipped
#: gradient down and updated weight back).
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


def updated_params(config: ParallelConfig, params: float | np.ndarray,
                   experts: float | np.ndarray = 0.0) -> float | np.ndarray:
    """``Ψ_o`` (module docstring): the parameters the optimizer of a rank holding ``params``
    parameters, ``experts`` of them expert parameters, updates — with or without offload;
    arrays give one entry per rank."""
    if config.zero_stage == 0:
        return params
    return (params - experts) / config.dp + experts * config.ep / config.dp


def offload_step_s(config: ParallelConfig, params: float, device: DeviceGroup, *,
                   expert_params: float = 0.0) -> float:
    """``T_off`` of one pipeline rank holding ``params`` parameters, ``expert_params`` of them
    expert parameters (module docstring); 0 without offload. Nothing of it overlaps a
    backward, and every copy is fp32 whatever the optimizer's device bytes
    (:data:`MASTER_BYTES`)."""
    if config.offload == "none":
        return 0.0
    host = HostSide.of(device)
    psi = updated_params(config, params, expert_params)
    cpu = host_step_s(psi, host, config.offload)
    if config.offload == "optimizer+params":
        return cpu
    return 2 * MASTER_BYTES * psi / host.link + cpu


def host_step_bytes(offload: str) -> float:
    """``Q``: bytes per parameter of the host step under ``offload`` (module docstring):
    AdamW, and the clipping where the gradients are on the host (``optimizer+params``)."""
    return ADAM_HOST_BYTES + (CLIP_HOST_BYTES if offload == "optimizer+params" else 0.0)


def host_step_s(params: float, host: HostSide, offload: str) -> float:
    """``cpu = Ψ_o·Q/(η_q·min(t·b_c, H/r))`` (module docstring): seconds of the runtime's
    host step under ``offload`` over ``params`` parameters on one rank, the node's ranks
    stepping at once."""
    per_rank = min(RANK_THREADS * CORE_MEMORY_GB_PER_S * 1e9,
                   host.memory_bandwidth / host.devices_per_node)
    return params * host_step_bytes(offload) / (HOST_STEP_EFFICIENCY * per_rank)


def offload_segment_s(config: ParallelConfig, segment_params: float, device: DeviceGroup, *,
                      expert_params: float = 0.0) -> tuple[float, float]:
    """``(before each all-gather, after the reduce-scatter)`` seconds of one segment's copies
    under ``offload=optimizer+params`` (module docstring): its shard, ``(ψ_seg − e)/N`` and
    the ``expert_params`` ``e`` over their ``N/ep`` replicas; ``(0, 0)`` otherwise."""
    if config.offload != "optimizer+params":
        return 0.0, 0.0
    shard = updated_params(config, segment_params, expert_params)
    seconds = MASTER_BYTES * shard / HostSide.of(device).link
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
