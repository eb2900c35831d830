"""``DeviceGroup``: identical devices in identical nodes, one entry of ``device_groups``.

A cluster is one or more device groups side by side. Ranks are numbered group by group
(in the order of the spec), node by node, device by device::

    rank = group.first_rank + (node - group.first_node) * group.devices_per_node + local_index
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from fxplan.cluster_specs.frozen import freeze
from fxplan.cluster_specs.host_costs import HostCosts

#: Data types a device may list under ``peak_tflops``.
DTYPES: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8")

#: Device kinds.
DEVICE_KINDS: tuple[str, ...] = ("gpu", "cpu")


@dataclass(frozen=True, kw_only=True)
class DeviceGroup:
    """``nodes × devices_per_node`` identical devices.

    Units are in the names: memory in GiB, bandwidth in GB/s (10⁹ bytes per second), peaks in
    TFLOP/s (dense), latencies in µs. ``compute_efficiency`` maps an op class (``matmul``,
    ``attention``, ... and ``memory_bound``) to the fraction of peak — of ``peak_tflops`` for
    compute-bound classes, of ``memory_bandwidth_gb_per_s`` for ``memory_bound`` — that the cost
    model may expect before profiling; ``backward_efficiency`` (same keys, optional) the same
    for the kernels of an op's backward where they differ from its forward (a CPU's backward
    GEMMs are bare ``mm`` calls, its forward linears carry the module call and the bias;
    missing keys: ``compute_efficiency``'s). ``nics_per_node`` overrides the cluster-scope level's
    NIC count for this group's nodes (``None``: the level's). ``comm_overlap`` is the fraction
    of a collective that can run concurrently with compute (1: GPUs; 0: one-thread CPU ranks,
    whose gloo threads need the rank's core). ``ddp_bucket_mib`` is the gradient
    bucket cap of the data-parallel wrapper the runtime runs on these devices (PyTorch DDP:
    25 MiB, its first bucket 1 MiB; 0: one bucket per model segment, as Megatron's overlapped
    buckets of the A100/V100 references are priced). ``host`` holds the CPU host costs of a
    step beyond its kernels (:class:`~fxplan.cluster_specs.host_costs.HostCosts`: DTensor's
    dispatch, the optimizer's loop, DDP's, FSDP2's and the pipeline runtime's host work, …):
    ``None`` on every GPU spec, whose host runs ahead of the kernels; the schema keeps them
    as keys of the device group.
    ``fused_attention`` says that attention runs as one fused (flash) kernel on these devices,
    whatever the model's code spells out (:mod:`cost_model.compute.attention_kernel` prices it so):
    the training stack's choice (Megatron-Core / Transformer Engine, PyTorch SDPA on GPUs
    with flash kernels), an explicit assumption of the spec. ``sm_count`` is the number of
    streaming multiprocessors of one device (0: not given); with it the cost model prices the
    SMs that communication kernels overlapped with compute hold (Transformer Engine's
    userbuffers under ``tp_overlap``, :mod:`cost_model.step.stage_costs`).

    Host side, for offload (all optional; ``None``: not given, and then nothing is offloaded
    to this group's hosts): ``host_memory_gib`` is the host (CPU) memory of one node,
    ``host_memory_bandwidth_gb_per_s`` its memory bandwidth (all sockets; the CPU optimizer
    step of a node's devices shares it) and ``host_link_gb_per_s`` the host↔device bandwidth
    of one device per direction while every device of the node copies at once (PCIe lanes
    shared behind a switch count once).

    ``cuda_context_gib`` is what one process holds on a GPU before its first tensor (CUDA
    context, library handles, workspaces), as ``fxplan calibrate`` measured it on these
    devices; ``None``: the cost model's public-figure default
    (:data:`fxplan.cost_model.memory.runtime.CUDA_CONTEXT_BYTES`).
    """

    name: str
    kind: str
    model: str
    nodes: int
    devices_per_node: int
    memory_gib: float
    reserved_memory_gib: float
    memory_bandwidth_gb_per_s: float
    peak_tflops: Mapping[str, float]
    intra_node_level: str
    compute_efficiency: Mapping[str, float] = field(default_factory=dict)
    backward_efficiency: Mapping[str, float] = field(default_factory=dict)
    kernel_launch_us: float = 0.0
    fused_attention: bool = False
    comm_overlap: float = 1.0
    ddp_bucket_mib: float = 0.0
    nics_per_node: int | None = None
    host_memory_gib: float | None = None
    host_memory_bandwidth_gb_per_s: float | None = None
    host_link_gb_per_s: float | None = None
    sm_count: int = 0
    cuda_context_gib: float | None = None
    host: HostCosts | None = None
    first_rank: int = 0
    first_node: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "peak_tflops", freeze(self.peak_tflops))
        object.__setattr__(self, "compute_efficiency", freeze(self.compute_efficiency))
        object.__setattr__(self, "backward_efficiency", freeze(self.backward_efficiency))

    @property
    def num_devices(self) -> int:
        """``nodes × devices_per_node``."""
        return self.nodes * self.devices_per_node

    @property
    def ranks(self) -> range:
        """The global ranks of this group."""
        return range(self.first_rank, self.first_rank + self.num_devices)

    @property
    def node_indices(self) -> range:
        """The global node indices of this group."""
        return range(self.first_node, self.first_node + self.nodes)

    @property
    def usable_memory_gib(self) -> float:
        """``memory_gib − reserved_memory_gib``: what a plan may fill per device."""
        return self.memory_gib - self.reserved_memory_gib

    def peak(self, dtype: str) -> float:
        """Peak dense TFLOP/s for ``dtype``; ``KeyError`` naming the listed dtypes if absent."""
        try:
            return self.peak_tflops[dtype]
        except KeyError:
            listed = ", ".join(self.peak_tflops)
            raise KeyError(f"{self.model} lists no peak for {dtype!r} (it lists {listed})") from None
