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
import json
import os
from typing import Any, Callable, Iterable

import torch

from local_cpu_lines.allreduce import allreduce
from local_cpu_lines.contention import contended_collective_us, queued_collective_us
from local_cpu_lines.dtensor_lines import (dtensor_overhead_us, dtensor_shard_overhead_us,
                                           dtensor_view_overhead_us, print_redistribute,
                                           redistribute_host_us)
from local_cpu_lines.first_touch import first_touch
from local_cpu_lines.fsdp_line import fsdp_host_us, print_fsdp
from local_cpu_lines.gangs import gangs_us, print_gangs
from local_cpu_lines.gloo_cpu import gloo_cpu_us, print_gloo_cpu
from local_cpu_lines.process_baseline import process_baseline_gib
from local_cpu_lines.rates import (SIZES, eager_overhead_us, matmul_tflops, memory_bound_gb_per_s,
                                   rate_probe)
from local_cpu_lines.sharing import print_sharing, time_sharing
from local_cpu_lines.step_host import optimizer_us, step_host_us


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
        (args.gangs, lambda: [gangs_us(iterations=150 if quick else 300)], print_gangs, None),
        (args.gloo_cpu, lambda: (gloo_cpu_us(world, runs=3 if quick else 5) for world in (2, 4)),
         print_gloo_cpu, None),
        (args.step, lambda: [step_host_us()], None, 1),
        (args.first_touch, lambda: [first_touch()], None, 1),
        (args.redistribute, lambda: [redistribute_host_us(repeats=7 if quick else 15)],
         print_redistribute, None),
        (args.fsdp, lambda: [fsdp_host_us(repeats=7 if quick else 21)], print_fsdp, None),
        (args.probe, lambda: [rate_probe()], None, None),
        (args.sharing, lambda: [time_sharing(rounds=1 if quick else 3)], print_sharing, None),
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
    print_redistribute(redistribute_host_us())
    print_fsdp(fsdp_host_us(repeats=repeats))
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
    print_sharing(time_sharing(rounds=1 if quick else 3))
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
