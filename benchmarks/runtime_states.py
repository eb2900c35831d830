"""Model states: what the runtime keeps on a rank against what the memory model prices.

The memory model (:func:`fxplan.cost_model.memory.breakdown.model_state_bytes`) prices Adam in
mixed precision after Megatron-LM and DeepSpeed: ``k_p = 2`` B of 16-bit weights, ``k_g = 2``
B of 16-bit gradients and ``k_o = 12`` B of fp32 master weights and moments per parameter,
ZeRO-1 sharding ``k_o`` over ``N = dp``, ZeRO-2 also ``k_g``, ZeRO-3 everything, and
``offload=optimizer`` moving ``k_o`` to the host (``16`` B there: master, gradient copy,
moments). fxplan's runtime keeps fp32 parameters (the masters) and computes in the plan's
dtype ``c`` (bf16: autocast under DDP, FSDP2's ``MixedPrecisionPolicy`` under
``fully_shard``), so per parameter a rank holds, with ``w = g = 4`` (fp32 parameter and
gradient; DDP's gradients are views into its fp32 buckets, ``gradient_as_bucket_view=True``),
``2`` (a gathered bf16 parameter), ``s = 8`` (AdamW's moments) and ``Ψ_o`` the parameters this
rank's optimizer updates::

    ZeRO-0, DDP                           w + g + s                   = 16
    ZeRO-1, tp = 1 (ZeroRedundancyOpt.)    w + g + s·Ψ_o/Ψ             = 8 + 8/N on average
    ZeRO-2 (fully_shard, no reshard)       (w + g + s)/N + 2           = 16/N + 2
    ZeRO-1, tp > 1 (runs as ZeRO-2)        the same, Ψ the tp shard
    ZeRO-3 (fully_shard)                   (w + g + s)/N + 2·(Ψ_root + 2·Ψ_block)/Ψ
    offload=optimizer, ZeRO-0/1            w + g on the device; 16·Ψ_o/Ψ on the host

(ZeRO-3's gathered window at its peak: the root's parameters — embedding, head, final norm,
which FSDP2 does not reshard after the root's forward — and two blocks, the one running its
backward and the one prefetched.)

This script measures those bytes: it builds each configuration's sharded module as
``fxplan launch`` does (:func:`fxplan.runtime.apply.graph.apply_plan`, the trainer's AdamW of
:func:`fxplan.runtime.train.optim.build_optimizer`) on the test suite's gloo pool of CPU ranks
(``tests/helpers/rt_pool.py``) for the tiny GPT of ``tests/helpers/rt_plans.py`` (4 layers),
runs three training steps in bf16 and counts on each rank the distinct storages of

* **params kept**: the local tensors of the parameters (a DTensor's ``_local_tensor``);
* **params gathered**: FSDP2's gathered parameters alive (each parameter's all-gather
  output, and the flat output of a prefetch not yet waited for), sampled after the forward
  of every leaf module and when the gradient reaches its output in the backward; the peak
  over the step;
* **grads**: the local tensors of the parameters' gradients after the backward;
* **DDP buckets**: the flat buffers DDP reduces (seen by a comm hook that calls torch's
  default all-reduce hook) that are not the gradients' own storage; kept when the same
  storage comes back in the third step while the second step's reference is still held (DDP
  rebuilds its buckets after the first);
* **optimizer**: the local optimizer's state tensors with a parameter's shape (AdamW's
  ``step`` scalars left out) on the device, and for the host optimizer its masters, gradient
  buffers and moments on the host (a CPU rank's "host" is the same memory: the objects tell
  them apart).

It prints one row per configuration: measured bytes per parameter of the rank (``Ψ``: the
rank's parameters after tensor parallelism, tied ones once) against ``model_state_bytes(Ψ,
dp, zero, adam_for("bf16"), offload)/Ψ`` (the runtime's layout), and the dtype and bytes per
parameter one gradient
reduction moves (DDP's buckets as the hook saw them; FSDP2's ``reduce_dtype`` read from its
parameters). Run: ``python benchmarks/runtime_states.py`` (about 10 s on 2 cores).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Iterable

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
HELPERS = os.path.join(os.path.dirname(HERE), "tests", "helpers")
if HELPERS not in sys.path:
    sys.path.append(HELPERS)

#: The tiny GPT's depth here: 4 blocks, so that ZeRO-3's gathered window (the running block,
#: the prefetched one and the root) is smaller than ZeRO-2's all blocks.
LAYERS = 4

#: name → ``rt_plans.make_plan`` keywords (global batch 4 samples of 16 tokens).
CONFIGS: dict[str, dict[str, Any]] = {
    "ZeRO-0 dp=2": dict(dp=2, zero=0),
    "ZeRO-1 dp=2": dict(dp=2, zero=1),
    "ZeRO-2 dp=2": dict(dp=2, zero=2),
    "ZeRO-3 dp=2": dict(dp=2, zero=3),
    "ZeRO-1 dp=2 tp=2": dict(dp=2, tp=2, zero=1),
    "ZeRO-0 dp=2 offload=optimizer": dict(dp=2, zero=0, offload="optimizer"),
    "ZeRO-1 dp=2 offload=optimizer": dict(dp=2, zero=1, offload="optimizer"),
    # FSDP2's reduction deferred to the last microbatch (gradient sync off before it)
    "ZeRO-1 dp=2 tp=2 m=2": dict(dp=2, tp=2, zero=1, num_microbatches=2, microbatch_size=1),
    "ZeRO-2 dp=2 pp=2 interleaved:2 m=4": dict(dp=2, pp=2, zero=2, schedule="interleaved:2",
                                               num_microbatches=4, microbatch_size=1),
}

#: The measured quantities, in table order (bytes on one rank).
KINDS = ("params", "gathered", "grads", "accumulated", "buckets", "optimizer", "host")


class _Storages:
    """Distinct storages by address: ``add`` a tensor, ``nbytes`` the total, ``dtypes``."""

    def __init__(self) -> None:
        self.bytes: dict[int, int] = {}
        self.dtypes: set[str] = set()

    def add(self, tensor: torch.Tensor | None) -> None:
        from torch.distributed.tensor import DTensor

        if tensor is None:
            return
        local = tensor._local_tensor if isinstance(tensor, DTensor) else tensor
        storage = local.untyped_storage()
        if storage.nbytes():
            self.bytes[storage.data_ptr()] = storage.nbytes()
            self.dtypes.add(str(local.dtype).removeprefix("torch."))

    def add_all(self, tensors: Iterable[torch.Tensor | None]) -> "_Storages":
        for tensor in tensors:
            self.add(tensor)
        return self

    @property
    def nbytes(self) -> int:
        return sum(self.bytes.values())


def _fsdp_groups(stages: list[Any]) -> list[Any]:
    """FSDP2's parameter groups (``FSDPParamGroup``, one per wrapped module) of ``stages``."""
    out = []
    for module in (m for s in stages for m in s.module.modules()):
        state = getattr(module, "_get_fsdp_state", None)
        group = state()._fsdp_param_group if state is not None else None
        if group is not None:
            out.append(group)
    return out


