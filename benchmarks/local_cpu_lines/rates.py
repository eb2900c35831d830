"""One core's rates on the thread's CPU clock: the fp32 matmul (line 1.), tiny eager ops (2.),
memory-bound ops (4.), and the per-core rates the ``local-cpu`` spec takes (the probe, 0.). The
formulas are in ``local_cpu_calibration.py``'s docstring."""

from __future__ import annotations

import os
import statistics
import time
from typing import Callable

import torch

__all__ = ["CHAIN", "chain_per_op_s", "copy_gb_per_s", "eager_overhead_us", "matmul_tflops",
           "median_thread_time", "memory_bound_gb_per_s", "op_chain_s", "op_seconds", "rate_probe",
           "SIZES", "vector_gb_per_s", "VECTOR_OPS", "VectorOp"]


SIZES = (256, 512, 1024)


CHAIN = 200


def median_thread_time(fn: Callable[[], object], *, repeats: int, inner: int = 1) -> float:
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
    t = median_thread_time(lambda: a @ b, repeats=repeats, inner=inner)
    return 2 * n**3 / t / 1e12


def op_chain_s(make: Callable[[torch.Tensor], torch.Tensor],
               repeats: int, backward: bool = True) -> tuple[float, float]:
    """Per-op forward and backward seconds of a chain of ``CHAIN`` tiny ops (add, mul, gelu,
    matmul, layer norm on 8×8) whose tensors ``make`` builds (plain, or ``DTensor``);
    ``backward=False``: the forward only (NaN for the backward)."""
    w = make(torch.randn(8, 8)).requires_grad_()
    x0 = make(torch.randn(8, 8)).requires_grad_()
    ops = (lambda x: x + 1.0, lambda x: x * w, torch.nn.functional.gelu, lambda x: x @ w,
           lambda x: torch.nn.functional.layer_norm(x, (8,)))
    return chain_per_op_s(ops, x0, repeats, backward=backward)


def chain_per_op_s(ops: tuple[Callable[[torch.Tensor], torch.Tensor], ...], x0: torch.Tensor,
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

    fwd = median_thread_time(forward, repeats=repeats)
    if not backward:
        return fwd / CHAIN, float("nan")
    both = median_thread_time(lambda: loss(forward()).backward(), repeats=repeats)
    return fwd / CHAIN, (both - fwd) / CHAIN


def copy_gb_per_s(repeats: int, mib: int = 128) -> float:
    """One-thread copy of a ``mib`` MiB fp32 tensor (larger than the caches): ``2·S / t``,
    GB/s (bytes read + written)."""
    x = torch.randn(mib * 2**18)
    out = torch.empty_like(x)
    return 2 * x.numel() * 4 / median_thread_time(lambda: out.copy_(x), repeats=repeats) / 1e9


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


def op_seconds(ops: dict[str, VectorOp], x: torch.Tensor, y: torch.Tensor, *, repeats: int,
               inner: int) -> dict[str, float]:
    """Each op's ``fn(x, y)``: the median over ``repeats`` of the thread CPU time of ``inner``
    calls, per call (s)."""
    return {name: median_thread_time(lambda fn=fn: fn(x, y), repeats=repeats, inner=inner)
            for name, (fn, _) in ops.items()}


def vector_gb_per_s(repeats: int, kib: int = 1024) -> float:
    """One-thread in-cache vector rate, GB/s: the :data:`VECTOR_OPS` on a ``kib`` KiB fp32
    tensor (256 rows; in L2, as a small model's activations are), ``Σ bytes / Σ t`` (bytes
    read + written, thread CPU time, each op's median of ``repeats``). What the memory-bound
    op classes run at on this core, which moves with neither the matmul rate nor the DRAM
    copy from one host to another (module docstring, 0.)."""
    x = torch.randn(256, kib * 1024 // (256 * 4))
    size = x.numel() * x.element_size()
    seconds = op_seconds(VECTOR_OPS, x, torch.randn_like(x), repeats=repeats, inner=10)
    return sum(size * passes for _, passes in VECTOR_OPS.values()) / sum(seconds.values()) / 1e9


def rate_probe(repeats: int = 5) -> dict[str, float]:
    """The per-core rates of this moment (module docstring, 0.): matmul TFLOP/s (1024³),
    copy GB/s, in-cache vector GB/s, eager op µs (forward of a tiny-op chain), and the load
    average."""
    return {"matmul_tflops": matmul_tflops(1024, repeats),
            "memory_gb_per_s": copy_gb_per_s(repeats),
            "vector_gb_per_s": vector_gb_per_s(repeats),
            "eager_op_us": op_chain_s(lambda t: t, repeats, backward=False)[0] * 1e6,
            "load": os.getloadavg()[0]}


def eager_overhead_us(repeats: int) -> dict[str, float]:
    """Per-op forward and backward cost of tiny eager ops (µs): a chain of ``CHAIN`` ops."""
    fwd, bwd = op_chain_s(lambda t: t, repeats)
    return {"forward_us": fwd * 1e6, "backward_us": bwd * 1e6,
            "forward_backward_us": (fwd + bwd) * 1e6}


def memory_bound_gb_per_s(repeats: int) -> dict[str, float]:
    """Effective bandwidth (GB/s, read + written) of memory-bound ops on one thread."""
    x = torch.randn(4, 64, 256)
    out = torch.empty_like(x)
    ops = {"copy": (lambda x, y: out.copy_(x), 2),
           **{name: VECTOR_OPS[name] for name in ("dropout", "gelu", "softmax")}}
    size = x.numel() * x.element_size()
    return {name: size * ops[name][1] / t / 1e9
            for name, t in op_seconds(ops, x, x, repeats=repeats, inner=20).items()}
