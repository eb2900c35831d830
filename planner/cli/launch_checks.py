"""``fxplan launch``'s pre-flight checks: everything refused before any process starts.

* the run settings (:func:`settings_for`): flags over ``--config`` over defaults, ``--data`` an
  existing token file, a saved Hugging Face dataset with ``input_ids`` (:func:`check_dataset_dir`),
  arrays named after the model's inputs (``FILE.npz``, ``FILE.pt`` or a directory of them:
  :func:`check_data` reads their names, shapes and kinds against the model's inputs),
  ``synthetic`` or ``FILE.py:FUNCTION``;
* the checkpoints (:func:`check_checkpoints`): ``--resume`` a complete, unaltered fxplan
  checkpoint (manifest and sha256 of every file, checked before anything is unpickled) with fewer
  than ``--steps`` steps done, ``--save`` a new directory;
* the plan (:func:`check_plan`): the model captured as the search captured it and the cluster
  must have the plan's fingerprints, the plan must be runnable here (offload layout, FP8, expert
  parallelism: for ``ep > 1`` the model is built on ``meta`` as the worker builds it, no
  weights, and its expert layers checked by :func:`check_expert_model`);
* the nodes (:func:`node_layout`): ``nnodes × nproc_per_node`` from the cluster (equal nodes),
  or the user's (the job is then replanned: docs/elastic.md); more than one node needs
  ``--rdzv-endpoint`` or ``--slurm``.

Each refusal is one :class:`~fxplan.cli.run_config.LaunchError` (a ``UserError``: exit code 2).
"""

from __future__ import annotations

import argparse
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fxplan.cli.run_config import SETTINGS, LaunchError, RunSettings, resolve_settings
from fxplan.cli.torchrun_command import needs_endpoint
from fxplan.core.files import not_regular

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from fxplan.cluster_specs import Cluster
    from fxplan.core.plan import Plan

__all__ = ["check_checkpoints", "check_data", "check_dataset_dir", "check_expert_model",
           "check_plan", "check_resume_model", "node_layout", "set_aside", "settings_for"]


def check_plan(args: argparse.Namespace) -> tuple[Any, int, int, Any]:
    """Load the plan and refuse it for another model, cluster or world size (no process yet).
    Returns ``(plan, nnodes, nproc_per_node, cluster)``."""
    from fxplan.api import capture_for_search
    from fxplan.cluster_specs import Cluster
    from fxplan.core.plan import load_plan
    from fxplan.cost_model.step.plan_check import check_plan as check_plan_against
    from fxplan.cluster_specs import training_dtype

    plan = load_plan(args.plan)
    cluster = Cluster.load(args.cluster or plan.cluster)
    nnodes, nproc = node_layout(args, plan, cluster)
    plan.check_matches(cluster_fingerprint=cluster.fingerprint(), source=args.plan)
    model = args.model or plan.model
    graph = capture_for_search(model, seq=plan.seq,
                               dtype=training_dtype(cluster))
    plan.check_matches(graph_fingerprint=graph.fingerprint(), source=args.plan)
    check_plan_against(plan, cluster, graph, source=args.plan)
    from fxplan.runtime.apply.offload import check_runnable

    check_runnable(plan, cluster.device(0).kind)   # offload layout, fp8 on CPU
    from fxplan.runtime.styles.expert_parallel import check_expert_parallel

    check_expert_parallel(plan)                     # ep > 1 with tp > 1 under sp: not run
    check_expert_model(model, plan, built=graph.module)   # the capture's meta build
    return plan, nnodes, nproc, cluster


def check_expert_model(model: str, plan: "Plan", built: "torch.nn.Module | None" = None
                       ) -> None:
    """For an ``ep > 1`` plan, refuse a model whose expert weights are in no layer the runtime
    can split, as the workers would refuse it
    (:func:`fxplan.runtime.styles.expert_parallel.check_expert_layers`), before any process starts.
    ``built``: the model already built on ``meta`` (the capture's,
    :attr:`~fxplan.passes.captured_graph.CapturedGraph.module`); else the model spec ``model``
    is built on ``meta`` as the worker builds it (no weights are allocated or initialised).
    An ``ep = 1`` plan is not checked."""
    if plan.config.ep <= 1:
        return
    from fxplan.runtime.styles.expert_parallel import check_expert_layers

    if built is None:
        from fxplan.examples.model_spec import resolve_model
        from fxplan.runtime.apply.build import meta_parameters

        bundle = resolve_model(model)
        with meta_parameters():
            built = bundle.build("cpu")
    check_expert_layers(built, plan)


