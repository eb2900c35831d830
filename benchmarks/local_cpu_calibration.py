"""Measure the constants of the ``local-cpu`` cluster spec on this machine and print a table.

    python benchmarks/local_cpu_calibration.py [--quick]
    python benchmarks/local_cpu_calibration.py --probe      # the per-core rates now, JSON

Every figure is a median; CPU-bound figures are read on the thread's CPU clock
(``time.thread_time``), so they are the time on a core of one's own even when the machine is
shared (the spec divides them among ranks itself, see :mod:`cluster_specs.local_cpu`). Every
spawned process is placed as ``fxplan launch`` places its ranks (:mod:`fxplan.runtime.launch.affinity`:
pinned to a core, round robin, where they outnumber the cores; 2026-11-25 (`e1334ce`)), so the lines
measure what a launched rank does; ``FXPLAN_CPU_AFFINITY=none`` (or ``core``) measures
processes never (always) pinned.

1. **matmul** — one thread, ``n×n @ n×n`` fp32, ``n`` ∈ {256, 512, 1024}:
   ``rate = 2n³ / t`` (TFLOP/s per core).
2. **eager overhead per op** — a chain of ``K`` ops on an 8×8 tensor, forward alone and
   forward+backward (autograd): ``t_fwd = T_fwd / K``, ``t_bwd = (T_fwd+bwd − T_fwd) / K``.
   The work is negligible, so this is PyTorch's dispatch + autograd cost per kernel.
3. **gloo all-reduce** — ``n`` ∈ {2, 4} processes, ``collectives_table.measure_gloo`` (wall
   clock, median over 15 repetitions of rank 0's time):
   ``hop latency = (t(4 B) − α) / 2(n−1)`` with ``α`` the cost model's per-collective base
   (``cost_model/data/collectives.json``), and bus bandwidth from two sizes ``S₁ < S₂``:
   ``B = 2(n−1)/n · (S₂ − S₁) / (t(S₂) − t(S₁))`` (the latency term cancels).
4. **memory-bound ops** — one thread, ``x`` of 4×64×256 fp32 (gpt-tiny's MLP activation at
   batch 4): effective bandwidth ``(bytes read + written) / t`` of ``copy``, ``dropout``
   (train mode, ``p`` = 0.1), ``gelu``, ``softmax``; the spec's ``compute_efficiency`` of a
   memory-bound class is its bandwidth over the copy's.
5. (was the step overhead, ``T_step − T_fb − t_opt`` of a 2-rank DDP step against a plain
   forward + backward in a warm loop: replaced by 8. and 9.)
0. **probe** (``--probe``, under a second) — the per-core rates the ``local-cpu`` spec takes
   as ``matmul_tflops``, ``memory_gb_per_s``, ``vector_gb_per_s``, ``eager_op_us``
   (:func:`rate_probe`): the 1024³ matmul of 1., the eager op of 2. (forward, the chain of
   ``CHAIN`` ops), the one-thread copy of a 128 MiB tensor, ``2·S / t`` (bytes read +
   written; the figure behind ``MEMORY_GB_PER_S_PER_CORE``), and the in-cache vector rate
   (:func:`vector_gb_per_s`: GELU, add, softmax, layer norm and dropout on a 1 MiB tensor;
   ``VECTOR_GB_PER_S_PER_CORE``, which the memory-bound classes move with; 2026-11-24 (`c352b19`)).
   ``benchmarks/measured_vs_predicted.py`` runs it beside every launch, so that a launch is
   priced at the rates of its moment of a shared machine.
6. **time-sharing** — ``N`` one-thread processes, ``N = 1``, ``N = C`` (the cores) and
   ``N = 2C``, all running gpt-tiny forward + backward at batch 4 for a fixed number of
   iterations; ``T_N`` is the median over processes of their wall time, each ``N`` run
   ``rounds`` times interleaved and the medians taken. Were sharing the machine free,
   ``T_C = T_1`` and ``T_2C = 2·T_C``; the concurrency efficiency is ``κ = T_1 / T_C`` (one
   process per core, each beside the others: the shared last-level cache, memory bandwidth,
   the kernel's page and allocator work) and the time-sharing efficiency ``η = 2·T_C / T_2C``
   (context switches, caches shared by more working sets). Each process also reports its
   CPU (all threads) and its voluntary and involuntary context switches over the loop, so
   that ``(CPU_2C − CPU_C) / (switches_2C − switches_C)`` is what a switch costs the process
   that comes back to its core.
7. **FSDP2 and DDP host work** (``--fsdp`` alone) — on 2 loopback gloo ranks, a model of
   8 blocks of ``w`` ∈ {1, 6} ``Linear(64, 64)`` and a root ``Linear``, forward + backward
   on the main thread's CPU clock, unwrapped, under DDP, and under ``fully_shard`` (every
   block and the root) as ZeRO-2 with gradient sync off and on and as ZeRO-3: FSDP2's work
   per group and microbatch (unshard and hooks), per group and step (the reduce), ZeRO-3's
   re-gather per group and microbatch, and DDP's per step, each as a part per group (step)
   plus a part per tensor (:func:`fsdp_host_us`).
8. **gloo's CPU per collective** (``--gloo-cpu`` alone) — ``n`` ∈ {2, 4} loopback ranks on
   this machine's cores, each kind the runtime issues (all-reduce, broadcast, all-gather,
   reduce-scatter, and a send/recv pair on 2 ranks) at sizes ``S`` from 4 B to 1 MiB, each
   rank looping ``work; collective`` (``work``: 4 one-thread 128³ matmuls, as line
   "gloo all-reduce between compute") and the same loop without the collective, in
   alternating runs: per collective, the added **wall** time, the added **main-thread CPU**
   (issuing and waiting) and the added **CPU of the rank's other threads** (``process_time
   − thread_time``: gloo's worker and transport threads — copies, reductions, loopback TCP
   in the kernel), and the same with ``work`` left out (idle ranks). A least-squares line per
   kind and rank count, ``c(S) = c₀ + c₁·S``, of the collective's whole CPU (main + other
   threads, every rank's mean) is its per-call and per-byte core time (:func:`gloo_cpu_us`).
   (The spec's loopback constants were these until 2026-11-25 (`42788fc`); they are now measured inside
   a launched training step, ``benchmarks/gloo_in_situ.py``, where the same collectives cost
   2–3× more between ranks with a core each.)
9. **first touch** (also ``--first-touch`` alone, as JSON) — gpt-tiny's training step (forward, loss,
   backward, clipping, AdamW, ``zero_grad``) in fresh processes, one thread, counting the
   main thread's minor page faults per step (``getrusage(RUSAGE_THREAD)``): the cost of a
   re-faulted 4 KiB page inside the step (the heap trimmed at every free against kept, set
   with glibc's ``mallopt``; ``Δt / Δfaults``), and with the heap as a launched rank keeps it
   (:func:`fxplan.runtime.train.heap.keep_heap`) the mean share of the microbatch's saved activation bytes faulted in
   again per step, at batch 4, 8 and 16 (:func:`first_touch`).
10. **the trainer's host work after ``train_step``** (also ``--step`` alone, as JSON) — the runtime's
   one-rank gpt-tiny plan at batch 16, each phase once per step in the trainer's order:
   clipping, the partial-gradient pass and ``zero_grad`` (the spec's step overhead), and
   AdamW's step less the cost model's price of its memory traffic, per tensor
   (:func:`step_host_us`).
11. **gangs** (``--gangs`` alone; not in the full run) — 4 one-thread ranks on the cores in
   independent groups: the wall a blocking all-reduce (4 B, 64 KiB) adds between bursts of
   compute in 2 groups of 2, against 1 group of 4 and a lone group of 2; and a one-microbatch
   two-stage pipeline of 2-rank stages, whose busy ranks' core share is
   ``2·Δwork(lone pair)/Δpipeline`` between 4 and 40 matmuls a burst (:func:`gangs_us`;
   informational, nothing in the spec is set from it).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import socket
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

SIZES = (256, 512, 1024)
CHAIN = 200
ALLREDUCE_BYTES = (4, 4 * 2**20, 16 * 2**20)


def _median_thread_time(fn: Callable[[], object], *, repeats: int, inner: int = 1) -> float:
    """Median over ``repeats`` of the thread CPU time of ``inner`` calls, per call (s)."""
    fn()
    fn()
    samples = []
    for _ in range(repeats):
        start = time.thread_time()
        for _ in range(inner):
            fn()
        samples.append((time.thread_time() - start) / inner)
    return statistics.median(samples)


def matmul_tflops(n: int, repeats: int) -> float:
    """One-thread fp32 ``n×n @ n×n`` rate, TFLOP/s: ``2n³ / t``."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    inner = max(1, int(2e8 // (2 * n**3)))
    t = _median_thread_time(lambda: a @ b, repeats=repeats, inner=inner)
    return 2 * n**3 / t / 1e12


def _op_chain_s(make: Callable[[torch.Tensor], torch.Tensor],
                repeats: int, backward: bool = True) -> tuple[float, float]:
    """Per-op forward and backward seconds of a chain of ``CHAIN`` tiny ops (add, mul, gelu,
    matmul, layer norm on 8×8) whose tensors ``make`` builds (plain, or ``DTensor``);
    ``backward=False``: the forward only (NaN for the backward)."""
    w = make(torch.randn(8, 8)).requires_grad_()
    x0 = make(torch.randn(8, 8)).requires_grad_()
    ops = (lambda x: x + 1.0, lambda x: x * w, torch.nn.functional.gelu, lambda x: x @ w,
           lambda x: torch.nn.functional.layer_norm(x, (8,)))
    return _chain_per_op_s(ops, x0, repeats, backward=backward)


