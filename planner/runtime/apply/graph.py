"""Apply a Plan to a model on the current process group: the pass pipeline plus the runtime.

    Two paths (``path=``; :mod:`fxplan.runtime.apply.module` for the first, docs/runtime.md):

* module level (default where the plan allows it): the user's module itself, cut at block
  boundaries, ``parallelize_module`` styles, ``fully_shard``/DDP, ``PipelineStage``; names and
  ``state_dict`` keys are the user's;
* graph rewrite (fallback, with the reason in ``ShardedModule.fallbacks``):

    model ─trace─► flat graph ─outline-layers─► embed · layer_i · head ─split-stages─► stages
        per local stage k (this rank's pp coordinate, k mod pp):
            distribute-parameters (tp DTensors) → insert-reshards (tp) → recompute
            → materialize (meta models only) → data parallel / ZeRO (dp) → PipelineStage
        tied-weight groups across pipeline ranks; schedule built at the first train_step

Where a part of the plan is realised differently (a parameter without a planned placement, a
planned node not in the program, ZeRO-1 with tp > 1 run as FSDP2, …) the pass logs a warning and
the line lands in ``ShardedModule.fallbacks``.

Every process of the default group calls :func:`apply_plan` (process groups are created
collectively); a process outside the plan's ranks gets ``None``. The model may live on ``meta``
(see :mod:`fxplan.runtime.apply.build`): then only this rank's stages get storage.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any, Sequence

import torch
import torch.distributed as dist
from torch import fx, nn

from fxplan.core.training import APPLY_PATHS
from fxplan.core.fallbacks import record_fallback
from fxplan.core.torch_support import TorchVersionError
from fxplan.passes.rewrite.base import PassManager
from fxplan.passes.rewrite.distribute import DistributeParameters
from fxplan.passes.rewrite.layers import OutlineLayers
from fxplan.passes.rewrite.recompute import Recompute
from fxplan.passes.rewrite.reshard import InsertReshards
from fxplan.passes.rewrite.stages import SplitStages, StagedProgram
from fxplan.runtime.apply.build import InitSource, has_meta, init_values, materialize
from fxplan.runtime.styles.context_parallel import (build_context_parallel, check_context_parallel,
                                             cp_degree)
from fxplan.runtime.styles.data_parallel import apply_data_parallel
from fxplan.runtime.apply.mesh import build_mesh, device_type
from fxplan.runtime.apply.offload import RuntimeSupportError
from fxplan.runtime.apply.module import ModuleLevel, build_module_stages, module_level_plan
from fxplan.runtime.apply.runnable import graph_rewrite_tp_torch_refusal
from fxplan.runtime.train.pipeline import local_stage_indices
from fxplan.runtime.apply.precision import Precision
from fxplan.runtime.apply.sharded_module import LocalStage, ShardedModule
from fxplan.runtime.apply.tied import TiedGradSync
from fxplan.runtime.styles.tp_styles import NotExpressible
from fxplan.passes.tracer import trace_model

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.plan import Plan

__all__ = ["apply_plan", "staged_program"]


def _as_tuple(inputs: Any) -> tuple[torch.Tensor, ...]:
    return tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)


def staged_program(model: nn.Module, plan: "Plan", inputs: Any) -> StagedProgram:
    """The plan's stages of ``model`` as one single-process module (no distribution)."""
    inputs = _as_tuple(inputs)
    microbatch = tuple(x[: plan.microbatch_size] for x in inputs)
    gm = trace_model(model, len(inputs))
    return PassManager([OutlineLayers(), SplitStages(microbatch)]).run(gm, plan).module


def _shared_users(model: nn.Module, program: StagedProgram) -> dict[str, list[int]]:
    """Names of parameters reachable under several names, and the stages that use each."""
    names: dict[int, list[str]] = defaultdict(list)
    for fqn, param in model.named_parameters(remove_duplicate=False):
        names[id(param)].append(fqn)
    users: dict[str, list[int]] = {}
    for k in range(program.num_stages):
        for param in program.stage(k).parameters():
            if len(names.get(id(param), ())) > 1:
                users.setdefault(names[id(param)][0], []).append(k)
    return users


#: How :func:`apply_plan` realises a plan: ``auto`` tries the module level and falls back.
PATHS = APPLY_PATHS


def unrun_overlaps(plan: Plan) -> list[str]:
    """A fallback line for each overlap the plan was priced with (Megatron-Core's) that this
    runtime does not run: ``tp_overlap=on`` and ``pg_overlap=on`` hide communication the runtime
    issues on the step's critical path, so the measured step is longer than the plan's."""
    lines = []
    for priced, what, runs in (
            (plan.config.tp_comm_overlap, "tp_overlap=on (tensor-parallel collectives "
             "pipelined with their GEMMs, Megatron-Core --tp-comm-overlap)",
             "issues them without overlap"),
            (plan.config.param_gather_overlap, "pg_overlap=on (the updated parameters' "
             "all-gather hidden behind the next step's forward, Megatron-Core "
             "--overlap-param-gather)", "gathers them after the optimizer step")):
        if priced:
            lines.append(f"[overlap] the plan was priced with {what}; this runtime {runs}, so "
                         "their full time is on the step's critical path")
    return lines