def check_checkpoints(args: argparse.Namespace, settings: RunSettings,
                      refused: list[Path] | None = None) -> str | None:
    """Before any process starts: ``--resume`` names a complete, unaltered fxplan checkpoint
    (manifest and sha256 of every file, checked before anything is unpickled) that has done
    fewer than ``--steps`` steps, and ``--save`` names no existing directory. Returns the
    checkpoint directory ``--resume`` resolves to: in a run or checkpoints directory the newest
    that passes the check, the newer ones that fail it appended to ``refused`` (the launch
    moves them aside: :func:`set_aside`)."""
    from fxplan.runtime.checkpoint.manifest import CheckpointError, read_json_file, resolve_checkpoint

    if args.save and os.path.exists(args.save):
        raise LaunchError(f"--save {args.save} exists: a checkpoint is written to a new "
                          "directory and never over another; give a new path")
    if not args.resume:
        return None
    skipped: list[tuple[Path, str]] = []
    found, manifest = resolve_checkpoint(args.resume, skipped)
    for directory, why in skipped:  # newer checkpoints cut or altered after their commit
        print(f"resume: {directory.name} is refused ({why}); going on from {found.name}",
              flush=True)
    if refused is not None:
        refused += [directory for directory, _ in skipped]
    skipped_dirs = {directory.resolve() for directory, _ in skipped}
    step = read_json_file(found, "train_state.json").get("step", manifest.get("step"))
    if not isinstance(step, int) or step >= settings.steps:
        raise CheckpointError(f"--resume {found}: the checkpoint has done {step} steps and "
                              f"--steps is {settings.steps} (the total a resumed run trains "
                              f"to): nothing to train; give --steps > {step}")
    later = sorted(int(m.group(1)) for entry in Path(settings.run_dir, "checkpoints").glob("step-*")
                   if (m := re.fullmatch(r"step-(\d+)", entry.name)) and int(m.group(1)) > step
                   and entry.resolve() not in skipped_dirs)
    if settings.checkpoint_every and later:
        raise LaunchError(f"--run-dir {settings.run_dir} already holds checkpoints after step "
                          f"{step} (step-{later[0]} …), which this run would write again and a "
                          "committed checkpoint is never overwritten: resume from the latest, "
                          "or give another --run-dir")
    return str(found)


def set_aside(refused: list[Path]) -> None:
    """Rename each refused ``step-N`` to ``step-N.refused-STAMP``: no longer a committed
    checkpoint, out of the way of the step this run writes again, kept for a look."""
    for directory in refused:
        aside = directory.with_name(f"{directory.name}.refused-{time.strftime('%Y%m%d-%H%M%S')}")
        os.rename(directory, aside)
        print(f"resume: the refused {directory.name} moved aside to {aside.name}", flush=True)


def check_resume_model(checkpoint: str, model: str) -> None:
    """Before any process starts: the ``--resume`` checkpoint must hold the parameters of the
    model this launch runs, as its manifest records them
    (:func:`fxplan.runtime.checkpoint.manifest.check_model`); the model is built on ``meta`` as the
    worker builds it (no weights allocated)."""
    from fxplan.examples.model_spec import resolve_model
    from fxplan.runtime.apply.build import meta_parameters
    from fxplan.runtime.checkpoint.manifest import MANIFEST, check_model, read_json_file
    from fxplan.runtime.checkpoint.training import model_fingerprint

    manifest = read_json_file(Path(checkpoint), MANIFEST)
    if not isinstance(manifest.get("model_fingerprint"), str):
        return  # written before fingerprints were recorded: nothing to compare
    with meta_parameters():
        built = resolve_model(model).build("cpu")
    check_model(Path(checkpoint), manifest, model, model_fingerprint(built))


def check_data(settings: RunSettings, plan: "Plan", model: str) -> None:
    """Before any process starts: a token file must feed the plan's model — not empty, a whole
    number of ids, at least one sample of ``seq + 1`` tokens, no id at or above the
    vocabulary in its first :data:`~fxplan.runtime.train.data.SCAN_BYTES` bytes
    (:func:`fxplan.runtime.train.data.check_token_file`); arrays must be named after the
    model's inputs and targets with their sample shapes and kinds
    (:class:`fxplan.runtime.train.array_data.ArrayData`). Synthetic data, datasets directories
    (:func:`check_dataset_dir`) and hooks are not read here; what only a worker sees is
    reported once by the launcher (:mod:`fxplan.runtime.launch.rank_errors`)."""
    data = settings.data
    if _arrays(data):   # names, shapes and kinds against the model's inputs
        from fxplan.examples.model_spec import resolve_model
        from fxplan.runtime.train.array_data import model_array_data
        from fxplan.rank.data_source import input_specs

        bundle = resolve_model(model)
        model_array_data(data, input_specs(bundle, plan), bundle.config, global_batch=plan.batch)
        return
    if data == "synthetic" or os.path.isdir(data) or \
            (data.rpartition(":")[1] and data.rpartition(":")[0].endswith(".py")):
        return
    from fxplan.examples.model_spec import resolve_model
    from fxplan.runtime.train.data import SCAN_BYTES, check_token_file, token_dtype

    config = resolve_model(model).config
    vocab = getattr(config, "vocab", None) or getattr(config, "vocab_size", None)
    check_token_file(data, seq=plan.seq or 1, dtype=token_dtype(settings.token_dtype, vocab),
                     vocab=vocab, scan_bytes=SCAN_BYTES)


