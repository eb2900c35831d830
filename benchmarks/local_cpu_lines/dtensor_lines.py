"""DTensor's host work: an op, a view op and a ``Shard(0)`` op over the plain one, and a
redistribution's main-thread CPU (``--redistribute``). The formulas are in
``local_cpu_calibration.py``'s docstring."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch

from local_cpu_lines.ranks import join_gloo, single_rank_group, spawn_json
from local_cpu_lines.rates import chain_per_op_s, median_thread_time, op_chain_s

__all__ = ["dtensor_overhead_us", "dtensor_shard_overhead_us", "dtensor_view_overhead_us",
           "print_redistribute", "redistribute_host_us"]


def dtensor_overhead_us(repeats: int) -> dict[str, float]:
    """Extra host cost of an op on a ``DTensor`` over the same op on a plain tensor (µs): the
    chain of :func:`op_chain_s` on 8×8 ``DTensor``s (``Replicate`` on a one-rank mesh,
    so no communication), ``t_dtensor − t_plain`` per op, forward and backward; then AdamW's
    ``step`` per parameter tensor on plain and on ``DTensor`` parameters (gpt-tiny's
    shapes): the optimizer's host cost per tensor and what DTensor adds to it."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate

    from fxplan.examples.model_spec import resolve_model

    single_rank_group()
    mesh = init_device_mesh("cpu", (1,))

    plain = op_chain_s(lambda t: t, repeats)
    dtensor = op_chain_s(lambda t: DTensor.from_local(t, mesh, [Replicate()]), repeats)

    def adamw(wrap: Callable[[torch.Tensor], torch.Tensor]) -> tuple[int, float]:
        model = resolve_model("gpt-tiny").build("cpu")
        params = [torch.nn.Parameter(wrap(p.detach().clone())) for p in model.parameters()]
        for p in params:
            p.grad = torch.zeros_like(p)
        opt = torch.optim.AdamW(params, lr=1e-3)
        return len(params), median_thread_time(opt.step, repeats=repeats) / len(params)

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

    single_rank_group()
    mesh = init_device_mesh("cpu", (1,))
    ops = (lambda x: x.view(4, 16), lambda x: x.view(8, 8), lambda x: x.t(), lambda x: x.t())
    plain = chain_per_op_s(ops, torch.randn(8, 8).requires_grad_(), repeats, backward=False)
    dtensor = chain_per_op_s(ops, DTensor.from_local(torch.randn(8, 8), mesh,
                                                     [Replicate()]).requires_grad_(),
                             repeats, backward=False)
    return {"view_us": (dtensor[0] - plain[0]) * 1e6, "plain_view_us": plain[0] * 1e6}


def _sharded_chain_worker(rank: int, world: int, port: int, repeats: int, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    join_gloo(rank, world, port)
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
    sharded = chain_per_op_s(ops, x0, repeats, loss=lambda y: y.to_local().sum())
    plain = op_chain_s(lambda t: t, repeats)
    if rank == 0:
        Path(out).write_text(json.dumps({"forward_us": (sharded[0] - plain[0]) * 1e6,
                                         "backward_us": (sharded[1] - plain[1]) * 1e6}))
    dist.barrier()
    dist.destroy_process_group()


def dtensor_shard_overhead_us(world: int = 2, repeats: int = 7) -> dict[str, float]:
    """Extra host cost of an op on ``Shard(0)`` ``DTensor``s over the same op on plain tensors
    on a ``world``-rank mesh (µs, forward / backward per op): the chain of :func:`op_chain_s`
    with the activations row-sharded and the weight replicated, as tensor parallelism with
    sequence parallelism runs a layer's ops (no collective: the placements propagate)."""
    return spawn_json(_sharded_chain_worker, world, repeats)


def _redistribute_worker(rank: int, world: int, port: int, repeats: int, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    join_gloo(rank, world, port)
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
        return median_thread_time(fn, repeats=repeats) * 1e6

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
           "eager_op_us": op_chain_s(lambda t: t, repeats, backward=False)[0] * 1e6}
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
    return spawn_json(_redistribute_worker, world, repeats)


def print_redistribute(red: dict[str, float]) -> None:
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
