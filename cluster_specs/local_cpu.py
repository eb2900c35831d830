"""``local-cpu``: this machine as a cluster of CPU ranks talking gloo over loopback.

Generated at load time (``Cluster.load("local-cpu")``, ``local-cpu:devices=4``) so that plans
for it really run here. ``devices=N`` is the number of CPU ranks (default: one per core, the
cores this process may run on). ``fxplan launch`` runs every rank on one thread
(``OMP_NUM_THREADS=1``), so a rank gets at most one core, and with more ranks than cores the
ranks time-share the cores (each pinned to one, round robin: :mod:`fxplan.runtime.affinity`).
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

Without ``memory_gb_per_s``, the bandwidth the memory-bound classes' efficiencies
(``COMPUTE_EFFICIENCY``) are relative to moves with the core's in-cache vector rate ``V``
(``vector_gb_per_s``: the probe's GELU, add, softmax, layer norm and dropout on a 1 MiB
tensor), ``M = M₀ · V / V₀`` (the constants ``MEMORY_GB_PER_S_PER_CORE``,
``VECTOR_GB_PER_S_PER_CORE``; :func:`memory_bound_reference_gb_per_s`): the efficiencies were
measured on in-cache tensors, which run at the core's vector speed, against that bandwidth at
the ``V`` of the same moment (``benchmarks/op_class_calibration.py``). A DRAM copy probed
beside a launch moves with the neighbours' memory traffic instead, and the matmul rate with
the core's matrix units: on the host of session 24 the 1024³ matmul ran 2.2× the rate of the
host the constants were first measured on, the DRAM copy 0.8×, and gpt-tiny's memory-bound
nodes about 1.25×. Given only a matmul rate (a series probed before ``V`` was), ``M = M₀ · F /
F₀`` as before session 24 (``F₀ = MEMORY_REFERENCE_MATMUL_TFLOPS``, the matmul rate of M₀'s
probes).
    dtensor_op_us = h · DTENSOR_OP_US / s   (and the backward, both optimizer costs and the
                                             step overhead alike)

The loopback level (gloo) is CPU work too: gloo's threads copy, reduce and push the bytes
through loopback TCP on the same cores the ranks compute on, so both its per-byte rate and
its per-step cost run at the core share::

    bandwidth_gb_per_s = B · s        latency_us = h        step_cpu_us[K] = c_K / s

with ``B``, ``h``, ``c_K`` the constants of the spec's regime — ``GLOO_BUS_GB_PER_S``,
``GLOO_WAKEUP_US``, ``GLOO_STEP_CPU_US`` with a core per rank (``N ≤ C``),
``GLOO_BUS_SHARED_GB_PER_S``, ``GLOO_WAKEUP_SHARED_US``, ``GLOO_STEP_CPU_SHARED_US``
time-shared (``N > C``) — measured **in situ**: what one more collective adds to a launched
training step, where it comes after the model's compute on busy cores
(``benchmarks/gloo_in_situ.py``, session 26; not scaled by the probed eager op). In tight
loops of collectives the same collectives cost 2–3× less between ranks with a core each.

``fxplan launch`` pins every CPU rank to a core, round robin, where the ranks outnumber the
cores (:mod:`fxplan.runtime.affinity`; with a core each it leaves them to the scheduler), and
the calibration lines place their processes the same way (session 25): the time-shared
constants of ``η`` and of gloo describe pinned ranks.

Every constant below was measured on the 2-core machines these tests run on with
``python benchmarks/local_cpu_calibration.py`` (torch 2.13.0+cpu); the comment of each says
which line of its table and the values of the runs. ``nodes=N`` describes N such machines
joined by a 100 Gb/s Ethernet NIC each (schema: a cluster-scope level).
"""

from __future__ import annotations

import os
import platform
from functools import partial
from pathlib import Path
from typing import Any, Callable

from fxplan.cluster_specs.overrides import positive_float, positive_int
from fxplan.core.bounds import MAX_DEVICES_PER_NODE

