"""FSDP2's and DDP's host work per group and tensor on 2 loopback gloo ranks (line 7., ``--fsdp``).
The formulas are in ``local_cpu_calibration.py``'s docstring."""

from __future__ import annotations

import gc
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from local_cpu_lines.ranks import join_gloo, spawn_json
from local_cpu_lines.rates import op_chain_s

__all__ = ["fsdp_host_us", "print_fsdp"]


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

    join_gloo(rank, world, port)
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
            eager.append(op_chain_s(lambda t: t, 1, backward=False)[0] * 1e6)
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
        raw = spawn_json(_fsdp_worker, world, repeats, groups, list(widths))
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


def print_fsdp(row: dict[str, Any]) -> None:
    """The table row of :func:`fsdp_host_us`."""
    print(f"| FSDP2 host work per group per microbatch, 2 ranks, {row['groups']} groups "
          f"(widths {row['widths']}): A, R, B = per group + k tensors | "
          + "; ".join(f"{name} {row[name + '_group_us']:.0f} + {row[name + '_tensor_us']:.1f}·k µs"
                      for name in ("gather", "reduce", "regather"))
          + f"; DDP {row['ddp_step_us']:.0f} + {row['ddp_tensor_us']:.1f}·(tensors) µs per step"
          + f" (at the spec's eager op; {len(row['eager_op_us'])} runs, probed "
          + ", ".join(f"{e:.2f}" for e in row["eager_op_us"]) + " µs) |")
