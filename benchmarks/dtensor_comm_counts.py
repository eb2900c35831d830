"""Count the collectives a launched plan really issues per step, and where its gradients live.

    python benchmarks/dtensor_comm_counts.py "tp=2,sp=on,recompute=none" [--ranks 2] [--time N]

Plans gpt-tiny at global batch 16 on ``local-cpu:devices=N`` under the ``--constrain`` text,
applies the plan on N gloo ranks (``torch.multiprocessing``, one thread each), runs one
warm-up step, then counts with DTensor's ``CommDebugMode`` the functional collectives of one
``train_step`` (forward + backward), of the trainer's Partial-gradient reduction and clipping
(:mod:`fxplan.runtime.apply.partial_grads`, then ``clip_grad_norm``) and of one
``optimizer.step()`` + ``zero_grad()``, the ATen ops dispatched on DTensors in that
``train_step`` (forward, backward; what :mod:`fxplan.cost_model.host.dtensor_dispatch` prices), and
prints the placements of the gradients after the backward. What the cost model prices is in
``fxplan estimate`` (``tp_comm`` of the breakdown); this script says what the runtime does,
for the comparison in docs/benchmarks.md. Collectives outside DTensor's functional
ops (DDP's reducer, ``ZeroRedundancyOptimizer``) are not seen by ``CommDebugMode``.
"""

from __future__ import annotations

import argparse
from collections import Counter

import torch

from fxplan.core.loopback import free_loopback_port


def _worker(rank: int, world: int, port: int, constrain: str, steps: int) -> None:
    import torch.distributed as dist
    from torch.distributed.tensor.debug import CommDebugMode

    import fxplan
    from fxplan.cli.constraint_text import parse_constraints
    from fxplan.examples.model_spec import resolve_model
    from fxplan.runtime.apply.graph import apply_plan
    from fxplan.runtime.train.optim import clip_grad_norm
    from fxplan.runtime.apply.partial_grads import reduce_partial_grads
    from fxplan.rank.loss import loss_fn

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    plan = fxplan.search("gpt-tiny", f"local-cpu:devices={world}", batch=16,
                         constraints=parse_constraints(constrain) or None, progress=False)
    bundle = resolve_model("gpt-tiny")
    vocab = getattr(bundle.config, "vocab", None) or bundle.config.vocab_size
    torch.manual_seed(0)
    tokens, targets = (torch.randint(0, vocab, (16, plan.seq)) for _ in range(2))
    sharded = apply_plan(bundle.build("cpu"), plan, (tokens,))
    optimizer = sharded.optimizer(torch.optim.AdamW, lr=1e-3)
    sharded.train_step(((tokens,), targets), loss_fn)
    optimizer.step()
    optimizer.zero_grad()
    with _DTensorOps() as ops:   # a step of its own: CommDebugMode dispatches ops itself
        sharded.train_step(((tokens,), targets), loss_fn)
    optimizer.zero_grad()
    step = CommDebugMode()
    with step:
        sharded.train_step(((tokens,), targets), loss_fn)
    grads = Counter(str(getattr(p.grad, "placements", "plain tensor"))
                    for p in sharded.parameters() if p.grad is not None)
    sync = CommDebugMode()
    with sync:  # as the trainer does: reduce the Partial gradients once, then clip
        flattened = reduce_partial_grads(sharded)
        clip_grad_norm(sharded, 1.0)
    opt = CommDebugMode()
    with opt:
        optimizer.step()
        optimizer.zero_grad()
    if rank == 0:
        fb = {str(k).rpartition(".")[2]: v for k, v in step.get_comm_counts().items()}
        os_ = {str(k).rpartition(".")[2]: v for k, v in opt.get_comm_counts().items()}
        cs = {str(k).rpartition(".")[2]: v for k, v in sync.get_comm_counts().items()}
        print(f"plan: {plan.summary}")
        print(f"forward + backward: {sum(fb.values())} collectives {fb}")
        for fqn, counts in _leaf_counts(step).items():
            print(f"  {fqn}: {counts}")
        print(f"Partial-gradient reduction + clipping: {sum(cs.values())} collectives {cs} "
              f"({flattened} of them the flattened reduction, the others the norm's)")
        print(f"optimizer step: {sum(os_.values())} collectives {os_}")
        print(f"DTensor-level ATen ops (cost_model.dtensor_dispatch): "
              f"forward {ops.total('fwd')}, backward {ops.total('bwd')}")
        for (phase, op), n in sorted(ops.counts.items()):
            print(f"  {phase} {op}: {n}")
        print(f"gradient placements ({len(sharded.parameters())} parameters): {dict(grads)}")
        print(f"predicted tp_comm {plan.estimate['breakdown'].get('tp_comm', 0.0) * 1e3:.1f} ms")
    if steps:
        _time_steps(sharded, optimizer, ((tokens,), targets), loss_fn, steps, rank)
    dist.destroy_process_group()