#: fp32 matmul on one thread, TFLOP/s per core: ``2·1024³ / t`` of a one-thread 1024³ matmul on
#: the thread's CPU clock, median of 5 (``benchmarks/local_cpu_calibration.py``
#: ``matmul_tflops(1024, 5)``, the very function ``--probe`` runs before each launch of
#: ``benchmarks/measured_vs_predicted.py``; the calibration table's line "fp32 matmul 1024³, 1
#: thread" is the same function with 21 repeats). The median of the 204 probes of the four
#: series of session 25 (``benchmarks/data/measured_vs_predicted_s25_{pinned,pinned2,auto,
#: auto2}.json``, load average 1.4–3.6): 0.1455 (quartiles 0.142 / 0.150, range
#: 0.137–0.167) — the host the matmul class's efficiency (``COMPUTE_EFFICIENCY``) was last
#: measured against. (Sessions 20–24 used 0.0883, the median of the 51 probes of the quiet
#: series ``measured_vs_predicted_s20_quiet.json`` on a slower host, range 0.060–0.099: the
#: spec at its constants then priced this host's matmuls 1.6× slow.)
FP32_TFLOPS_PER_CORE = 0.1455
#: The matmul rate probed when ``MEMORY_GB_PER_S_PER_CORE`` was measured (the same 51 probes
#: of session 20): the ``F₀`` of a series probed before the vector rate was
#: (:func:`memory_bound_reference_gb_per_s`).
MEMORY_REFERENCE_MATMUL_TFLOPS = 0.0883
#: One-thread copy of a 128 MiB fp32 tensor (through DRAM), ``2·S / t`` (bytes read plus
#: written), median of 5 on the thread's CPU clock: ``copy_gb_per_s`` of the same script, the
#: probe's third rate. The median of the 51 probes of the quiet series above: 18.6 GB/s
#: (15.9–20.3). (It was 12.0, "≈ 13.7 GB/s rounded down" by another method.) In-cache ops do
#: not run at this rate: see ``COMPUTE_EFFICIENCY``.
MEMORY_GB_PER_S_PER_CORE = 18.6
#: One-thread in-cache vector rate, GB/s: ``vector_gb_per_s`` of ``benchmarks/
#: local_cpu_calibration.py`` (the probe's GELU, add, softmax, layer norm and dropout on a
#: 1 MiB fp32 tensor, bytes read + written over the summed thread CPU, each op's median of 5):
#: the ``V₀`` the memory-bound efficiencies below are relative to (module docstring), the
#: median of the five rounds' probes of the calibration run that measured them (session 24:
#: 5.80, 5.55, 5.78, 5.97, 6.03; ``benchmarks/data/op_class_calibration_s24.json``).
VECTOR_GB_PER_S_PER_CORE = 5.80
#: Eager PyTorch's fixed cost per kernel on one core (dispatch, autograd bookkeeping), µs.
#: Calibration line "eager tiny op, forward": 4.73, 4.62, 4.45 and 4.60 µs per op of a 200-op
#: chain on 8×8 tensors (median 4.61); "backward": 7.05, 6.31, 8.05 and 7.09 µs per op, i.e.
#: 4.5–5.8 µs per kernel over the cost model's mean 1.4 backward kernels of that chain's ops
#: (add, mul, gelu: 1; matmul, layer_norm: 2).
EAGER_OP_US = 4.61
#: ``DistributedDataParallel``'s main-thread host work per step (autograd hooks, bucket copies,
#: issuing and waiting for the all-reduce), µs: a part per step and one per parameter tensor
#: (:func:`fxplan.cost_model.host_overhead.ddp_host_s`). Calibration line "FSDP2 host work …"
#: (its DDP figure: the same model wrapped in DDP against it unwrapped, 18 and 98 tensors),
#: scaled to ``EAGER_OP_US`` like the FSDP2 figures below, the mean of the same two
#: invocations: 151 µs + 8.2 µs per tensor (alone: 205 + 7.6, 97 + 8.8; on gpt-tiny's 28
#: tensors 418 / 343 µs).
DDP_STEP_US, DDP_TENSOR_US = 151.0, 8.2
#: The pipeline runtime's host work per step and per microbatch of a stage, µs
#: (``torch.distributed.pipelining``'s schedule: batch split and actions; per microbatch the
#: received activations, the kept outputs, the backward through ``torch.autograd``, the sends
#: and receives posted). ``benchmarks/pipeline_host.py`` (session 26): a model of negligible
#: compute (``gpt:layers=2,hidden=8,heads=1,vocab=16``, sequence 8, batch 16) at ``pp=2`` on 2
#: ranks, gpipe with m = 1, 2, 4, 8, 16 microbatches and 1f1b with m = 2 … 16: each stage's
#: main-thread CPU in the schedule's step less the cost model's compute of the stage
#: (residuals 1.2–1.3 ms at m = 1, 2.1–2.6 at 4, 5.8–6.9 at 16), each divided by that
#: moment's ``h`` (probed eager op 5.0–5.6 µs), the least-squares line through the 18
#: residuals: 972 + 300·m µs (``benchmarks/data/pipeline_host_s26.json``).
PIPELINE_STEP_US, PIPELINE_MICROBATCH_US = 972.0, 300.0
#: Host cost of one training step beyond its kernels and the optimizer's step, on one core,
#: µs: the trainer's gradient clipping (the norm and the scaling, ``runtime/optim.py``), its
#: partial-gradient pass (``runtime/partial_grads.py``, nothing to reduce without sp) and
#: ``zero_grad``. Calibration line 10 (``python benchmarks/local_cpu_calibration.py --step``:
#: the runtime's one-rank gpt-tiny plan, batch 16, AdamW, each phase timed once per step in
#: the trainer's order, median of 30 steps, three fresh ranks, each scaled to the spec's eager
#: op by its own probe; session 22, load average 5–7 from other sessions' jobs): clip 388 +
#: partial 62 + zero 51 µs = 501 µs (raw, at the probed 5.26 µs eager op: 443, 72, 57 µs).
#: (It was 2146 µs: ``T_step − T_fb − t_opt`` of a 2-rank DDP step against a plain forward
#: and backward in a hot loop, less DDP's share — a difference that also held the runtime
#: step's page faults, ``FIRST_TOUCH_PAGE_US``, which the plain loop did not pay, and counted
#: AdamW's memory traffic twice.)
STEP_OVERHEAD_US = 501.0
#: Host cost of a view node (``view``, ``transpose``, ``split``, ``narrow``, ``getitem``: no
#: kernel, the roofline prices it 0) on one core, forward and backward, µs: dispatch, the view's
#: autograd node and, backward, its gradient's reshaping (``split``'s is a ``cat``). Calibration:
#: ``python benchmarks/op_class_calibration.py --rounds 3 --batches 4,8,16`` (gpt-tiny's
#: graph node by node, session 22, load average 21–24 from other sessions' jobs): the view
#: nodes' summed thread CPU over the number of view nodes run, scaled to the spec's eager op by
#: the round's probe; per round forward 6.18, 6.22, 6.17 µs, backward 8.93, 8.75, 9.44 µs (the
#: backward over every view node, as the cost model charges them; ``benchmarks/data/
#: op_class_calibration_s22.json``). Session 24, the same line on a quiet machine
#: (``--rounds 5``, load average 0.4–0.5): forward 5.33, 5.25, 5.24, 5.36, 5.61 µs, backward 7.81,
#: 7.55, 7.48, 7.86, 8.21 µs (``op_class_calibration_s24.json``). Session 25, same host, quiet
#: (``--rounds 3``, load average 2.7–2.8 from the line itself and the probes): forward 5.76,
#: 5.70, 5.72 µs, backward 9.95, 10.04, 10.42 µs; the medians
#: (``op_class_calibration_s25.json``; see ``COMPUTE_EFFICIENCY`` for why they moved).
VIEW_OP_US, VIEW_BACKWARD_OP_US = 5.72, 10.04
#: Fresh pages faulted in by a step's activations. glibc's malloc gives the free top of its
#: heap back to the kernel (``M_TRIM_THRESHOLD``, dynamic) when the step frees its
#: activations, and the next step faults the pages in again (zeroed) on first touch — a cost
#: the per-class efficiencies, measured in a loop whose heap stays warm, do not hold.
#: ``FIRST_TOUCH_PAGE_US``, µs per re-faulted 4 KiB page, calibration line 9
#: (``python benchmarks/local_cpu_calibration.py --first-touch``): gpt-tiny's step (forward,
#: loss, backward, clipping, AdamW, ``zero_grad``) at batch 16 in a fresh process, alternately
#: with the heap trimmed at every free and kept (``mallopt``), ``Δt / Δfaults`` (2560 faults,
#: 33.6 against 30.1 ms in the last run), scaled to the spec's eager op by each run's probe;
#: three runs 1.79, 1.74, 1.18 µs, the median (session 22, load average 5–6). (Filling a
#: freshly ``mmap``-ed buffer costs 1.44 µs a page: the in-step figure adds the cache misses of
#: the re-faulted data.)
FIRST_TOUCH_PAGE_US = 1.74
#: The share of a microbatch's saved activation bytes (the cost model's ``saved`` bytes)
#: faulted in again per step as a launched rank runs. fxplan's worker keeps its heap between
#: steps (:func:`fxplan.runtime.heap.keep_heap`: glibc's trim and mmap thresholds raised), so
#: the steady state re-faults almost nothing: same calibration line, the step in fresh
#: processes with the heap kept (3 × 20 steps per batch size), mean faults per step × 4 KiB
#: over the saved bytes: batch 4 0.012 (0–160 faults a step), batch 8 0.0087 (0–256), batch
#: 16 0.0056 (0–513); pooled 0.0073, the constant (session 22, load average 4–6; the same run
#: measured the page at 2.41, 1.82, 1.94 µs). With glibc's defaults, before the worker kept
#: its heap, the same line measured 0.39, 0.76, 0.26 (pooled 0.42: 0–3296 faults a step, a
#: step's share varying from none to all with the heap's layout), and the launched one-rank
#: worker re-faulted 1511 and 1835 pages a step at batch 16: 3–5 ms of a 32 ms step, which
#: keeping the heap removes from the step rather than pricing.
REFAULT_FRACTION = 0.0073
#: The page the kernel faults in (x86-64, no huge pages for malloc's heap).
PAGE_BYTES = 4096
#: Extra host cost of an op on a DTensor over the same op on a plain tensor, µs. Calibration
#: line "DTensor op extra (Replicate, 1-rank mesh): forward / backward" (200-op chain on 8×8
#: DTensors minus the same chain on tensors): 34.7 / 19.7 µs (torch 2.13.0+cpu, one run).
DTENSOR_OP_US = 34.7
DTENSOR_BACKWARD_OP_US = 19.7
#: Extra host cost of a view op (``view``, ``t``) on a DTensor over the same view on a plain
#: tensor, µs: ``F.linear`` on a 3-D DTensor dispatches ``t``, ``view``, ``addmm``, ``view``,
#: its backward 4 ``t`` and 3 ``view`` beside the two ``mm``s (counted on gpt-tiny's tp=2 sp
#: step). Calibration line "DTensor view op extra (view/t, Replicate, 1-rank mesh)" (a chain
#: of 200 views of an 8×8 tensor that needs a gradient, DTensor minus plain), three runs at load
#: average 25–26: 40.3, 47.3, 48.4 µs (a plain view: 1.28 µs) with the eager op at 5.13–5.24 µs
#: (median 5.145); the median 47.3 µs moved to the spec's ``EAGER_OP_US``:
#: 47.3 · 4.61 / 5.145 = 42.4 µs. (The same runs measured a non-view DTensor op at 21.9–22.5 µs:
#: a view costs DTensor about twice an ordinary op — its sharding propagation takes the shape.)
DTENSOR_VIEW_OP_US = 42.4
#: Main-thread host work of a tensor-parallel collective issued by DTensor's ``redistribute``
#: beyond the same collective issued with ``torch.distributed`` (planning the redistribution,
#: the functional collective's wrappers and wait), µs. Calibration line "main-thread CPU per
#: collective, 2 ranks, 1024×64 fp32" (gpt-tiny's residual stream; one run at load average
#: 15.4): all-gather 428 − 79 = 349 µs, reduce-scatter 377 − 129 = 248 µs; the mean, 298 µs,
#: was measured with the eager op at 5.43 µs (the rate probe of the same run), and host costs
#: move with the eager op (module docstring): 298 · 4.61 / 5.43 = 253 µs at the spec's
#: ``EAGER_OP_US``. (A ``Shard(0)`` op on a 2-rank mesh that communicates nothing costs about
#: what the ``Replicate`` one below does: 21.9 / 33.4 µs, same run.)
DTENSOR_REDISTRIBUTE_US = 253.0
#: Re-measured (session 22) as sequence parallelism issues it — the 16 × 64 × 64 stream split
#: on dim 1, the result used by one op so that the asynchronous collective's wait and unpacking
#: run, the plain side with the same transposed copies: calibration line "main-thread CPU per
#: collective used once" (``--redistribute``), six runs at load average 2–27, (all-gather +
#: reduce-scatter extra) / 2 at the spec's eager op: 266, 210, 247, 178, 149, 295 µs (median 229);
#: within its spread of the 253 above, which is kept.
#:
#: A redistribution that communicates nothing (``Replicate → Shard``: each rank keeps its
#: slice; ``Replicate → Partial`` of a row-parallel bias, ``Replicate → _MaskPartial`` of a
#: vocabulary-parallel lookup's indices), µs beyond the plain slice. Same calibration line
#: ("… without communication", ``Replicate → Shard(1)`` of the stream), six runs: 103, 103,
#: 114, 112, 184, 150 µs, median 112.8, with the eager op at 5.18–12.13 µs (median of the six
#: runs 6.12; the probe runs beside the other rank's and read twice 11–12 µs at load 2): 112.8 ·
#: 4.61 / 6.12 = 85.0 µs at the spec's ``EAGER_OP_US``.
DTENSOR_LOCAL_REDISTRIBUTE_US = 85.0
#: A tensor-parallel style's boundary (``parallelize_module``'s hooks): ``DTensor.from_local``
#: of a local tensor (a row-parallel Linear's input shard, a vocabulary-parallel lookup's
#: indices) beyond the plain view, and the autograd node of ``to_local`` (a column-parallel
#: Linear's output handed on as a local tensor: its backward wraps the local gradient as a
#: DTensor again, computing its global shape and stride), µs. Same calibration line
#: ("DTensor.from_local of a 16×64×128 shard …"), three runs: from_local 63.3, 57.4, 69.8 µs
#: extra (median 63.3), to_local's backward 151.6, 138.1, 153.3 µs (median 151.6), scaled by
#: the same 4.61 / 6.12: 47.7 and 114.2 µs. (In the launched tp=2 sp step, 20 steps at
#: batch 1, load 3.9, autograd node hooks: 9 ``_ToTorchTensorBackward`` nodes, 168 µs each.)
DTENSOR_FROM_LOCAL_US = 47.7
DTENSOR_TO_LOCAL_BACKWARD_US = 114.2
#: AdamW ``step`` per plain parameter tensor beyond its memory traffic (torch's per-tensor
#: loop on CPU: no ``foreach`` on CPU tensors), µs. Calibration line 10 (as
#: ``STEP_OVERHEAD_US``): ``set_lr`` + ``step`` once per step in the trainer's order, 1240 µs
#: for 28 tensors (137k parameters) at the probed rates, less the cost model's price of its
#: 28 bytes per parameter (``op_time("elementwise", 12·Ψ, 28·Ψ)``, 321 µs at the same
#: rates), per tensor, at the spec's eager op: three runs, the median 28.8 µs. (It was
#: 46.9 µs, the whole ``step`` of a hot loop over 28 tensors, memory traffic included — which
#: the cost model also priced on its own.) A DTensor parameter adds what DTensor's dispatch
#: adds to the same loop: calibration line "AdamW step per tensor, gpt-tiny (28 tensors):
#: plain / DTensor" (a hot loop of ``step`` over the 28 tensors, plain and as 1-rank
#: ``Replicate`` DTensors), session 25, quiet machine (load average 0.9–1.0), eager op
#: 4.59–4.61 µs (the spec's), three runs: 41.5 / 145.9, 42.3 / 147.6, 43.1 / 146.4 µs, the
#: DTensor's extra 104.4, 105.3, 103.3, the median 104.4; so 28.8 + 104.4 = 133.2 µs per
#: DTensor tensor beyond its memory traffic. (In the launched dp=4 ZeRO-3 step, 28 FSDP2
#: DTensor parameters, the optimizer phase's main-thread CPU was 4.5 ms: 160 µs a tensor with
#: its bytes and ``set_lr``, ``benchmarks/step_phases.py``. The constant was 232.2 µs, the
#: whole step per tensor measured once at load.)
OPTIMIZER_TENSOR_US = 28.8
DTENSOR_OPTIMIZER_TENSOR_US = 133.2
#: Resident set of a rank before its model exists (interpreter, torch, fxplan's runtime, a gloo
#: group): calibration line "process baseline … ru_maxrss", 0.307 GiB. ``fxplan launch``
#: reports a CPU rank's peak as its ``ru_maxrss``, so this is the fixed part of every peak.
PROCESS_BASELINE_GIB = 0.307
#: Time-sharing efficiency with more one-thread ranks than cores. Calibration line
#: "time-sharing" (``--sharing``: 1, C and 2C processes on C = 2 cores, gpt-tiny forward +
#: backward): η = 2·T_C / T_2C on a quiet machine, as the series it prices run (one process per
#: rank, nothing else; autogroup nice −19), the 2C processes pinned two to a core as ``fxplan
#: launch`` pins time-shared ranks (:mod:`fxplan.runtime.affinity`; session 25, five runs, the
#: first three with the C processes pinned too): 0.856, 0.859, 0.848, 0.862, 0.830, the
#: median. Each process of the 2C switched 273–289 times more over its 150 iterations than one
#: of the C (involuntary: the scheduler's time slices), 534, 555, 673, 625 and 689 µs of CPU
#: per added switch — the cache a rank refills after another rank ran on its core
#: (``benchmarks/data/gloo_cpu_s25.json``, "sharing"). (Unpinned: session 23 0.892,
#: 0.927, 0.881 (``benchmarks/data/gloo_cpu_s23_quiet.json``), session 24 on another host
#: 0.894, 0.925, 0.920, whose median 0.907 was the constant; session 25 on that host 0.844; at
#: load average 6–9 from other sessions' jobs 0.866, 0.888, 0.854.) The concurrency efficiency
#: of C ranks on C cores ``κ = T_1 / T_C`` measured 0.989, 0.969, 0.993 in the same runs: not
#: priced, ``s = 1`` for ``N ≤ C``.
TIME_SHARING_EFFICIENCY = 0.856
#: The core share ``η·C/N`` of the time-shared runs the shared regime's gloo constants were
#: measured in (4 ranks on 2 cores): they are stored per unit of share.
SHARE_MEASURED_AT = TIME_SHARING_EFFICIENCY * 2 / 4
#: What a rank's CPU pays to refill its caches after another rank ran on its core, µs: the
#: time-sharing line's "CPU per added switch" (``(CPU_2C − CPU_C) / (switches_2C −
#: switches_C)`` per process, gpt-tiny forward + backward at batch 4; the five runs above):
#: 534, 555, 673, 625, 689 µs, the median. ``η`` charges the switches the scheduler's time slices
#: make; a tensor-parallel collective of one data-parallel replica adds one more each time its
#: wait hands the core to another replica's rank (``switch_refill_us``,
#: :func:`fxplan.cost_model.host_overhead.evicted_waits_s`).
SWITCH_REFILL_US = 625.0
#: Per op class, the fraction of the matmul rate ``F`` (matmul) or of the memory-bound reference
#: ``M = M₀ · V / V₀`` (memory-bound classes; module docstring) that the class's nodes reach,
#: measured on the nodes of gpt-tiny's own graph at microbatch 4, 8 and 16 (s = 64) by
#: ``python benchmarks/op_class_calibration.py --rounds 5 --batches 4,8,16`` (thread CPU time
#: of each node as an fx interpreter runs it, autograd recording; ratio of sums over a class's
#: nodes, each node priced as the roofline does: ``t − t_launch = (w + w_half) / (R · η)``;
#: ``cost_model/class_efficiency.py``), each round against its own probes. Session 24, quiet
#: machine (load average 0.4–0.5), five rounds (forward): matmul 0.485–0.547, elementwise
#: 0.693–0.770, norm 0.352–0.388, softmax 0.498–0.564, dropout 0.068–0.073, loss 0.223–0.265,
#: embedding 0.392–0.431; the medians below (``benchmarks/data/op_class_calibration_s24.json``,
#: printed against ``V₀ = 6.1`` and scaled here to the run's own median ``V₀ = 5.80``). (Session
#: 21 measured them against ``M₀ · F / F₀`` on a host whose matmul ran at 0.45× this one's:
#: matmul 0.658, elementwise 0.603, norm 0.247, softmax 0.530, dropout 0.062, loss 0.229,
#: embedding 0.257; priced at this host's probed matmul rate those put gpt-tiny's one-rank
#: step 19 % under the measured one, ``docs/benchmarks.md``, session 24.) The forward linear
#: of a module is ≈ 0.52 of the bare 1024³ rate: its nodes carry the module call, the bias add
#: and autograd's recording; the attention's batched matmuls (head dim 16) are slower still.
#:
#: Session 25, the same host a day later, re-measured (``--rounds 3 --batches 4,8,16``, load
#: average 2.7–2.8, probes R 0.161–0.163 TFLOP/s, V 5.40–5.47 GB/s; ``benchmarks/data/
#: op_class_calibration_s25.json``), per round forward matmul 0.442, 0.455, 0.464, elementwise
#: 0.606, 0.591, 0.613, norm 0.327, 0.313, 0.329, softmax 0.528, 0.532, 0.531, dropout 0.071,
#: 0.070, 0.070, loss 0.198, 0.193, 0.199, embedding 0.337, 0.321, 0.338: the medians below,
#: 3–21 % under session 24's against the same probes. The host had slowed where the probes do
#: not see it: gpt-tiny's one-rank step took 27–28 ms (session 24: 19–22) while the probes read
#: R 0.14–0.16 (0.17–0.18) and V 5.2–5.7 (6.0–6.1); priced with session 24's efficiencies at
#: the probed rates the step came out 10–12 % short (``docs/benchmarks.md``, session 25). The
#: efficiencies hold for the state of the host they were measured in.
#: The memory-bound classes are in cache at these sizes (0.25–2 MiB) and run at the core's
#: vector speed: GELU, masked_fill, softmax and layer norm are arithmetic-bound (erf, exp,
#: broadcasts, a two-pass reduction), dropout draws one random number per element
#: (``bernoulli_``). Out of cache (64 MiB tensors, ``--out-of-cache``, informational) the same
#: ops read 0.13–0.23 of the copy (fresh pages of the output on every call; session 21), not
#: priced here.
COMPUTE_EFFICIENCY: dict[str, float] = {
    "matmul": 0.455, "elementwise": 0.606, "norm": 0.327, "softmax": 0.531,
    "dropout": 0.070, "loss": 0.198, "embedding": 0.337,
    # not measured (gpt-tiny has none of these nodes): unfused attention is priced as its
    # matmuls and softmax; the other memory-bound classes keep the roofline's default
    "attention": 0.6, "memory_bound": 0.8,
}
#: The same for the kernels of each class's backward, priced by ``cost_model.compute.BACKWARD``
#: (dropout's backward is an elementwise kernel): session 24's runs, per round matmul
#: 0.668–0.747 (bare ``mm`` calls, no module or bias: faster than the forward's linears),
#: elementwise 1.286–1.493 (the rule's two passes over the bytes; an add's backward passes its
#: gradient through without a kernel), norm 1.070–1.279, softmax 1.493–1.670, loss
#: 0.703–1.003, embedding 1.478–1.640 (medians 0.729, 1.443, 1.212, 1.610, 0.866, 1.570).
#: Session 25's runs (above): matmul 0.672, 0.691, 0.674, elementwise 1.228, 1.167, 1.192, norm
#: 0.967, 0.916, 0.920, softmax 1.296, 1.248, 1.287, loss 0.652, 0.631, 0.626, embedding 1.352,
#: 1.271, 1.304; the medians. Above 1: faster than the reference, in cache.
BACKWARD_EFFICIENCY: dict[str, float] = {
    "matmul": 0.674, "elementwise": 1.192, "norm": 0.920, "softmax": 1.287, "loss": 0.631,
    "embedding": 1.304,
}
#: The loopback level's constants are what gloo's collectives cost **inside a training step**
#: (session 26, ``benchmarks/gloo_in_situ.py``): one more blocking collective of each kind the
#: runtime issues (all-reduce, all-gather, broadcast, a send/recv ping-pong) at 4 B, 64 KiB,
#: 256 KiB and 1 MiB, issued after each attention and MLP of gpt-tiny's launched dp=N step —
#: from a millisecond or two of the model's compute, as a step's own collectives — against
#: the step without it, the ranks placed as ``fxplan launch`` places them; the least-squares
#: fit of the cost model's own form ``α + s·(h + c_K·f) + b·S/B`` to the 16 points of each
#: regime, each point the median of six runs (two invocations of three runs:
#: ``benchmarks/data/gloo_in_situ_s26.json``, ``…_s26_2.json``; pooled and fitted in
#: ``…_s26_pooled.json``. The invocations' own fits: a core per rank h 0 / 231 µs, B 1.695 /
#: 1.826 GB/s, all-reduce 859 / 605, all-gather 1494 / 940 — ``h`` and ``c`` trade off, the
#: per-collective prices agree within 0–30 %). In situ a collective
#: between ranks with a core each costs 1.3–2.8 ms where tight loops of collectives between
#: 0.1 ms bursts of compute (the constants before, ``local_cpu_calibration.py --gloo-cpu``)
#: said 0.3–1.8; between ranks time-sharing the cores it costs about what it did there for
#: small messages and half for large ones (a 1 MiB all-reduce 3.1 ms against 5.8: gloo's
#: threads move the bytes while the core's other rank computes, not at the core share).
#:
#: Bus bandwidth, GB/s: a core per rank (``N ≤ C``) 1.811; time-shared (``N > C``) 1.518 at
#: ``N = 4, C = 2``, stored per unit of core share (``B·s`` is the spec's, so ``N = 4``
#: reads the measurement). (Before: 0.978 from tight 4 MiB and 16 MiB all-reduces, times
#: ``s`` in both regimes.)
GLOO_BUS_GB_PER_S = 1.811
GLOO_BUS_SHARED_GB_PER_S = 1.518 / SHARE_MEASURED_AT
#: Per hop of a small gloo collective issued between bursts of compute, as training issues
#: them: calibration line "gloo all-reduce 4 B between compute, N ranks" ((work + AR) − work,
#: every rank computing ≈ 0.2–0.4 ms between all-reduces), (t − 6 µs α) / 2(n−1) hops. Two
#: runs: 2 ranks 1327 and 759 µs → 660 and 376 µs per hop; 4 ranks 3182 and 3697 µs → 529 and
#: 615 µs per hop; the median 572 µs. A waiting rank sleeps in gloo and must be woken and
#: scheduled again while the machine's cores are busy; between idle ranks ("gloo N ranks: hop
#: latency") the same all-reduce costs only 32–68 µs per hop, which priced every collective of
#: a training step ~10× too cheap. (Superseded in the spec by the split below: a wake-up per
#: step plus the kind's CPU per step at the core share; kept as the calibration's record.)
GLOO_HOP_LATENCY_US = 572.0

