"""``python -m fxplan.calibration.collectives_worker --out FILE``: one rank of ``fxplan calibrate``.

Run under torchrun on every local device (nccl on GPUs, gloo on CPU ranks). Rank 0 writes one
JSON object to ``--out``:

* ``memory``: per rank, what the process holds before its first tensor. On CUDA, ``total −
  free`` of ``torch.cuda.mem_get_info`` once the context, a cuBLAS handle and a first kernel
  exist and before any communicator (``context_gib``), the device's total (``total_gib``), and
  what the first collectives' communicators took on top (``nccl_gib``). On CPU, the process's
  resident set once torch and the process group are up and a first collective has run
  (``baseline_gib``: the interpreter, torch's libraries and gloo's buffers).
* ``host_link_gb_per_s``: CUDA only — every rank copies a pinned host buffer to its device at
  the same moment (the spec's definition: per device and direction while all devices of the
  node copy), median of :data:`H2D_REPEATS`.
* ``collectives``: for each kind and size (nccl-tests' sizes: the all-reduce buffer, the
  gathered output, the scattered input, each rank's send buffer, the message), the median over
  ``--iters`` of the slowest rank's time of one call, each call started after a barrier.
  ``send_recv`` is a ping-pong between ranks 0 and 1 (half the round trip).

A kind the backend does not run is recorded with its error instead of times.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time
import warnings
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

__all__ = ["KINDS", "H2D_BYTES", "H2D_REPEATS", "main"]

KINDS: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
#: Pinned host buffer copied to the device for the host↔device bandwidth.
H2D_BYTES = 256 << 20
H2D_REPEATS = 5
GIB = float(1 << 30)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _rss_gib() -> float:
    """The current resident set (``/proc/self/statm``), else the peak (``getrusage``)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / GIB
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB


def _cuda_context(device: torch.device) -> dict[str, float]:
    """Context, cuBLAS handle and a first kernel, no communicator yet."""
    torch.cuda.set_device(device)
    a = torch.ones(64, 64, device=device)
    (a @ a).sum().item()
    del a
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    return {"context_gib": (total - free) / GIB, "total_gib": total / GIB}


def _host_link(device: torch.device) -> float:
    """GB/s of a pinned host → device copy, all ranks copying at once (median)."""
    host = torch.empty(H2D_BYTES, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(H2D_BYTES, dtype=torch.uint8, device=device)
    rates = []
    for _ in range(H2D_REPEATS + 1):
        dist.barrier()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dev.copy_(host, non_blocking=True)
        stop.record()
        stop.synchronize()
        rates.append(H2D_BYTES / (start.elapsed_time(stop) * 1e-3) / 1e9)
    del host, dev
    return statistics.median(rates[1:])


def _call(kind: str, nbytes: int, device: torch.device, dtype: torch.dtype) -> Callable[[], None]:
    """One call of ``kind`` on ``nbytes`` (nccl-tests' size, module docstring)."""
    n, rank = dist.get_world_size(), dist.get_rank()
    size = torch.tensor([], dtype=dtype).element_size()
    per_rank = max(1, nbytes // (size * n))
    if kind == "all_reduce":
        buf = torch.ones(per_rank * n, dtype=dtype, device=device)
        return lambda: dist.all_reduce(buf)
    if kind == "all_gather":
        out = torch.empty(per_rank * n, dtype=dtype, device=device)
        inp = torch.ones(per_rank, dtype=dtype, device=device)
        return lambda: dist.all_gather_into_tensor(out, inp)
    if kind == "reduce_scatter":
        out = torch.empty(per_rank, dtype=dtype, device=device)
        inp = torch.ones(per_rank * n, dtype=dtype, device=device)
        return lambda: dist.reduce_scatter_tensor(out, inp)
    if kind == "all_to_all":
        out = torch.empty(per_rank * n, dtype=dtype, device=device)
        inp = torch.ones(per_rank * n, dtype=dtype, device=device)
        return lambda: dist.all_to_all_single(out, inp)
    if kind == "send_recv":
        msg = torch.ones(max(1, nbytes // size), dtype=dtype, device=device)

        def ping_pong() -> None:
            if rank == 0:
                dist.send(msg, 1)
                dist.recv(msg, 1)
            elif rank == 1:
                dist.recv(msg, 0)
                dist.send(msg, 0)
        return ping_pong
    raise ValueError(f"unknown collective {kind!r}")


def _time(kind: str, nbytes: int, iters: int, device: torch.device, dtype: torch.dtype) -> float:
    """Median over ``iters`` of the slowest rank's seconds for one call (after 2 warm-ups)."""
    call = _call(kind, nbytes, device, dtype)
    times = []
    for i in range(iters + 2):
        dist.barrier()
        _sync(device)
        began = time.perf_counter()
        call()
        _sync(device)
        if i >= 2:
            times.append(time.perf_counter() - began)
    slowest = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    median = statistics.median(slowest.tolist())
    return median / 2 if kind == "send_recv" else median


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fxplan.calibration.collectives_worker")
    parser.add_argument("--out", required=True)
    parser.add_argument("--sizes", required=True, help="bytes, comma-separated")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--kinds", default=",".join(KINDS))
    args = parser.parse_args(argv)
    from fxplan.runtime.launch.process_group import init_process_group

    # torch 2.13 renames reduce_scatter_tensor; the old name is the one every supported torch has
    warnings.filterwarnings("ignore", category=FutureWarning, message=".*reduce_scatter_tensor")

    cuda = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    memory: dict[str, float] = _cuda_context(device) if cuda else {}
    init_process_group("nccl" if cuda else "gloo")
    n, rank = dist.get_world_size(), dist.get_rank()
    dist.all_reduce(torch.ones(1, device=device))   # communicators and gloo's buffers exist now
    if cuda:
        free, total = torch.cuda.mem_get_info(device)
        memory["nccl_gib"] = max(0.0, (total - free) / GIB - memory["context_gib"])
    else:
        memory["baseline_gib"] = _rss_gib()
    link = _host_link(device) if cuda else None
    dtype = torch.bfloat16 if cuda else torch.float32
    results: dict[str, dict[str, float | str]] = {}
    for kind in [k for k in args.kinds.split(",") if k]:
        if kind == "send_recv" and n < 2:
            continue
        row: dict[str, float | str] = {}
        for nbytes in (int(s) for s in args.sizes.split(",")):
            try:
                row[str(nbytes)] = _time(kind, nbytes, args.iters, device, dtype)
            except (RuntimeError, ValueError) as err:   # a kind this backend does not run
                row = {"error": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"}
                break
        results[kind] = row
    gathered: list[dict[str, float] | None] = [None] * n
    dist.all_gather_object(gathered, memory)
    if rank == 0:
        Path(args.out).write_text(json.dumps({
            "ranks": n, "backend": dist.get_backend(), "device": torch.cuda.get_device_name(device)
            if cuda else "cpu", "dtype": str(dtype).removeprefix("torch."),
            "iters": args.iters, "memory": gathered, "host_link_gb_per_s": link,
            "collectives": results}, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
