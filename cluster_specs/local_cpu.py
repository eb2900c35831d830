"""``local-cpu``: this machine as a cluster of CPU ranks talking gloo over loopback.

Generated at load time (``Cluster.load("local-cpu")``, ``local-cpu:devices=4``) so that plans
for it really run here. ``devices=N`` is the number of CPU ranks (default: one per core, the
cores this process may run on). ``fxplan launch`` runs every rank on one thread
(``OMP_NUM_THREADS=1``), so a rank gets at most one core, and with more ranks than cores the
ranks time-share the cores (each pinned to one, round robin: :mod:`fxplan.runtime.launch.affinity`).
With ``C`` cores each rank's share of a core is::

    s = 1                    if N ≤ C                             (core_share)
    s = η · C / N            if N > C

where ``η`` (``TIME_SHARING_EFFICIENCY``, measured) is what time-sharing loses to context
switches and to caches shared by more working sets (``η = 1``: a perfect split), and everything a rank does on its core, arithmetic *and* per-op overhead, is slowed by it::

    memory_gib                 = MemTotal / N                    (/proc/meminfo)
    peak_tflops.fp32           = FP32_TFLOPS_PER_CORE · s
    memory_bandwidth_gb_per_s  = MEMORY_GB_PER_S_PER_CORE · s
    kernel_launch_us           = EAGER_OP_US / s                 (dispatch + autograd per kernel)
    dtensor_op_us              = DTENSOR_OP_US / s               (DTensor dispatch per op, fwd)
    dtensor_backward_op_us     = DTENSOR_BACKWARD_OP_US / s      (… and its backward)
    dtensor_view_op_us         = DTENSOR_VIEW_OP_US / s          (… of a view op: view, t)
    dtensor_redistribute_us    = DTENSOR_REDISTRIBUTE_US / s     (DTensor's work per tp collective)
    dtensor_local_redistribute_us = DTENSOR_LOCAL_REDISTRIBUTE_US / s  (… without communication)
    dtensor_from_local_us      = DTENSOR_FROM_LOCAL_US / s       (a style's boundary, forward;
    dtensor_to_local_backward_us = DTENSOR_TO_LOCAL_BACKWARD_US / s   backward)
    optimizer_tensor_us        = OPTIMIZER_TENSOR_US / s         (AdamW per plain tensor)
    dtensor_optimizer_tensor_us = DTENSOR_OPTIMIZER_TENSOR_US / s (AdamW per DTensor tensor)
    step_overhead_us           = STEP_OVERHEAD_US / s            (training loop's host work)
    view_op_us, view_backward_op_us = VIEW_OP_US / s, VIEW_BACKWARD_OP_US / s  (per view node)
    switch_refill_us           = SWITCH_REFILL_US / s if N > C, else 0  (a cache refill per
                                                                 tp wait another replica fills)
    first_touch_us_per_mib     = ρ · 256 · FIRST_TOUCH_PAGE_US / s (activations faulted in again;
                                                                 ρ = REFAULT_FRACTION)
    ddp_step_us, ddp_tensor_us = DDP_STEP_US / s, DDP_TENSOR_US / s  (DDP's, where it runs)
    pipeline_step_us           = PIPELINE_STEP_US / s            (the pipeline schedule's host
    pipeline_microbatch_us     = PIPELINE_MICROBATCH_US / s       work per step, microbatch)
    comm_overlap               = 0                               (gloo needs the rank's core)
    ddp_bucket_mib             = 25                              (DDP's default bucket cap)
    queued_collective_us       = QUEUED_COLLECTIVE_US            (async batch: each further one;
                                                                 N > C: …_SHARED_US)
    fsdp_gather_us             = FSDP_GATHER_US / s              (FSDP2 per group, microbatch;
    fsdp_reduce_us             = FSDP_REDUCE_US / s               per step; ZeRO-3 re-gather;
    fsdp_regather_us           = FSDP_REGATHER_US / s             each + a part per tensor)
    reserved_memory_gib        = PROCESS_BASELINE_GIB            (interpreter, torch, gloo)
    compute_efficiency         = COMPUTE_EFFICIENCY              (per op class, measured)
    backward_efficiency        = BACKWARD_EFFICIENCY             (… of the backward kernels)

**Rates measured now.** The three per-core rates are the calibration's constants unless the
spec string gives them (``local-cpu:devices=4,matmul_tflops=0.09,memory_gb_per_s=10,
eager_op_us=5.4``: what ``benchmarks/local_cpu_calibration.py --probe`` measured a moment
ago). A shared machine's cores are not as fast under other tenants' load as when the constants
were measured (the one-thread fp32 matmul, on thread CPU time, measured 0.07–0.09 TFLOP/s at
load average 10–16 against 0.1666 at load ≈ 1), so a prediction meant to match a launch is
priced at the rates measured beside it. With ``F``, ``M``, ``e`` the given matmul rate,
bandwidth and eager op cost (default the constants), every host cost moves with the eager
op, ``h = e / EAGER_OP_US``::

    peak_tflops.fp32 = F · s       memory_bandwidth_gb_per_s = M · s       kernel_launch_us = e / s
    dtensor_op_us = h · DTENSOR_OP_US / s   (and the backward, both optimizer costs and the
                                             step overhead alike)

Without ``memory_gb_per_s``, the bandwidth the memory-bound classes' efficiencies
(``COMPUTE_EFFICIENCY``) are relative to moves with the core's in-cache vector rate ``V``
(``vector_gb_per_s``: the probe's GELU, add, softmax, layer norm and dropout on a 1 MiB
tensor), ``M = M₀ · V / V₀`` (the constants ``MEMORY_GB_PER_S_PER_CORE``,
``VECTOR_GB_PER_S_PER_CORE``; :func:`memory_bound_reference_gb_per_s`): the efficiencies were
measured on in-cache tensors, which run at the core's vector speed, against that bandwidth at
the ``V`` of the same moment (``benchmarks/op_class_calibration.py``). A DRAM copy probed
beside a launch moves with the neighbours' memory traffic instead, and the matmul rate with
the core's matrix units (one host ran the 1024³ matmul at 2.2× the rate of the host the
constants were first measured on, the DRAM copy at 0.8×, and gpt-tiny's memory-bound nodes at
about 1.25×). Given only a matmul rate (a series probed before ``V`` was), ``M = M₀ · F / F₀``
(``F₀ = MEMORY_REFERENCE_MATMUL_TFLOPS``, the matmul rate of M₀'s probes).

The loopback level (gloo) is CPU work too: gloo's threads copy, reduce and push the bytes
through loopback TCP on the same cores the ranks compute on, so both its per-byte rate and
its per-step cost run at the core share::

    bandwidth_gb_per_s = B · s        latency_us = h        step_cpu_us[K] = c_K / s

with ``B``, ``h``, ``c_K`` the constants of the spec's regime — ``GLOO_BUS_GB_PER_S``,
``GLOO_WAKEUP_US``, ``GLOO_STEP_CPU_US`` with a core per rank (``N ≤ C``),
``GLOO_BUS_SHARED_GB_PER_S``, ``GLOO_WAKEUP_SHARED_US``, ``GLOO_STEP_CPU_SHARED_US``
time-shared (``N > C``) — measured **in situ**: what one more collective adds to a launched
training step, where it comes after the model's compute on busy cores
(``benchmarks/gloo_in_situ.py``; not scaled by the probed eager op). In tight loops of
collectives the same collectives cost 2–3× less between ranks with a core each.
``fxplan launch`` pins every CPU rank to a core, round robin, where the ranks outnumber the
cores (:mod:`fxplan.runtime.launch.affinity`; with a core each it leaves them to the scheduler), and
the calibration lines place their processes the same way: the time-shared constants of ``η``
and of gloo describe pinned ranks.

Every constant below was measured on 2-core x86-64 machines (torch 2.13.0+cpu); each line says
its unit, the script (``benchmarks/local_cpu_calibration.py`` where none is named, with the
flag of its line) and the data file where the runs were kept. ``docs/local_cpu_history.md``
records when and how each was measured, its runs and the values it replaced. Host costs measured
at another eager op cost ``e`` are scaled to ``EAGER_OP_US`` by ``· EAGER_OP_US / e``.
``nodes=N`` describes N such machines joined by a 100 Gb/s Ethernet NIC each (schema: a
cluster-scope level).
"""

