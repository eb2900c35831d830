"""Host work of a training step that a kernel's roofline does not see, and how much of the
communication can hide behind compute.

Every term is priced from a device group's host costs, ``DeviceGroup.host``
(:class:`~fxplan.cluster_specs.HostCosts`, µs; ``None`` on the GPU specs, where the host runs
ahead of asynchronous kernels and these costs hide unless the host is the bottleneck: every
term is then 0, and the stage pricing skips it; ``local-cpu`` measures them,
``benchmarks/local_cpu_calibration.py``):

**DTensor dispatch** of the ops that run on DTensors, ordinary and view ops, is priced per
node by :mod:`fxplan.cost_model.host.dtensor_dispatch`.

**DTensor's redistributions.** Every tensor-parallel collective the layout prices (the
``tp`` row: the reshards' all-gathers and reduce-scatters, the backward re-gathers) is issued
by DTensor's ``redistribute``, whose host work — planning the redistribution, wrapping the
functional collective, waiting on it — runs on the rank's main thread, before and after the
transfer, and cannot overlap it. With ``n_C`` such collectives in a chunk's forward (or
backward)::

    t_tp += n_C · dtensor_redistribute_us                       (:func:`redistribute_host_s`)

(measured on ``local-cpu``; 0 on the GPU specs, where the host runs ahead of the kernels).

**Waits that hand the core to another rank.** Where ranks time-share cores (more one-thread
CPU ranks than cores), a rank that blocks in a collective gives its core to another rank,
and finds its caches refilled with that rank's data when it comes back. The core share
(``η``) prices the switches the scheduler's time slices make; a blocking wait adds one
whenever the rank's core has another rank with work meanwhile:

- with one pipeline stage (``pp = 1``) every rank on the node runs the same step, so every
  blocking collective — the tp collectives, the data-parallel reductions, ZeRO's gathers and
  scatters, the buffer broadcasts, the loss and norm scalars — adds one (an async batch
  waited once, one);
- with ``pp > 1`` the ranks beside a stage run other stages, busy or idle as the schedule
  has it; priced only for the tp collectives of a stage with other data-parallel (or
  context-parallel) replicas on its node, which take no part in its chain and have work.

With ``n_W`` such waits in a chunk's forward (or backward), or in the step's reductions, and
``switch_refill_us`` the device's refill (0 without time-sharing)::

    t += n_W · switch_refill_us                                 (:func:`evicted_waits_s`)

(``local-cpu``: 4 pinned ranks on 2 cores; its refill is the time-sharing line's CPU per
added switch, measured, not fitted. 2026-11-25 (`42788fc`), with gloo priced in situ: without the term
the single-stage 4-rank plans were priced 10–29 % under their measured steps; with it dp=4
and its ZeRO stages are within −5…+20 %: ``docs/benchmarks.md``.)

**Optimizer's per-tensor loop.** An optimizer that steps one parameter tensor at a time
(PyTorch's default on CPU tensors: no ``foreach``, no fused kernel) pays a fixed host cost
per tensor, larger when the parameter is a DTensor (every one of its ~10 ops dispatches
through DTensor). With ``P`` plain and ``D`` DTensor parameter tensors on a rank::

    t_opt_host = P · optimizer_tensor_us + D · dtensor_optimizer_tensor_us

Parameters are DTensors under tensor parallelism (``tp > 1``: ``parallelize_module``
distributes every parameter of the modules it parallelizes) and under FSDP2 (ZeRO-2/3, and
ZeRO-1 with ``tp > 1``, which the runtime runs as FSDP2; :mod:`fxplan.runtime.styles.data_parallel`).

**Overlap of communication with compute.** ``comm_overlap`` ``ω ∈ [0, 1]`` is the fraction
of a collective that can run while the device computes: 1 on GPUs (own streams and copy
engines), 0 for one-thread CPU ranks, where gloo's threads need the same core as the
compute. A data-parallel bucket of ``t`` seconds ready at fraction ``f`` of the backward
becomes two transfers, ``ω·t`` ready at ``f`` and ``(1 − ω)·t`` ready at the backward's end
(exposed). ZeRO-3's per-segment all-gathers ``AG_k`` and reduce-scatters ``RS_k`` are
prefetched one segment ahead (:func:`zero3_exposed_s`).

**DDP's gradient buckets.** PyTorch's ``DistributedDataParallel`` (the runtime's wrapper for
ZeRO-0 and ZeRO-1 without tensor parallelism) does not reduce one bucket per model segment:
it packs the gradients, in backward order, into buckets of ``ddp_bucket_mib`` (25 MiB, the
first one ``DDP_FIRST_BUCKET_MIB`` = 1 MiB, ``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``)
and launches a bucket's all-reduce when its last gradient is ready. Over the per-segment
gradients ``(f_i, S_i)`` in backward order, a bucket closes after segment ``i`` once its
bytes reach the cap (``compute_bucket_assignment_by_size``: a tensor is added, then the
bucket is closed if full); it is ready at the ``f`` of its last segment and moves the sum
of its segments' bytes (:func:`ddp_buckets`). A small model is one all-reduce (gpt-tiny:
0.55 MB), one latency instead of one per segment — which matters where a collective's latency
is milliseconds (gloo between time-shared ranks). ``ddp_bucket_mib = 0`` (GPU specs) keeps
one bucket per segment.

**DDP's host work.** Where the runtime wraps a stage in ``DistributedDataParallel``
(``dp > 1``, ``tp = 1``, ZeRO-0/1: :func:`ddp_runs`) its autograd hooks and bucket copies
run on the main thread every step, with ``P`` parameter tensors (measured on ``local-cpu``,
0 on the GPU specs)::

    t_ddp = ddp_step_us + P · ddp_tensor_us                    (:func:`ddp_host_s`)

charged with the optimizer's host work; the device's ``step_overhead_us`` is the host work
every step has (clipping, the schedule, ``zero_grad``), DDP or not. Beside a zero-bubble
pipeline no DDP runs (the gradients are all-reduced in one pass after the step,
:mod:`fxplan.core.zero_bubble_dp`): that pass's copies into and out of its buckets are not
measured, and not charged.

**The pipeline runtime's host work.** Where ``pp > 1`` each stage runs
``torch.distributed.pipelining``'s schedule: per step it splits the batch and builds its
actions, per microbatch it prepares the received activations, keeps the outputs, runs the
backward through ``torch.autograd`` with the received gradient and posts the sends and
receives — main-thread work no op of the model accounts for (measured on ``local-cpu`` with a
model whose compute is negligible, ``benchmarks/pipeline_host.py``; 0 on the GPU specs)::

    t_pipeline = pipeline_step_us + m · pipeline_microbatch_us   per stage and step

half of the microbatch's part with each forward and each backward of a chunk, the step's part
with the optimizer's host work (:func:`pipeline_host_s`).

**DDP's buffer broadcasts.** DDP (``broadcast_buffers=True``, torch's default, which the
runtime keeps) broadcasts the stage's buffers from dp rank 0 before the first forward of every
step (the forward after one that synchronised gradients), one blocking broadcast per dtype
(``_broadcast_coalesced`` flattens the tensors of one dtype together): gpt-tiny's int64
positions and bool causal masks are 2 broadcasts per step, counted with ``torch.profiler``
(``gloo:broadcast``, 2 per step on a dp=2 rank). With ``B_d`` the bytes of the stage's
buffers of dtype ``d`` (:func:`ddp_buffer_bytes`)::

    t_buffers = Σ_d broadcast(B_d, G_dp)                       (only where DDP runs)

**First touch of a microbatch's activations.** A CPU rank's allocator (glibc's malloc)
gives the free top of its heap back to the kernel when a step frees its activations, and
the next microbatch faults those pages in again — zeroed by the kernel, missing the caches —
on first touch. The roofline's efficiencies were measured in a loop whose heap stays warm,
so this is priced on its own: with ``A`` the bytes the microbatch's nodes save for the
backward (the cost model's ``saved`` activations of a segment), a fraction ``ρ`` of which
is faulted in again (glibc's thresholds decide which steps; ``ρ`` is the measured mean)
at ``c`` per 4 KiB page, both folded into the spec's ``first_touch_us_per_mib``::

    t_touch = A / MiB · first_touch_us_per_mib          (= ρ · A / 4 KiB · c)
                                                         (:func:`first_touch_s`)

added to the segment's forward (and to a recomputed forward, which allocates them again:
the bytes the policy no longer keeps). 0 on the GPU specs: the CUDA caching allocator keeps
its blocks between steps.

**Async batches of collectives.** ZeRO-1 as the runtime runs it (``ZeroRedundancyOptimizer``
``_sync_params``) issues one broadcast per parameter tensor with ``async_op=True`` and then
waits for all of them. The ranks meet once, for the first; the others are queued behind it
in gloo's worker and run back to back. With the collectives' α-β times ``t_i`` and their
bandwidth terms ``t_i − ℓ_i`` (``ℓ_i``: the same collective of one byte), and ``q =
queued_collective_us`` (measured)::

    t_batch = t_1 + Σ_{i≥2} (t_i − ℓ_i + q)                  (q = 0: Σ t_i)

(:func:`async_batch_s`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Sequence

from fxplan.core.zero_bubble_dp import reduces_after_step
from fxplan.cost_model.compute.efficiency import family_of

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import HostCosts
    from fxplan.core.config import ParallelConfig

__all__ = ["DDP_FIRST_BUCKET_MIB", "async_batch_s", "ddp_buckets", "ddp_buffer_bytes",
           "ddp_host_s", "ddp_runs", "dtensor_params", "evicted_waits_s",
           "first_touch_s", "offload_runs", "optimizer_host_s", "overlapped_buckets",
           "pipeline_host_s", "redistribute_host_s", "runs_kernel", "zero3_exposed_s"]


#: DDP's first bucket, MiB (``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`` = 1024²).
DDP_FIRST_BUCKET_MIB = 1.0


def ddp_buckets(grads: Sequence[tuple[float, float]], cap_mib: float
                ) -> tuple[tuple[float, float], ...]:
    """DDP's buckets ``(ready fraction, bytes)`` from per-segment gradients ``(f_i, S_i)`` in
    backward order (module docstring); ``cap_mib = 0``: unchanged, one per segment."""
    if cap_mib <= 0:
        return tuple(grads)
    out: list[tuple[float, float]] = []
    cap, size, ready = min(DDP_FIRST_BUCKET_MIB, cap_mib) * 2**20, 0.0, 0.0
    for fraction, nbytes in grads:
        size, ready = size + nbytes, fraction
        if size >= cap:
            out.append((ready, size))
            cap, size = cap_mib * 2**20, 0.0
    if size > 0:
        out.append((ready, size))
    return tuple(out)


def async_batch_s(times: Sequence[float], latencies: Sequence[float], queued_s: float) -> float:
    """Seconds of a batch of collectives issued async and then waited (module docstring):
    ``times`` their α-β times, ``latencies`` the same collectives' times for one byte,
    ``queued_s`` the cost of each further one beyond its bandwidth (0: ``Σ times``)."""
    if not times:
        return 0.0
    if queued_s <= 0:
        return float(sum(times))
    return times[0] + sum(t - lat + queued_s for t, lat in zip(times[1:], latencies[1:]))


def runs_kernel(info: Any) -> bool:
    """Whether a captured node runs a kernel (a priced op class with FLOPs or bytes; views
    and ops without work run none, as :func:`cost_model.compute.op_time.op_time_s` prices them)."""
    moved = (info.bytes_read or 0) + (info.bytes_written or 0)
    return family_of(info.op_class) is not None and ((info.flops or 0) > 0 or moved > 0)


def redistribute_host_s(collectives: int, host: HostCosts | None) -> float:
    """``n_C · dtensor_redistribute_us`` seconds: DTensor's host work of ``collectives``
    tensor-parallel collectives (module docstring)."""
    return collectives * host.dtensor_redistribute_us * 1e-6 if host else 0.0


def evicted_waits_s(waits: int, host: HostCosts | None, others_have_work: bool) -> float:
    """``n_W · switch_refill_us`` seconds where the waiting rank's core has another rank with
    work meanwhile (``others_have_work``), else 0: the caches refilled after each of the
    ``waits`` blocking collectives handed the core over (module docstring)."""
    return waits * host.switch_refill_us * 1e-6 if host and others_have_work else 0.0


def offload_runs(config: ParallelConfig) -> bool:
    """Whether the runtime runs ``config``'s offload: ``optimizer+params`` keeps the parameter
    shards on the host with FSDP2's ``CPUOffloadPolicy``, so only where FSDP2 shards the
    parameters (``ParallelConfig.shards_params_with_fsdp``); ``optimizer`` (the runtime's host
    optimizer) and ``none`` at every ZeRO stage. The search offers
    (:func:`fxplan.inter_op.stage_zero.runnable_rungs`) and the runtime accepts
    (:func:`fxplan.runtime.apply.offload.check_runnable`) by this one rule, each pipeline rank
    under its own stage and offload."""
    return config.offload != "optimizer+params" or config.shards_params_with_fsdp


def ddp_runs(config: ParallelConfig) -> bool:
    """Whether the runtime wraps the stage in PyTorch DDP: ``dp > 1`` without tensor
    parallelism and without FSDP2 (ZeRO-0/1; :mod:`fxplan.runtime.styles.data_parallel`),
    unless a zero-bubble pipeline reduces after its step instead
    (:func:`fxplan.core.zero_bubble_dp.reduces_after_step`: no wrapper, no buffer broadcast)."""
    return (config.dp > 1 and config.tp == 1 and not config.shards_params_with_fsdp
            and not reduces_after_step(config))


def ddp_buffer_bytes(buffers: Iterable[tuple[str, float, str]], layers: Sequence[str],
                     stage_layers: Sequence[str], first: bool) -> tuple[float, ...]:
    """Bytes per dtype of one stage's buffers, in first-seen order (module docstring).
    ``buffers``: the model's ``(name, bytes, dtype)``; ``layers``: every layer's module path
    (``h.3``); a buffer under one of them belongs to the stage holding that layer
    (``stage_layers``), any other one (positions, …) to the ``first`` stage."""
    by_dtype: dict[str, float] = {}
    for name, nbytes, dtype in buffers:
        owner = next((layer for layer in layers if name.startswith(f"{layer}.")), None)
        if (owner in stage_layers) if owner is not None else first:
            by_dtype[dtype] = by_dtype.get(dtype, 0.0) + nbytes
    return tuple(by_dtype.values())


def pipeline_host_s(host: HostCosts | None) -> tuple[float, float, float]:
    """``(per forward, per backward, per step)`` seconds of the pipeline runtime's host work
    on a stage (module docstring): ``pipeline_microbatch_us / 2`` with each forward and each
    backward of a chunk, ``pipeline_step_us`` once a step."""
    if not host:
        return 0.0, 0.0, 0.0
    half = host.pipeline_microbatch_us / 2 * 1e-6
    return half, half, host.pipeline_step_us * 1e-6


def ddp_host_s(tensors: int, host: HostCosts | None) -> float:
    """``ddp_step_us + P·ddp_tensor_us`` seconds: DDP's host work per step with ``tensors``
    parameter tensors (module docstring)."""
    return (host.ddp_step_us + tensors * host.ddp_tensor_us) * 1e-6 if host else 0.0


def first_touch_s(saved_bytes: float, host: HostCosts | None) -> float:
    """``A / MiB · first_touch_us_per_mib`` seconds: the pages of ``saved_bytes`` of
    activations faulted in again on first touch (module docstring)."""
    return saved_bytes / 2**20 * host.first_touch_us_per_mib * 1e-6 if host else 0.0


def dtensor_params(config: ParallelConfig) -> bool:
    """Whether the runtime holds this configuration's parameters as DTensors (module
    docstring): tensor parallelism, or FSDP2 for the data-parallel sharding."""
    return config.tp > 1 or config.shards_params_with_fsdp


def optimizer_host_s(tensors: int, host: HostCosts | None, *, dtensor: bool) -> float:
    """``P·optimizer_tensor_us`` or ``D·dtensor_optimizer_tensor_us`` seconds for ``tensors``
    parameter tensors stepped one at a time (0 without host costs)."""
    if not host:
        return 0.0
    per_tensor = host.dtensor_optimizer_tensor_us if dtensor else host.optimizer_tensor_us
    return tensors * per_tensor * 1e-6


def overlapped_buckets(buckets: Sequence[tuple[float, float]],
                       overlap: float) -> tuple[tuple[float, float], ...]:
    """Gradient buckets ``(f, t)`` with only ``ω = overlap`` of each able to overlap the
    backward: ``(f, ω·t)`` and ``(1, (1 − ω)·t)`` (module docstring)."""
    if overlap >= 1.0:
        return tuple(buckets)
    out = [(f, overlap * t) for f, t in buckets if overlap > 0]
    out += [(1.0, (1.0 - overlap) * t) for _, t in buckets]
    return tuple(out)


def zero3_exposed_s(compute_fwd: Sequence[float], compute_bwd: Sequence[float],
                    gather: Sequence[float], scatter: Sequence[float],
                    overlap: float) -> tuple[float, float]:
    """Exposed ZeRO-3 communication of one chunk's forward and backward, seconds.

    Segments ``k = 0 … n−1`` in forward order with compute ``f_k`` / ``b_k`` and
    all-gather / reduce-scatter times ``AG_k`` / ``RS_k``; ``ω = overlap``. The forward
    gathers segment ``k+1`` while ``k`` computes; nothing runs before the first gather::

        fwd = AG_0 + Σ_{k<n−1} [ (1−ω)·AG_{k+1} + max(0, ω·AG_{k+1} − f_k) ]

    The backward runs the segments in reverse order ``j``; while ``j`` computes, the stream
    gathers the next segment to run and reduce-scatters the previous one's gradients
    (``c_j``); the first gather and the last reduce-scatter have nothing to hide behind::

        bwd = AG_{n−1} + RS_0 + Σ_j [ (1−ω)·c_j + max(0, ω·c_j − b_j) ],
        c_j = AG_{j−1} (j > 0) + RS_{j+1} (j < n−1)

    With ``ω = 0`` (nothing overlaps) this is ``Σ AG`` forward and ``Σ (AG + RS)`` backward.
    """
    n = len(gather)
    if n == 0:
        return 0.0, 0.0
    fwd = gather[0]
    for k in range(n - 1):
        fwd += (1 - overlap) * gather[k + 1] + max(0.0, overlap * gather[k + 1] - compute_fwd[k])
    bwd = gather[n - 1] + scatter[0]
    for j in range(n):
        c = (gather[j - 1] if j > 0 else 0.0) + (scatter[j + 1] if j < n - 1 else 0.0)
        bwd += (1 - overlap) * c + max(0.0, overlap * c - compute_bwd[j])
    return fwd, bwd
