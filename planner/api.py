"""The public Python API: ``fxplan.capture``, ``fxplan.search`` and ``fxplan.plan``.

Model specs (``"gpt-1.7b"``, ``"gpt:layers=48,…"``, ``"path/model.py:build"``) are resolved
here, at the edge (:mod:`fxplan.examples.model_spec`); the layers below take modules, bundles
and captured graphs.

    graph = fxplan.capture("gpt-1.7b", batch=1)                      # -> CapturedGraph
    plan = fxplan.search("gpt-1.7b", "dgx-a100-80g:nodes=4", batch=512)   # -> Plan

``fxplan.plan(model, cluster, *, inputs, batch, plan=None, …)``: plan, then apply.

    sharded = fxplan.plan(model, "local-cpu:devices=4", inputs=(tokens,), batch=8).module
    optimizer = sharded.optimizer(torch.optim.AdamW, lr=1e-3)
    loss = sharded.train_step((tokens, targets), lm_loss); optimizer.step(); optimizer.zero_grad()

1. The plan: ``plan=`` when given (a :class:`~fxplan.core.plan.Plan`, e.g. from ``load_plan``),
   otherwise :func:`fxplan.search` on the model captured at one sample of ``inputs`` in the
   cluster's training dtype (as ``fxplan plan`` captures). A given plan made by this function
   (its ``model`` is the module's class name) is refused when the module, captured the same way,
   has another graph fingerprint; a plan made from a model spec (``fxplan plan gpt-…``) cannot
   be compared with a module captured from ``inputs`` (the spec's capture includes the targets
   and loss), so only its world size is checked, and a log line says so.
2. Without ``torch.distributed`` initialised there is no mesh to apply it on: the result holds
   the plan alone, with ``status="not-distributed"`` and a logged message (plan and report).
3. Otherwise every process applies it (:func:`fxplan.runtime.apply.graph.apply_plan`) and the
   result holds its :class:`~fxplan.runtime.apply.sharded_module.ShardedModule`; the world size
   must be the plan's. Every case returns one type, :class:`PlanResult`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Callable, Literal, Sequence

import os

from fxplan.core.bounds import MAX_BATCH, MAX_SEQ, check_count
from fxplan.core.training import APPLY_PATHS
from fxplan.core.errors import UserError
from fxplan.core.plan import Plan, PlanError
from fxplan.core.torch_support import check_torch

# The public entry points run on the supported torch releases only (one paragraph otherwise).
check_torch()

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from fxplan.cluster_specs import Cluster
    from fxplan.examples.bundle import ModelBundle
    from fxplan.inter_op.progress import PhaseTimer
    from fxplan.passes.captured_graph import CapturedGraph
    from fxplan.runtime.apply.sharded_module import ShardedModule

__all__ = ["ApiArgumentError", "PlanResult", "capture", "capture_for_search", "plan", "search"]

logger = logging.getLogger("fxplan.api")


def capture(model: "str | ModelBundle | torch.nn.Module", **options: Any) -> CapturedGraph:
    """:func:`fxplan.passes.capture.capture` that also takes a model spec string (resolved
    with :func:`~fxplan.examples.model_spec.resolve_model`); ``options`` as there
    (``inputs``, ``batch``, ``seq``, ``leaf_modules``, ``dtype``, …)."""
    from fxplan.examples.model_spec import resolve_model
    from fxplan.passes.capture import capture as capture_module

    _check_model(model, "capture")
    if "batch" in options and options["batch"] is not None:
        check_count("batch", options["batch"], high=MAX_BATCH)
    if options.get("seq") is not None:
        check_count("seq", options["seq"], high=MAX_SEQ)
    return capture_module(resolve_model(model) if isinstance(model, str) else model, **options)


@lru_cache(maxsize=8)
def _capture_spec(spec: str, seq: int | None, dtype: str, leaf_modules: tuple[str, ...],
                  method: str) -> CapturedGraph:
    import torch

    return capture(spec, batch=1, seq=seq, dtype=getattr(torch, dtype),
                   leaf_modules=leaf_modules, method=method)


def capture_for_search(model: "str | ModelBundle", *, seq: int | None = None,
                       dtype: str = "bfloat16", timer: PhaseTimer | None = None,
                       leaf_modules: Sequence[str] = (), method: str = "auto"
                       ) -> CapturedGraph:
    """Capture ``model`` (a spec string or bundle) at microbatch 1 for the search.

    The cost model scales every segment by ``microbatch / 1``, so one capture serves every
    microbatch size the search tries. Captures of spec strings are cached (8 most recent).
    ``leaf_modules`` and ``method`` as in :func:`fxplan.passes.capture.capture`.
    """
    import torch

    from fxplan.inter_op.progress import PhaseTimer

    timer = timer or PhaseTimer()
    with timer("capture"):
        if isinstance(model, str):
            return _capture_spec(model, seq, dtype, tuple(leaf_modules), method)
        return capture(model, batch=1, seq=seq, dtype=getattr(torch, dtype),
                       leaf_modules=leaf_modules, method=method)


def search(model: "str | ModelBundle | CapturedGraph", cluster: "str | Cluster", *, batch: int,
           seq: int | None = None, **options: Any) -> Plan:
    """The fastest plan of ``model`` on ``cluster`` for global ``batch`` that fits.

    ``model``: a model spec or bundle, captured here at microbatch 1 in the cluster's training
    dtype (phase ``capture`` of the plan's timings), or a graph captured already. ``options``
    are those of :func:`fxplan.inter_op.search` (``constraints``, ``time_budget_s``,
    ``finalists``, ``progress``, ``model``, ``memory_headroom`` — also spelled ``headroom``).
    """
    from fxplan.inter_op import search as search_graph
    from fxplan.cluster_specs import training_dtype
    from fxplan.inter_op import check_search_arguments
    from fxplan.inter_op.progress import PhaseTimer

    _check_model(model, "search", graph_ok=True)
    options = _headroom_alias(options)
    check_search_arguments(batch=batch, seq=seq, **{k: options[k] for k in (
        "time_budget_s", "finalists", "constraints") if k in options})
    cluster = _load_cluster(cluster)
    timer = PhaseTimer()
    if isinstance(model, str):
        from fxplan.examples.model_spec import canonical_spec

        model = canonical_spec(model)
        options.setdefault("model", model)
    if not hasattr(model, "gm"):
        model = capture_for_search(model, seq=seq, dtype=training_dtype(cluster), timer=timer)
    elif getattr(model, "dtype", None) is not None:   # a graph captured already: its dtype
        from fxplan.cluster_specs import check_precision
        from fxplan.cluster_specs.precision import TORCH_NAMES

        short = {torch_name: key for key, torch_name in TORCH_NAMES.items()}
        key = short.get(str(model.dtype).removeprefix("torch."))
        if key is not None:
            check_precision(cluster, key)
    options.setdefault("runnable", runtime_check(model, cluster))
    return search_graph(model, cluster, batch=batch, seq=seq, timer=timer, **options)


#: Inputs that are a loss's targets, not the model's (left out of the runtime's check).
_TARGETS = ("targets", "labels")


def runtime_check(graph: CapturedGraph, cluster: "str | Cluster"
                  ) -> "Callable[[Plan], str | None] | None":
    """The search's question to the runtime for ``graph``'s model on ``cluster``:
    ``plan -> reason | None`` (:func:`fxplan.runtime.apply.runnable.runtime_refusal` on the
    module capture built on ``meta``, with zero inputs of the plan's microbatch; the targets
    among them when the forward is trained on the loss it returns, which needs the module
    level and ``pp = 1``: :mod:`fxplan.runtime.train.fed_targets`). ``None`` for a graph
    captured from a module the caller gave (capture keeps no module then)."""
    import torch

    from fxplan.passes.flex_attention import priced_as_fused
    from fxplan.passes.forward_swap import taking
    from fxplan.runtime.apply.runnable import graph_rewrite_tp_refusal, runtime_refusal
    from fxplan.runtime.train.fed_targets import pipeline_refusal

    module = graph.module
    if module is None:
        return None
    named = {k: v for k, v in graph.inputs.items()
             if k not in _TARGETS or (graph.fed_targets and k == "targets")}
    shapes = list(named.values())
    cpu = all(g.kind == "cpu" for g in _load_cluster(cluster).device_groups)
    rewrite_tp = graph_rewrite_tp_refusal(graph, cpu)

    def refusal(plan: Plan) -> str | None:
        if graph.fed_targets and pipeline_refusal(plan):
            return pipeline_refusal(plan)
        inputs = [torch.zeros((plan.microbatch_size, *s[1:]), dtype=d) for s, d in shapes]
        # by position, bound by name as at launch; the probe's fake run on the host's CPU
        # prices FlexAttention as capture does (the devices run their own kernel)
        with taking(module, list(named)), priced_as_fused():
            return runtime_refusal(module, plan, inputs, rewrite_tp=rewrite_tp,
                                   graph_rewrite=graph.method == "symbolic_trace"
                                   and not graph.fed_targets)
    return refusal


def _headroom_alias(options: dict[str, Any]) -> dict[str, Any]:
    """``headroom=`` is ``memory_headroom=`` (parsed, so a bad value fails before capture);
    both at once is an :class:`ApiArgumentError`."""
    from fxplan.cost_model.memory.headroom import parse_headroom

    options = dict(options)
    if "headroom" in options:
        if "memory_headroom" in options:
            raise ApiArgumentError("give headroom= or memory_headroom=, not both (they are "
                                   "the same option)")
        options["memory_headroom"] = options.pop("headroom")
    if "memory_headroom" in options:
        options["memory_headroom"] = parse_headroom(options["memory_headroom"])
    return options


def _capture(model: "torch.nn.Module", cluster: Cluster, inputs: tuple) -> CapturedGraph:
    """The module at one sample of ``inputs`` in ``cluster``'s training dtype (as the CLI)."""
    import torch

    from fxplan.cluster_specs import training_dtype

    one_sample = tuple(x[:1] for x in inputs)
    return capture(model, inputs=one_sample, dtype=getattr(torch, training_dtype(cluster)))


def _load_cluster(cluster: "str | Cluster") -> Cluster:
    """A ``Cluster``, or one loaded from a spec string or path; anything else (``None``, a
    dict) is a :class:`ApiArgumentError` saying what is expected."""
    import os

    from fxplan.cluster_specs import Cluster

    if isinstance(cluster, Cluster):
        return cluster
    if isinstance(cluster, (str, os.PathLike)):
        return Cluster.load(cluster)
    hint = " (Cluster.from_dict(d) reads a dict)" if isinstance(cluster, dict) else ""
    raise ApiArgumentError(f"cluster = {cluster!r:.60} ({type(cluster).__name__}): expected a "
                           f"spec string such as 'dgx-a100-80g:nodes=4', a file path or a "
                           f"fxplan Cluster{hint}")


class ApiArgumentError(UserError, TypeError):
    """An argument of the public API of the wrong type: the message names it and what is
    expected."""


def _check_model(model: Any, function: str, *, graph_ok: bool = False,
                 module_only: bool = False) -> None:
    """``model`` is what ``function`` takes: a spec string, a ModelBundle or an nn.Module
    (``graph_ok``: also a captured graph; ``module_only``: an nn.Module alone)."""
    import torch

    from fxplan.examples.bundle import ModelBundle

    if module_only:
        kinds: tuple[type, ...] = (torch.nn.Module,)
        expected = "a torch.nn.Module"
    else:
        kinds = (str, ModelBundle, torch.nn.Module)
        expected = "a model spec string (e.g. 'gpt-1.7b'), a ModelBundle or a torch.nn.Module"
    if isinstance(model, kinds) or (graph_ok and hasattr(model, "gm")):
        return
    if graph_ok:
        expected += " or a captured graph"
    raise ApiArgumentError(f"{function}(model={model!r:.60}): expected {expected}, got "
                           f"{type(model).__name__}")


def _search(model: "torch.nn.Module", cluster: str | Cluster, inputs: tuple, batch: int,
            seq: int | None, search_options: dict[str, Any]) -> Plan:
    from fxplan.inter_op import search as search_graph

    cluster = _load_cluster(cluster)
    graph = _capture(model, cluster, inputs)
    return search_graph(graph, cluster, batch=batch, seq=seq, progress=False,
                  model=type(model).__name__, **search_options)


def _check_graph(model: "torch.nn.Module", chosen: Plan, cluster: str | Cluster,
                 inputs: tuple) -> None:
    """Refuse a given plan for another graph when the module can be captured as it was."""
    if chosen.model != type(model).__name__:
        logger.info("plan for model %r (not made from this %s module): its graph fingerprint "
                    "is not checked, only its world size", chosen.model, type(model).__name__)
        return
    graph = _capture(model, _load_cluster(cluster), inputs)
    chosen.check_matches(graph_fingerprint=graph.fingerprint(),
                         source=f"plan (compared with the {type(model).__name__} module "
                                "captured at one sample of inputs=)")


@dataclass(frozen=True)
class PlanResult:
    """What :func:`plan` gives every process: the plan, and this process's sharded module
    when the plan was applied here.

    ``status``: ``"applied"`` (``module`` trains like the original); ``"not-distributed"``
    (``torch.distributed`` is not initialised, so there is no mesh to apply on: the plan is
    for reporting, ``module`` is ``None``); ``"not-a-member"`` (this process is outside the
    ``ranks`` the plan was applied on, ``module`` is ``None``). ``message`` says the same in
    words (also logged).
    """

    plan: Plan
    module: "ShardedModule | None"
    status: Literal["applied", "not-distributed", "not-a-member"]
    message: str

    @property
    def applied(self) -> bool:
        return self.status == "applied"




def plan(model: "torch.nn.Module", cluster: "str | Cluster", *, inputs: Any, batch: int,
         plan: Plan | None = None, seq: int | None = None, ranks: Sequence[int] | None = None,
         debug: bool = False, path: str = "auto", **search_options: Any) -> PlanResult:
    """Search (or take ``plan``) and apply it on the current process group.

    ``path``: ``module`` applies the plan to the user's module with PyTorch's pieces (a
    ``PassError`` when it cannot), ``graph`` runs the graph rewrite, ``auto`` (default) the
    module level where the plan allows it, else the graph rewrite (the reason in the sharded
    module's ``fallbacks``). Returns a :class:`PlanResult` on every process: the plan, and this
    process's :class:`~fxplan.runtime.apply.sharded_module.ShardedModule` where it was applied
    (``.path`` says which ran). ``search_options`` go to the search (:func:`search`):
    ``constraints``, ``time_budget_s``, ``finalists``, ``memory_headroom`` (or ``headroom``: a
    fraction such as ``0.1``/``"10%"`` or ``"4GiB"`` each device must leave free; default 5 %).
    """
    import torch
    import torch.distributed as dist

    if path not in APPLY_PATHS:
        raise ApiArgumentError(f"path={path!r}: expected one of {', '.join(APPLY_PATHS)}")
    _check_model(model, "plan", module_only=True)
    search_options = _headroom_alias(search_options)
    check_count("batch", batch, high=MAX_BATCH)
    if seq is not None:
        check_count("seq", seq, high=MAX_SEQ)
    if plan is not None and not isinstance(plan, Plan):
        hint = (" (fxplan.load_plan(path) reads a plan file)" if isinstance(plan, (str, os.PathLike))
                else "")
        raise ApiArgumentError(f"plan={plan!r:.60} ({type(plan).__name__}): expected a fxplan "
                               f"Plan or None{hint}")
    if inputs is None or (isinstance(inputs, (tuple, list)) and not inputs):
        raise ApiArgumentError(f"inputs={inputs!r}: expected a tensor or a tuple of tensors "
                               "(one batch of the model's example inputs)")
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    bad = [type(x).__name__ for x in inputs if not isinstance(x, torch.Tensor)]
    if bad:
        raise ApiArgumentError(f"inputs holds {', '.join(bad)}: expected tensors")
    _load_cluster(cluster)
    if plan is not None:
        _check_graph(model, plan, cluster, inputs)
    chosen = plan if plan is not None else _search(model, cluster, inputs, batch, seq,
                                                   search_options)
    if chosen.batch != batch:
        raise PlanError(f"plan is for global batch {chosen.batch}, but batch={batch} was given")
    if not dist.is_available() or not dist.is_initialized():
        message = (f"torch.distributed is not initialised, so the plan is reported, not applied: "
                   f"{chosen.summary} (needs {chosen.world_size} ranks). Run under torchrun (or "
                   "`fxplan launch plan.json`) to train with it.")
        logger.info(message)
        return PlanResult(chosen, None, "not-distributed", message)
    world = dist.get_world_size()
    needed = len(ranks) if ranks is not None else world
    chosen.check_matches(world_size=needed, source="plan")
    from fxplan.runtime.apply.graph import apply_plan

    module = apply_plan(model, chosen, inputs, ranks=ranks, debug=debug, path=path)
    if module is None:
        message = (f"rank {dist.get_rank()} is outside the ranks {list(ranks or [])} the plan "
                   "was applied on")
        logger.info(message)
        return PlanResult(chosen, None, "not-a-member", message)
    return PlanResult(chosen, module, "applied", f"applied on {needed} ranks: {chosen.summary}")
