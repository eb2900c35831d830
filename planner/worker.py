"""The process ``fxplan launch`` starts on every rank (``torchrun -m fxplan.worker``).

Builds the plan's model on ``meta`` and materialises only this rank's stages and shards
(values from the seeded single-device initialisation, or from ``--resume CKPT``, a sharded
checkpoint saved under any plan — that is how training goes on after a re-plan for a changed
cluster), applies the plan, and trains with :func:`fxplan.runtime.train.trainer.train` on ``--data``
(a token file, a Hugging Face datasets directory, ``synthetic`` or a ``data.py:build`` hook;
:mod:`fxplan.runtime.train.data`) in the plan's dtype with fp32 master weights (``--dtype``;
:mod:`fxplan.runtime.apply.precision`): AdamW or SGD, warm-up + cosine learning rate, global-norm
clipping. ``--checkpoint-every K`` writes a
training checkpoint (parameters, optimizer state, step and data position, every rank's random
generators) to ``RUN_DIR/checkpoints/step-N/`` every K steps and after the last;
``--resume DIR`` (a run directory, its ``checkpoints/`` or one ``step-N``) verifies the
checkpoint's manifest before anything is unpickled and goes on at exactly the next sample, up to
``--steps`` in all (:mod:`fxplan.runtime.checkpoint.training`). ``--save CKPT`` writes the same
checkpoint at the end to a directory of the user's choosing.

Rank 0 logs every ``--log-every`` steps (:mod:`fxplan.runtime.train.metrics`: loss, grad norm, lr,
tokens/s, TFLOP/s and MFU per device, peak memory and its share of the device) to the terminal
and to ``RUN_DIR/metrics.jsonl``, prints every rank's runtime fallbacks once after the first
step, and at the end the plan's predicted step time, MFU and memory against the measured ones,
also written to ``RUN_DIR/summary.json`` (with the resolved settings in ``run_config.json``).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from fxplan.core.errors import UserError
from fxplan.core.training import APPLY_PATHS

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster
    from fxplan.core.plan import Plan
    from fxplan.runtime.train.metrics import FlopCounts


def loss_fn(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every position (integer targets), else mean squared error
    (:func:`fxplan.examples.user_loss.default_loss`); the runtime adds a Hugging Face MoE's
    router auxiliary loss (``router_aux_loss_coef · aux``, when its config sets
    ``output_router_logits``: :mod:`fxplan.runtime.styles.router_aux`). A bundle that fixes its own
    loss (a user file's ``loss(outputs, batch)``) is trained on that (:func:`training_loss`)."""
    from fxplan.examples.user_loss import default_loss

    return default_loss(output, targets)


