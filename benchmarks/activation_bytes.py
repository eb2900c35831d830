"""Activation bytes one repeated block holds for its backward at module level, against the price.

    python benchmarks/activation_bytes.py                     # llama-tiny:layers=2, 4 x 64
    python benchmarks/activation_bytes.py --model gpt-tiny:layers=2,attention=sdpa --seq 128

For each recompute policy the runtime applies (:func:`fxplan.runtime.apply.recompute.
apply_recompute`: ``selective`` checkpoints each fused attention call alone, ``full`` the
block) the model's first repeated block runs forward once, on the input the whole model gives
it, in fp32 on this CPU. Every op output's storage is tracked by weak reference; what is still
alive after the forward — less the parameters, the buffers and the block's output, plus the
block's input (the first op keeps it, or the checkpoint does) — is what the block holds for its
backward. Printed beside the cost model's saved bytes for the same block and microbatch
(:func:`fxplan.cost_model.step.layer_costs.segment_cost` on the capture's graph of the same
model, ``local-cpu``), and the difference each policy makes against ``none`` on both sides.
Measured bytes, not timed: the numbers do not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import copy
import gc
import weakref
from typing import Any

POLICIES = ("none", "selective", "full")


def _block_and_input(spec: str, batch: int, seq: int) -> tuple[Any, tuple, dict, bool]:
    """The model's first repeated block (the runtime's probe finds it) and the arguments the
    model's forward passes it, detached, each needing a gradient where it did in the model
    (the hidden state does; position tables made from buffers do not)."""
    import torch

    from fxplan.examples.model_spec import resolve_model
    from fxplan.runtime.apply.probe import probe_module

    model_spec = resolve_model(spec)
    torch.manual_seed(0)
    model = model_spec.build("cpu")
    specs = dict(model_spec.example_inputs(batch, seq))
    first = next(iter(specs.values()))
    tokens = torch.randint(0, 64, tuple(first.shape), generator=torch.Generator().manual_seed(1))
    probe = probe_module(model, (tokens,))
    block = model.get_submodule(probe.blocks[0])
    seen: dict[str, Any] = {}
    hook = block.register_forward_pre_hook(
        lambda module, args, kwargs: seen.setdefault("call", (args, kwargs)), with_kwargs=True)
    model(tokens)
    hook.remove()
    args, kwargs = seen["call"]
    args = tuple(a.detach().requires_grad_(a.requires_grad) if torch.is_tensor(a) else a
                 for a in args)
    return block, args, kwargs, probe.fused_attention


def held_bytes(block: Any, args: tuple, kwargs: dict, policy: str) -> int:
    """Bytes a copy of ``block`` under ``policy`` holds for its backward after one forward
    (module docstring)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    from fxplan.runtime.apply.recompute import apply_recompute

    class Outputs(TorchDispatchMode):
        """Every op output's storage, by weak reference, with its size."""

        def __init__(self) -> None:
            super().__init__()
            self.storages: dict[int, tuple[weakref.ref, int]] = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if torch.is_tensor(t):
                    storage = t.untyped_storage()
                    self.storages[id(storage)] = (weakref.ref(storage), storage.nbytes())
            return out

    copied = copy.deepcopy(block)
    apply_recompute([copied], [policy])
    with Outputs() as outputs:
        out = copied(*args, **kwargs)
    gc.collect()
    left_out = {id(t.untyped_storage()) for t in tree_leaves(out) if torch.is_tensor(t)}
    left_out |= {id(t.untyped_storage()) for t in [*copied.parameters(), *copied.buffers()]}
    alive = sum(n for key, (ref, n) in outputs.storages.items()
                if ref() is not None and key not in left_out)
    first = next(a for a in args if torch.is_tensor(a))
    return alive + first.untyped_storage().nbytes()


def priced_bytes(graph: Any, batch: int, policy: str) -> float:
    """The cost model's saved bytes of ``graph``'s first repeated block at microbatch
    ``batch``, ``local-cpu``."""
    from fxplan.cluster_specs import Cluster
    from fxplan.cost_model.step.layer_costs import graph_segments, segment_cost

    key = graph_segments(graph).layers[0][0]
    device = Cluster.load("local-cpu:devices=2").device(0)
    return segment_cost(graph, key, tp=1, sequence_parallel=False, recompute=policy,
                        microbatch=batch, device=device).activations.saved


def measure(spec: str, batch: int, seq: int) -> dict[str, dict[str, float]]:
    """Per policy the module level runs: ``held`` (measured) and ``priced`` bytes (the model
    captured once, fp32). Selective recompute only where the blocks make a fused attention
    call: the module level leaves a written-out attention's to the graph rewrite."""
    import torch

    import fxplan

    block, args, kwargs, fused = _block_and_input(spec, batch, seq)
    graph = fxplan.capture(spec, batch=batch, seq=seq, dtype=torch.float32)
    return {policy: {"held": float(held_bytes(block, args, kwargs, policy)),
                     "priced": priced_bytes(graph, batch, policy)}
            for policy in POLICIES if fused or policy != "selective"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama-tiny:layers=2")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    args = parser.parse_args()
    rows = measure(args.model, args.batch, args.seq)
    none = rows["none"]
    print(f"{args.model}, {args.batch} x {args.seq} tokens, one block, fp32 (KiB)")
    print(f"{'policy':10} {'held':>9} {'priced':>9} {'priced/held':>12} "
          f"{'held - none':>12} {'priced - none':>14}")
    if "selective" not in rows:
        print("selective: the blocks make no fused attention call; the module level leaves "
              "the plan to the graph rewrite")
    for policy, row in rows.items():
        print(f"{policy:10} {row['held'] / 1024:9.0f} {row['priced'] / 1024:9.0f} "
              f"{row['priced'] / row['held']:12.3f} {(row['held'] - none['held']) / 1024:12.0f} "
              f"{(row['priced'] - none['priced']) / 1024:14.0f}")


if __name__ == "__main__":
    main()