def _fsdp_params(stages: list[Any]) -> list[Any]:
    """FSDP2's per-parameter records (``FSDPParam``) of ``stages``."""
    return [p for group in _fsdp_groups(stages) for p in group.fsdp_params]


class _GatheredPeak:
    """The peak bytes of FSDP2's gathered parameters alive — each parameter's all-gather
    output, and the flat output of an all-gather issued but not yet waited for (a prefetch) —,
    sampled in forward and backward at every leaf module of ``stages`` (module docstring)."""

    def __init__(self, stages: list[Any]) -> None:
        self.groups = _fsdp_groups(stages)
        self.peak, self.dtypes = 0, set()
        #: FSDP2's unsharded gradients accumulated between microbatches with sync off, peak
        self.accumulated, self.accumulated_dtypes = 0, set()
        leaves = [m for s in stages for m in s.inner.modules() if not list(m.children())]
        self.handles = [m.register_forward_hook(self._forward) for m in leaves]

    def sample(self) -> None:
        pending = (g._all_gather_result for g in self.groups)
        seen = _Storages().add_all(t for g in self.groups for p in g.fsdp_params
                                   for t in p.all_gather_outputs)
        seen.add_all(r.all_gather_output for r in pending if r is not None)
        if seen.nbytes > self.peak:
            self.peak = seen.nbytes
        self.dtypes |= seen.dtypes
        kept = _Storages().add_all(p.unsharded_accumulated_grad for g in self.groups
                                   for p in g.fsdp_params)
        self.accumulated = max(self.accumulated, kept.nbytes)
        self.accumulated_dtypes |= kept.dtypes

    def _forward(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        self.sample()
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda grad: self.sample())

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


