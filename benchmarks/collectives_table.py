"""Predicted vs published collective times, and (optionally) vs gloo measured on this machine.

    python benchmarks/collectives_table.py            # published rows + 2-rank gloo on loopback
    python benchmarks/collectives_table.py --no-gloo  # published rows only

Published numbers: ``benchmarks/data/hardware.md`` (nccl-tests bus bandwidths, NCCL
maintainers' statements). Predictions: :func:`cost_model.comm.collectives.collective_cost` on the
built-in cluster specs. The gloo rows time ``all_reduce`` between real processes on this
machine and compare with the ``local-cpu`` spec, whose loopback level was itself set from
such measurements (``benchmarks/local_cpu_calibration.py``, see :mod:`cluster_specs.local_cpu`), so
they check the formulas, not the data.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import NamedTuple

GiB = 2**30


class Row(NamedTuple):
    case: str
    spec: str
    kind: str
    nbytes: int
    ranks: int
    published_s: float
    source: str
    algorithm: str = "auto"


def _busbw_time(busbw_gb_per_s: float, nbytes: int, n: int) -> float:
    """Time implied by an all-reduce bus bandwidth: S / (busbw · n / (2(n−1)))."""
    return nbytes / (busbw_gb_per_s * 1e9 * n / (2 * (n - 1)))


PUBLISHED: tuple[Row, ...] = (
    Row("1 GiB all-reduce, 8× A100 NVSwitch", "dgx-a100-80g", "all_reduce", GiB, 8,
        _busbw_time(230, GiB, 8), "busbw ≈230 GB/s"),
    Row("1 GiB all-reduce, 8× H100 (NVLS)", "dgx-h100", "all_reduce", GiB, 8,
        _busbw_time(480, GiB, 8), "busbw ≈480 GB/s"),
    Row("1 GiB all-reduce, 8× H100 ring", "dgx-h100", "all_reduce", GiB, 8,
        _busbw_time(370, GiB, 8), "busbw ≈370 GB/s", "ring"),
    Row("1 GiB all-reduce, 2 DGX A100 nodes", "dgx-a100-80g:nodes=2", "all_reduce", GiB, 16,
        _busbw_time(192, GiB, 16), "busbw ≈192 GB/s"),
    Row("8 B all-reduce, 8× A100", "dgx-a100-80g", "all_reduce", 8, 8, 34e-6, "≈34 µs"),
    Row("8 B all-reduce, 2× A100", "dgx-a100-80g", "all_reduce", 8, 2, 10e-6, "≈10 µs"),
)


def predicted(row: Row) -> tuple[float, str]:
    from fxplan.cluster_specs import Cluster
    from fxplan.cost_model.comm.collectives import collective_cost

    cost = collective_cost(row.kind, row.nbytes, range(row.ranks), Cluster.load(row.spec),
                           algorithm=row.algorithm)
    return cost.time_s, cost.algorithm


def _gloo_worker(rank: int, world: int, init_file: str, sizes: list[int], queue) -> None:  # type: ignore[no-untyped-def]
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    results = {}
    for nbytes in sizes:
        tensor = torch.ones(max(1, nbytes // 4), dtype=torch.float32)
        for _ in range(3):
            dist.all_reduce(tensor)
        times = []
        for _ in range(15):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(tensor)
            times.append(time.perf_counter() - start)
        results[nbytes] = statistics.median(times)
    if rank == 0:
        queue.put(results)
    dist.barrier()
    dist.destroy_process_group()


def measure_gloo(world: int, sizes: list[int]) -> dict[int, float]:
    """Median seconds of a gloo all-reduce of each size among ``world`` local processes."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "init")
        procs = [ctx.Process(target=_gloo_worker, args=(r, world, init_file, sizes, queue))
                 for r in range(world)]
        for p in procs:
            p.start()
        results = queue.get()
        for p in procs:
            p.join()
    return results


def _print_table(rows: list[tuple[str, str, float, float, str]]) -> None:
    header = f"{'case':<40} {'source':<22} {'reference':>11} {'predicted':>11} {'error':>7}  algorithm"
    print(header)
    print("-" * len(header))
    for case, source, measured_s, predicted_s, algorithm in rows:
        error = predicted_s / measured_s - 1
        print(f"{case:<40} {source:<22} {_fmt(measured_s):>11} {_fmt(predicted_s):>11} "
              f"{error:>+6.1%}  {algorithm}")


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.1f} µs"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-gloo", action="store_true", help="skip the local gloo measurement")
    parser.add_argument("--world", type=int, default=2, help="gloo ranks (default 2)")
    args = parser.parse_args(argv)

    rows = []
    for row in PUBLISHED:
        seconds, algorithm = predicted(row)
        rows.append((row.case, row.source, row.published_s, seconds, algorithm))
    if not args.no_gloo:
        sizes = [4, 4 * 2**20]
        measured = measure_gloo(args.world, sizes)
        for nbytes in sizes:
            spec = Row("", f"local-cpu:devices={args.world}", "all_reduce", nbytes, args.world, 0.0, "")
            seconds, algorithm = predicted(spec)
            label = f"{nbytes} B" if nbytes < 2**20 else f"{nbytes >> 20} MiB"
            rows.append((f"{label} all-reduce, {args.world} gloo ranks here", "measured now",
                         measured[nbytes], seconds, algorithm))
    _print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
