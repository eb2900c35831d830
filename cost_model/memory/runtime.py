"""Memory a GPU training process holds beyond its tensors: CUDA context, NCCL buffers and
the caching allocator's fragmentation — each a named term of :class:`MemoryBreakdown`.

A plan that fills HBM to 97–99 % with tensors OOMs on a real GPU: the process also holds
the CUDA context, the communication buffers of every NCCL communicator it created, and the
difference between what the caching allocator reserved from the driver and what tensors
use. Per rank, on a ``gpu`` device (all three are 0 on a ``cpu`` device: no CUDA context,
no NCCL — gloo's buffers and the CPU allocator are the ``local-cpu`` spec's reserve)::

    cuda_context  = C_ctx                                           (per process)
    nccl          = n_comm · channels · peers · NCCL_BUFFSIZE
                    n_comm = [world > 1] + [tp > 1] + [dp > 1] + [pp > 1]
    fragmentation = f · (activations + recompute_working + buffers)

**CUDA context** ``C_ctx = 0.5 GiB``: the driver's per-process context (module images,
cuBLAS/cuDNN handles and the cuBLAS workspace). With lazy module loading — the default of
CUDA ≥ 12.2 and of the PyTorch CUDA 12 wheels (NVIDIA, *CUDA C++ Programming Guide*, "Lazy
Loading", https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#lazy-loading,
which reports the context shrinking from over 1 GiB to a few hundred MiB) — ``nvidia-smi``
shows about 0.4–0.6 GiB per process on A100/H100 before any tensor; PyTorch's cuBLAS
workspace adds ``CUBLAS_WORKSPACE_CONFIG`` ``:4096:8`` = 8 × 4 MiB = 32 MiB per stream
(PyTorch, *Reproducibility* notes). An assumption from those public figures, not measured
here (no GPU was available to this change).

**NCCL buffers.** Each communicator a rank belongs to allocates, per channel and per
connected peer, a receive buffer of ``NCCL_BUFFSIZE`` bytes for the Simple protocol —
default 4 MiB = 4194304 bytes (NCCL user guide, "Environment Variables", NCCL_BUFFSIZE,
https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html). A ring connects each
rank to 2 peers (previous and next); NCCL opens up to 16–32 channels on NVLink/NVSwitch
A100 and H100 (NCCL_MIN_NCHANNELS/NCCL_MAX_NCHANNELS in the same guide), we take
``channels = 16``. So a communicator costs ``16 · 2 · 4 MiB = 128 MiB`` on each member, and
a plan creates one per parallel dimension it uses plus the world group: Megatron-style
training builds the tensor-, data- and pipeline-parallel groups and the default group (the
first collective on it creates its communicator), so ``n_comm`` above; LL/LL128 buffers and
the tied-embedding group are not counted.

**Allocator fragmentation.** PyTorch's CUDA caching allocator rounds large requests up to
2 MiB, carves requests of 1–10 MiB out of 20 MiB segments and cannot merge free blocks of
different segments, so ``torch.cuda.max_memory_reserved()`` exceeds
``max_memory_allocated()`` by what the allocation pattern strands (PyTorch, *CUDA
semantics*, "Memory management" and ``PYTORCH_CUDA_ALLOC_CONF`` / ``expandable_segments``,
https://pytorch.org/docs/stable/notes/cuda.html#memory-management). Model states are
allocated once, in large blocks, and strand little; what churns every microbatch —
activations, recompute working sets and the buffers of collectives — strands some; we take
``f = 10 %`` of those bytes (an assumption: reserved/allocated ratios of 1.05–1.3 are what
practitioners report for transformer training without ``expandable_segments``).
"""

from __future__ import annotations

__all__ = ["CUDA_CONTEXT_BYTES", "FRAGMENTATION_RATE", "NCCL_BUFFSIZE", "NCCL_CHANNELS",
           "NCCL_PEERS", "communicators", "cuda_context_bytes", "fragmentation_bytes",
           "nccl_bytes"]

MIB = float(1 << 20)

#: ``C_ctx``: CUDA context, library handles and workspaces of one GPU process (docstring).
CUDA_CONTEXT_BYTES = 512 * MIB
#: NCCL's default ``NCCL_BUFFSIZE`` (Simple protocol buffer per channel and peer).
NCCL_BUFFSIZE = 4 * MIB
#: Channels NCCL opens per communicator on NVLink/NVSwitch nodes (assumption, docstring).
NCCL_CHANNELS = 16
#: Peers a ring connects each rank to.
NCCL_PEERS = 2
#: ``f``: share of the transient bytes the caching allocator strands.
FRAGMENTATION_RATE = 0.10


def _gpu(kind: str) -> bool:
    return kind == "gpu"


def cuda_context_bytes(kind: str, measured_gib: float | None = None) -> float:
    """``C_ctx`` on a GPU — ``measured_gib`` where the spec carries a measured context
    (``cuda_context_gib``, written by ``fxplan calibrate``), else :data:`CUDA_CONTEXT_BYTES` —,
    0 on a CPU device."""
    if not _gpu(kind):
        return 0.0
    return CUDA_CONTEXT_BYTES if measured_gib is None else measured_gib * 2**30


def communicators(*, pp: int, dp: int, tp: int) -> int:
    """``n_comm``: the world group (when there is more than one rank) and one group per
    parallel dimension of size > 1."""
    return int(pp * dp * tp > 1) + int(tp > 1) + int(dp > 1) + int(pp > 1)


def nccl_bytes(kind: str, *, pp: int, dp: int, tp: int) -> float:
    """``n_comm · channels · peers · NCCL_BUFFSIZE`` on a GPU, 0 on a CPU device."""
    if not _gpu(kind):
        return 0.0
    return communicators(pp=pp, dp=dp, tp=tp) * NCCL_CHANNELS * NCCL_PEERS * NCCL_BUFFSIZE


def fragmentation_bytes(kind: str, transient: float) -> float:
    """``f · transient`` on a GPU (``transient`` = activations + recompute working set +
    buffers), 0 on a CPU device."""
    return FRAGMENTATION_RATE * transient if _gpu(kind) else 0.0