def _chain_per_op_s(ops: tuple[Callable[[torch.Tensor], torch.Tensor], ...], x0: torch.Tensor,
                    repeats: int, backward: bool = True,
                    loss: Callable[[torch.Tensor], torch.Tensor] = lambda y: y.sum(),
                    ) -> tuple[float, float]:
    """Per-op forward and backward seconds of ``CHAIN`` ops applied in turn from ``x0``:
    ``t_fwd / CHAIN`` and ``(t_fwd+bwd − t_fwd) / CHAIN`` (thread CPU time, median of
    ``repeats``); ``loss`` turns the chain's output into the scalar the backward starts from;
    ``backward=False``: NaN for the backward."""

    def forward() -> torch.Tensor:
        x = x0
        for i in range(CHAIN):
            x = ops[i % len(ops)](x)
        return x

    fwd = _median_thread_time(forward, repeats=repeats)
    if not backward:
        return fwd / CHAIN, float("nan")
    both = _median_thread_time(lambda: loss(forward()).backward(), repeats=repeats)
    return fwd / CHAIN, (both - fwd) / CHAIN


def copy_gb_per_s(repeats: int, mib: int = 128) -> float:
    """One-thread copy of a ``mib`` MiB fp32 tensor (larger than the caches): ``2·S / t``,
    GB/s (bytes read + written)."""
    x = torch.randn(mib * 2**18)
    out = torch.empty_like(x)
    return 2 * x.numel() * 4 / _median_thread_time(lambda: out.copy_(x), repeats=repeats) / 1e9


#: The in-cache vector ops of :func:`vector_gb_per_s` and the tensors each reads and writes
#: (in units of its input's size): the memory-bound classes the cost model prices
#: (elementwise, softmax, norm, dropout) as one representative each.
VectorOp = tuple[Callable[[torch.Tensor, torch.Tensor], torch.Tensor], int]
VECTOR_OPS: dict[str, VectorOp] = {
    "gelu": (lambda x, y: torch.nn.functional.gelu(x), 2),
    "add": (lambda x, y: x + y, 3),
    "softmax": (lambda x, y: torch.softmax(x, -1), 2),
    "layer_norm": (lambda x, y: torch.nn.functional.layer_norm(x, (x.shape[-1],)), 2),
    "dropout": (lambda x, y: torch.nn.functional.dropout(x, 0.1, training=True), 2),
}


def _op_seconds(ops: dict[str, VectorOp], x: torch.Tensor, y: torch.Tensor, *, repeats: int,
                inner: int) -> dict[str, float]:
    """Each op's ``fn(x, y)``: the median over ``repeats`` of the thread CPU time of ``inner``
    calls, per call (s)."""
    return {name: _median_thread_time(lambda fn=fn: fn(x, y), repeats=repeats, inner=inner)
            for name, (fn, _) in ops.items()}