class _DDPBuckets:
    """A comm hook on every DDP wrapper of ``stages`` that records each bucket's buffer and
    hands the bucket to torch's default all-reduce hook (what DDP runs without a hook)."""

    def __init__(self, stages: list[Any]) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        from torch.nn.parallel import DistributedDataParallel

        #: per step, bucket index → its buffer (held: a freed one cannot come back at its address)
        self.steps: list[dict[tuple[int, int], torch.Tensor]] = []
        self.wrappers = [s.module for s in stages if isinstance(s.module, DistributedDataParallel)]

        for k, ddp in enumerate(self.wrappers):
            def hook(group, bucket, k=k):  # type: ignore[no-untyped-def]  # DDP reads annotations
                self.steps[-1][(k, bucket.index())] = bucket.buffer()
                return allreduce_hook(group, bucket)

            ddp.register_comm_hook(ddp.process_group, hook)

    def new_step(self) -> None:
        self.steps.append({})

    def kept(self) -> bool:
        """Whether every bucket of the last step reused the storage of the step before (DDP
        rebuilds its buckets once, after the first step: compare the last two)."""
        first, last = self.steps[-2], self.steps[-1]
        return bool(last) and all(
            key in first and first[key].untyped_storage().data_ptr()
            == buffer.untyped_storage().data_ptr() for key, buffer in last.items())

    def buffers(self) -> list[torch.Tensor]:
        return list(self.steps[-1].values()) if self.steps else []


def _tp_local_count(params: Iterable[torch.nn.Parameter]) -> int:
    """``Ψ``: the rank's parameters after tensor parallelism as the runtime lays them out
    (a DTensor's global size divided by the sizes of the mesh dims other than ``dp`` it is
    sharded over), each once."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    total = 0
    for param in params:
        split = 1
        if isinstance(param, DTensor):
            names = param.device_mesh.mesh_dim_names or ()
            for dim, placement in enumerate(param.placements):
                if isinstance(placement, (Shard, _StridedShard)) and names[dim] != "dp":
                    split *= param.device_mesh.size(dim)
        total += param.numel() // split
    return total


def _optimizer_states(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Device and host bytes of this rank's optimizer, and the parameters it updates."""
    from fxplan.runtime.checkpoint.optim_state import local_optimizer
    from fxplan.runtime.train.host_optimizer import HostOffloadOptimizer

    local = local_optimizer(optimizer)
    updated = sum((p._local_tensor if hasattr(p, "_local_tensor") else p).numel()
                  for g in local.param_groups for p in g["params"])
    moments = lambda opt: (v for state in opt.state.values() for v in state.values()  # noqa: E731
                           if isinstance(v, torch.Tensor) and v.dim() > 0)
    device, host = _Storages(), _Storages()
    if isinstance(local, HostOffloadOptimizer):
        host.add_all(local.masters.values())
        host.add_all(local._grad_buffers.values())
        host.add_all(moments(local.host))
        shown = _Storages().add_all(moments(local))
        assert set(shown.bytes) <= set(host.bytes), "the host optimizer shows device state"
    else:
        device.add_all(moments(local))
    return dict(optimizer=device, host=host, updated=updated, kind=type(local).__name__)