def apply_plan(model: nn.Module, plan: "Plan", inputs: Any, *, ranks: Sequence[int] | None = None,
               debug: bool = False, init: InitSource = None, checkpoint: str | None = None,
               path: str = "auto", precision: Precision | None = None) -> ShardedModule | None:
    """Turn ``model`` into this process's part of the plan's distributed program.

    ``inputs``: example model inputs (any batch size ≥ ``plan.microbatch_size``); ``ranks``: the
    global ranks of the plan's mesh (default ``0 … world-1``); ``debug``: reshards verify the
    planned placement at run time (graph rewrite). A model with parameters on ``meta`` is built
    per stage: ``init`` (a builder of the full CPU model, or ``{fqn: tensor}``) gives the
    values, or ``checkpoint`` (a path saved by :meth:`ShardedModule.save` under any plan) is
    loaded. ``path``: ``module`` applies the plan to the user's module with PyTorch's pieces
    (:mod:`fxplan.runtime.apply.module`; a :class:`PassError` when it cannot), ``graph`` runs
    the graph rewrite, ``auto`` (default) the module level where the plan allows it, else the
    graph rewrite with the reason as a fallback line. ``ShardedModule.path`` says which ran.
    A plan whose offload layout or FP8 this runtime cannot run here is refused first
    (:func:`fxplan.runtime.apply.offload.check_runnable`); FP8 converts the linears with torchao.
    ``precision``: mixed precision (:mod:`fxplan.runtime.apply.precision`; default fp32).
    """
    from fxplan.core.pass_error import PassError

    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    from fxplan.runtime.styles.expert_parallel import (check_expert_layers, check_expert_parallel,
                                                refuse_graph_path)

    check_expert_parallel(plan)
    check_expert_layers(model, plan)   # before any collective
    if plan.pp == 1 and plan.virtual_stages > 1:
        raise PassError("split-stages", f"schedule {str(plan.schedule)!r} needs pp ≥ 2")
    from fxplan.runtime.apply.fp8 import apply_fp8
    from fxplan.runtime.apply.offload import check_runnable

    check_runnable(plan, "gpu" if torch.cuda.is_available() else "cpu")   # offload, fp8
    fallbacks: list[str] = []
    for line in unrun_overlaps(plan):
        record_fallback(fallbacks, line)
    model = apply_fp8(model, plan)   # FP8 linears keep the parameters' names (init, checkpoints)
    on_meta = has_meta(model)
    if on_meta and init is None and checkpoint is None:
        raise ValueError("a model on meta needs init= (a builder or values) or checkpoint=")
    inputs = _as_tuple(inputs)
    decided = None
    cp = cp_degree(plan)
    if cp > 1:  # context parallelism runs at module level only, on s/cp-token chunks
        if path == "graph":
            raise RuntimeSupportError(f"cp={cp} runs at module level only (the graph rewrite "
                                      "has no context-parallel pass); use path='module' or 'auto'")
        inputs = tuple(x.narrow(1, 0, x.size(1) // cp) if x.dim() > 1 and x.size(1) == plan.seq
                       else x for x in inputs)
    if path != "graph":
        try:
            decided = module_level_plan(model, plan, inputs)
        except NotExpressible as why:
            if cp > 1:
                raise RuntimeSupportError(f"cp={cp} runs at module level only, and the module "
                                          f"level cannot run this plan: {why}") from why
            if path == "module":
                raise PassError("module-apply", f"the plan cannot run on the module: {why}") from why
            refuse_graph_path(plan, str(why))
            record_fallback(fallbacks, f"[module-apply] {why}: the plan runs as the graph rewrite")
    if decided is None:
        refuse_graph_path(plan, "path='graph' was asked for")
    if decided is not None:
        if cp > 1:
            microbatch = tuple(x[: plan.microbatch_size] for x in inputs)
            check_context_parallel(model, plan, microbatch, decided.probe.blocks, fallbacks)
        sharded = _apply_module_level(model, plan, decided, ranks, init, on_meta, checkpoint,
                                      precision, fallbacks)
    else:
        sharded = _apply_graph(model, plan, inputs, ranks, debug, init, on_meta, checkpoint,
                               fallbacks, precision)
    if sharded is not None and checkpoint is not None:
        sharded.load(checkpoint)
    return sharded


def _member_setup(plan: "Plan", ranks: Sequence[int] | None
                  ) -> tuple[Any, dist.ProcessGroup, int | None, torch.device]:
    """Mesh, the group of its members, this rank's pp coordinate (``None``: not a member), and
    the device (collective: every process calls it)."""
    mesh = build_mesh(plan, ranks)
    members = [int(r) for r in mesh.mesh.flatten().tolist()]
    group = dist.new_group(members)
    coordinate = mesh.get_coordinate()
    pp_rank = None if coordinate is None else dict(zip(mesh.mesh_dim_names, coordinate))["pp"]
    device = torch.device(device_type(), torch.cuda.current_device()) if device_type() == "cuda" \
        else torch.device("cpu")
    return mesh, group, pp_rank, device


def _apply_module_level(model: nn.Module, plan: "Plan", decided: ModuleLevel,
                        ranks: Sequence[int] | None, init: InitSource, on_meta: bool,
                        checkpoint: str | None, precision: Precision | None,
                        fallbacks: list[str]) -> ShardedModule | None:
    from fxplan.runtime.styles.expert_parallel import ExpertGradSync, expert_mesh

    mesh, group, pp_rank, device = _member_setup(plan, ranks)
    ep_mesh = expert_mesh(plan, mesh)   # collective, like the mesh
    tied = TiedGradSync(plan, mesh, decided.tied_users)
    context = build_context_parallel(plan, mesh)   # collective: every process, cp > 1 only
    if pp_rank is None:
        return None
    values = init_values(init) if on_meta and checkpoint is None else None
    for line in decided.fallbacks:
        record_fallback(fallbacks, line)
    experts: list[nn.Parameter] = []
    stages = build_module_stages(model, plan, decided, mesh, local_stage_indices(plan, pp_rank),
                                 device, values, fallbacks, precision, context, ep_mesh, experts)
    del values
    sync = ExpertGradSync(experts, ep_mesh, plan.dp) if ep_mesh is not None else None
    return ShardedModule(plan, mesh, stages, decided.stage_io, tied, group, device,
                         fallbacks=fallbacks, path="module", context=context, experts=sync)


def _traced_program(model: nn.Module, plan: "Plan", inputs: tuple,
                    fallbacks: Sequence[str]) -> StagedProgram:
    """:func:`staged_program`, or a :class:`PassError` (one paragraph, before any process
    group) when ``torch.fx.symbolic_trace`` cannot trace the model — an export-only model
    (Hugging Face, ``nn.TransformerEncoder``) whose plan the module level refused."""
    from fxplan.core.pass_error import PassError

    try:
        return staged_program(model, plan, inputs)
    except PassError:
        raise
    except Exception as err:  # noqa: BLE001 - any trace failure ends here, named
        text = (str(err).strip().splitlines() or [""])[0]
        why = f" ({fallbacks[0]})" if fallbacks else ""
        raise PassError("graph-rewrite", f"the plan cannot run on {type(model).__name__}: the "
                        f"module level refused it{why}, and the graph rewrite needs a model "
                        f"torch.fx.symbolic_trace can trace ({type(err).__name__}: {text}); "
                        "re-plan with --constrain to avoid what was refused") from err


def _apply_graph(model: nn.Module, plan: "Plan", inputs: tuple, ranks: Sequence[int] | None,
                 debug: bool, init: InitSource, on_meta: bool, checkpoint: str | None,
                 fallbacks: list[str], precision: Precision | None) -> ShardedModule | None:
    names: dict[int, str] = {}
    for fqn, tensor in [*model.named_parameters(remove_duplicate=False),
                        *model.named_buffers(remove_duplicate=False)]:
        names.setdefault(id(tensor), fqn)
    program = _traced_program(model, plan, inputs, fallbacks)
    refusal = graph_rewrite_tp_torch_refusal() if plan.tp > 1 else None
    if refusal:   # before any process group: every rank would fail in its first view
        raise TorchVersionError(f"{plan.summary} runs as the graph rewrite, and with "
                                f"tp={plan.tp} {refusal}. Upgrade torch, or re-plan on this "
                                "machine (the search then leaves such plans out)")
    mesh, group, pp_rank, device = _member_setup(plan, ranks)
    tied = TiedGradSync(plan, mesh, _shared_users(model, program))
    if pp_rank is None:
        return None
    values = init_values(init) if on_meta and checkpoint is None else None
    known_nodes = {node.name for m in program.modules() if isinstance(m, fx.GraphModule)
                   for node in m.graph.nodes}
    # one instance of each pass for all local stages: a fallback is logged once
    passes = [DistributeParameters(mesh["tp"], names),
              InsertReshards(mesh["tp"], debug=debug, known_nodes=known_nodes), Recompute()]
    stages = []
    for k in local_stage_indices(plan, pp_rank):
        module = program.stage(k) if on_meta else program.stage(k).to(device)
        manager = PassManager(passes)
        inner = manager.run(module, plan).module
        fallbacks.extend(manager.fallbacks)
        materialize(inner, names, device, values)
        local_names = {local: names[id(p)]
                       for local, p in inner.named_parameters(remove_duplicate=False)}
        wrapped = apply_data_parallel(inner, plan, mesh, fallbacks, precision=precision)
        stages.append(LocalStage(k, wrapped, inner, local_names))
    del values
    return ShardedModule(plan, mesh, stages, program.stage_io, tied, group, device,
                         fallbacks=fallbacks, path="graph")
