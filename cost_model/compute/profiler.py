"""Time the database's ops (:data:`cost_model.compute.op_database.OPS`) over a grid of shapes on the
local device and return an :class:`~cost_model.compute.op_database.OpDatabase`.

Method. CPU: one thread (``torch.set_num_threads(1)``; the run-to-run spread is 1–2 % on one
thread and ~8 % on two, see the project's CPU timing notes), a warm-up of a few calls, then
``torch.utils.benchmark.Timer.blocked_autorange`` whose median is stored, with its
interquartile range. The clock is the thread's CPU time (``time.thread_time``,
``CLOCK_THREAD_CPUTIME_ID``): for a single-threaded op it is the wall time the op takes on a
core of its own, and it does not count the time slices another process takes on a shared
machine (measured here under a load of 2.7 on 2 cores: a 512×1024 ``mul`` read 226–608 µs of
wall time but 239–259 µs of thread time). CUDA: a warm-up, then ``REPEATS`` blocks of
CUDA-event-timed calls sized to last ``min_run_time / REPEATS`` each; the median block mean is
stored.

Grid. Each op has *families*: a shape template ``shape(s)`` scaled by ``s`` over a geometric
range, so that a family holds one aspect (e.g. a square matmul ``(s, s, s)``, an MLP-like
``(8s, s, 4s)``) at several sizes. Quick mode keeps every other scale of the CPU grid (factor
4 apart), so a shape halfway in between is an interpolation test.
"""

from __future__ import annotations

import datetime
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from fxplan.cluster_specs.local_cpu import cpu_model
from fxplan.cost_model.compute.efficiency import dtype_key
from fxplan.cost_model.compute.op_database import OPS, OpDatabase, Record, element_bytes

__all__ = ["GRID", "Family", "profile", "measure", "local_device_model", "make_call"]

REPEATS = 7
Shapes = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Family:
    """Shapes ``shape(s)`` of one op for ``s`` in ``cpu`` (CPU grid) or ``cuda`` (GPU grid)."""

    op: str
    name: str
    shape: Callable[[int], Shapes]
    cpu: tuple[int, ...]
    cuda: tuple[int, ...]

    def scales(self, device: str, quick: bool) -> tuple[int, ...]:
        scales = self.cpu if device == "cpu" else self.cuda
        return scales[::2] if quick else scales


def _p2(lo: int, hi: int, step: int = 1) -> tuple[int, ...]:
    """``2**lo, 2**(lo+step), …, 2**hi``."""
    return tuple(2 ** k for k in range(lo, hi + 1, step))


GRID: tuple[Family, ...] = (
    Family("linear", "square", lambda s: ((s, s), (s, s)), _p2(6, 10), _p2(8, 13)),
    Family("linear", "mlp-up", lambda s: ((8 * s, s), (4 * s, s)), _p2(4, 8), _p2(6, 11)),
    Family("linear", "mlp-down", lambda s: ((8 * s, 4 * s), (s, 4 * s)), _p2(4, 8), _p2(6, 11)),
    Family("bmm", "scores", lambda s: ((8, s, 64), (8, 64, s)), _p2(6, 10), _p2(8, 13)),
    Family("bmm", "context", lambda s: ((8, s, s), (8, s, 64)), _p2(6, 10), _p2(8, 13)),
    Family("softmax", "rows", lambda s: ((4 * s, s),), _p2(5, 10), _p2(7, 13)),
    Family("layer_norm", "tokens", lambda s: ((4 * s, s),), _p2(5, 10), _p2(7, 13)),
    Family("gelu", "flat", lambda s: ((s, 1024),), _p2(2, 12), _p2(4, 16)),
    Family("add", "flat", lambda s: ((s, 1024), (s, 1024)), _p2(2, 12), _p2(4, 16)),
    Family("mul", "flat", lambda s: ((s, 1024), (s, 1024)), _p2(2, 12), _p2(4, 16)),
    Family("dropout", "flat", lambda s: ((s, 1024),), _p2(2, 12), _p2(4, 16)),
    Family("embedding", "tokens", lambda s: ((4 * s,), (8192, s)), _p2(5, 10), _p2(7, 13)),
    Family("conv2d", "resnet", lambda s: ((4, s, 32, 32), (s, s, 3, 3)), _p2(3, 7), _p2(5, 10)),
    Family("sdpa", "heads", lambda s: ((4, 4, s, 64),) * 3, _p2(5, 9), _p2(7, 14)),
)


def make_call(op: str, shapes: Shapes, dtype: Any, device: str) -> tuple[Callable[..., Any], tuple]:
    """A function and its arguments that run ``op`` once on ``shapes`` (see ``OPS``)."""
    import torch
    import torch.nn.functional as F

    tdtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype_key(dtype)]

    def randn(shape: Sequence[int]) -> "torch.Tensor":
        return torch.randn(*shape, dtype=tdtype, device=device)

    if op == "linear":
        return F.linear, (randn(shapes[0]), randn(shapes[1]))
    if op == "bmm":
        return torch.bmm, (randn(shapes[0]), randn(shapes[1]))
    if op == "softmax":
        return (lambda x: torch.softmax(x, -1)), (randn(shapes[0]),)
    if op == "layer_norm":
        c = shapes[0][-1]
        return (lambda x, w, b: F.layer_norm(x, (c,), w, b)), (randn(shapes[0]), randn((c,)), randn((c,)))
    if op == "gelu":
        return F.gelu, (randn(shapes[0]),)
    if op in ("add", "mul"):
        return getattr(torch, op), (randn(shapes[0]), randn(shapes[1]))
    if op == "dropout":
        return (lambda x: F.dropout(x, 0.1, True)), (randn(shapes[0]),)
    if op == "embedding":
        vocab = shapes[1][0]
        idx = torch.randint(0, vocab, shapes[0], device=device)
        return F.embedding, (idx, randn(shapes[1]))
    if op == "conv2d":
        return (lambda x, w: F.conv2d(x, w, padding="same")), (randn(shapes[0]), randn(shapes[1]))
    if op == "sdpa":
        return F.scaled_dot_product_attention, tuple(randn(s) for s in shapes)
    raise ValueError(f"no way to run op {op!r}; known: {', '.join(OPS)}")