def vector_gb_per_s(repeats: int, kib: int = 1024) -> float:
    """One-thread in-cache vector rate, GB/s: the :data:`VECTOR_OPS` on a ``kib`` KiB fp32
    tensor (256 rows; in L2, as a small model's activations are), ``Σ bytes / Σ t`` (bytes
    read + written, thread CPU time, each op's median of ``repeats``). What the memory-bound
    op classes run at on this core, which moves with neither the matmul rate nor the DRAM
    copy from one host to another (module docstring, 0.)."""
    x = torch.randn(256, kib * 1024 // (256 * 4))
    size = x.numel() * x.element_size()
    seconds = _op_seconds(VECTOR_OPS, x, torch.randn_like(x), repeats=repeats, inner=10)
    return sum(size * passes for _, passes in VECTOR_OPS.values()) / sum(seconds.values()) / 1e9


def rate_probe(repeats: int = 5) -> dict[str, float]:
    """The per-core rates of this moment (module docstring, 0.): matmul TFLOP/s (1024³),
    copy GB/s, in-cache vector GB/s, eager op µs (forward of a tiny-op chain), and the load
    average."""
    return {"matmul_tflops": matmul_tflops(1024, repeats),
            "memory_gb_per_s": copy_gb_per_s(repeats),
            "vector_gb_per_s": vector_gb_per_s(repeats),
            "eager_op_us": _op_chain_s(lambda t: t, repeats, backward=False)[0] * 1e6,
            "load": os.getloadavg()[0]}


def eager_overhead_us(repeats: int) -> dict[str, float]:
    """Per-op forward and backward cost of tiny eager ops (µs): a chain of ``CHAIN`` ops."""
    fwd, bwd = _op_chain_s(lambda t: t, repeats)
    return {"forward_us": fwd * 1e6, "backward_us": bwd * 1e6,
            "forward_backward_us": (fwd + bwd) * 1e6}


def _single_rank_group() -> None:
    """A one-rank gloo group on a free loopback port (DTensor needs a device mesh)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0,
                                world_size=1)


def dtensor_overhead_us(repeats: int) -> dict[str, float]:
    """Extra host cost of an op on a ``DTensor`` over the same op on a plain tensor (µs): the
    chain of :func:`_op_chain_s` on 8×8 ``DTensor``s (``Replicate`` on a one-rank mesh,
    so no communication), ``t_dtensor − t_plain`` per op, forward and backward; then AdamW's
    ``step`` per parameter tensor on plain and on ``DTensor`` parameters (gpt-tiny's
    shapes): the optimizer's host cost per tensor and what DTensor adds to it."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate

    from fxplan.examples.model_spec import resolve_model

    _single_rank_group()
    mesh = init_device_mesh("cpu", (1,))

    plain = _op_chain_s(lambda t: t, repeats)
    dtensor = _op_chain_s(lambda t: DTensor.from_local(t, mesh, [Replicate()]), repeats)

    def adamw(wrap: Callable[[torch.Tensor], torch.Tensor]) -> tuple[int, float]:
        model = resolve_model("gpt-tiny").build("cpu")
        params = [torch.nn.Parameter(wrap(p.detach().clone())) for p in model.parameters()]
        for p in params:
            p.grad = torch.zeros_like(p)
        opt = torch.optim.AdamW(params, lr=1e-3)
        return len(params), _median_thread_time(opt.step, repeats=repeats) / len(params)

    tensors, opt_plain = adamw(lambda t: t)
    _, opt_dtensor = adamw(lambda t: DTensor.from_local(t, mesh, [Replicate()]))
    return {"forward_us": (dtensor[0] - plain[0]) * 1e6,
            "backward_us": (dtensor[1] - plain[1]) * 1e6,
            "plain_forward_us": plain[0] * 1e6, "plain_backward_us": plain[1] * 1e6,
            "adamw_tensors": tensors, "adamw_per_tensor_us": opt_plain * 1e6,
            "adamw_dtensor_per_tensor_us": opt_dtensor * 1e6}


def dtensor_view_overhead_us(repeats: int) -> dict[str, float]:
    """Extra host cost of a *view* op on a ``DTensor`` over the same view on a plain tensor
    (µs per op): a chain of ``CHAIN`` views of an 8×8 tensor that needs a gradient
    (``view(4, 16)``, ``view(8, 8)``, ``t()``, ``t()``: the ops ``F.linear`` and its backward
    dispatch around the matmul on a 3-D input), ``Replicate`` on a one-rank mesh (no
    communication), forward, ``t_dtensor − t_plain``; and the plain view's own cost."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate

    _single_rank_group()
    mesh = init_device_mesh("cpu", (1,))
    ops = (lambda x: x.view(4, 16), lambda x: x.view(8, 8), lambda x: x.t(), lambda x: x.t())
    plain = _chain_per_op_s(ops, torch.randn(8, 8).requires_grad_(), repeats, backward=False)
    dtensor = _chain_per_op_s(ops, DTensor.from_local(torch.randn(8, 8), mesh,
                                                      [Replicate()]).requires_grad_(),
                              repeats, backward=False)
    return {"view_us": (dtensor[0] - plain[0]) * 1e6, "plain_view_us": plain[0] * 1e6}


def _sharded_chain_worker(rank: int, world: int, port: int, repeats: int, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    _join_gloo(rank, world, port)
    mesh = init_device_mesh("cpu", (world,))
    # the chain's activations sharded on their rows (tp's sequence split), its weight
    # replicated: every op propagates Shard(0) and runs locally, no collective
    # (the multiply by a replicated row vector: the plain chain's 8×8 weight would not
    # broadcast against the global (8·world)×8 activation)
    w = DTensor.from_local(torch.randn(8, 8), mesh, [Replicate()]).requires_grad_()
    v = DTensor.from_local(torch.randn(8), mesh, [Replicate()]).requires_grad_()
    x0 = DTensor.from_local(torch.randn(8, 8), mesh, [Shard(0)]).requires_grad_()
    ops = (lambda x: x + 1.0, lambda x: x * v, torch.nn.functional.gelu, lambda x: x @ w,
           lambda x: torch.nn.functional.layer_norm(x, (8,)))
    sharded = _chain_per_op_s(ops, x0, repeats, loss=lambda y: y.to_local().sum())
    plain = _op_chain_s(lambda t: t, repeats)
    if rank == 0:
        Path(out).write_text(json.dumps({"forward_us": (sharded[0] - plain[0]) * 1e6,
                                         "backward_us": (sharded[1] - plain[1]) * 1e6}))
    dist.barrier()
    dist.destroy_process_group()


def dtensor_shard_overhead_us(world: int = 2, repeats: int = 7) -> dict[str, float]:
    """Extra host cost of an op on ``Shard(0)`` ``DTensor``s over the same op on plain tensors
    on a ``world``-rank mesh (µs, forward / backward per op): the chain of :func:`_op_chain_s`
    with the activations row-sharded and the weight replicated, as tensor parallelism with
    sequence parallelism runs a layer's ops (no collective: the placements propagate)."""
    return _spawn_json(_sharded_chain_worker, world, repeats)


def _redistribute_worker(rank: int, world: int, port: int, repeats: int, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    _join_gloo(rank, world, port)
    mesh = init_device_mesh("cpu", (world,))
    batch, seq, h = 16, 64, 64               # gpt-tiny's residual stream at batch 16
    local = torch.randn(batch, seq // world, h)
    shard = DTensor.from_local(local, mesh, [Shard(1)])
    partial = DTensor.from_local(torch.randn(batch, seq, h), mesh, [Partial()])
    full = torch.randn(batch, seq, h)
    replicate = DTensor.from_local(full, mesh, [Replicate()])
    hidden = torch.randn(batch, seq, 4 * h // world)     # a column-parallel MLP output's shard
    source = DTensor.from_local(hidden, mesh, [Shard(2)]).requires_grad_()
    plain_weight = torch.randn(4 * h // world, h, requires_grad=True)
    weight = torch.nn.Parameter(DTensor.from_local(plain_weight.detach().clone(), mesh,
                                                   [Shard(0)]))
    # the plain collectives gather / scatter along dim 0; the sequence split (dim 1) needs the
    # same transposed copies DTensor makes, so the plain side makes them too
    gathered = torch.empty(world * seq // world, batch, h)
    scattered = torch.empty(seq // world, batch, h)

    def cpu_us(fn: Callable[[], object]) -> float:
        dist.barrier()
        return _median_thread_time(fn, repeats=repeats) * 1e6

    def plain_gather() -> torch.Tensor:
        dist.all_gather_into_tensor(gathered, local.transpose(0, 1).contiguous())
        return gathered.transpose(0, 1) + 0.0

    def plain_scatter() -> torch.Tensor:
        dist.reduce_scatter_tensor(scattered, full.transpose(0, 1).contiguous())
        return scattered.transpose(0, 1) + 0.0

    # every result is used (``+ 0``) as the next op of a layer uses it: DTensor's collectives
    # are asynchronous, their wait and unpacking run at that first use
    row = {"all_gather_dtensor_us": cpu_us(lambda: shard.redistribute(mesh, [Replicate()])
                                           .to_local() + 0.0),
           "all_gather_plain_us": cpu_us(plain_gather),
           "reduce_scatter_dtensor_us": cpu_us(lambda: partial.redistribute(mesh, [Shard(1)])
                                               .to_local() + 0.0),
           "reduce_scatter_plain_us": cpu_us(plain_scatter),
           # a redistribution that communicates nothing (Replicate → Shard(1): each rank keeps
           # its slice), against the plain slice
           "local_dtensor_us": cpu_us(lambda: replicate.redistribute(mesh, [Shard(1)])
                                      .to_local() + 0.0),
           "local_plain_us": cpu_us(lambda: full.chunk(world, 1)[rank] + 0.0),
           # a parallel style's boundary: a local tensor wrapped as a DTensor (a row-parallel
           # Linear's input) against the plain view, and the backward of a DTensor handed on
           # as a local tensor (a column-parallel Linear's output), timed by its autograd node
           "from_local_dtensor_us": cpu_us(lambda: DTensor.from_local(hidden, mesh,
                                                                      [Shard(2)])),
           "from_local_plain_us": cpu_us(lambda: hidden.view_as(hidden)),
           "to_local_backward_us": _node_us(lambda: (source * 1.0).to_local(),
                                            lambda out: out.grad_fn, repeats),
           # autograd storing a parameter's gradient (AccumulateGrad of the leaf), a DTensor
           # parameter (a column-parallel weight's shard) against a plain one
           "accumulate_dtensor_us": _node_us(
               lambda: (weight * 1.0).to_local(),
               lambda out: out.grad_fn.next_functions[0][0].next_functions[0][0], repeats,
               (weight,)),
           "accumulate_plain_us": _node_us(
               lambda: plain_weight * 1.0, lambda out: out.grad_fn.next_functions[0][0],
               repeats, (plain_weight,)),
           "eager_op_us": _op_chain_s(lambda t: t, repeats, backward=False)[0] * 1e6}
    if rank == 0:
        Path(out).write_text(json.dumps(row))
    dist.barrier()
    dist.destroy_process_group()


def _node_us(forward: Callable[[], torch.Tensor], node_of: Callable[[torch.Tensor], Any],
             repeats: int, leaves: tuple[torch.Tensor, ...] = ()) -> float:
    """Median thread CPU (µs) of one autograd node of ``forward()``'s graph (``node_of`` picks
    it from the output), timed by the node's pre-hook and hook over ``out.sum().backward()``;
    ``leaves``' gradients are reset to ``None`` before each run (as ``zero_grad`` does)."""
    samples: list[float] = []
    start: list[float] = []
    for _ in range(repeats + 2):
        for leaf in leaves:
            leaf.grad = None
        out = forward()
        node = node_of(out)
        node.register_prehook(lambda grads: start.append(time.thread_time()))
        node.register_hook(lambda inputs, grads: samples.append(time.thread_time() - start[-1]))
        out.sum().backward()
    return statistics.median(samples[2:]) * 1e6


def redistribute_host_us(world: int = 2, repeats: int = 15) -> dict[str, float]:
    """Main-thread CPU time (µs) of a tensor-parallel collective issued by ``DTensor``'s
    ``redistribute`` as sequence parallelism issues it (gpt-tiny's 16 × 64 × 64 residual
    stream split on the sequence, ``Shard(1) → Replicate``: all-gather; ``Partial →
    Shard(1)``: reduce-scatter), its result used by one op (its wait and unpacking run
    there), and of the same collective issued with ``torch.distributed`` directly (with the
    same transposed copies and the same use): their difference is DTensor's host work per
    redistribution (planning it, the functional collective's wrappers, its wait), which no
    communication term prices; also a redistribution that communicates nothing
    (``Replicate → Shard(1)``) against the plain slice; with the eager op of the same run
    (host costs move with it)."""
    return _spawn_json(_redistribute_worker, world, repeats)


class _Blocks(torch.nn.Module):
    """``groups`` blocks of ``width`` ``Linear(h, h)`` each and a ``Linear`` head of the
    root's own: each block one FSDP2 group of ``2·width`` tensors, the root one of 2."""

    def __init__(self, groups: int, width: int, h: int = 64) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(*(torch.nn.Linear(h, h) for _ in range(width)))
            for _ in range(groups))
        self.head = torch.nn.Linear(h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.tanh(block(x))
        return self.head(x)


def _fsdp_worker(rank: int, world: int, port: int, repeats: int, groups: int,
                 widths: list[int], out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    _join_gloo(rank, world, port)
    mesh = init_device_mesh("cpu", (world,))
    x = torch.randn(64, 64)

    def build(width: int, reshard: bool | None, sync: bool = True) -> torch.nn.Module:
        torch.manual_seed(0)
        model = _Blocks(groups, width)
        if reshard is None:
            return (model if sync else
                    torch.nn.parallel.DistributedDataParallel(model))   # the DDP variant
        for block in model.blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
        model.set_requires_gradient_sync(sync)
        return model

    variants = {"plain_us": (None, True), "ddp_us": (None, False),
                "zero2_nosync_us": (False, False),
                "zero2_us": (False, True), "zero3_us": (True, True)}
    models = {(w, name): build(w, reshard, sync) for w in widths
              for name, (reshard, sync) in variants.items()}
    samples: dict[tuple[int, str], list[float]] = {key: [] for key in models}
    eager: list[float] = []
    for r in range(repeats + 2):        # interleaved: a load burst hits every variant alike
        for key, model in models.items():
            start = time.thread_time()
            model(x).sum().backward()
            if r >= 2:                   # two warm-up rounds
                samples[key].append((time.thread_time() - start) * 1e6)
        # the rate probe's eager op, in the same rounds (the host costs' scale)
        if r >= 2:
            eager.append(_op_chain_s(lambda t: t, 1, backward=False)[0] * 1e6)
    if rank == 0:
        rows: dict[str, Any] = {"eager_op_us": statistics.median(eager)}
        for (w, name), values in samples.items():
            rows.setdefault(str(w), {})[name] = statistics.median(values)
        Path(out).write_text(json.dumps(rows))
    # FSDP2's state holds the group: free it before destroying the group (docs/runtime.md,
    # "Clean exits"), else the rank may abort at exit
    del models, samples
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def fsdp_host_us(world: int = 2, groups: int = 8, widths: tuple[int, int] = (1, 6),
                 repeats: int = 15, runs: int = 3) -> dict[str, Any]:
    """FSDP2's main-thread host work per ``fully_shard`` group (µs), on a loopback gloo group
    of ``world`` ranks: a model of ``G = groups`` blocks of ``w`` Linears (``k = 2w`` tensors)
    plus a root with a Linear of its own (``n = G + 1`` groups), forward + backward of a
    64×64 input, thread CPU time, against the same model unwrapped (``T_0``). ``fully_shard``
    on every block and the root, ``reshard_after_forward`` False (ZeRO-2, ``T_2``) or True
    (ZeRO-3, ``T_3``), gradient sync off or on (``set_requires_gradient_sync``)::

        A = (T_2,nosync − T_0) / n      per group and microbatch: its pre-forward unshard
                                        (all-gather copy-in, the collective's issue and wait,
                                        copy-out) and the rest of its four hooks
        R = (T_2 − T_2,nosync) / n      per group, on the microbatch that syncs: the
                                        post-backward reduce (copy-in, reduce-scatter, the
                                        divide, copy-out into the sharded gradient)
        B = (T_3 − T_2) / n             per group and microbatch under ZeRO-3: the reshard
                                        after the forward and the unshard again before the
                                        backward (the root's too: ``reshard_after_forward=True``
                                        given explicitly, as the runtime does)

    Each is measured at two widths ``w₁ < w₂`` and split into a part per group and a part per
    tensor, ``X(k) = X_g + k·X_t`` with ``X_t = (X(k₂) − X(k₁)) / (k₂ − k₁)``. The tensors are
    small (64 × 64) so that the collectives' bytes do not matter; their latency is spent in
    gloo's threads (not on the main thread's CPU clock) and is priced by the collective
    terms. Each of ``runs`` runs (fresh ranks) measures the rate probe's eager op
    (:func:`rate_probe`) in the same rounds on rank 0, ``e``, and every raw figure is scaled
    to the spec's eager op, ``· EAGER_OP_US / e`` (host costs move with it,
    :mod:`cluster_specs.local_cpu`); the decomposition is taken from the median over runs of
    each scaled figure. ``ddp_step_us`` +
    ``ddp_tensor_us``·(tensors): the same for ``DistributedDataParallel`` on the unwrapped
    model, its host work per step (autograd hooks, bucket copies, the all-reduce's issue and
    wait) with all ``2·w·G + 2`` tensors in one bucket."""
    from fxplan.cluster_specs.local_cpu import EAGER_OP_US

    scaled: list[dict[str, dict[str, float]]] = []
    eager: list[float] = []
    for _ in range(runs):
        raw = _spawn_json(_fsdp_worker, world, repeats, groups, list(widths))
        e = raw.pop("eager_op_us")
        eager.append(e)
        scaled.append({w: {k: v * EAGER_OP_US / e for k, v in row.items()}
                       for w, row in raw.items()})
    rows = {str(w): {k: statistics.median(run[str(w)][k] for run in scaled)
                     for k in scaled[0][str(w)]} for w in widths}
    n = groups + 1
    per: dict[str, dict[int, float]] = {"gather": {}, "reduce": {}, "regather": {}}
    for w in widths:
        r = rows[str(w)]
        per["gather"][w] = (r["zero2_nosync_us"] - r["plain_us"]) / n
        per["reduce"][w] = (r["zero2_us"] - r["zero2_nosync_us"]) / n
        per["regather"][w] = (r["zero3_us"] - r["zero2_us"]) / n
    w1, w2 = widths
    # DDP on the same model: its hooks and bucket copies, all n·2w + 2 tensors in one step
    ddp = {w: rows[str(w)]["ddp_us"] - rows[str(w)]["plain_us"] for w in widths}
    ddp_tensor = (ddp[w2] - ddp[w1]) / (2 * groups * (w2 - w1))
    out: dict[str, Any] = {"groups": n, "widths": list(widths), "eager_op_us": eager,
                           "ddp_tensor_us": ddp_tensor,
                           "ddp_step_us": ddp[w1] - (2 * groups * w1 + 2) * ddp_tensor,
                           "raw": rows}
    for name, by_width in per.items():
        tensor = (by_width[w2] - by_width[w1]) / (2 * w2 - 2 * w1)
        out[f"{name}_tensor_us"] = tensor
        out[f"{name}_group_us"] = by_width[w1] - 2 * w1 * tensor
    return out


def process_baseline_gib() -> float:
    """Resident set of a process that imported torch and fxplan's runtime and joined a gloo
    group, before any model exists: the fixed part of a rank's peak (``ru_maxrss``), GiB."""
    import subprocess
    import sys

    code = ("import resource, torch, torch.distributed as dist, fxplan.worker, "
            "fxplan.runtime.apply.graph;"
            f"dist.init_process_group('gloo', init_method='tcp://127.0.0.1:{_free_port()}', "
            "rank=0, world_size=1);"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1]) * 1024 / 2**30


def memory_bound_gb_per_s(repeats: int) -> dict[str, float]:
    """Effective bandwidth (GB/s, read + written) of memory-bound ops on one thread."""
    x = torch.randn(4, 64, 256)
    out = torch.empty_like(x)
    ops = {"copy": (lambda x, y: out.copy_(x), 2),
           **{name: VECTOR_OPS[name] for name in ("dropout", "gelu", "softmax")}}
    size = x.numel() * x.element_size()
    return {name: size * ops[name][1] / t / 1e9
            for name, t in _op_seconds(ops, x, x, repeats=repeats, inner=20).items()}


def optimizer_us(repeats: int) -> dict[str, float]:
    """AdamW ``step`` + ``zero_grad`` on gpt-tiny's parameters: total and per tensor (µs)."""
    from fxplan.examples.model_spec import resolve_model

    model = resolve_model("gpt-tiny").build("cpu")
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.zeros_like(p)
    opt = torch.optim.AdamW(params, lr=1e-3)

    def step() -> None:
        opt.step()
        for p in params:  # keep the grads (zero_grad(set_to_none) would drop them)
            p.grad.zero_()

    t = _median_thread_time(step, repeats=repeats)
    return {"tensors": len(params), "elements": sum(p.numel() for p in params),
            "step_us": t * 1e6, "per_tensor_us": t / len(params) * 1e6}


def _sharing_worker(rank: int, world: int, iterations: int, out: str) -> None:
    import torch.nn.functional as F

    from fxplan.examples.model_spec import resolve_model
    from fxplan.runtime.launch.affinity import pin_rank

    pin_rank(rank, world)   # as fxplan launch places its ranks
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = resolve_model("gpt-tiny").build("cpu")
    x, y = torch.randint(0, 512, (4, 64)), torch.randint(0, 512, (4, 64))

    def forward_backward() -> None:
        out_ = model(x)
        F.cross_entropy(out_.reshape(-1, out_.size(-1)), y.reshape(-1)).backward()

    forward_backward()
    before = resource.getrusage(resource.RUSAGE_SELF)
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(iterations):
        forward_backward()
    after = resource.getrusage(resource.RUSAGE_SELF)
    Path(out, f"{rank}.json").write_text(json.dumps({
        "wall": time.perf_counter() - start, "cpu": time.process_time() - cpu,
        "voluntary": after.ru_nvcsw - before.ru_nvcsw,
        "involuntary": after.ru_nivcsw - before.ru_nivcsw}))


def time_sharing(iterations: int = 150, rounds: int = 3) -> dict[str, Any]:
    """``T_1``, ``T_C``, ``T_2C`` (s), ``κ = T_1 / T_C`` and ``η = 2·T_C / T_2C`` (module
    docstring); each ``N`` runs ``rounds`` times, interleaved, and its median is taken."""
    import tempfile

    import torch.multiprocessing as mp

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    runs: dict[int, list[float]] = {n: [] for n in (1, cores, 2 * cores)}
    # per N and round, the medians over processes of their CPU and context switches
    usage: dict[int, list[dict[str, float]]] = {n: [] for n in runs}
    keys = ("cpu", "voluntary", "involuntary")
    for _ in range(rounds):
        for n in runs:
            with tempfile.TemporaryDirectory() as tmp:
                mp.spawn(_sharing_worker, args=(n, iterations, tmp), nprocs=n)
                procs = [json.loads(p.read_text()) for p in Path(tmp).glob("*.json")]
                runs[n].append(statistics.median(p["wall"] for p in procs))
                usage[n].append({k: statistics.median(p[k] for p in procs) for k in keys})
    t = {n: statistics.median(v) for n, v in runs.items()}
    per = {n: {k: statistics.median(u[k] for u in usage[n]) for k in keys} for n in runs}
    return {"cores": cores, "t_1": t[1], "t_c": t[cores], "t_2c": t[2 * cores],
            "runs": {str(n): v for n, v in runs.items()}, "load": os.getloadavg()[0],
            "concurrency": t[1] / t[cores], "efficiency": 2 * t[cores] / t[2 * cores],
            # a process's CPU (all its threads) and context switches over the loop, per N
            "usage": {str(n): u for n, u in per.items()}}


def _print_sharing(share: dict[str, Any]) -> None:
    print(f"| time-sharing, gpt-tiny fwd+bwd ×150: 1 / {share['cores']} / {2 * share['cores']} "
          f"processes on {share['cores']} cores | {share['t_1']:.2f} s / {share['t_c']:.2f} s / "
          f"{share['t_2c']:.2f} s ⇒ κ = {share['concurrency']:.3f}, η = "
          f"{share['efficiency']:.3f} |")
    usage = share["usage"]
    c, c2 = usage[str(share["cores"])], usage[str(2 * share["cores"])]
    switches = (c2["voluntary"] + c2["involuntary"]) - (c["voluntary"] + c["involuntary"])
    print(f"| … CPU per process, {share['cores']} / {2 * share['cores']} processes; context "
          f"switches (voluntary + involuntary) | {c['cpu']:.3f} s / {c2['cpu']:.3f} s; "
          f"{c['voluntary']:.0f} + {c['involuntary']:.0f} / {c2['voluntary']:.0f} + "
          f"{c2['involuntary']:.0f} ⇒ "
          + (f"{(c2['cpu'] - c['cpu']) / switches * 1e6:.0f} µs of CPU per added switch |"
             if switches > 0 else "no added switch |"))


def _contended_worker(rank: int, world: int, port: int, iterations: int, batch: int,
                      out: str) -> None:
    import torch.distributed as dist

    _join_gloo(rank, world, port)
    a = torch.randn(128, 128)
    flag = torch.zeros(1)
    flags = [torch.zeros(1) for _ in range(batch)]

    def communicate() -> None:
        if not batch:
            dist.all_reduce(flag)
            return
        # as ZeroRedundancyOptimizer._sync_params: every broadcast issued async, then waited
        handles = [dist.broadcast(f, src=i % world, async_op=True) for i, f in enumerate(flags)]
        for handle in handles:
            handle.wait()

    def loop(collective: bool) -> float:
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iterations):
            for _ in range(4):
                a @ a
            if collective:
                communicate()
        elapsed = time.perf_counter() - start
        dist.barrier()
        return elapsed / iterations

    loop(True)
    samples = [(loop(False), loop(True)) for _ in range(5)]
    if rank == 0:
        Path(out).write_text(json.dumps(samples))
    dist.destroy_process_group()


def contended_collective_us(world: int, iterations: int = 300,
                            batch: int = 0) -> dict[str, float]:
    """A 4-byte gloo all-reduce between bursts of compute (µs): every rank loops ``4 × (128³
    matmul); all_reduce`` and the same without the all-reduce, wall clock; the collective's
    cost is the difference per iteration (medians of 5 alternating runs). With more ranks
    than cores a rank waiting in a collective must be scheduled again while another rank
    computes on its core, which the idle ranks of :func:`allreduce` do not see.

    ``batch = k > 0``: instead of the all-reduce, ``k`` 4-byte broadcasts issued
    asynchronously and then waited (sources round-robin), as ``ZeroRedundancyOptimizer``
    syncs its parameters; ``(t_k − t_1)/(k − 1)`` is what each further collective of such a
    batch costs once the ranks have met (:func:`queued_collective_us`)."""
    samples = _spawn_json(_contended_worker, world, iterations, batch)
    work = statistics.median(w for w, _ in samples)
    both = statistics.median(b for _, b in samples)
    return {"work_us": work * 1e6, "work_collective_us": both * 1e6,
            "collective_us": (both - work) * 1e6}


def queued_collective_us(world: int, batch: int = 28, iterations: int = 100) -> dict[str, float]:
    """Cost of each further 4-byte broadcast of an async batch of ``batch`` between bursts of
    compute: ``(t_batch − t_1)/(batch − 1)`` from :func:`contended_collective_us` (µs). 28 is
    gpt-tiny's parameter tensor count (ZeRO-1 broadcasts each)."""
    one = contended_collective_us(world, iterations, batch=1)["collective_us"]
    many = contended_collective_us(world, iterations, batch=batch)["collective_us"]
    return {"one_us": one, "batch_us": many, "batch": batch,
            "queued_us": (many - one) / (batch - 1)}


def _gang_worker(rank: int, world: int, port: int, iterations: int, gang: int, mode: str,
                 matmuls: int, nbytes: int, out: str) -> None:
    """One rank of :func:`gangs_us`: ``world`` ranks in ``world // gang`` independent groups
    of ``gang`` consecutive ranks. ``mode == "loop"``: every rank loops ``4 × 128³ matmul;
    all_reduce(nbytes, its group)`` (``matmuls`` of them), against the same loop without the all-reduce. ``mode ==
    "pipeline"`` (two groups): a one-microbatch pipeline of two stages — group 0 computes, each
    of its ranks sends a 4-byte token to its partner in group 1, which computes and sends it
    back — so only one group is busy at a time; against the same without the token (the two
    groups then compute side by side)."""
    import torch.distributed as dist

    _join_gloo(rank, world, port)
    groups = [dist.new_group(list(range(first, first + gang)))
              for first in range(0, world, gang)] if gang < world else [None]
    mine = groups[rank // gang]
    a = torch.randn(128, 128)
    token = torch.zeros(max(1, nbytes // 4))

    def work() -> None:
        for _ in range(matmuls):
            a @ a

    def loop(communicate: bool) -> float:
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iterations):
            if mode == "loop":
                work()
                if communicate:
                    dist.all_reduce(token, group=mine)
            elif rank < gang:                          # stage 0: compute, hand over, wait
                work()
                if communicate:
                    dist.send(token, rank + gang)
                    dist.recv(token, rank + gang)
            else:                                      # stage 1: wait, compute, hand back
                if communicate:
                    dist.recv(token, rank - gang)
                work()
                if communicate:
                    dist.send(token, rank - gang)
        elapsed = time.perf_counter() - start
        dist.barrier()
        return elapsed / iterations

    loop(True)
    samples = [(loop(False), loop(True)) for _ in range(5)]
    _gather_and_leave(samples, world, rank, out)


#: Configurations of the gang line: (name, ranks, group size, mode, 128³ matmuls per burst,
#: bytes of the collective; 64 KiB: a tp all-reduce of gpt-tiny's activations, 4×64×64 fp32).
GANG_CONFIGS = (("1 group of 2", 2, 2, "loop", 4, 4), ("1 group of 4", 4, 4, "loop", 4, 4),
                ("2 groups of 2", 4, 2, "loop", 4, 4),
                ("1 group of 2, 64 KiB", 2, 2, "loop", 4, 2**16),
                ("1 group of 4, 64 KiB", 4, 4, "loop", 4, 2**16),
                ("2 groups of 2, 64 KiB", 4, 2, "loop", 4, 2**16),
                ("1 group of 2, 10x work", 2, 2, "loop", 40, 4),
                ("pipeline 2 stages x 2", 4, 2, "pipeline", 4, 4),
                ("pipeline 2 stages x 2, 10x work", 4, 2, "pipeline", 40, 4))


def gangs_us(iterations: int = 300) -> list[dict[str, Any]]:
    """Independent tp groups time-sharing the cores, and a pipeline that runs one stage at a
    time (µs per iteration, wall clock, the median over ranks of each rank's median of 5
    alternating runs). Per configuration of :data:`GANG_CONFIGS`: ``work_us`` (the loop
    without communication), ``both_us`` (with it) and ``extra_us = both − work``. For the
    loops ``extra_us`` is the wall one blocking 4-byte all-reduce adds; if independent groups
    pay an extra wait until the partner is scheduled, "2 groups of 2" shows more than "1 group
    of 4" (same ranks, same cores). For the pipeline, ``both_us`` is one microbatch through
    both stages (each stage's work once plus two token hand-overs), at 4 and 40 matmuls a
    burst; the hand-overs cancel in the difference, so the share of a core each busy rank got
    is ``busy_share = 2 · Δwork(1 group of 2) / Δboth(pipeline)`` (Δ: 40 − 4 matmuls; a rank
    of the lone 2-rank group has a core of its own): 1 if only the busy ranks share the cores,
    ``η · 2/4`` if all four ranks did."""
    rows = []
    for name, world, gang, mode, matmuls, nbytes in GANG_CONFIGS:
        per_rank = _spawn_json(_gang_worker, world, iterations, gang, mode, matmuls, nbytes)
        work = statistics.median(statistics.median(w for w, _ in s) for s in per_rank)
        both = statistics.median(statistics.median(b for _, b in s) for s in per_rank)
        rows.append({"config": name, "ranks": world, "group": gang, "mode": mode,
                     "matmuls": matmuls, "bytes": nbytes,
                     "work_us": work * 1e6, "both_us": both * 1e6,
                     "extra_us": (both - work) * 1e6})
    by = {r["config"]: r for r in rows}
    alone = by["1 group of 2, 10x work"]["work_us"] - by["1 group of 2"]["work_us"]
    pipe = by["pipeline 2 stages x 2, 10x work"]
    pipe["busy_share"] = 2 * alone / (pipe["both_us"] - by["pipeline 2 stages x 2"]["both_us"])
    return rows


def _print_gangs(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        share = f"; busy share {r['busy_share']:.3f}" if "busy_share" in r else ""
        print(f"| gang line, {r['config']} ({r['ranks']} ranks): work; work + collective "
              f"⇒ extra | {r['work_us']:.0f}; {r['both_us']:.0f} ⇒ {r['extra_us']:.0f} µs"
              f"{share} |")


#: Sizes (bytes) and kinds of the gloo CPU line (8.): the runtime's collectives at gpt-tiny's
#: scale span 4 B (the loss, the norm) to 0.55 MB (DDP's one bucket).
GLOO_CPU_BYTES = (4, 64 * 2**10, 256 * 2**10, 2**20)
GLOO_CPU_KINDS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "send_recv")


def _collective_call(kind: str, nbytes: int, rank: int, world: int) -> Callable[[], object]:
    """One blocking ``kind`` collective of ``nbytes`` (nccl-tests sizes: the gathered output
    of an all-gather, the input of a reduce-scatter, the message of a send/recv — which
    sends one way and back, two messages, as a pipeline's forward and backward do)."""
    import torch.distributed as dist

    n = max(1, nbytes // 4)
    if kind == "all_reduce":
        x = torch.zeros(n)
        return lambda: dist.all_reduce(x)
    if kind == "broadcast":
        x = torch.zeros(n)
        return lambda: dist.broadcast(x, src=0)
    if kind == "all_gather":
        per = max(1, n // world)
        out, x = torch.zeros(per * world), torch.zeros(per)
        return lambda: dist.all_gather_into_tensor(out, x)
    if kind == "reduce_scatter":
        per = max(1, n // world)
        out, x = torch.zeros(per), torch.zeros(per * world)
        return lambda: dist.reduce_scatter_tensor(out, x)
    x = torch.zeros(n)
    peer = rank ^ 1

    def ping() -> None:
        if rank % 2 == 0:
            dist.send(x, peer)
            dist.recv(x, peer)
        else:
            dist.recv(x, peer)
            dist.send(x, peer)
    return ping


def _gloo_cpu_worker(rank: int, world: int, port: int, iterations: int, runs: int,
                     out: str) -> None:
    import torch.distributed as dist

    _join_gloo(rank, world, port)
    a = torch.randn(128, 128)

    def loop(work: bool, call: Callable[[], object] | None) -> tuple[float, float, float]:
        """Per iteration: wall, main-thread CPU, other threads' CPU (s)."""
        dist.barrier()
        w, c, pc = time.perf_counter(), time.thread_time(), time.process_time()
        for _ in range(iterations):
            if work:
                for _ in range(4):
                    a @ a
            if call is not None:
                call()
        w, c, pc = time.perf_counter() - w, time.thread_time() - c, time.process_time() - pc
        dist.barrier()
        return w / iterations, c / iterations, (pc - c) / iterations

    rows: dict[str, Any] = {}
    for kind in GLOO_CPU_KINDS:
        if kind == "send_recv" and world % 2:
            continue
        for nbytes in GLOO_CPU_BYTES:
            call = _collective_call(kind, nbytes, rank, world)
            for work in (True, False):
                loop(work, call)              # warm-up
                base, both = [], []
                for _ in range(runs):         # alternating: drift hits both alike
                    base.append(loop(work, None))
                    both.append(loop(work, call))
                added = [statistics.median(b[i] for b in both)
                         - statistics.median(x[i] for x in base) for i in range(3)]
                rows[f"{kind} {nbytes} {'work' if work else 'idle'}"] = [v * 1e6 for v in added]
    _gather_and_leave(rows, world, rank, out)


def _line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares ``y = c₀ + c₁·x`` through ``points``: ``(c₀, c₁)``."""
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    return my - slope * mx, slope


def gloo_cpu_us(world: int, iterations: int = 40, runs: int = 5) -> dict[str, Any]:
    """gloo's CPU per collective on ``world`` loopback ranks (module docstring, 8.): for each
    ``"kind bytes work|idle"`` the added wall, main-thread CPU and other threads' CPU (µs per
    collective, each rank's median over ``runs``; the mean and the max over ranks), and per
    kind and setting the line ``c₀ µs + c₁ µs/KiB`` of the whole CPU (main + other threads,
    the ranks' mean) against the size, and of the wall."""
    per_rank = _spawn_json(_gloo_cpu_worker, world, iterations, runs)
    rows: dict[str, Any] = {}
    for key in per_rank[0]:
        values = [r[key] for r in per_rank]
        rows[key] = {"wall_us": statistics.mean(v[0] for v in values),
                     "wall_max_us": max(v[0] for v in values),
                     "main_cpu_us": statistics.mean(v[1] for v in values),
                     "other_cpu_us": statistics.mean(v[2] for v in values)}
    fits: dict[str, Any] = {}
    for kind in GLOO_CPU_KINDS:
        for setting in ("work", "idle"):
            keys = [(nbytes, f"{kind} {nbytes} {setting}") for nbytes in GLOO_CPU_BYTES]
            if keys[0][1] not in rows:
                continue
            cpu = _line([(b / 1024, rows[k]["main_cpu_us"] + rows[k]["other_cpu_us"])
                         for b, k in keys])
            wall = _line([(b / 1024, rows[k]["wall_us"]) for b, k in keys])
            fits[f"{kind} {setting}"] = {"cpu_us": cpu[0], "cpu_us_per_kib": cpu[1],
                                         "wall_us": wall[0], "wall_us_per_kib": wall[1]}
    return {"world": world, "load": os.getloadavg()[0], "rows": rows, "fits": fits}


def _print_gloo_cpu(result: dict[str, Any]) -> None:
    """The table rows of :func:`gloo_cpu_us`."""
    world = result["world"]
    for key, fit in result["fits"].items():
        print(f"| gloo CPU per collective, {world} ranks, {key} (4 B … 1 MiB): CPU (main + "
              f"gloo threads) c₀ + c₁·S; wall | {fit['cpu_us']:.0f} µs + "
              f"{fit['cpu_us_per_kib']:.2f} µs/KiB; {fit['wall_us']:.0f} µs + "
              f"{fit['wall_us_per_kib']:.2f} µs/KiB |")


def _join_gloo(rank: int, world: int, port: int) -> None:
    """A spawned calibration rank: one thread, placed as ``fxplan launch`` would place it
    (:func:`fxplan.runtime.launch.affinity.pin_rank`), the gloo group of ``world`` ranks on
    loopback."""
    import torch.distributed as dist

    from fxplan.runtime.launch.affinity import pin_rank

    pin_rank(rank, world)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)


def _gather_and_leave(result: Any, world: int, rank: int, out: str) -> None:
    """A spawned rank's last act: every rank's ``result`` gathered, rank 0 writes the list as
    JSON to ``out`` (what :func:`_spawn_json` returns), and the gloo group is closed."""
    import torch.distributed as dist

    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, result)
    if rank == 0:
        Path(out).write_text(json.dumps(gathered))
    dist.barrier()
    dist.destroy_process_group()


def _spawn_json(worker: Callable[..., None], world: int, *args: Any) -> Any:
    """Run ``worker(rank, world, port, *args, out)`` on ``world`` spawned ranks (``port``: a
    free loopback port) and return the JSON the worker wrote to the file ``out``."""
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        mp.spawn(worker, args=(world, _free_port(), *args, out), nprocs=world)
        return json.loads(Path(out).read_text())


PAGE_BYTES = 4096


def _mallopt(**params: int) -> None:
    """Set glibc malloc parameters by name (``trim``, ``top_pad``, ``mmap``), bytes, or raise
    (:func:`fxplan.runtime.train.heap.set_malloc`)."""
    from fxplan.runtime.train.heap import set_malloc

    failed = set_malloc(**params)
    if failed:
        raise RuntimeError(failed)


def _saved_bytes(batch: int, seq: int = 64) -> float:
    """The cost model's saved activation bytes of one gpt-tiny microbatch of ``batch``
    (``NodeInfo.saved_bytes`` of the captured graph, whose batch is 1)."""
    from fxplan.api import capture_for_search

    graph = capture_for_search("gpt-tiny", seq=seq, dtype="float32")
    return batch * float(sum(n.meta["fxplan"].saved_bytes for n in graph.gm.graph.nodes
                             if "fxplan" in n.meta))


def _plain_train_step(batch: int) -> Callable[[], None]:
    """gpt-tiny's training step as the trainer runs it on one rank, without the runtime:
    forward, cross-entropy, backward, clipping, AdamW, ``zero_grad`` (gradients to None)."""
    import torch.nn.functional as F

    from fxplan.examples.model_spec import resolve_model

    torch.manual_seed(0)
    model = resolve_model("gpt-tiny").build("cpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randint(0, 512, (batch, 64)), torch.randint(0, 512, (batch, 64))

    def step() -> None:
        out = model(x)
        F.cross_entropy(out.reshape(-1, out.size(-1)), y.reshape(-1)).backward()
        del out
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
    return step


def _faulted_steps(step: Callable[[], None], steps: int) -> tuple[list[float], list[int]]:
    """Thread CPU seconds and minor page faults of each of ``steps`` calls of ``step``."""
    import resource

    times, faults = [], []
    for _ in range(steps):
        f = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        c = time.thread_time()
        step()
        times.append(time.thread_time() - c)
        faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - f)
    return times, faults


def _first_touch_worker(rank: int, world: int, port: int, batch: int, steps: int,
                        in_situ: bool, out: str) -> None:
    """A fresh process: gpt-tiny's step at ``batch``; ``in_situ``: alternating blocks with
    the heap trimmed after every free and with it kept (``mallopt``), else the heap as a
    launched rank has it (:func:`fxplan.runtime.train.heap.keep_heap`, module docstring, 9.)."""
    torch.set_num_threads(1)
    if not in_situ:
        from fxplan.runtime.train.heap import keep_heap

        note = keep_heap()
        if note:
            raise RuntimeError(note)
    step = _plain_train_step(batch)
    for _ in range(3):
        step()
    result: dict[str, Any] = {"eager_op_us": _op_chain_s(lambda t: t, 3, backward=False)[0] * 1e6}
    if in_situ:
        samples: dict[str, tuple[list[float], list[int]]] = {"trim": ([], []), "keep": ([], [])}
        # every tensor on the heap (none mmapped), then: give back all of the free top at
        # every free / never give back
        _mallopt(mmap=32 * 2**20, top_pad=0)
        for r in range(steps):
            for mode, trim in (("trim", 0), ("keep", 2**30)):
                _mallopt(trim=trim)
                step()                      # the first step after the switch settles it
                t, f = _faulted_steps(step, 3)
                samples[mode][0].extend(t)
                samples[mode][1].extend(f)
        for mode, (t, f) in samples.items():
            result[mode] = {"cpu_ms": statistics.median(t) * 1e3, "faults": statistics.median(f)}
    else:
        t, f = _faulted_steps(step, steps)
        result.update(cpu_ms=statistics.median(t) * 1e3, faults=f)
    Path(out).write_text(json.dumps(result))


def first_touch(batches: tuple[int, ...] = (4, 8, 16), runs: int = 3, steps: int = 20,
                in_situ_batch: int = 16) -> dict[str, Any]:
    """9. What the first touch of fresh pages costs a training step (module docstring).

    ``page_us``: in one fresh process, gpt-tiny's step at ``in_situ_batch`` alternately with
    the heap trimmed at every free (``M_TRIM_THRESHOLD`` 0: the step's pages are given back
    and faulted again on the next step) and kept (``M_TRIM_THRESHOLD`` 1 GiB: no faults),
    every tensor on the heap (``M_MMAP_THRESHOLD`` 32 MiB):
    ``(t_trim − t_keep) / (faults_trim − faults_keep)``, the seconds a re-faulted 4 KiB page
    costs the step (the fault, the kernel zeroing it, the missed cache), at the spec's eager
    op (``· EAGER_OP_US / e``, each run's own probe). ``fraction``: with the heap as a
    launched rank keeps it (:func:`fxplan.runtime.train.heap.keep_heap`), the mean over ``runs`` fresh processes × ``steps`` steps of the faults
    per step, in bytes, over the saved activation bytes of the microbatch
    (:func:`_saved_bytes`), per batch size; the pooled fraction weighs each batch size by its
    bytes."""
    from fxplan.cluster_specs.local_cpu import EAGER_OP_US

    page = []
    for _ in range(runs):
        r = _spawn_json(_first_touch_worker, 1, in_situ_batch, 6, True)
        page.append((r["trim"]["cpu_ms"] - r["keep"]["cpu_ms"]) * 1e3
                    / max(1.0, r["trim"]["faults"] - r["keep"]["faults"])
                    * EAGER_OP_US / r["eager_op_us"])
        page_raw = r
    natural: dict[str, Any] = {}
    faulted = saved = 0.0
    for b in batches:
        faults = [f for _ in range(runs)
                  for f in _spawn_json(_first_touch_worker, 1, b, steps, False)["faults"]]
        mean = statistics.fmean(faults) * PAGE_BYTES
        natural[str(b)] = {"faults_per_step": statistics.fmean(faults),
                           "min": min(faults), "max": max(faults),
                           "saved_mib": _saved_bytes(b) / 2**20,
                           "fraction": mean / _saved_bytes(b)}
        faulted += mean
        saved += _saved_bytes(b)
    return {"page_us": statistics.median(page), "page_us_runs": page, "last_in_situ": page_raw,
            "natural": natural, "fraction": faulted / saved}


def _step_host_worker(rank: int, world: int, port: int, steps: int, out: str) -> None:
    """One rank (a one-rank gloo group) running the trainer's step on the runtime's one-rank
    gpt-tiny plan, each phase timed once per step as the trainer runs it (module docstring,
    9.)."""
    import fxplan
    from fxplan.cluster_specs import Cluster
    from fxplan.cost_model.compute.op_time import op_time_s
    from fxplan.cost_model.memory.breakdown import adam_for
    from fxplan.examples.model_spec import resolve_model
    from fxplan.runtime.apply.graph import apply_plan
    from fxplan.runtime.train.optim import build_optimizer, clip_grad_norm, set_lr
    from fxplan.runtime.apply.partial_grads import reduce_partial_grads
    from fxplan.worker import loss_fn

    _join_gloo(rank, world, port)
    plan = fxplan.search("gpt-tiny", "local-cpu:devices=1", batch=16, progress=False)
    torch.manual_seed(0)
    tokens, targets = (torch.randint(0, 512, (16, plan.seq)) for _ in range(2))
    sharded = apply_plan(resolve_model("gpt-tiny").build("cpu"), plan, (tokens,))
    optimizer = build_optimizer(sharded, "adamw", lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95))
    phases = {"train_step": lambda: sharded.train_step(((tokens,), targets), loss_fn, local=True),
              "partial": lambda: reduce_partial_grads(sharded),
              "clip": lambda: clip_grad_norm(sharded, 1.0),
              "opt": lambda: (set_lr(optimizer, 1e-3), optimizer.step()),
              "zero": optimizer.zero_grad}
    samples: dict[str, list[float]] = {k: [] for k in phases}
    for step in range(steps + 3):
        for name, fn in phases.items():
            c = time.thread_time()
            fn()
            if step >= 3:                    # warm-up: the optimizer's states, the caches
                samples[name].append(time.thread_time() - c)
    probe = rate_probe()
    params = sum(p.numel() for p in sharded.parameters())
    # the optimizer's memory traffic as the cost model prices it at this moment's rates
    device = Cluster.load(f"local-cpu:devices=1,matmul_tflops={probe['matmul_tflops']:.6g},"
                          f"vector_gb_per_s={probe['vector_gb_per_s']:.6g},"
                          f"eager_op_us={probe['eager_op_us']:.6g}").device_groups[0]
    adam = adam_for("fp32")
    traffic = op_time_s("elementwise", adam.step_flops * params, adam.step_bytes * params,
                        torch.float32, device)
    result = {k: statistics.median(v) * 1e6 for k, v in samples.items()}
    result.update(tensors=len(list(sharded.parameters())), params=params,
                  traffic_us=traffic * 1e6, eager_op_us=probe["eager_op_us"],
                  matmul_tflops=probe["matmul_tflops"])
    Path(out).write_text(json.dumps(result))
    import torch.distributed as dist
    dist.destroy_process_group()


def step_host_us(steps: int = 30, runs: int = 3) -> dict[str, Any]:
    """9. The trainer's host work after ``train_step`` on one rank (no DDP), each phase once
    per step in the trainer's order (its caches as a real step leaves them: the forward and
    backward in between), median over ``steps``, then over ``runs`` fresh ranks, µs at the
    spec's eager op (``· EAGER_OP_US / e``, each run's probe): ``clip``, ``partial``,
    ``zero`` — together the spec's ``step_overhead_us`` — and ``opt`` (``set_lr`` + AdamW's
    step) less the cost model's price of its memory traffic at the run's probed rates
    (``traffic``: ``op_time("elementwise", 12·Ψ, 28·Ψ)``), per parameter tensor: the spec's
    ``optimizer_tensor_us``, the host loop the roofline does not price."""
    from fxplan.cluster_specs.local_cpu import EAGER_OP_US

    rows = []
    for _ in range(runs):
        r = _spawn_json(_step_host_worker, 1, steps)
        h = EAGER_OP_US / r["eager_op_us"]
        rows.append({**r, **{f"{k}_us": r[k] * h for k in ("clip", "partial", "zero")},
                     "optimizer_tensor_us": (r["opt"] - r["traffic_us"]) * h / r["tensors"]})
    keys = ("train_step", "partial", "clip", "opt", "zero", "traffic_us", "clip_us",
            "partial_us", "zero_us", "optimizer_tensor_us", "eager_op_us", "matmul_tflops")
    out: dict[str, Any] = {k: statistics.median(r[k] for r in rows) for k in keys}
    out["step_overhead_us"] = statistics.median(r["clip_us"] + r["partial_us"] + r["zero_us"]
                                                for r in rows)
    out["runs"] = rows
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def allreduce(world: int) -> dict[str, float]:
    """Gloo all-reduce on ``world`` local processes: times, hop latency, bus bandwidth."""
    from collectives_table import measure_gloo  # benchmarks/: this script's folder

    alpha_s = _base_latency_s()
    times = measure_gloo(world, list(ALLREDUCE_BYTES))
    small, s1, s2 = ALLREDUCE_BYTES
    factor = 2 * (world - 1) / world
    return {"t_4B_us": times[small] * 1e6, "t_4MiB_ms": times[s1] * 1e3,
            "t_16MiB_ms": times[s2] * 1e3,
            "hop_latency_us": (times[small] - alpha_s) / (2 * (world - 1)) * 1e6,
            "bus_gb_per_s": factor * (s2 - s1) / (times[s2] - times[s1]) / 1e9}


def _base_latency_s() -> float:
    """The cost model's per-collective base latency ``α`` (ring), seconds."""
    data = json.loads((Path(__file__).resolve().parents[1] / "cost_model" / "data"
                       / "collectives.json").read_text())
    for key in ("base_latency_us", "alpha_us"):
        if key in data:
            value = data[key]
            return (value["ring"] if isinstance(value, dict) else value) * 1e-6
    return 6.0e-6


def _print_fsdp(row: dict[str, Any]) -> None:
    """The table row of :func:`fsdp_host_us`."""
    print(f"| FSDP2 host work per group per microbatch, 2 ranks, {row['groups']} groups "
          f"(widths {row['widths']}): A, R, B = per group + k tensors | "
          + "; ".join(f"{name} {row[name + '_group_us']:.0f} + {row[name + '_tensor_us']:.1f}·k µs"
                      for name in ("gather", "reduce", "regather"))
          + f"; DDP {row['ddp_step_us']:.0f} + {row['ddp_tensor_us']:.1f}·(tensors) µs per step"
          + f" (at the spec's eager op; {len(row['eager_op_us'])} runs, probed "
          + ", ".join(f"{e:.2f}" for e in row["eager_op_us"]) + " µs) |")


def _print_redistribute(red: dict[str, float]) -> None:
    print(f"| main-thread CPU per collective used once, 2 ranks, 16×64×64 fp32 split on dim 1: "
          f"all-gather DTensor / plain; reduce-scatter DTensor / plain; eager op | "
          f"{red['all_gather_dtensor_us']:.0f} / {red['all_gather_plain_us']:.0f} µs; "
          f"{red['reduce_scatter_dtensor_us']:.0f} / {red['reduce_scatter_plain_us']:.0f} µs; "
          f"{red['eager_op_us']:.2f} µs |")
    print(f"| DTensor.from_local of a 16×64×128 shard: DTensor / plain view; to_local's backward "
          f"(autograd node) | {red['from_local_dtensor_us']:.0f} / "
          f"{red['from_local_plain_us']:.1f} µs; {red['to_local_backward_us']:.0f} µs |")
    print(f"| AccumulateGrad of a 128×64 parameter (its gradient None before): DTensor / plain | "
          f"{red['accumulate_dtensor_us']:.0f} / {red['accumulate_plain_us']:.0f} µs |")
    print(f"| main-thread CPU of a DTensor redistribution without communication (Replicate → "
          f"Shard(1), same tensor): DTensor / plain slice | {red['local_dtensor_us']:.0f} / "
          f"{red['local_plain_us']:.0f} µs |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--probe", action="store_true",
                        help="only the per-core rates of this moment, as one JSON line")
    parser.add_argument("--gloo-cpu", action="store_true",
                        help="only gloo's CPU per collective (8.), 2 and 4 ranks, as table "
                        "rows and JSON")
    parser.add_argument("--fsdp", action="store_true",
                        help="only the FSDP2 (and DDP) host-work line (7.), as a table row "
                        "and JSON")
    parser.add_argument("--step", action="store_true",
                        help="only the trainer's host work after train_step (10.), JSON")
    parser.add_argument("--first-touch", action="store_true",
                        help="only the first touch of fresh pages per step (9.), JSON")
    parser.add_argument("--redistribute", action="store_true",
                        help="only the DTensor redistribution line, as a table row and JSON")
    parser.add_argument("--sharing", action="store_true",
                        help="only the time-sharing line (6.): κ and η, as a table row and JSON")
    parser.add_argument("--gangs", action="store_true",
                        help="only the gang line: independent tp groups and a one-stage-at-a-"
                        "time pipeline time-sharing the cores, as table rows and JSON")
    args = parser.parse_args()
    quick = args.quick
    #: The lines run alone: (asked for, their rows, each row's table line or None, the JSON's
    #: indent), first asked first; each row printed as a table line (if any), then as JSON.
    alone: tuple[tuple[bool, Callable[[], Iterable[Any]], Callable[[Any], None] | None,
                       int | None], ...] = (
        (args.gangs, lambda: [gangs_us(iterations=150 if quick else 300)], _print_gangs, None),
        (args.gloo_cpu, lambda: (gloo_cpu_us(world, runs=3 if quick else 5) for world in (2, 4)),
         _print_gloo_cpu, None),
        (args.step, lambda: [step_host_us()], None, 1),
        (args.first_touch, lambda: [first_touch()], None, 1),
        (args.redistribute, lambda: [redistribute_host_us(repeats=7 if quick else 15)],
         _print_redistribute, None),
        (args.fsdp, lambda: [fsdp_host_us(repeats=7 if quick else 21)], _print_fsdp, None),
        (args.probe, lambda: [rate_probe()], None, None),
        (args.sharing, lambda: [time_sharing(rounds=1 if quick else 3)], _print_sharing, None),
    )
    for asked, rows, table_line, indent in alone:
        if asked:
            torch.set_num_threads(1)
            for row in rows():
                if table_line is not None:
                    table_line(row)
                print(json.dumps(row, indent=indent))
            return
    repeats = 7 if args.quick else 21
    torch.set_num_threads(1)
    load = os.getloadavg()[0]
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, load average {load:.2f}\n")
    print("| quantity | value |\n|---|---|")
    for n in SIZES:
        print(f"| fp32 matmul {n}³, 1 thread | {matmul_tflops(n, repeats):.4f} TFLOP/s |")
    for key, value in eager_overhead_us(repeats).items():
        print(f"| eager tiny op, {key.removesuffix('_us')} | {value:.2f} µs |")
    bandwidth = memory_bound_gb_per_s(repeats)
    for name, value in bandwidth.items():
        share = f" ({value / bandwidth['copy']:.3f} of copy)" if name != "copy" else ""
        print(f"| {name} 4×64×256 fp32, 1 thread | {value:.2f} GB/s{share} |")
    dt = dtensor_overhead_us(repeats)
    print(f"| eager tiny op, plain: forward / backward | {dt['plain_forward_us']:.2f} / "
          f"{dt['plain_backward_us']:.2f} µs |")
    print(f"| DTensor op extra (Replicate, 1-rank mesh): forward / backward | "
          f"{dt['forward_us']:.2f} / {dt['backward_us']:.2f} µs |")
    print(f"| AdamW step per tensor, gpt-tiny ({dt['adamw_tensors']} tensors): plain / DTensor | "
          f"{dt['adamw_per_tensor_us']:.1f} / {dt['adamw_dtensor_per_tensor_us']:.1f} µs |")
    view = dtensor_view_overhead_us(repeats)
    print(f"| DTensor view op extra (view/t, Replicate, 1-rank mesh): forward; plain view | "
          f"{view['view_us']:.2f} µs; {view['plain_view_us']:.2f} µs |")
    shard = dtensor_shard_overhead_us()
    print(f"| DTensor op extra (Shard(0), 2-rank mesh): forward / backward | "
          f"{shard['forward_us']:.2f} / {shard['backward_us']:.2f} µs |")
    _print_redistribute(redistribute_host_us())
    _print_fsdp(fsdp_host_us(repeats=repeats))
    print(f"| process baseline (torch + fxplan runtime + gloo group), ru_maxrss | "
          f"{process_baseline_gib():.3f} GiB |")
    opt = optimizer_us(repeats)
    print(f"| AdamW step + zero, gpt-tiny ({opt['tensors']} tensors, {opt['elements']:,} el.) "
          f"| {opt['step_us']:.0f} µs ({opt['per_tensor_us']:.1f} µs/tensor) |")
    host = step_host_us()
    print(f"| trainer after train_step, one rank, gpt-tiny ({host['runs'][0]['tensors']} tensors): "
          f"clip + partial + zero; AdamW per tensor beyond its bytes | "
          f"{host['step_overhead_us']:.0f} µs; {host['optimizer_tensor_us']:.1f} µs |")
    touch = first_touch()
    batches = ", ".join(touch["natural"])
    print("| first touch: per re-faulted 4 KiB page in the step; share of the saved activations "
          f"re-faulted per step (batch {batches}) | "
          f"{touch['page_us']:.2f} µs; {touch['fraction']:.2f} ("
          + ", ".join(f"{v['fraction']:.2f}" for v in touch["natural"].values()) + ") |")
    _print_sharing(time_sharing(rounds=1 if quick else 3))
    for world in (2, 4):
        c = contended_collective_us(world)
        print(f"| gloo all-reduce 4 B between compute, {world} ranks: (work + AR) − work | "
              f"{c['work_collective_us']:.0f} − {c['work_us']:.0f} = {c['collective_us']:.0f} µs |")
    for world in (2, 4):
        q = queued_collective_us(world)
        print(f"| gloo async broadcast batch between compute, {world} ranks: 1 / {q['batch']} × "
              f"4 B ⇒ each further one | {q['one_us']:.0f} µs / {q['batch_us']:.0f} µs ⇒ "
              f"{q['queued_us']:.0f} µs |")
    for world in (2, 4):
        r = allreduce(world)
        print(f"| gloo all-reduce {world} ranks: 4 B / 4 MiB / 16 MiB | {r['t_4B_us']:.0f} µs / "
              f"{r['t_4MiB_ms']:.2f} ms / {r['t_16MiB_ms']:.2f} ms |")
        print(f"| gloo {world} ranks: hop latency, bus bandwidth | {r['hop_latency_us']:.1f} µs, "
              f"{r['bus_gb_per_s']:.3f} GB/s |")
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
