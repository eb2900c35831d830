"""The object a plan turns into: local stages, their schedule, and the plan itself.

One :class:`ShardedModule` per process holds the pipeline stages of its ``pp`` coordinate (each
already tensor-parallel on ``tp`` and data-parallel on ``dp``) and trains them SPMD:

``train_step((inputs, targets), loss_fn)`` takes the *global* batch (the same on every rank),
keeps this replica's slice ``[d·B/dp, (d+1)·B/dp)`` along dim 0 (with context parallelism the
CP group's slice ``[g·B/R, (g+1)·B/R)``, ``R = dp/cp``, and this rank's chunks of the sequence:
:mod:`fxplan.runtime.styles.context_parallel`), runs the plan's schedule over
``num_microbatches`` microbatches (forward, loss, backward; with ``pp = 1`` a plain
gradient-accumulation loop, :mod:`fxplan.runtime.train.accumulate`, instead of a schedule), under
a zero-bubble schedule with ``dp > 1`` averages the gradients over dp after it
(:mod:`fxplan.runtime.train.dp_reduce`), sums the
gradients of weights shared
between pipeline ranks, and returns the mean loss ``L = (1/dp) Σ_d (1/m) Σ_j loss(mb_j^d)`` — equal
to ``loss_fn`` over the global batch when ``loss_fn`` is a mean. For a Hugging Face mixture of
experts whose config sets ``output_router_logits``, ``loss`` is ``loss_fn + coef · aux``, the
router's auxiliary loss from the global routing (:mod:`fxplan.runtime.styles.router_aux`), as
``transformers`` trains it. The caller steps the optimizer
from :meth:`optimizer`.

:attr:`path` says how the plan was applied: ``module`` (the user's own module with
``parallelize_module`` / ``fully_shard`` / pipeline stages cut at block boundaries) or ``graph``
(the graph rewrite; the reason is the first line of :attr:`fallbacks`).
:attr:`fallbacks` lists, readably and without repeats, where this rank realises the plan other
than as planned (each was also logged as a warning when it happened).

Parameters are addressed by their names in the original model (``h.0.attn.qkv.weight``) in
:meth:`named_parameters`, :meth:`state_dict` and :meth:`full_parameters`, whatever stage, wrapper
or shard they live in now.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from fxplan.core.zero_bubble_dp import reduces_after_step
from fxplan.runtime.train.accumulate import accumulate_microbatches
from fxplan.runtime.train.dp_reduce import AfterStepReduction
from fxplan.runtime.styles.data_parallel import make_optimizer
from fxplan.runtime.styles.router_aux import with_router_aux
from fxplan.runtime.apply.mesh import gather_merged
from fxplan.runtime.train.pipeline import build_schedule
from fxplan.runtime.apply.strided import full_tensor
from fxplan.runtime.apply.tied import TiedGradSync

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.stage_io import StageIO
    from fxplan.core.plan import Plan
    from fxplan.runtime.styles.context_parallel import ContextParallel

__all__ = ["LocalStage", "ShardedModule"]


@dataclass
class LocalStage:
    """Stage ``index`` on this rank: ``module`` as wrapped for dp, ``inner`` unwrapped, and
    ``names`` from ``inner``'s parameter names to the original model's."""

    index: int
    module: nn.Module
    inner: nn.Module
    names: dict[str, str]


class ShardedModule:
    """See the module docstring. Built by :func:`fxplan.runtime.apply.graph.apply_plan`."""

    def __init__(self, plan: "Plan", mesh: DeviceMesh, stages: Sequence[LocalStage],
                 stage_io: Sequence["StageIO"], tied: TiedGradSync, group: dist.ProcessGroup,
                 device: torch.device, fallbacks: Sequence[str] = (), path: str = "graph",
                 context: "ContextParallel | None" = None,
                 experts: Callable[[], None] | None = None) -> None:
        self.plan, self.mesh, self.stages = plan, mesh, list(stages)
        self.stage_io, self.tied, self.group, self.device = stage_io, tied, group, device
        coordinate = mesh.get_coordinate()
        self.coordinate = dict(zip(mesh.mesh_dim_names or (), coordinate))
        last = plan.pp * plan.virtual_stages - 1
        self.is_first = any(s.index == 0 for s in self.stages)
        self.is_last = any(s.index == last for s in self.stages)
        self._built_fallbacks = list(dict.fromkeys(fallbacks))
        #: ``module`` (the user's module, PyTorch's parallel pieces) or ``graph`` (the rewrite)
        self.path = path
        self._schedule_for: tuple[Callable[..., torch.Tensor], Any] | None = None
        #: this rank's context-parallel group (``cp > 1``: :mod:`fxplan.runtime.styles.context_parallel`)
        self.context = context
        #: expert parallelism's gradient reduction over the expert-data-parallel group
        #: (:class:`fxplan.runtime.styles.expert_parallel.ExpertGradSync`), run after each backward
        self.experts = experts
        #: a zero-bubble pipeline's dp reduction after the step (unwrapped stages,
        #: :mod:`fxplan.runtime.train.dp_reduce`; the expert weights are ``experts``')
        self.dp_reduce = (AfterStepReduction([s.module for s in self.stages],
                                             mesh["dp"].get_group(), plan.dp,
                                             skip=getattr(experts, "params", ()))
                          if reduces_after_step(plan.config) else None)

    @property
    def fallbacks(self) -> list[str]:
        """Where this rank departs from the plan: build-time lines (passes, data parallelism)
        and reshards to a partial placement met while training; deduplicated, in order."""
        from fxplan.passes.rewrite.reshard import Reshard

        lines = list(self._built_fallbacks)
        for stage in self.stages:
            for module in stage.inner.modules():
                if isinstance(module, Reshard) and module.fallbacks:
                    lines.append(module.fallback_line)
        return list(dict.fromkeys(lines))

    # -- parameters -----------------------------------------------------------------------
    def named_parameters(self) -> dict[str, nn.Parameter]:
        """Original name → this rank's parameter (a DTensor when sharded), tied ones once."""
        params: dict[str, nn.Parameter] = {}
        for stage in self.stages:
            for local, param in stage.inner.named_parameters(remove_duplicate=False):
                params.setdefault(stage.names[local], param)
        return params

    def parameters(self) -> list[nn.Parameter]:
        unique = {id(p): p for p in self.named_parameters().values()}
        return list(unique.values())

    def optimizer(self, optimizer_class: type[torch.optim.Optimizer] = torch.optim.SGD,
                  **kwargs: Any) -> torch.optim.Optimizer:
        """``optimizer_class`` over the local parameters (state sharded over dp for ZeRO-1)."""
        return make_optimizer(self.parameters(), self.plan, self.mesh, optimizer_class, **kwargs)

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter of the model, unsharded, on every member rank (collective; tests)."""
        local = {}
        for fqn, param in self.named_parameters().items():
            full = full_tensor(param) if isinstance(param, DTensor) else param
            local[fqn] = full.detach().cpu().clone()
        return gather_merged(local, self.group)

    # -- training -------------------------------------------------------------------------
    @property
    def plain_loop(self) -> bool:
        """``pp = 1`` with one local stage: the step is a plain gradient-accumulation loop
        (:mod:`fxplan.runtime.train.accumulate`), no pipeline schedule."""
        return self.plan.pp == 1 and len(self.stages) == 1

    def _schedule(self, loss_fn: Callable[..., torch.Tensor]) -> Any:
        """The schedule for ``loss_fn``, rebuilt only when another loss is given (compared with
        ``==``: a bound method made afresh each step is equal, an id could be reused)."""
        if self._schedule_for is None or self._schedule_for[0] != loss_fn:
            modules = [(s.index, s.module) for s in self.stages]
            schedule = build_schedule(self.plan, modules, self.stage_io,
                                      self.mesh["pp"].get_group(), self.device, loss_fn)
            self._schedule_for = (loss_fn, schedule)
        return self._schedule_for[1]

    def _replicas(self) -> tuple[int, int]:
        """``(dp/cp, g)``: replicas reading different samples, and this rank's (``g = d/cp``)."""
        cp = self.context.cp if self.context is not None else 1
        return self.plan.dp // cp, self.coordinate["dp"] // cp

    def _local(self, tensor: torch.Tensor) -> torch.Tensor:
        replicas, index = self._replicas()
        return tensor.chunk(replicas)[index].to(self.device)

    def _sequence(self, tensor: torch.Tensor) -> torch.Tensor:
        """This CP rank's two sequence chunks (``cp > 1``), else ``tensor``."""
        return tensor if self.context is None else self.context.split(tensor)

    def replica_slice(self) -> tuple[int, int]:
        """This replica's samples ``[start, stop)`` of the global batch: ``g·B/R … (g+1)·B/R``
        for ``R = dp/cp`` replicas (``g = d`` without context parallelism; the ``cp`` ranks of
        a CP group read the same samples and keep their chunks of the sequence)."""
        replicas, index = self._replicas()
        size = self.plan.batch // replicas
        start = index * size
        return start, start + size

    def train_step(self, batch: tuple[Any, torch.Tensor],
                   loss_fn: Callable[[Any, torch.Tensor], torch.Tensor], *,
                   local: bool = False) -> torch.Tensor:
        """Forward and backward over the microbatches of this replica's slice of ``batch``;
        returns the mean loss over the global batch (same value on every member rank).
        ``local``: ``batch`` is already this replica's slice (:meth:`replica_slice`); ranks
        that run neither the first nor the last stage may then pass ``((), None)``."""
        inputs, targets = batch
        inputs = inputs if isinstance(inputs, tuple) else (inputs,)
        loss_fn = with_router_aux(loss_fn, [s.inner for s in self.stages])   # HF MoE: + coef·aux
        move = (lambda x: x.to(self.device)) if local else self._local
        place = lambda x: self._sequence(move(x))  # noqa: E731
        args = tuple(place(x) for x in inputs) if self.is_first else ()
        losses: list[torch.Tensor] = []
        kwargs = dict(target=place(targets), losses=losses) if self.is_last else {}
        with self._spmd():
            if self.plain_loop:
                (stage,) = self.stages
                accumulate_microbatches(stage.module, args, kwargs["target"],
                                        self.plan.num_microbatches, loss_fn, losses,
                                        reduce_every=self.plan.config.reduces_every_microbatch,
                                        gathered=self.plan.config.keeps_blocks_gathered)
            else:
                self._schedule(loss_fn).step(*args, **kwargs)
        if self.dp_reduce is not None:
            self.dp_reduce()
        if self.experts is not None:
            self.experts()
        self.tied(self.named_parameters())
        return self._reduce_loss(losses)

    def _spmd(self) -> contextlib.AbstractContextManager:
        if self.plan.tp == 1:
            return contextlib.nullcontext()
        from torch.distributed.tensor.experimental import implicit_replication

        return implicit_replication()

    def _reduce_loss(self, losses: list[torch.Tensor]) -> torch.Tensor:
        loss = (torch.stack([l.detach() for l in losses]).mean() if losses
                else torch.zeros((), device=self.device))
        loss = loss.to(self.device, torch.float32)
        if self.plan.pp > 1:
            last_pp = self.plan.schedule.placement(self.plan.pp * self.plan.virtual_stages - 1,
                                                   self.plan.pp)[0]
            src = int(self.mesh["pp"].mesh[last_pp].item())
            dist.broadcast(loss, src=src, group=self.mesh["pp"].get_group())
        if self.plan.dp > 1:
            dist.all_reduce(loss, group=self.mesh["dp"].get_group())
            loss = loss / self.plan.dp
        return loss

    # -- checkpoints ----------------------------------------------------------------------
    @property
    def copies_saved_elsewhere(self) -> frozenset[str]:
        """Tied weights whose copy here is not saved: held in another dp layout than on their
        first pipeline rank, which saves them
        (:func:`fxplan.runtime.checkpoint.dcp.save_sharded`)."""
        return frozenset(self.tied.whole & self.tied.not_first)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Original name → local (sharded) parameter, for ``torch.distributed.checkpoint``."""
        return {fqn: param.detach() for fqn, param in self.named_parameters().items()}

    def load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Copy a state dict of the same layout (e.g. one filled by ``dcp.load``) in place."""
        own = self.state_dict()
        with torch.no_grad():
            for fqn, value in state_dict.items():
                if fqn in own and value is not own[fqn]:
                    own[fqn].copy_(value)

    def save(self, path: str, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Sharded checkpoint of the parameters (and ``optimizer``'s state): every rank writes
        its shards (see :mod:`fxplan.runtime.checkpoint.dcp`)."""
        from fxplan.runtime.checkpoint.dcp import save_sharded

        save_sharded(self, path, optimizer)

    def load(self, path: str, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Load a checkpoint saved under any plan, resharding into this one (parameters, and
        ``optimizer``'s state when given)."""
        from fxplan.runtime.checkpoint.dcp import load_sharded

        load_sharded(self, path, optimizer)