#: Per step of a gloo collective's algorithm (``2(n−1)`` all-reduce, ``n−1`` all-gather and
#: broadcast, 1 per message of a send/recv), µs, per kind: the in-situ fit above. A core per
#: rank: all-reduce 756, all-gather 1236, broadcast 836, send/recv 387, with hop latency
#: ``h`` 85. Time-shared, at ``N = 4, C = 2``: 174, 407, 222, 878 and ``h`` 133 µs; the
#: per-step figures stored times that core share (the spec divides by ``s``). (Before, from the tight loops, session 25: a core
#: per rank 192 / 245 / 122 / 53 and wake-up 193; time-shared 104 / 200 / 102 / 197 and 98.)
GLOO_STEP_CPU_US: dict[str, float] = {
    "all_reduce": 756.0, "all_gather": 1236.0, "broadcast": 836.0, "send_recv": 387.0,
}
GLOO_STEP_CPU_SHARED_US: dict[str, float] = {kind: us * SHARE_MEASURED_AT for kind, us in {
    "all_reduce": 174.0, "all_gather": 407.0, "broadcast": 222.0, "send_recv": 878.0,
}.items()}
#: The hop latency ``h`` of the fit (the spec's loopback ``latency_us``), µs.
GLOO_WAKEUP_US = 85.0
GLOO_WAKEUP_SHARED_US = 133.0

