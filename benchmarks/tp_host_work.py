"""Where a tensor-parallel rank's main-thread CPU goes in one training step.

    python benchmarks/tp_host_work.py "tp=2,sp=on,recompute=none" [--ranks 2] [--batch 1]
        [--steps 20] [--log]

Plans gpt-tiny at global batch ``--batch`` (microbatch = the batch, one microbatch) on
``local-cpu:devices=N`` under the ``--constrain`` text, applies the plan on N gloo ranks
(``torch.multiprocessing``, one thread each) and runs the trainer's phases (``train_step``,
the partial-gradient reduction, clipping, ``AdamW.step``, ``zero_grad``) for 3 warm-up steps
and ``--steps`` measured ones. It prints, per rank and per step, the calls and the inclusive
main-thread CPU time (``time.thread_time``) of:

- the phases, the model's forward (root module hooks) and the loss;
- DTensor's mechanisms, each wrapped with a counter: ``redistribute_local_tensor`` (every
  redistribution, communicating or not), the ``Redistribute`` autograd function forward and
  backward, ``from_local``/``to_local`` forward and backward, ``wait_tensor`` (the functional
  collectives' waits), and the hooks of each ``torch.distributed.tensor.parallel`` style;
- the backward per autograd node name (``bwd:<node>``: pre-hook to hook of every node of the
  loss's graph, registered on each step's graph).

At a small batch the kernels cost little, so what remains is host work: the figures behind
the "2026-11-24 (`613a7a6`) (branch `tpcpu`)" block of ``docs/benchmarks.md``. ``--log`` prints, for the
first measured step of rank 0, every redistribution (shape, from → to placements) and every
``from_local``/``to_local`` backward, which is how the counts of
:mod:`fxplan.cost_model.host.dtensor_dispatch` ("The styles' boundaries") were read. The wrappers
cost ≈ 1–2 ms per step themselves. Not a timing benchmark to put under the lock: thread CPU
time is a rank's own time even on a shared machine, though a loaded machine inflates it.
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import time
from typing import Any, Callable

import torch

from fxplan.core.loopback import free_loopback_port

#: name → [calls, seconds] of the current process (one rank)
_ACC: collections.defaultdict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
_LOG = [False]


def _timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            row = _ACC[name]
            row[0] += 1
            row[1] += time.thread_time() - start
    return wrapper


def _patch() -> None:
    """Wrap DTensor's redistribution, boundary functions, waits and the styles' hooks."""
    import torch.distributed._functional_collectives as funcol
    import torch.distributed.tensor._api as api
    import torch.distributed.tensor._dispatch as dispatch
    import torch.distributed.tensor._redistribute as redistribute
    import torch.distributed.tensor.parallel.style as style

    plain = redistribute.redistribute_local_tensor

    def logged(local: torch.Tensor, current: Any, target: Any, *args: Any, **kwargs: Any) -> Any:
        if _LOG[0]:
            print(f"redistribute {tuple(local.shape)} {current.placements} -> "
                  f"{target.placements}", flush=True)
        return plain(local, current, target, *args, **kwargs)

    wrapped = _timed("redistribute_local_tensor", logged)
    redistribute.redistribute_local_tensor = api.redistribute_local_tensor = wrapped
    dispatch.redistribute_local_tensor = wrapped
    to_local_backward = api._ToTorchTensor.backward

    def logged_backward(ctx: Any, grad: Any) -> Any:
        if _LOG[0]:
            print(f"to_local backward {ctx.dtensor_spec.placements}", flush=True)
        return to_local_backward(ctx, grad)

    api._ToTorchTensor.backward = staticmethod(logged_backward)
    for cls, name in ((api._ToTorchTensor, "to_local"), (api._FromTorchTensor, "from_local"),
                      (redistribute.Redistribute, "Redistribute")):
        cls.forward = staticmethod(_timed(f"{name}.forward", cls.forward))
        cls.backward = staticmethod(_timed(f"{name}.backward", cls.backward))
    funcol.wait_tensor = _timed("wait_tensor", funcol.wait_tensor)
    for cls in vars(style).values():
        if not isinstance(cls, type):
            continue
        for method in ("_prepare_input_fn", "_prepare_output_fn"):
            raw = cls.__dict__.get(method)
            if isinstance(raw, staticmethod):
                setattr(cls, method, staticmethod(_timed(f"{cls.__name__}.{method}",
                                                         raw.__func__)))
            elif callable(raw):
                setattr(cls, method, _timed(f"{cls.__name__}.{method}", raw))


def _hook_backward(loss: torch.Tensor) -> None:
    """Time every autograd node of ``loss``'s graph (pre-hook to hook), by node name."""
    started: dict[int, float] = {}
    seen: set[Any] = set()
    stack = [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        name = f"bwd:{node.name()}"

        def pre(grads: Any, key: int = id(node)) -> None:
            started[key] = time.thread_time()

        def post(inputs: Any, grads: Any, key: int = id(node), name: str = name) -> None:
            row = _ACC[name]
            row[0] += 1
            row[1] += time.thread_time() - started.pop(key, time.thread_time())

        node.register_prehook(pre)
        node.register_hook(post)
        stack.extend(next_fn for next_fn, _ in node.next_functions)


def _worker(rank: int, world: int, port: int, constrain: str, batch: int, steps: int,
            log: bool, queue: Any) -> None:
    _patch()
    import torch.distributed as dist

    import fxplan
    from fxplan.cli.constraint_text import parse_constraints
    from fxplan.examples.model_spec import resolve_model
    from fxplan.runtime.apply.graph import apply_plan
    from fxplan.runtime.train.optim import build_optimizer, clip_grad_norm
    from fxplan.runtime.apply.partial_grads import reduce_partial_grads
    from fxplan.rank.loss import loss_fn

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    plan = fxplan.search("gpt-tiny", f"local-cpu:devices={world}", batch=batch,
                         constraints=parse_constraints(f"{constrain},mb={batch}"),
                         progress=False)
    bundle = resolve_model("gpt-tiny")
    torch.manual_seed(0)
    vocab = getattr(bundle.config, "vocab", None) or bundle.config.vocab_size
    tokens, targets = (torch.randint(0, vocab, (batch, plan.seq)) for _ in range(2))
    sharded = apply_plan(bundle.build("cpu"), plan, (tokens,))
    start, stop = sharded.replica_slice()
    data = ((tokens[start:stop],), targets[start:stop])
    optimizer = build_optimizer(sharded, "adamw", lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95))
    root = sharded.stages[0].module
    began: list[float] = []
    root.register_forward_pre_hook(lambda module, args: began.append(time.thread_time()))

    def forward_done(module: Any, args: Any, out: Any) -> None:
        row = _ACC["forward"]
        row[0] += 1
        row[1] += time.thread_time() - began.pop()

    root.register_forward_hook(forward_done)

    def loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        value = _timed("loss", loss_fn)(out, target)
        _hook_backward(value)
        return value

    phases = (("train_step", lambda: float(sharded.train_step(data, loss, local=True))),
              ("partial", lambda: reduce_partial_grads(sharded)),
              ("clip", lambda: clip_grad_norm(sharded, 1.0)),
              ("opt", optimizer.step), ("zero", optimizer.zero_grad))
    for step in range(steps + 3):
        if step == 3:
            _ACC.clear()
        _LOG[0] = log and rank == 0 and step == 3
        for name, run in phases:
            _timed(name, run)()
    queue.put((rank, {k: (v[0] / steps, v[1] / steps * 1e3) for k, v in _ACC.items()}))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("constrain", help="a --constrain text, e.g. tp=2,sp=on,recompute=none")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1, help="global batch = the microbatch")
    parser.add_argument("--steps", type=int, default=20, help="measured steps (after 3)")
    parser.add_argument("--log", action="store_true",
                        help="print rank 0's redistributions and to_local backwards, one step")
    args = parser.parse_args()
    import torch.multiprocessing as mp

    port = free_loopback_port()
    context = mp.get_context("spawn")
    queue = context.Queue()
    procs = [context.Process(target=_worker, args=(r, args.ranks, port, args.constrain,
                                                   args.batch, args.steps, args.log, queue))
             for r in range(args.ranks)]
    for proc in procs:
        proc.start()
    results = sorted(queue.get() for _ in procs)
    for proc in procs:
        proc.join()
    print(f"gpt-tiny {args.constrain} at batch {args.batch}, {args.ranks} ranks, load average "
          f"{os.getloadavg()[0]:.1f}: per step, calls and inclusive main-thread CPU (ms), by rank")
    first = results[0][1]
    for key in sorted(first, key=lambda k: -first[k][1]):
        print(f"  {key:42s} " + " | ".join(f"{row.get(key, (0, 0))[0]:6.1f} "
                                           f"{row.get(key, (0, 0))[1]:7.2f}"
                                           for _, row in results))


if __name__ == "__main__":
    main()