def _reduce_dtype(stages: list[Any], buckets: _DDPBuckets) -> dict[str, Any]:
    """What one gradient reduction moves: DDP's bucket buffers as its hook saw them, else
    FSDP2's ``reduce_dtype`` read from its parameters (the dtype the reduce-scatter runs in)."""
    if buckets.wrappers:
        moved = buckets.buffers()
        return dict(by="DDP buckets (measured)",
                    dtypes=sorted({str(b.dtype).removeprefix("torch.") for b in moved}),
                    bytes=sum(b.numel() * b.element_size() for b in moved))
    fsdp = _fsdp_params(stages)
    dtypes = {p.reduce_dtype or p.orig_dtype for p in fsdp}
    return dict(by="FSDP2 reduce_dtype (configured)",
                dtypes=sorted(str(d).removeprefix("torch.") for d in dtypes),
                bytes=sum(p.sharded_param._local_tensor.numel() * p.mesh_info.shard_mesh_size
                          * torch.finfo(p.reduce_dtype or p.orig_dtype).bits // 8 for p in fsdp))


def measure_states(plan_kwargs: dict[str, Any], dtype: str = "bf16", layers: int = LAYERS,
                   steps: int = 3) -> dict[str, Any] | None:
    """Pool job (every rank): ``steps`` AdamW steps of the tiny GPT under the plan in
    ``dtype``, then this rank's bytes of each of :data:`KINDS`, their dtypes, ``psi`` (its
    parameters after tp), ``updated`` (those its optimizer steps), the optimizer's class, the
    gradient reduction's dtype and bytes, and the fallbacks taken; ``None`` outside the plan."""
    from fxplan.examples.models.lm import lm_loss
    from fxplan.runtime.apply.graph import apply_plan
    from fxplan.runtime.apply.precision import DTYPES, Precision
    from fxplan.runtime.train.optim import build_optimizer
    from rt_plans import build_model, fixed_batch, make_plan

    plan = make_plan(layers=layers, **plan_kwargs)
    batch = fixed_batch(plan)
    sharded = apply_plan(build_model(layers), plan, batch[0],
                         precision=Precision(DTYPES[dtype]))
    if sharded is None:
        return None
    psi = _tp_local_count(sharded.parameters())
    buckets = _DDPBuckets(sharded.stages)
    optimizer = build_optimizer(sharded, "adamw", lr=1e-3)
    for step in range(steps):
        buckets.new_step()
        gathered = _GatheredPeak(sharded.stages) if step == steps - 1 else None
        sharded.train_step(batch, lm_loss)
        if gathered is not None:
            gathered.remove()
        else:
            optimizer.step()
            optimizer.zero_grad()
    grads = _Storages().add_all(p.grad for p in sharded.parameters())
    optimizer.step()   # the last step's state, the gradients kept for the count above
    params = _Storages().add_all(sharded.parameters())
    states = _optimizer_states(optimizer)
    ddp = _Storages().add_all(buckets.buffers() if buckets.kept() else ())
    for shared in set(ddp.bytes) & set(grads.bytes):   # gradients as views of the buckets
        del ddp.bytes[shared]
    measured = dict(params=params, grads=grads, buckets=ddp, optimizer=states["optimizer"],
                    host=states["host"])
    return dict(
        psi=psi, updated=states["updated"], optimizer_class=states["kind"], dtype=dtype,
        bytes={**{k: v.nbytes for k, v in measured.items()}, "gathered": gathered.peak,
               "accumulated": gathered.accumulated},
        dtypes={**{k: sorted(v.dtypes) for k, v in measured.items()},
                "gathered": sorted(gathered.dtypes),
                "accumulated": sorted(gathered.accumulated_dtypes)},
        reduction=_reduce_dtype(sharded.stages, buckets), fallbacks=sharded.fallbacks,
        wrapper=sorted({type(s.module).__name__ for s in sharded.stages}))


def priced(config: dict[str, Any], psi: int, dtype: str = "bf16") -> dict[str, float]:
    """The memory model's model states of ``psi`` parameters under ``config``, in the
    runtime's layout: bytes by kind (a ZeRO-2 rank's gathered copy is part of ``params``
    there; DDP buckets are no model state: 0)."""
    from fxplan.cost_model.memory.breakdown import adam_for, model_state_bytes

    states = model_state_bytes(psi, config.get("dp", 1), config.get("zero", 0),
                               adam_for(dtype), config.get("offload", "none"),
                               dtensor=config.get("tp", 1) > 1, accumulates=defers(config))
    return dict(params=states.params, gathered=0.0, grads=states.grads, accumulated=0.0,
                buckets=0.0, optimizer=states.optimizer, host=states.host)


def defers(config: dict[str, Any]) -> bool:
    """Whether FSDP2's reduction waits for the last microbatch under ``config``
    (:attr:`~fxplan.core.config.ParallelConfig.defers_sharded_reduction`)."""
    from rt_plans import make_plan

    return make_plan(layers=LAYERS, **config).config.defers_sharded_reduction


def device_states(row: dict[str, float], config: dict[str, Any]) -> float:
    """The device bytes of a row that the model's model states stand for: every kind but the
    host's, and under ZeRO-3 without the gathered window (the model prices two layers of it
    as a buffer, not as a state); where the reduction is deferred, the gradients at their
    peak, the unsharded ones accumulated before it (the shards after it are kept in their
    place: the step sets them to ``None`` before the next one accumulates)."""
    skip = {"host"} | ({"gathered"} if config.get("zero") == 3 else set())
    skip |= {"grads"} if row.get("accumulated") else {"accumulated"}
    return sum(v for k, v in row.items() if k not in skip)


def _table(results: dict[str, dict[str, Any]]) -> str:
    def per(values: dict[str, float], psi: int) -> str:
        return " | ".join(f"{values[k] / psi:.2f}" for k in KINDS)

    head = ("| configuration | params kept | params gathered (peak) | grads | grads accumulated "
            "unsharded (peak) | DDP buckets | "
            "optimizer | host | device states | priced params / grads / optimizer / host | "
            "priced device states | measured / priced | reduction moves |")
    lines = [head, "|---" * 13 + "|"]
    for name, report in results.items():
        psi, measured = report["psi"], report["bytes"]
        config = CONFIGS[name]
        model = priced(config, psi, report["dtype"])
        runtime_total, model_total = device_states(measured, config), device_states(model, config)
        red = report["reduction"]
        lines.append(
            f"| {name} | {per(measured, psi)} | {runtime_total / psi:.2f} | "
            f"{model['params'] / psi:.2f} / {model['grads'] / psi:.2f} / "
            f"{model['optimizer'] / psi:.2f} / {model['host'] / psi:.2f} | "
            f"{model_total / psi:.2f} | {runtime_total / model_total:.2f}× | "
            f"{red['bytes'] / psi:.2f} B ({', '.join(red['dtypes'])}) |")
    return "\n".join(lines)


def main() -> None:
    from rt_pool import RankPool

    pool = RankPool(world=4)
    results: dict[str, dict[str, Any]] = {}
    try:
        for name, config in CONFIGS.items():
            reports = pool.run("runtime_states:measure_states", plan_kwargs=config)
            results[name] = reports[0]
            others = [r for r in reports[1:] if r is not None]
            print(f"{name}: Ψ={reports[0]['psi']} rank 0 updates {reports[0]['updated']}"
                  f" ({reports[0]['optimizer_class']}, {', '.join(reports[0]['wrapper'])});"
                  f" other members update {[r['updated'] for r in others]}; dtypes "
                  f"{reports[0]['dtypes']}; reduction {reports[0]['reduction']['by']}",
                  flush=True)
            for line in reports[0]["fallbacks"]:
                print(f"    fallback: {line}")
    finally:
        pool.close()
    print()
    print(f"Bytes per parameter of rank 0 (Ψ its parameters after tp), tiny GPT "
          f"{LAYERS} layers, {results[next(iter(results))]['dtype']} compute, AdamW:")
    print(_table(results))
    print("device states: every device column but ZeRO-3's gathered window, which the model "
          "prices as a buffer (two layers), not as a model state")


if __name__ == "__main__":
    main()