def training_loss(bundle: Any) -> Any:
    """The loss ``bundle``'s model is trained on: the bundle's own (a user file's, the one
    capture priced), else :func:`loss_fn`; a forward that takes the targets and returns its
    own loss is trained on that instead (:func:`_returned_loss`)."""
    return getattr(bundle, "loss", None) or loss_fn


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fxplan.worker",
                                     description="one rank of `fxplan launch` (run under torchrun)")
    parser.add_argument("plan")
    parser.add_argument("--data", required=True, help="token file, datasets directory, "
                        "'synthetic' or FILE.py:FUNCTION")
    parser.add_argument("--token-dtype", default="auto", choices=("auto", "uint16", "uint32"))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="plan", choices=("plan", "bf16", "fp16", "fp32"),
                        help="compute dtype (plan: the plan's; fp32: mixed precision off)")
    parser.add_argument("--path", default="auto", choices=APPLY_PATHS,
                        help="how the plan is applied (apply_plan's path)")
    parser.add_argument("--optimizer", default="adamw", choices=("adamw", "sgd"))
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--min-lr", type=float, default=None)
    parser.add_argument("--warmup-steps", type=int, default=0)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--beta1", type=float, default=0.9)
    parser.add_argument("--beta2", type=float, default=0.95)
    parser.add_argument("--grad-clip", type=float, default=1.0)
    parser.add_argument("--log-every", type=int, default=1)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--model", default=None, help="model spec (default: the plan's)")
    parser.add_argument("--resume", default=None,
                        help="checkpoint to go on from: run dir, its checkpoints/ or a step-N dir")
    parser.add_argument("--save", default=None, help="write a training checkpoint at the end")
    parser.add_argument("--checkpoint-every", type=int, default=0,
                        help="checkpoint to RUN_DIR/checkpoints/step-N every N steps and at the "
                        "end (0: none)")
    parser.add_argument("--trace", default=None, metavar="DIR",
                        help="record steps 2… (at most TRACE_STEPS) with torch.profiler and "
                        "write DIR/measured-rank<R>.json (Chrome trace format)")
    parser.add_argument("--auto-resume", action="store_true",
                        help="go on from the newest committed checkpoint of RUN_DIR when there "
                        "is one (a restarted or requeued job; before --resume)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, plan: "Plan | None" = None) -> int:
    """One rank: ``argv`` as the flags above; ``plan`` given (a program ``fxplan plan --emit``
    wrote, which embeds its plan) replaces the positional ``PLAN`` file, which is then left
    out of ``argv``."""
    if plan is not None:
        argv = [os.path.abspath(sys.argv[0]), *(sys.argv[1:] if argv is None else argv)]
    args = parse_args(argv)
    args.plan_object = plan
    args.fallbacks = []   # the process's own fallback lines (the program's: ShardedModule)
    if "TORCHELASTIC_RUN_ID" in os.environ:  # under torchrun: die with it, however it ends
        import signal

        from fxplan.runtime.launch.parent_death import die_with_parent

        die_with_parent(signal.SIGKILL)
    from fxplan.runtime.launch.heartbeat import Heartbeat

    args.heartbeat = Heartbeat(int(os.environ.get("RANK", "0")))
    args.heartbeat.beat(0, "start")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    else:  # a CPU rank: its own core(s), and the heap's pages reused from step to step
        from fxplan.core.fallbacks import record_fallback
        from fxplan.runtime.launch.affinity import pin_rank
        from fxplan.runtime.train.heap import keep_heap

        args.affinity, affinity_fallback = pin_rank()   # before gloo starts its threads
        for note in (affinity_fallback, keep_heap()):
            if note:
                record_fallback(args.fallbacks, note)
    from fxplan.runtime.launch.process_group import init_process_group

    init_process_group(backend)  # a fresh store namespace per torchrun restart
    try:
        _train(args)
    except UserError as err:  # under fxplan launch: reported once by the launcher, exit 2
        from fxplan.runtime.launch.rank_errors import INPUT_ERROR_EXIT, report_error

        if not report_error(dist.get_rank(), err):
            raise
        sys.stdout.flush()
        os._exit(INPUT_ERROR_EXIT)  # no collective teardown: the other ranks may wait in one
    except Exception as err:  # under fxplan launch: one paragraph, the traceback in RUN_DIR
        from fxplan.runtime.launch.rank_errors import FAILURE_EXIT, report_failure

        if not report_failure(dist.get_rank(), err, args.run_dir):
            raise
        sys.stdout.flush()
        os._exit(FAILURE_EXIT)
    finally:
        gc.collect()  # drop DTensor/FSDP state before the groups go (clean exit, no SIGABRT)
        dist.destroy_process_group()
    return 0


def data_source(args: argparse.Namespace, bundle: Any, plan: Any, start: int, stop: int) -> Any:
    """The ``--data`` source for this rank (:mod:`fxplan.runtime.train.data`)."""
    from fxplan.runtime.train.data import (DataError, HookData, SyntheticData, TokenFile,
                                     replica_coordinates, token_dtype)
    from fxplan.runtime.train.array_data import is_array_data, model_array_data
    from fxplan.runtime.train.hf_data import HFDataset, is_dataset_dir

    specs = input_specs(bundle, plan)
    vocab = (getattr(bundle.config, "vocab", None) or getattr(bundle.config, "vocab_size", None)
             or getattr(specs.get("targets"), "high", None))   # a user file's: its output's
    if args.data == "synthetic":
        return SyntheticData(specs, high=vocab or 2, seed=args.seed)
    path, sep, function = args.data.rpartition(":")
    if sep and path.endswith(".py"):
        replica, replicas = replica_coordinates(plan.batch, start, stop)   # (d/cp, dp/cp)
        return HookData(args.data, seq=plan.seq, global_batch=plan.batch, start=start, stop=stop,
                        seed=args.seed, dp_rank=replica, dp_size=replicas)
    if is_array_data(args.data) and not is_dataset_dir(args.data):
        return model_array_data(args.data, specs, bundle.config, global_batch=plan.batch,
                                seed=args.seed)
    inputs = {k: v for k, v in specs.items() if k != "targets"}
    shapes = [(tuple(v.shape), v.dtype) for v in inputs.values()]
    if len(inputs) != 1 or shapes[0][1].is_floating_point or len(shapes[0][0]) != 2:
        raise DataError(f"--data {args.data}: token data feeds a language model (one integer "
                        f"input of shape (batch, seq)); {plan.model} takes {shapes}. Give it "
                        f"arrays named after its inputs and the targets instead (FILE.npz, "
                        f"FILE.pt or a directory of NAME.npy files; docs/runtime.md), or "
                        f"FILE.py:FUNCTION")
    if os.path.isdir(args.data):
        return HFDataset(args.data, seq=plan.seq, global_batch=plan.batch, vocab=vocab,
                         seed=args.seed)
    return TokenFile(args.data, seq=plan.seq, global_batch=plan.batch,
                     dtype=token_dtype(args.token_dtype, vocab), vocab=vocab, seed=args.seed)


def flop_counts(plan: Plan, cluster: Cluster) -> tuple[FlopCounts | None, str | None]:
    """FLOPs of a step from the plan's estimate and the devices' peak, or ``None`` and why.
    The peak is the mean of every device's own (:func:`fxplan.cost_model.step.estimate.peak_flops`,
    each group in its own precision), so the measured MFU is defined as the predicted one."""
    from fxplan.cluster_specs import group_precisions, training_precision
    from fxplan.cost_model.step.estimate import peak_flops
    from fxplan.runtime.train.metrics import FlopCounts

    model, hardware = plan.estimate.get("model_flops"), plan.estimate.get("hardware_flops")
    if model is None or hardware is None:
        return None, "the plan has no FLOP estimate (model_flops): TFLOP/s and MFU not computed"
    precisions = group_precisions(cluster, training_precision(cluster))
    peak = peak_flops(cluster, {k: str(v) for k, v in precisions.items()}) / cluster.num_devices
    return FlopCounts(float(model), float(hardware), peak, plan.world_size), None


@dataclass
class Run:
    """What one rank trains: the plan as applied here and everything the loop needs."""

    rank: int
    events: Any
    plan: Any
    replanned: Any
    bundle: Any
    cluster: Any
    identity: tuple[str, str]          # (model spec, fingerprint): in every manifest
    precision: Any
    sharded: Any
    resume: Any                        # the located checkpoint (``--resume``), or None
    config: Any
    optimizer: Any
    data: Any
    flops: Any
    no_flops: str | None
    loss: Any                          # the loss the steps minimise (:func:`training_loss`)


def _train(args: argparse.Namespace) -> None:
    """One rank's run: :func:`_prepare` the sharded model, :func:`_resume` its position,
    :func:`_announce` it on rank 0, :func:`_run_steps`, then :func:`_summarise`."""
    run = _prepare(args)
    position, notes = _resume(run, args)
    start_step = 0 if position is None else position.step
    from fxplan.runtime.train.metrics import MetricsLog

    log = MetricsLog(args.run_dir, args.steps, resume_after=start_step if position else None
                     ) if run.rank == 0 else None
    if log is not None:
        _announce(run, args, log, position, notes)
    result = _run_steps(run, args, log, start_step)
    if log is not None:
        _summarise(run, args, log, result)


def _prepare(args: argparse.Namespace) -> Run:
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
    examples = _example_batch(bundle, plan)
    batch = {k: v for k, v in examples.items() if k != "targets"}
    if fed:
        batch["targets"] = examples["targets"]
    example = tuple(batch.values())

    def seeded_model() -> torch.nn.Module:
        torch.manual_seed(0)
        return forward_taking(bundle.build("cpu"), list(batch))

    with meta_parameters():   # inputs fed by position, bound by name as capture bound them
        model = forward_taking(bundle.build("cpu"), list(batch))
    loss, path = _returned_loss(plan, model, args.path) if fed else (training_loss(bundle),
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


def _returned_loss(plan: Any, model: torch.nn.Module, path: str) -> tuple[Any, str]:
    """The loss and apply path of a forward trained on the loss it returns
    (:mod:`fxplan.runtime.train.fed_targets`): its returned loss, at module level; a
    pipeline or the graph rewrite (which does not run the user's forward) refused."""
    from fxplan.runtime.apply.offload import RuntimeSupportError
    from fxplan.runtime.train.fed_targets import ReturnedLoss, pipeline_refusal

    refusal = pipeline_refusal(plan) or ("--path graph: the graph rewrite does not run the "
                                         "user's forward, whose own loss is trained"
                                         if path == "graph" else None)
    if refusal:
        raise RuntimeSupportError(f"{plan.summary}: {refusal}")
    return ReturnedLoss(model), "module"


def _resume(run: Run, args: argparse.Namespace) -> tuple[Any, list[str]]:
    """The position a ``--resume`` checkpoint holds (parameters, optimizer state, random
    generators and the data position restored — last before training), and what differs from
    the run that saved it; ``(None, [])`` for a fresh run."""
    if run.resume is None:
        return None, []
    from fxplan.runtime.checkpoint.training import load_training_checkpoint

    position, notes = load_training_checkpoint(run.sharded, run.optimizer, *run.resume)
    notes += resume_notes(position, args, run.plan)
    if hasattr(run.data, "skip"):
        run.data.skip(position.step)
    return position, notes


def _announce(run: Run, args: argparse.Namespace, log: Any, position: Any,
              notes: list[str]) -> None:
    """Rank 0, before the first step: the settings, the plan as applied, a re-plan, a resume,
    the precision and what the FLOP counts could not cover."""
    from fxplan.cluster_specs import training_dtype

    plan = run.plan
    log.write_json("run_config.json", {k: v for k, v in vars(args).items()
                                       if k not in ("plan_object", "heartbeat")})
    log.print(f"fxplan launch: {plan.model} on {plan.cluster} | {plan.summary} | "
              f"{dist.get_world_size()} ranks, backend {dist.get_backend()} | data {args.data} | "
              f"applied: {run.sharded.path} level")
    if run.replanned is not None:
        from fxplan.replan import report_replan

        report_replan(run.replanned, log.print, run.events)
    if position is not None and run.resume is not None:
        log.print(f"resumed parameters, optimizer state and data position from {run.resume[0]}: "
                  f"step {position.step} done, going on at step {position.step + 1} "
                  f"(global sample {position.next_sample}) up to step {args.steps}")
        log_resume(log, run.events, position, run.resume[0], plan)
    for line in notes:
        log.print(f"resume: {line}")
    log_precision(log, run.precision, training_dtype(run.cluster))
    if run.no_flops:
        log.print(run.no_flops)
    if getattr(args, "affinity", None):
        log.print(args.affinity)


def _run_steps(run: Run, args: argparse.Namespace, log: Any, start_step: int) -> Any:
    """Steps ``start_step + 1 … --steps`` (:func:`fxplan.runtime.train.trainer.train`) with the
    heartbeat, checkpoints every ``--checkpoint-every`` and after the last, injected faults
    (tests), and the ``--save`` checkpoint at the end; the loop's result."""
    from fxplan.runtime.checkpoint.training import TrainPosition, data_identity, \
        save_training_checkpoint
    from fxplan.runtime.train.trainer import train

    plan, sharded = run.plan, run.sharded

    def here(step: int) -> TrainPosition:
        return TrainPosition(step=step, seed=args.seed, global_batch=plan.batch,
                             data=data_identity(args.data), optimizer=args.optimizer,
                             world_size=dist.get_world_size(sharded.group), plan=plan.summary)

    def on_step(step: int) -> None:
        if step == start_step + 1:
            _print_fallbacks(sharded, run.rank, args.fallbacks)
        inject_fault(step, run.rank, run.events.attempt, "step")
        args.heartbeat.beat(step, "step")
        every = args.checkpoint_every
        if every and (step % every == 0 or step == args.steps):
            final = Path(args.run_dir) / "checkpoints" / f"step-{step}"
            args.heartbeat.beat(step, "save")
            inject_fault(step, run.rank, run.events.attempt, "save")
            save_training_checkpoint(sharded, run.optimizer, here(step), final,
                                     model=run.identity)
            args.heartbeat.beat(step, "step")
            if log is not None:
                log.print(f"checkpoint: step {step} saved to {final}")

    trace = None if args.trace is None else Path(args.trace) / f"measured-rank{run.rank}.json"
    result, run.optimizer = train(
        sharded, run.data, run.loss, run.config,
        tokens_per_step=plan.batch * (plan.seq or 1), optimizer=run.optimizer, flops=run.flops,
        capacity_gib=plan.estimate.get("capacity_gib"), log=log, on_step=on_step,
        start_step=start_step, trace=trace)
    if trace is not None and log is not None:
        log.print(f"measured trace of steps {start_step + 2}…: {trace.parent}/measured-rank*.json")
    args.heartbeat.beat(args.steps, "end")
    if args.save:
        save_training_checkpoint(sharded, run.optimizer, here(args.steps), args.save,
                                 latest=False, model=run.identity)
        if log is not None:
            log.print(f"saved parameters, optimizer state and data position to {args.save}")
    return result


def _summarise(run: Run, args: argparse.Namespace, log: Any, result: Any) -> None:
    """Rank 0, at the end: ``summary.json`` (predicted against measured step time, memory,
    MFU and tokens/s, every rank's own figures) and the same as a table."""
    import dataclasses

    plan, measured = run.plan, result.median_step_time_s
    tokens = plan.batch * (plan.seq or 1)
    summary = {
        "plan": plan.summary, "model": plan.model, "cluster": plan.cluster,
        "applied": run.sharded.path,  # module (the user's module) or graph (the graph rewrite)
        "world_size": plan.world_size, "batch": plan.batch, "seq": plan.seq,
        "steps": args.steps, "final_loss": result.losses[-1],
        "predicted_step_time_s": _number(plan.estimate.get("step_time_s")),
        "measured_step_time_s": measured,
        "predicted_peak_memory_gib": _number(plan.estimate.get("peak_memory_gib")),
        "measured_peak_memory_gib": result.peak_memory_gib,
        "predicted_mfu": _number(plan.estimate.get("mfu")),
        "measured_mfu": None if run.flops is None else run.flops.mfu(measured),
        "predicted_tokens_per_s": _number(plan.estimate.get("tokens_per_s")),
        "measured_tokens_per_s": tokens / measured,
        "capacity_gib": plan.estimate.get("capacity_gib"),
        "mixed_precision": run.precision.describe(), "compute_dtype": run.precision.name,
        "memory_measured_as": ("torch.cuda.max_memory_allocated"
                               if run.sharded.device.type == "cuda"
                               else "peak resident set size of the process (getrusage)"),
        "step_time_measured_as": "median over steps 2… of the slowest rank's step",
        "ranks": result.ranks,   # each rank's own step times and peaks (fxplan validate)
        "config": dataclasses.asdict(run.config),
    }
    log.write_json("summary.json", summary)
    rows = [("step time", "predicted_step_time_s", "measured_step_time_s", 1e3, "ms"),
            ("peak memory per rank", "predicted_peak_memory_gib", "measured_peak_memory_gib", 1,
             "GiB"),
            ("MFU", "predicted_mfu", "measured_mfu", 100, "%"),
            ("tokens/s", "predicted_tokens_per_s", "measured_tokens_per_s", 1, "")]
    log.print(f"{'':<22}{'predicted':>14}{'measured':>14}")
    for label, p, m, scale, unit in rows:
        log.print(f"{label:<22}{_show(summary[p], scale):>14}{_show(summary[m], scale):>14} {unit}")
    log.print(f"wrote {log.path} and {log.dir / 'summary.json'}")


def log_precision(log: Any, precision: Any, plan_dtype: str) -> None:
    """Rank 0: the run's mixed precision (:mod:`fxplan.runtime.apply.precision`), where it departs
    from the dtype the plan was priced in, and its fallback (fp16 without a loss scaler)."""
    from fxplan.runtime.apply.precision import DTYPES

    log.print(f"mixed precision: {precision.describe()} ({precision.source})")
    if DTYPES.get(plan_dtype) != precision.compute:
        log.print(f"precision: the plan was priced in {plan_dtype}, this run computes in "
                  f"{precision.name}: expect step time and memory other than predicted")
    if precision.fallback():
        log.print(f"fallback: {precision.fallback()}")


def plan_for_world(plan: "Plan", world: int, run_dir: str) -> "tuple[Plan, Any]":
    """``plan`` when the world this job got is the plan's (case b: a restart, no replanning);
    otherwise the plan :func:`fxplan.replan.replan` finds for the plan's cluster resized to
    ``world`` devices — computed by rank 0, saved to ``RUN_DIR/plans/``, broadcast to every
    rank (collective). Returns ``(plan, Replan or None)``; a failed search ends every rank
    with rank 0's message."""
    from fxplan.core.plan import Plan
    from fxplan.replan import replan

    if world == plan.world_size:
        return plan, None
    box: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            found = replan(plan, world=world)
            path = Path(run_dir) / "plans" / f"plan-world{world}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            found.new.save(path)
            box[0] = (found.new.to_dict(), found.replan_time_s, found.import_s, found.cpu_s)
        except Exception as err:  # every rank must hear of it, not wait in the broadcast
            box[0] = f"{type(err).__name__}: {err}"
    dist.broadcast_object_list(box, src=0)
    if isinstance(box[0], str):
        raise RuntimeError(f"replanning {plan.summary} for a world of {world} failed on rank 0: "
                           f"{box[0]}")
    from fxplan.replan import Replan

    new = Plan.from_dict(box[0][0], source="replanned plan")
    return new, Replan(plan, new, *box[0][1:])


def log_resume(log: Any, events: Any, position: Any, checkpoint: Any, plan: Any) -> None:
    """Rank 0: the checkpoint resumed from and the samples skipped or replayed, from the data
    position: the checkpoint's next sample against the first global sample this run's first
    step reads (``step · B`` of this plan; :mod:`fxplan.runtime.train.data`)."""
    first = position.step * plan.batch
    skipped, replayed = max(0, first - position.next_sample), max(0, position.next_sample - first)
    log.print(f"resume: checkpoint step {position.step}, next sample {position.next_sample}, "
              f"first sample read {first}: {skipped} skipped, {replayed} replayed")
    events.log("resume", checkpoint_step=position.step, checkpoint=str(checkpoint),
               next_sample=position.next_sample, first_sample=first,
               samples_skipped=skipped, samples_replayed=replayed)


def newest_checkpoint(run_dir: str) -> str | None:
    """``run_dir`` when it holds a committed checkpoint (``--resume`` finds the newest)."""
    from fxplan.runtime.checkpoint.manifest import newest_committed_step

    return run_dir if newest_committed_step(run_dir) is not None else None


#: ``FXPLAN_FAULT=WHERE:RANK:STEP:ATTEMPT[:ACTION]`` (tests only): at step STEP of attempt
#: ATTEMPT, after the update (``step``) or as the checkpoint save begins (``save``), rank RANK
#: does ACTION: ``kill`` (default) SIGKILLs itself as a failing node would; ``stop`` SIGSTOPs
#: itself as a hung rank would; ``fsize`` caps the size of any file it writes from then on at
#: :data:`FAULT_FILE_BYTES` (``RLIMIT_FSIZE``, ``SIGXFSZ`` ignored: a write past it fails with
#: ``EFBIG``, as a write to a full disk fails with ``ENOSPC``).
FAULT_ENV = "FXPLAN_FAULT"
FAULT_FILE_BYTES = 4096


def inject_fault(step: int, rank: int, attempt: int, where: str) -> None:
    """Test fault injection (:data:`FAULT_ENV`)."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    at, *fields = spec.split(":")
    action = fields.pop() if len(fields) == 4 else "kill"
    if at != where or [int(n) for n in fields] != [rank, step, attempt]:
        return
    import signal

    what = {"kill": "kills itself", "stop": "stops itself", "fsize": "caps its file size"}
    print(f"{FAULT_ENV}: rank {rank} {what[action]} at step {step} ({where}) of attempt "
          f"{attempt}", flush=True)
    if action == "fsize":
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (FAULT_FILE_BYTES, FAULT_FILE_BYTES))
    else:
        os.kill(os.getpid(), signal.SIGSTOP if action == "stop" else signal.SIGKILL)


def resume_notes(position: Any, args: argparse.Namespace, plan: Any) -> list[str]:
    """What differs between the checkpoint's run and this one, as lines to print; refuses a
    checkpoint already at or past ``--steps``."""
    from fxplan.runtime.checkpoint.manifest import CheckpointError
    from fxplan.runtime.checkpoint.training import data_identity

    if position.step >= args.steps:
        raise CheckpointError(f"--resume: the checkpoint has done {position.step} steps and "
                              f"--steps is {args.steps} (the total): nothing to train; give "
                              f"--steps > {position.step}")
    notes = []
    if data_identity(args.data) != position.data:
        notes.append(f"the data source differs from the checkpoint's ({position.data} → "
                     f"{data_identity(args.data)}): its order continues at step "
                     f"{position.step + 1}, not at the saved position")
    if args.seed != position.seed:
        notes.append(f"--seed {args.seed} differs from the checkpoint's {position.seed}: the "
                     "data order is another one from here")
    if plan.batch != position.global_batch:
        notes.append(f"the global batch changed ({position.global_batch} → {plan.batch}): "
                     f"step {position.step + 1} reads samples from {position.step * plan.batch}, "
                     f"not from the saved next sample {position.next_sample}")
    if args.optimizer != position.optimizer:
        notes.append(f"--optimizer {args.optimizer} differs from the checkpoint's "
                     f"{position.optimizer}")
    return notes


def input_specs(bundle: Any, plan: Any) -> dict[str, Any]:
    """The bundle's inputs at the plan's batch, with the targets of the loss; an ``hf:``
    model's ``labels`` become the ``targets`` of the worker's loss (the model is run without
    them: logits out). A user file's bundle names its targets itself (given by ``build()`` or
    derived from the output: :mod:`fxplan.examples.user_loss`)."""
    specs = dict(bundle.example_inputs(plan.batch, plan.seq))
    if "labels" in specs and "targets" not in specs:
        specs["targets"] = specs.pop("labels")
    return specs


def _example_batch(bundle: Any, plan: Any) -> dict[str, torch.Tensor]:
    """Zero tensors of the plan's global batch: shapes for tracing and stage metadata."""
    return {name: torch.zeros(spec.shape, dtype=spec.dtype)
            for name, spec in input_specs(bundle, plan).items()}


def _print_fallbacks(sharded: Any, rank: int, process: list[str]) -> None:
    """Rank 0 prints the union of every rank's fallbacks (collective), each line once: the
    program's (``sharded.fallbacks``) and the process's own (``process``: the heap's)."""
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, [*sharded.fallbacks, *process])
    if rank != 0:
        return
    lines = list(dict.fromkeys(line for part in gathered for line in part or ()))
    for line in lines:
        print(f"fallback: {line}", flush=True)


def _number(value: Any) -> float | None:
    """A scalar estimate, or the largest of a per-stage list."""
    if isinstance(value, (list, tuple)):
        return max(value) if value else None
    return None if value is None else float(value)


def _show(value: float | None, scale: float = 1.0) -> str:
    from fxplan.core.units import plain

    return "n/a" if value is None else plain(value * scale)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