def measure(fn: Callable[..., Any], args: tuple, device: str, min_run_time: float) -> tuple[float, float]:
    """(median seconds per call, interquartile range) of ``fn(*args)``, after a warm-up; thread
    CPU time on CPU, CUDA events on CUDA (module docstring)."""
    import torch

    for _ in range(3):
        fn(*args)
    if device == "cpu":
        from torch.utils.benchmark import Timer

        m = Timer("fn(*args)", globals={"fn": fn, "args": args}, timer=time.thread_time,
                  num_threads=torch.get_num_threads()).blocked_autorange(min_run_time=min_run_time)
        return m.median, m.iqr
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn(*args)
    end.record()
    torch.cuda.synchronize()
    per_call = max(start.elapsed_time(end) * 1e-3, 1e-6)
    calls = max(1, int(min_run_time / REPEATS / per_call))
    blocks = []
    for _ in range(REPEATS):
        start.record()
        for _ in range(calls):
            fn(*args)
        end.record()
        torch.cuda.synchronize()
        blocks.append(start.elapsed_time(end) * 1e-3 / calls)
    quartiles = statistics.quantiles(blocks, n=4)
    return statistics.median(blocks), quartiles[2] - quartiles[0]


def _record(family: Family, shapes: Shapes, dtype: str, times: list[tuple[float, float]]) -> Record:
    """The record of ``family`` at ``shapes``: median over rounds of (median, IQR) pairs."""
    kind = OPS[family.op]
    median = statistics.median(t for t, _ in times)
    iqr = statistics.median(q for _, q in times)
    return Record(family.op, family.name, dtype, shapes, kind.flops(shapes),
                  kind.bytes(shapes, element_bytes(dtype)), median, iqr)


def local_device_model(device: str) -> str:
    """``torch.cuda.get_device_name()`` on CUDA; on CPU the processor's name from
    ``/proc/cpuinfo``, which is the model the ``local-cpu`` cluster spec gives its devices."""
    if device == "cpu":
        return cpu_model()
    import torch

    return torch.cuda.get_device_name()


def profile(device: str = "cpu", *, quick: bool = False, dtype: Any = "fp32",
            ops: Sequence[str] | None = None, min_run_time: float | None = None,
            rounds: int = 1, device_model: str | None = None,
            progress: Callable[[Record], None] | None = None) -> OpDatabase:
    """Measure the grid (:data:`GRID`, restricted to ``ops``) and return the database.

    ``min_run_time`` (seconds per shape) defaults to 0.05 in quick mode, 0.1 otherwise; on CPU
    the measurement runs on one thread and the previous thread count is restored afterwards.
    ``rounds > 1`` measures the whole grid that many times and keeps each shape's median (a
    load spike on a shared machine then spoils one round of one shape, not the database).
    ``progress`` is called with each measurement as it is made.
    """
    import torch

    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: torch.cuda.is_available() is False on this machine")
    if rounds < 1:
        raise ValueError(f"rounds must be ≥ 1, got {rounds}")
    unknown = set(ops or ()) - set(OPS)
    if unknown:
        raise ValueError(f"unknown ops {sorted(unknown)}; known: {', '.join(OPS)}")
    run_time = min_run_time if min_run_time is not None else (0.05 if quick else 0.1)
    key = dtype_key(dtype)
    threads = torch.get_num_threads()
    started = time.perf_counter()
    db = OpDatabase(device_model or local_device_model(device), device)
    grid = [(f, s) for f in GRID if ops is None or f.op in ops for s in f.scales(device, quick)]
    measured: list[list[tuple[float, float]]] = [[] for _ in grid]
    try:
        if device == "cpu":
            torch.set_num_threads(1)
        for _ in range(rounds):
            for (family, scale), times in zip(grid, measured):
                shapes = family.shape(scale)
                fn, args = make_call(family.op, shapes, key, device)
                times.append(measure(fn, args, device, run_time))
                del fn, args
                if progress is not None:
                    progress(_record(family, shapes, key, [times[-1]]))
    finally:
        torch.set_num_threads(threads)
    db.records = [_record(f, f.shape(s), key, times) for (f, s), times in zip(grid, measured)]
    db.metadata = {
        "torch_version": torch.__version__,
        "threads": 1 if device == "cpu" else None,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "processor": cpu_model(),
        "cuda_device": torch.cuda.get_device_name() if device == "cuda" else None,
        "cpu_count": os.cpu_count(),
        "quick": quick,
        "rounds": rounds,
        "min_run_time_s": run_time,
        "method": ("Timer.blocked_autorange median of thread CPU time" if device == "cpu"
                   else f"CUDA events, median of {REPEATS} blocks"),
        "wall_time_s": round(time.perf_counter() - started, 2),
    }
    return db