from __future__ import annotations

import os
import platform
from functools import partial
from pathlib import Path
from typing import Any, Callable

from fxplan.cluster_specs.overrides import positive_float, positive_int
from fxplan.core.bounds import MAX_DEVICES_PER_NODE

# -- rates of a core ------------------------------------------------------------------------
#: fp32 matmul, TFLOP/s per core: ``--probe``'s one-thread 1024³ matmul, median of 204 probes
#: (``measured_vs_predicted_2026-11-25_e1334ce_{pinned,pinned2,auto,auto2}.json``).
FP32_TFLOPS_PER_CORE = 0.1455
#: ``F₀``, TFLOP/s: the matmul rate probed beside ``MEMORY_GB_PER_S_PER_CORE``
#: (``measured_vs_predicted_2026-11-24_0a4deab_quiet.json``).
MEMORY_REFERENCE_MATMUL_TFLOPS = 0.0883
#: ``M₀``, GB/s: one-thread DRAM copy of 128 MiB, ``--probe``'s ``copy_gb_per_s``
#: (``measured_vs_predicted_2026-11-24_0a4deab_quiet.json``).
MEMORY_GB_PER_S_PER_CORE = 18.6
#: ``V₀``, GB/s: one-thread in-cache vector rate, ``--probe``'s ``vector_gb_per_s``
#: (``op_class_calibration_2026-11-24_c352b19.json``).
VECTOR_GB_PER_S_PER_CORE = 5.80
#: Eager op, µs per kernel (dispatch, autograd): calibration line "eager tiny op".
EAGER_OP_US = 4.61