class _DTensorOps:
    """Count the ATen ops dispatched on DTensors, forward and backward (a dispatch mode sees
    an op before the DTensor subclass does; the phase: whether autograd's engine runs)."""

    def __init__(self) -> None:
        from collections import Counter

        self.counts: Counter[tuple[str, str]] = Counter()

    def __enter__(self) -> "_DTensorOps":
        from torch.distributed.tensor import DTensor
        from torch.utils._python_dispatch import TorchDispatchMode

        counts = self.counts

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                if any(issubclass(t, DTensor) for t in types):
                    phase = "bwd" if torch._C._current_graph_task_id() != -1 else "fwd"
                    counts[(phase, func.overloadpacket.__name__)] += 1
                return func(*args, **(kwargs or {}))

        self.mode = Mode()
        self.mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.mode.__exit__(*exc)

    def total(self, phase: str) -> int:
        return sum(n for (p, _), n in self.counts.items() if p == phase)


def _leaf_counts(mode) -> dict[str, dict[str, int]]:  # type: ignore[no-untyped-def]
    """Forward/backward collectives per innermost module that issued them (CommDebugMode's
    module tracker; the rewrite's ``Reshard`` modules name the planned node)."""
    out: dict[str, dict[str, int]] = {}
    table = getattr(mode, "comm_module_counts", {})
    for fqn, entry in table.items():
        if fqn == "Global":  # the whole step, printed as the total
            continue
        own: dict[str, int] = {}
        for phase in ("forward", "backward"):
            for op, n in entry.get(phase, {}).items():
                # subtract what the module's children issued
                kids = sum(e.get(phase, {}).get(op, 0) for f, e in table.items()
                           if f.startswith(fqn + ".") and f.count(".") == fqn.count(".") + 1)
                if n - kids:
                    own[f"{phase} {str(op).rpartition('.')[2]}"] = n - kids
        if own:
            out[fqn] = own
    return out


def _time_steps(sharded, optimizer, batch, loss_fn, steps: int, rank: int) -> None:  # type: ignore[no-untyped-def]
    """Alternate ``steps`` trainer steps without (``clip`` redistributes each Partial gradient
    on its own, the runtime before 2026-11-24 (`ae51932`)) and with the flattened reduction; print the
    median of the slowest rank's step time of each (ms)."""
    import statistics
    import time

    import torch.distributed as dist

    from fxplan.runtime.train.optim import clip_grad_norm
    from fxplan.runtime.apply.partial_grads import reduce_partial_grads

    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(2 * steps):
        flattened = bool(i % 2)
        dist.barrier()
        began = time.perf_counter()
        sharded.train_step(batch, loss_fn)
        if flattened:
            reduce_partial_grads(sharded)
        clip_grad_norm(sharded, 1.0)
        optimizer.step()
        optimizer.zero_grad()
        elapsed = torch.tensor(time.perf_counter() - began, dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        times[flattened].append(float(elapsed) * 1e3)
    if rank == 0:
        for flattened, label in ((False, "per-gradient (clip)"), (True, "flattened")):
            print(f"step, Partial gradients {label}: median {statistics.median(times[flattened]):.1f}"
                  f" ms over {steps} steps")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("constrain", help="--constrain text, e.g. tp=2,sp=on,recompute=none")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--time", type=int, default=0, metavar="N",
                        help="then time N steps of each Partial-gradient reduction, alternated")
    args = parser.parse_args()
    port = free_loopback_port()
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(args.ranks, port, args.constrain, args.time), nprocs=args.ranks)


if __name__ == "__main__":
    main()