def node_layout(args: argparse.Namespace, plan: Plan, cluster: Cluster) -> tuple[int, int]:
    """Nodes and processes per node: the plan's cluster's, or the user's (the job is then
    replanned for them: docs/elastic.md)."""
    per_node = {cluster.devices_per_node(n) for n in range(cluster.num_nodes)}
    if len(per_node) > 1:
        raise LaunchError(f"cluster {cluster.name} has nodes with {sorted(per_node)} devices: "
                          "torchrun starts the same number of processes on every node, so it "
                          "cannot run this plan (re-plan on a cluster of equal nodes)")
    nnodes, nproc = cluster.num_nodes, per_node.pop()
    for flag, value in (("--nnodes", args.nnodes), ("--nproc-per-node", args.nproc_per_node),
                        ("--node-rank", args.node_rank)):
        if value is not None and value < (0 if flag == "--node-rank" else 1):
            raise LaunchError(f"{flag} {value}: expected an integer ≥ "
                              f"{0 if flag == '--node-rank' else 1}")
    user = (nnodes if args.nnodes is None else args.nnodes,
            nproc if args.nproc_per_node is None else args.nproc_per_node)
    resized = user != (nnodes, nproc)  # replanned by run() (or the workers, --elastic)
    planned = (nnodes, nproc)
    nnodes, nproc = user
    if args.node_rank is not None and args.node_rank >= nnodes:
        raise LaunchError(f"--node-rank {args.node_rank}: the plan runs on {nnodes} node(s), "
                          f"ranks 0–{nnodes - 1}")
    if nnodes > 1 and not args.rdzv_endpoint and not args.slurm:
        raise LaunchError(needs_endpoint(args, nnodes, nproc))
    if resized:
        print(f"{nnodes} node(s) × {nproc} process(es) = {nnodes * nproc} ranks, the plan's "
              f"cluster {cluster.name} has {planned[0]} × {planned[1]}: replanning for "
              f"{nnodes * nproc} ranks (same model and global batch; docs/elastic.md)", flush=True)
    return nnodes, nproc


def settings_for(args: argparse.Namespace) -> RunSettings:
    """The run settings (flags over ``--config`` over defaults) with ``--data`` checked and
    made absolute, and the run directory (default ``runs/PLAN-STAMP``) absolute."""
    flags = {name: getattr(args, name, None) for name in SETTINGS}
    stem = Path(args.plan).stem
    default = os.path.join("runs", f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}")
    settings = resolve_settings(flags, args.config, default_run_dir=default)
    data = settings.data
    if data != "synthetic":
        path, sep, function = data.rpartition(":")
        if sep and path.endswith(".py"):
            if not os.path.isfile(path) or not function.isidentifier():
                raise LaunchError(f"--data {data}: expected FILE.py:FUNCTION with an existing "
                                  "file and a function name")
            data = f"{os.path.abspath(path)}:{function}"
        elif _arrays(data):
            data = os.path.abspath(data)
        elif os.path.isdir(data):
            data = check_dataset_dir(data)
        elif not_regular(data):
            raise LaunchError(f"--data {data} is {not_regular(data)}, not a regular file: "
                              "expected a token file (memory-mapped), a datasets directory, "
                              "'synthetic' or FILE.py:FUNCTION")
        elif not os.path.isfile(data):
            raise LaunchError(f"--data {data}: no such file (expected a token file, 'synthetic' "
                              "or FILE.py:FUNCTION)")
        else:
            data = os.path.abspath(data)
    return RunSettings(**{**settings.to_dict(), "data": data,
                          "run_dir": os.path.abspath(settings.run_dir)})


def _arrays(data: str) -> bool:
    """Whether ``--data`` names arrays (:mod:`fxplan.runtime.train.array_data`), not a
    datasets directory."""
    from fxplan.runtime.train.array_data import is_array_data
    from fxplan.runtime.train.hf_data import is_dataset_dir

    return data != "synthetic" and is_array_data(data) and not is_dataset_dir(data)


def check_dataset_dir(path: str) -> str:
    """A ``--data`` directory must be a saved Hugging Face dataset with an ``input_ids``
    column (:mod:`fxplan.runtime.train.hf_data`), checked before any process starts; its absolute
    path."""
    from fxplan.runtime.train.hf_data import is_dataset_dir, load_token_column

    if not is_dataset_dir(path):
        raise LaunchError(f"--data {path} is a directory without the files "
                          "Dataset.save_to_disk writes (state.json, dataset_info.json or "
                          "dataset_dict.json) and without .npy or .pt arrays: expected a Hugging "
                          "Face datasets directory, a directory of arrays, a token file, "
                          "'synthetic' or FILE.py:FUNCTION")
    load_token_column(path)
    return os.path.abspath(path)