# -- host costs of a step (µs at EAGER_OP_US) --------------------------------------------------
#: DDP's main-thread work, µs per step + per tensor (:func:`fxplan.cost_model.host.host_overhead.
#: ddp_host_s`): ``--fsdp``, its DDP figure.
DDP_STEP_US, DDP_TENSOR_US = 151.0, 8.2
#: The pipeline schedule's host work, µs per step + per microbatch of a stage:
#: ``benchmarks/pipeline_host.py`` (``pipeline_host_2026-11-25_42788fc.json``).
PIPELINE_STEP_US, PIPELINE_MICROBATCH_US = 972.0, 300.0
#: The trainer's host work per step (clipping, partial gradients, ``zero_grad``), µs: ``--step``.
STEP_OVERHEAD_US = 501.0
#: A view node's host cost, µs forward, backward: ``benchmarks/op_class_calibration.py``
#: (``op_class_calibration_2026-11-25_e1334ce.json``).
VIEW_OP_US, VIEW_BACKWARD_OP_US = 5.72, 10.04
#: A page of activations faulted in again, µs per 4 KiB page: ``--first-touch``.
FIRST_TOUCH_PAGE_US = 1.74
#: The share of a microbatch's saved bytes faulted in again per step, the worker's heap kept
#: (:func:`fxplan.runtime.train.heap.keep_heap`): ``--first-touch``.
REFAULT_FRACTION = 0.0073
#: The page the kernel faults in, bytes (x86-64, no huge pages for malloc's heap).
PAGE_BYTES = 4096
#: DTensor's extra per op over a plain tensor, µs forward, backward: "DTensor op extra".
DTENSOR_OP_US = 34.7
DTENSOR_BACKWARD_OP_US = 19.7
#: DTensor's extra per view op (``view``, ``t``), µs: "DTensor view op extra".
DTENSOR_VIEW_OP_US = 42.4
#: DTensor's main-thread work per tp collective beyond ``torch.distributed``'s, µs:
#: "main-thread CPU per collective" (checked by ``--redistribute``).
DTENSOR_REDISTRIBUTE_US = 253.0
#: A redistribution that communicates nothing, µs beyond the plain slice: ``--redistribute``.
DTENSOR_LOCAL_REDISTRIBUTE_US = 85.0
#: A tp style's boundary, µs: ``DTensor.from_local`` forward, ``to_local``'s backward:
#: ``--redistribute``.
DTENSOR_FROM_LOCAL_US = 47.7
DTENSOR_TO_LOCAL_BACKWARD_US = 114.2
#: AdamW per plain tensor beyond its memory traffic, µs: ``--step``.
OPTIMIZER_TENSOR_US = 28.8
#: AdamW per DTensor tensor beyond its memory traffic, µs: ``--step`` plus "AdamW step per
#: tensor … plain / DTensor".
DTENSOR_OPTIMIZER_TENSOR_US = 133.2
#: A rank's resident set before its model exists, GiB: "process baseline … ru_maxrss".
PROCESS_BASELINE_GIB = 0.307

# -- sharing the cores -----------------------------------------------------------------------
#: ``η``, time-sharing efficiency of pinned one-thread ranks: ``--sharing``
#: (``gloo_cpu_2026-11-25_e1334ce.json``, "sharing").
TIME_SHARING_EFFICIENCY = 0.856
#: The core share ``η·C/N`` of the time-shared gloo measurements (4 ranks on 2 cores): they are
#: stored per unit of share.
SHARE_MEASURED_AT = TIME_SHARING_EFFICIENCY * 2 / 4
#: A cache refill after another rank ran on the core, µs per switch: ``--sharing``
#: (``gloo_cpu_2026-11-25_e1334ce.json``); priced per time-shared tp wait
#: (:func:`fxplan.cost_model.host.host_overhead.evicted_waits_s`).
SWITCH_REFILL_US = 625.0