#: ``DistributedDataParallel``'s default ``bucket_cap_mb`` (torch 2.13), which the runtime
#: keeps (:mod:`fxplan.runtime.data_parallel`); the first bucket is 1 MiB
#: (:data:`fxplan.cost_model.host_overhead.DDP_FIRST_BUCKET_MIB`).
DDP_BUCKET_MIB = 25.0

#: Each further 4-byte broadcast of an async batch between bursts of compute (as
#: ``ZeroRedundancyOptimizer`` syncs its parameters), µs, per regime as gloo's per-step
#: constants. Calibration line "gloo async broadcast batch between compute, N ranks: 1 / 28 ×
#: 4 B ⇒ each further one" (``queued_collective_us``), session 25, quiet, the ranks placed as
#: the launcher places them, two runs: 2 ranks (a core each) 215 and 220 µs, 4 ranks (pinned,
#: two to a core) 816 and 823 µs; the means (``benchmarks/data/queued_collective_s25.json``).
#: One run at load average 18–22, unpinned, had read 657 and 508 (the constant was their mean,
#: 582). (The first of the batch — the ranks meeting — is a full collective.)
QUEUED_COLLECTIVE_US = 217.7
QUEUED_COLLECTIVE_SHARED_US = 819.3

#: FSDP2's main-thread host work per ``fully_shard`` group, µs: a part per group and one per
#: parameter tensor of the group (:mod:`fxplan.cost_model.fsdp_host`). Calibration line "FSDP2
#: host work per group per microbatch, 2 ranks, 9 groups (widths [1, 6])" (blocks of 1 and 6
#: Linear(64, 64), k = 2 and 12 tensors; thread CPU time against the unwrapped model), each
#: run scaled to the spec's eager op by its own probe (``· EAGER_OP_US / e``; host costs
#: move with it, module docstring). Two invocations (``--fsdp``: 3 runs of 21 interleaved
#: rounds each; the eager op probed at 6.24–6.58 and 6.40–7.00 µs, load average 12–19 from
#: other sessions' jobs), each the median over its runs of each scaled figure; the constants
#: split the mean of the two: unshard and hooks ``A`` 522 + 24.3·k µs (the invocations alone:
#: 520 + 16.8·k, 524 + 31.7·k), reduce ``R`` 269 + 3.4·k (250 + 5.6·k, 288 + 1.1·k), ZeRO-3's
#: re-gather ``B`` 219 + 21.4·k (166 + 38.4·k, 273 + 4.4·k; ``(T_3 − T_2)/n``: the root is
#: re-gathered too). The split into a group and a tensor part is the noisy part; a 12-tensor
#: group (a gpt-tiny layer) costs A 722 / 904, R 317 / 301, B 627 / 326 µs in the two.
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
