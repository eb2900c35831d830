"""One rank's run prepared: the plan for this world (re-planned after a resize), the model built
on ``meta`` with only this rank's stages made real (seeded values, or a checkpoint's), the
optimizer and this replica's data."""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

from fxplan.rank.data_source import data_source, example_batch
from fxplan.rank.flops import flop_counts
from fxplan.rank.loss import returned_loss, training_loss
from fxplan.rank.resume import newest_checkpoint
from fxplan.rank.run import Run
from fxplan.rank.world_plan import plan_for_world

__all__ = ["prepare_run"]


def prepare_run(args: argparse.Namespace) -> Run:
    """The plan for this world (re-planned after a resize), the model built on ``meta`` with
    only this rank's stages made real (seeded values, or the ``--resume`` checkpoint's), the
    optimizer and this replica's data."""
    from fxplan.cluster_specs import Cluster, training_dtype
    from fxplan.core.plan import load_plan
    from fxplan.core.training import TrainConfig
    from fxplan.examples.model_spec import resolve_model
    from fxplan.passes.forward_swap import computes_own_loss, forward_taking
    from fxplan.runtime.apply.graph import apply_plan
    from fxplan.runtime.apply.build import meta_parameters
    from fxplan.runtime.train.events import EventLog
    from fxplan.runtime.train.optim import build_optimizer
    from fxplan.runtime.apply.precision import resolve_precision
    from fxplan.runtime.launch.process_group import restart_count
    from fxplan.runtime.checkpoint.training import locate_checkpoint, model_fingerprint

    rank = dist.get_rank()
    # attempt: fxplan's supervised attempts plus torchrun's own restarts within one
    events = EventLog(args.run_dir, int(os.environ.get("FXPLAN_ATTEMPT", "0")) + restart_count())
    if restart_count() and rank == 0:
        events.log("restart", by="torchrun", restart_count=restart_count())
    plan, replanned = plan_for_world(args.plan_object or load_plan(args.plan),
                                     dist.get_world_size(), args.run_dir)
    bundle = resolve_model(args.model or plan.model)
    cluster = Cluster.load(plan.cluster)
    if args.auto_resume or restart_count():
        args.resume = newest_checkpoint(args.run_dir) or args.resume
    torch.manual_seed(args.seed)

    # a forward trained on the loss it returns is fed the targets, last (runtime.train.fed_targets)
    fed = computes_own_loss(bundle, bundle.build("meta"))
    examples = example_batch(bundle, plan)
    batch = {k: v for k, v in examples.items() if k != "targets"}
    if fed:
        batch["targets"] = examples["targets"]
    example = tuple(batch.values())

    def seeded_model() -> torch.nn.Module:
        torch.manual_seed(0)
        return forward_taking(bundle.build("cpu"), list(batch))

    with meta_parameters():   # inputs fed by position, bound by name as capture bound them
        model = forward_taking(bundle.build("cpu"), list(batch))
    loss, path = returned_loss(plan, model, args.path) if fed else (training_loss(bundle),
                                                                      args.path)
    identity = (args.model or plan.model, model_fingerprint(model))
    precision = resolve_precision(args.dtype, training_dtype(cluster))
    resume = None
    if args.resume:  # verified (manifest and hashes) before DCP unpickles anything
        resume = locate_checkpoint(args.resume)
        sharded = apply_plan(model, plan, example, checkpoint=str(resume[0]), precision=precision,
                             path=path)
    else:
        sharded = apply_plan(model, plan, example, init=seeded_model, precision=precision,
                             path=path)
    config = TrainConfig(
        steps=args.steps, optimizer=args.optimizer, lr=args.lr, min_lr=args.min_lr,
        warmup_steps=args.warmup_steps, weight_decay=args.weight_decay, beta1=args.beta1,
        beta2=args.beta2, grad_clip=args.grad_clip, log_every=args.log_every)
    optimizer = build_optimizer(sharded, config.optimizer, lr=config.lr,
                                weight_decay=config.weight_decay, betas=(config.beta1, config.beta2))
    start, stop = sharded.replica_slice()
    data = data_source(args, bundle, plan, start, stop)
    if fed:
        from fxplan.runtime.train.fed_targets import FedTargets

        data = FedTargets(data)
    flops, no_flops = flop_counts(plan, cluster)
    return Run(rank=rank, events=events, plan=plan, replanned=replanned, bundle=bundle,
               cluster=cluster, identity=identity, precision=precision, sharded=sharded,
               resume=resume, config=config, optimizer=optimizer, data=data, flops=flops,
               no_flops=no_flops, loss=loss)