# -- per-class efficiencies ------------------------------------------------------------------
#: Fraction of ``F`` (matmul) or of ``M = M₀ · V / V₀`` (memory-bound classes) a class's forward
#: nodes reach: ``benchmarks/op_class_calibration.py --rounds 3 --batches 4,8,16``
#: (``op_class_calibration_2026-11-25_e1334ce.json``).
COMPUTE_EFFICIENCY: dict[str, float] = {
    "matmul": 0.455, "elementwise": 0.606, "norm": 0.327, "softmax": 0.531,
    "dropout": 0.070, "loss": 0.198, "embedding": 0.337,
    # not measured (gpt-tiny has none of these nodes): unfused attention is priced as its
    # matmuls and softmax; the other memory-bound classes keep the roofline's default
    "attention": 0.6, "memory_bound": 0.8,
}
#: The same for each class's backward kernels (``cost_model.compute.op_time.BACKWARD``; dropout's is
#: elementwise), same run. Above 1: faster than the reference, in cache.
BACKWARD_EFFICIENCY: dict[str, float] = {
    "matmul": 0.674, "elementwise": 1.192, "norm": 0.920, "softmax": 1.287, "loss": 0.631,
    "embedding": 1.304,
}

# -- gloo over loopback, in situ: benchmarks/gloo_in_situ.py ----------------------------------
# (gloo_in_situ_2026-11-25_42788fc.json, …_7f23801_2.json, fitted in …_7f23801_pooled.json)
#: Bus bandwidth, GB/s: a core per rank; time-shared (N = 4, C = 2) per unit of core share.
GLOO_BUS_GB_PER_S = 1.811
GLOO_BUS_SHARED_GB_PER_S = 1.518 / SHARE_MEASURED_AT
#: Per hop of a 4-byte all-reduce between bursts of compute, µs: "gloo all-reduce 4 B between
#: compute" (no longer priced: the wake-up and per-step split below replaced it).
GLOO_HOP_LATENCY_US = 572.0
#: CPU per step of a collective's algorithm, µs per kind: a core per rank; time-shared stored
#: times the share it was measured at (the spec divides by ``s``).
GLOO_STEP_CPU_US: dict[str, float] = {
    "all_reduce": 756.0, "all_gather": 1236.0, "broadcast": 836.0, "send_recv": 387.0,
}
GLOO_STEP_CPU_SHARED_US: dict[str, float] = {kind: us * SHARE_MEASURED_AT for kind, us in {
    "all_reduce": 174.0, "all_gather": 407.0, "broadcast": 222.0, "send_recv": 878.0,
}.items()}
#: The fit's hop latency ``h`` (the spec's loopback ``latency_us``), µs.
GLOO_WAKEUP_US = 85.0
GLOO_WAKEUP_SHARED_US = 133.0

#: ``DistributedDataParallel``'s default ``bucket_cap_mb`` (torch 2.13), MiB, which the runtime
#: keeps (:mod:`fxplan.runtime.styles.data_parallel`); the first bucket is 1 MiB
#: (:data:`fxplan.cost_model.host.host_overhead.DDP_FIRST_BUCKET_MIB`).
DDP_BUCKET_MIB = 25.0
#: Each further 4-byte broadcast of an async batch between bursts of compute, µs, per regime:
#: "gloo async broadcast batch between compute" (``queued_collective_2026-11-25_e1334ce.json``).
QUEUED_COLLECTIVE_US = 217.7
QUEUED_COLLECTIVE_SHARED_US = 819.3
#: FSDP2's main-thread work per ``fully_shard`` group, µs per group + per tensor
#: (:mod:`fxplan.cost_model.host.fsdp_host`): unshard, reduce, ZeRO-3's re-gather: ``--fsdp``.
FSDP_GATHER_US, FSDP_GATHER_TENSOR_US = 522.0, 24.3
FSDP_REDUCE_US, FSDP_REDUCE_TENSOR_US = 269.0, 3.4
FSDP_REGATHER_US, FSDP_REGATHER_TENSOR_US = 219.0, 21.4

#: Override keys the generator takes itself, each with the parser of its value
#: (``parse(key, value, spec_string)`` → the argument, or a ``ClusterSpecError``); the other keys
#: apply to the generated spec. ``devices``: the ranks; the others: per-core rates measured now
#: (module docstring).
GENERATOR_PARAMS: dict[str, Callable[[str, Any, str], Any]] = {
    "devices": partial(positive_int, high=MAX_DEVICES_PER_NODE),
    "matmul_tflops": positive_float,
    "memory_gb_per_s": positive_float,
    "vector_gb_per_s": positive_float,
    "eager_op_us": positive_float,
}


def cpu_cores() -> int:
    """Cores this process may run on (``sched_getaffinity``), else ``os.cpu_count()``."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def memory_gib() -> float:
    """Total memory from ``/proc/meminfo`` (``MemTotal``), else ``sysconf``."""
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024 / 2**30
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (or ``platform``)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "cpu"


def core_share(cores: int, ranks: int) -> float:
    """Share of one core each one-thread rank gets: 1 with a core each, else ``η · cores /
    ranks`` (module docstring)."""
    return 1.0 if ranks <= cores else TIME_SHARING_EFFICIENCY * cores / ranks


def memory_bound_reference_gb_per_s(matmul_tflops: float | None = None,
                                    vector_gb_per_s: float | None = None) -> float:
    """The bandwidth the memory-bound classes' efficiencies are relative to, at a moment whose
    probe measured ``vector_gb_per_s`` (``V``) or, without it, ``matmul_tflops`` (``F``):
    ``M₀ · V / V₀``, else ``M₀ · F / F₀``, else ``M₀`` (module docstring)."""
    if vector_gb_per_s is not None:
        return MEMORY_GB_PER_S_PER_CORE * vector_gb_per_s / VECTOR_GB_PER_S_PER_CORE
    if matmul_tflops is not None:
        return MEMORY_GB_PER_S_PER_CORE * matmul_tflops / MEMORY_REFERENCE_MATMUL_TFLOPS
    return MEMORY_GB_PER_S_PER_CORE


def local_cpu_spec(devices: int | None = None, *, matmul_tflops: float | None = None,
                   memory_gb_per_s: float | None = None, vector_gb_per_s: float | None = None,
                   eager_op_us: float | None = None) -> dict[str, Any]:
    """The schema-v1 spec of this machine with ``devices`` CPU ranks (default: one per core);
    the per-core rates default to the calibration's constants (module docstring)."""
    cores, total = cpu_cores(), memory_gib()
    ranks = devices or cores
    share = core_share(cores, ranks)
    shared = ranks > cores               # the time-shared regime of the gloo constants
    per_rank = total / ranks
    flops = FP32_TFLOPS_PER_CORE if matmul_tflops is None else matmul_tflops
    # in-cache ops run at the core's vector speed: without a measured bandwidth, the one the
    # class efficiencies were measured against moves with it (module docstring)
    bandwidth = (memory_bound_reference_gb_per_s(matmul_tflops, vector_gb_per_s)
                 if memory_gb_per_s is None else memory_gb_per_s)
    eager = EAGER_OP_US if eager_op_us is None else eager_op_us
    host = eager / EAGER_OP_US        # host costs move with the eager op's
    return {
        "schema_version": 1,
        "name": "local-cpu",
        "description": f"this machine: {cores} cores, {total:.1f} GiB; "
        f"{ranks} CPU ranks on gloo over loopback",
        "device_groups": [
            {
                "name": "cpu",
                "kind": "cpu",
                "model": cpu_model(),
                "nodes": 1,
                "devices_per_node": ranks,
                "memory_gib": round(per_rank, 3),
                # The process's own resident set (measured); never more than a quarter.
                "reserved_memory_gib": round(min(PROCESS_BASELINE_GIB, per_rank / 4), 3),
                "memory_bandwidth_gb_per_s": round(bandwidth * share, 4),
                "peak_tflops": {"fp32": round(flops * share, 5)},
                "intra_node_level": "loopback",
                "kernel_launch_us": round(eager / share, 3),
                "step_overhead_us": round(host * STEP_OVERHEAD_US / share, 1),
                "view_op_us": round(host * VIEW_OP_US / share, 3),
                "view_backward_op_us": round(host * VIEW_BACKWARD_OP_US / share, 3),
                # glibc gives the freed activations back between steps (measured)
                # another replica's rank runs while a tp collective waits (time-shared only)
                "switch_refill_us": round(SWITCH_REFILL_US / share, 1) if shared else 0.0,
                "first_touch_us_per_mib": round(
                    host * REFAULT_FRACTION * (2**20 // PAGE_BYTES) * FIRST_TOUCH_PAGE_US / share,
                    3),
                # Host and device are the same memory: "offloaded" states stay in this RAM
                # (the code path runs; the copies are memory-to-memory at the ranks' bandwidth).
                "host_memory_gib": round(total, 3),
                "host_memory_bandwidth_gb_per_s": round(bandwidth * cores, 4),
                "host_link_gb_per_s": round(bandwidth * share, 4),
                "dtensor_op_us": round(host * DTENSOR_OP_US / share, 3),
                "dtensor_backward_op_us": round(host * DTENSOR_BACKWARD_OP_US / share, 3),
                "dtensor_view_op_us": round(host * DTENSOR_VIEW_OP_US / share, 3),
                "dtensor_redistribute_us": round(host * DTENSOR_REDISTRIBUTE_US / share, 3),
                **{f"dtensor_{name}_us": round(host * value / share, 3) for name, value in (
                    ("local_redistribute", DTENSOR_LOCAL_REDISTRIBUTE_US),
                    ("from_local", DTENSOR_FROM_LOCAL_US),
                    ("to_local_backward", DTENSOR_TO_LOCAL_BACKWARD_US))},
                "optimizer_tensor_us": round(host * OPTIMIZER_TENSOR_US / share, 3),
                "dtensor_optimizer_tensor_us": round(host * DTENSOR_OPTIMIZER_TENSOR_US / share,
                                                     3),
                # One-thread ranks: gloo's threads need the core the compute runs on.
                "comm_overlap": 0.0,
                # The runtime's DDP (torch defaults: 25 MiB buckets, the first 1 MiB).
                "ddp_bucket_mib": DDP_BUCKET_MIB,
                "queued_collective_us": round(QUEUED_COLLECTIVE_SHARED_US if shared
                                              else QUEUED_COLLECTIVE_US, 1),
                "ddp_step_us": round(host * DDP_STEP_US / share, 3),
                "ddp_tensor_us": round(host * DDP_TENSOR_US / share, 3),
                "pipeline_step_us": round(host * PIPELINE_STEP_US / share, 3),
                "pipeline_microbatch_us": round(host * PIPELINE_MICROBATCH_US / share, 3),
                **{f"fsdp_{name}_us": round(host * value / share, 3) for name, value in (
                    ("gather", FSDP_GATHER_US), ("gather_tensor", FSDP_GATHER_TENSOR_US),
                    ("reduce", FSDP_REDUCE_US), ("reduce_tensor", FSDP_REDUCE_TENSOR_US),
                    ("regather", FSDP_REGATHER_US),
                    ("regather_tensor", FSDP_REGATHER_TENSOR_US))},
                # Measured per op class on gpt-tiny's nodes, relative to the per-core rates.
                "compute_efficiency": dict(COMPUTE_EFFICIENCY),
                "backward_efficiency": dict(BACKWARD_EFFICIENCY),
            }
        ],
        "levels": [
            {
                "name": "loopback",
                "kind": "loopback",
                "scope": "node",
                # gloo's per-byte and per-step work is CPU on the time-shared cores (``/ s``)
                "bandwidth_gb_per_s": round(
                    (GLOO_BUS_SHARED_GB_PER_S if shared else GLOO_BUS_GB_PER_S) * share, 4),
                "latency_us": GLOO_WAKEUP_SHARED_US if shared else GLOO_WAKEUP_US,
                "efficiency": 1.0,
                # gloo runs _reduce_scatter_base as a gloo:all_reduce of the whole input
                # (FSDP2's and DTensor's reduce-scatters, counted with torch.profiler)
                "reduce_scatter_as_all_reduce": True,
                "step_cpu_us": {kind: round(us / share, 1) for kind, us in (
                    GLOO_STEP_CPU_SHARED_US if shared else GLOO_STEP_CPU_US).items()},
            },
            {
                # Only used with nodes=N > 1. benchmarks/data/hardware.md: Ethernet 100 Gb/s =
                # 12.5 GB/s, "typical single-NIC cloud node"; efficiency and latency assumed.
                "name": "ethernet",
                "kind": "ethernet",
                "scope": "cluster",
                "bandwidth_gb_per_s": 12.5,
                "nics_per_node": 1,
                "latency_us": 14.0,
                "efficiency": 0.8,
                "reduce_scatter_as_all_reduce": True,      # gloo here too
            },
        ],
    }
