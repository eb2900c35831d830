"""The Megatron-LM format: command-line arguments of ``pretrain_gpt.py``
(``megatron/training/arguments.py``), one per line with shell continuations.

:func:`export` writes them from a :class:`TargetConfig`; :func:`parse` reads them back. What
Megatron cannot say comes back as notes:

* the GPipe schedule: Megatron runs 1F1B (interleaved 1F1B with virtual stages);
* uneven stages beyond the first and last (``--decoder-first-pipeline-num-layers``,
  ``--decoder-last-pipeline-num-layers``), and uneven virtual stages;
* parameter offload: ``--optimizer-cpu-offload`` moves the optimizer states (and the
  optimizer step) to the host, the parameters stay on the device.

ZeRO-1 is ``--use-distributed-optimizer``; ZeRO-2/3 are Megatron-FSDP (``--use-megatron-fsdp
--data-parallel-sharding-strategy optim_grads|optim_grads_params --ckpt-format fsdp_dtensor``,
with ``CUDA_DEVICE_MAX_CONNECTIONS`` unset); the gradient reduction overlaps the backward
(``--overlap-grad-reduce``) as fxplan prices it. Offload adds
``--use-precision-aware-optimizer``, which ``--optimizer-cpu-offload`` requires. Context and
expert parallelism are ``--context-parallel-size`` (with ``--cp-comm-type all_gather``: fxplan
prices the K/V all-gather, Megatron's default is the ``p2p`` ring) and
``--expert-model-parallel-size``; with tensor or context parallelism (and no FSDP) the text
opens with the ``CUDA_DEVICE_MAX_CONNECTIONS=1`` Megatron requires, as a comment line. FP8 is
``--fp8-format hybrid`` (Transformer Engine: E4M3 forward, E5M2 gradients); ``tp_overlap=on``
is ``--tp-comm-overlap`` (Transformer Engine's userbuffers pipeline each sequence-parallel
all-gather/reduce-scatter with its GEMM). The flags and their cross-checks are those of the
table :mod:`fxplan.export.framework_tables` read from Megatron-LM's sources.

Megatron takes the world size from the launcher, so the data-parallel degree is
``world / (tp · pp)`` and the microbatch count ``global / (mb · dp)``: :func:`parse` needs the
world size.
"""

from __future__ import annotations

import shlex
from typing import Any

from fxplan.core.schedule import Schedule
from fxplan.export.errors import ExportError
from fxplan.export.target_config import TargetConfig, without_zero_bubble

__all__ = ["STATE_LAYOUT", "export", "parse"]

#: How Megatron-LM keeps the model states (one of
#: :data:`fxplan.cost_model.memory.breakdown.STATE_LAYOUTS`): 16-bit weights and gradients
#: beside the distributed optimizer's fp32 masters and moments.
STATE_LAYOUT = "megatron"

#: Options that take a value (the rest are switches).
_VALUED = frozenset({
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--num-layers",
    "--num-layers-per-virtual-pipeline-stage", "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers", "--micro-batch-size", "--global-batch-size",
    "--seq-length", "--recompute-granularity", "--recompute-method", "--recompute-num-layers",
    "--context-parallel-size", "--expert-model-parallel-size", "--fp8-format",
    "--cp-comm-type", "--data-parallel-sharding-strategy", "--ckpt-format",
})
_SWITCHES = frozenset({"--sequence-parallel", "--recompute-activations",
                       "--use-distributed-optimizer", "--bf16", "--fp16",
                       "--optimizer-cpu-offload", "--tp-comm-overlap",
                       "--overlap-param-gather", "--overlap-grad-reduce",
                       "--use-precision-aware-optimizer", "--use-megatron-fsdp"})
#: ZeRO stage → Megatron-FSDP's ``--data-parallel-sharding-strategy`` (stages 2 and 3).
_SHARDING = {2: "optim_grads", 3: "optim_grads_params"}
_DTYPE_FLAGS = {"bfloat16": "--bf16", "float16": "--fp16"}


def export(target: TargetConfig) -> tuple[str, list[str], dict[str, Any]]:
    """Megatron-LM arguments for ``target``, the notes on what they approximate and the
    changes (:class:`~fxplan.core.config.ParallelConfig` fields) of the run they describe."""
    notes: list[str] = []
    changes: dict[str, Any] = {}
    args: list[tuple[str, object | None]] = [
        ("--tensor-model-parallel-size", target.tp),
        ("--pipeline-model-parallel-size", target.pp),
        ("--context-parallel-size", target.cp or 1),
        ("--expert-model-parallel-size", target.ep or 1),
    ]
    if (target.cp or 1) > 1:
        args.append(("--cp-comm-type", "all_gather"))   # fxplan prices the K/V all-gather
    if target.layers is not None:
        args.append(("--num-layers", target.layers))
    args += _pipeline_layout(target, notes, changes)
    args += [("--micro-batch-size", target.microbatch_size),
             ("--global-batch-size", target.global_batch)]
    if target.seq is not None:
        args.append(("--seq-length", target.seq))
    if target.sequence_parallel:
        args.append(("--sequence-parallel", None))
        if target.tp_comm_overlap:
            args.append(("--tp-comm-overlap", None))
    if target.recompute == "selective":
        args.append(("--recompute-granularity", "selective"))
    elif target.recompute == "full":
        args += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                 ("--recompute-num-layers", 1)]
    args += _data_parallel(target, notes, changes)
    if target.dtype in _DTYPE_FLAGS:
        args.append((_DTYPE_FLAGS[target.dtype], None))
    if target.fp8:
        args.append(("--fp8-format", "hybrid"))
    fsdp = (target.zero_stage or 0) >= 2
    lines = [flag if value is None else f"{flag} {value}" for flag, value in args]
    return _environment(target, fsdp, notes) + " \\\n".join(lines) + "\n", notes, changes


def _data_parallel(target: TargetConfig, notes: list[str],
                   changes: dict[str, Any]) -> list[tuple[str, object | None]]:
    """ZeRO, gradient-reduction overlap and offload: ZeRO-1 is the distributed optimizer,
    ZeRO-2/3 are Megatron-FSDP (``optim_grads`` / ``optim_grads_params``, which needs the
    ``fsdp_dtensor`` checkpoint format); the gradient reduction overlaps the backward as
    fxplan prices it (``--overlap-grad-reduce``, which ``--overlap-param-gather`` needs)."""
    zero = target.zero_stage or 0
    args: list[tuple[str, object | None]] = []
    if zero or target.offload not in (None, "none"):
        args.append(("--use-distributed-optimizer", None))  # Megatron-FSDP v1 needs it too
    if zero >= 2:
        args += [("--use-megatron-fsdp", None),
                 ("--data-parallel-sharding-strategy", _SHARDING[zero]),
                 ("--ckpt-format", "fsdp_dtensor")]
    if (target.dp or 1) > 1:   # Megatron reduces gradients over its dp·cp ranks
        args.append(("--overlap-grad-reduce", None))
        if target.param_gather_overlap and zero:
            args.append(("--overlap-param-gather", None))
    if target.offload not in (None, "none"):
        args += [("--optimizer-cpu-offload", None), ("--use-precision-aware-optimizer", None)]
        if not zero and (target.dp or 1) > 1:
            changes["zero_stage"] = 1
            notes.append("changed: Megatron-LM offloads the distributed optimizer's shards, so "
                         "the plan's ZeRO-0 is written as ZeRO-1 (--use-distributed-optimizer)")
        if target.offload == "optimizer+params":
            changes["offload"] = "optimizer"
            notes.append("approximated: Megatron-LM's --optimizer-cpu-offload moves the "
                         "optimizer states and step to the host; the parameters stay on the "
                         "device (more device memory than the plan's optimizer+params)")
    return args


def _environment(target: TargetConfig, fsdp: bool, notes: list[str]) -> str:
    """The environment line Megatron-LM checks: with tensor or context parallelism it asserts
    ``CUDA_DEVICE_MAX_CONNECTIONS=1`` (GPUs before Blackwell); Megatron-FSDP asserts the
    opposite (unset or > 1) and only warns about tp/cp beside it."""
    model_parallel = (target.tp or 1) > 1 or (target.cp or 1) > 1
    if fsdp:
        notes.append("environment: leave CUDA_DEVICE_MAX_CONNECTIONS unset (or > 1); "
                     "Megatron-FSDP refuses CUDA_DEVICE_MAX_CONNECTIONS=1"
                     + (" and, beside tensor or context parallelism, warns that their "
                        "collectives then overlap less on GPUs before Blackwell"
                        if model_parallel else ""))
        return "# environment: CUDA_DEVICE_MAX_CONNECTIONS unset (Megatron-FSDP)\n"
    if model_parallel:
        notes.append("environment: export CUDA_DEVICE_MAX_CONNECTIONS=1 before launching; "
                     "Megatron-LM requires it with tensor or context parallelism on GPUs "
                     "before Blackwell")
        return "# environment: export CUDA_DEVICE_MAX_CONNECTIONS=1\n"
    return ""


def _pipeline_layout(target: TargetConfig, notes: list[str],
                     changes: dict[str, Any]) -> list[tuple[str, object]]:
    """Virtual stages, uneven first/last stages, and the notes on the schedule."""
    pp, v = target.pp or 1, target.virtual_stages or 1
    if pp == 1:
        return []
    without_zero_bubble(target, "Megatron-LM", notes, changes)
    if target.schedule == "gpipe":
        changes["schedule"] = Schedule("1f1b")
        notes.append("approximated: Megatron-LM has no GPipe schedule; it runs 1F1B over the "
                     "same microbatches (same bubble, less activation memory)")
    counts = target.stage_layers
    if v > 1:
        if counts is not None:
            notes.append(f"approximated: Megatron-LM splits layers evenly over virtual stages; "
                         f"the planned stages {_slashed(counts)} are not exported (Megatron "
                         f"needs num-layers divisible by pp·v = {pp}·{v})")
            changes["stage_layers"] = None
            return []
        if target.layers is None:
            notes.append(f"not exported: --num-layers-per-virtual-pipeline-stage needs the "
                         f"layer count, which the plan does not record (layers / (pp·v) with "
                         f"pp·v = {pp}·{v})")
            return []
        return [("--num-layers-per-virtual-pipeline-stage", target.layers_per_virtual_stage)]
    if counts is None:
        return []
    first, middle, last = counts[0], counts[1:-1], counts[-1]
    if len(set(middle)) > 1:
        notes.append(f"approximated: Megatron-LM lets only the first and last pipeline stage "
                     f"differ; the planned stages {_slashed(counts)} are not exported and "
                     "Megatron splits the layers evenly")
        changes["stage_layers"] = None
        return []
    even = middle[0] if middle else None
    layout: list[tuple[str, object]] = []
    if first != even:
        layout.append(("--decoder-first-pipeline-num-layers", first))
    if middle and last != even:
        layout.append(("--decoder-last-pipeline-num-layers", last))
    return layout


def parse(text: str, *, world_size: int | None = None,
          layers: int | None = None) -> TargetConfig:
    """Read Megatron-LM arguments back into a :class:`TargetConfig`.

    ``world_size`` (the launcher's process count) gives ``dp`` and the microbatch count;
    ``layers`` is used when the text has no ``--num-layers``. Unknown options are errors.
    """
    values: dict[str, str] = {}
    switches: set[str] = set()
    tokens = shlex.split(text.replace("\\\n", " "), comments=True)  # line continuations
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token in _SWITCHES:
            switches.add(token)
            i += 1
        elif token in _VALUED and i + 1 < len(tokens):
            values[token] = tokens[i + 1]
            i += 2
        else:
            raise ExportError(f"Megatron-LM arguments: cannot read {token!r}; expected one of "
                              f"{', '.join(sorted(_VALUED | _SWITCHES))}")

    def number(flag: str, default: int | None = None) -> int | None:
        if flag not in values:
            return default
        try:
            return int(values[flag])
        except ValueError:
            raise ExportError(f"Megatron-LM arguments: {flag} {values[flag]!r} is not an "
                              "integer") from None

    tp = number("--tensor-model-parallel-size") or 1
    pp = number("--pipeline-model-parallel-size") or 1
    layers = number("--num-layers", layers)
    per_virtual = number("--num-layers-per-virtual-pipeline-stage")
    v = layers // (pp * per_virtual) if per_virtual and layers else 1
    dp = world_size // (tp * pp) if world_size else None
    cp = number("--context-parallel-size", 1)
    mb, batch = number("--micro-batch-size"), number("--global-batch-size")
    granularity = values.get("--recompute-granularity")
    if "--recompute-activations" in switches:
        granularity = "selective"
    dtype = next((d for d, f in _DTYPE_FLAGS.items() if f in switches), "float32")
    return TargetConfig(
        dp=dp, tp=tp, pp=pp,
        schedule=(f"interleaved:{v}" if v > 1 else "1f1b"), virtual_stages=v,
        microbatch_size=mb,
        # Megatron's data-parallel size is world/(tp·pp·cp): fxplan's dp/cp replicas
        num_microbatches=batch // (mb * (dp // cp)) if batch and mb and dp else None,
        global_batch=batch,
        sequence_parallel="--sequence-parallel" in switches and tp > 1,
        recompute=granularity or "none",
        zero_stage=_zero_stage(switches, values),
        layers=layers,
        stage_layers=_stage_layers(layers, pp, number("--decoder-first-pipeline-num-layers"),
                                   number("--decoder-last-pipeline-num-layers")),
        seq=number("--seq-length"),
        dtype=dtype,
        cp=cp, ep=number("--expert-model-parallel-size", 1),
        offload="optimizer" if "--optimizer-cpu-offload" in switches else "none",
        fp8="--fp8-format" in values,
        tp_comm_overlap="--tp-comm-overlap" in switches and "--sequence-parallel" in switches
        and tp > 1,
        param_gather_overlap="--overlap-param-gather" in switches
        and "--use-distributed-optimizer" in switches and (dp is None or dp > 1),
        cp_comm=values.get("--cp-comm-type", "p2p") if cp and cp > 1 else None,
    )


def _zero_stage(switches: set[str], values: dict[str, str]) -> int:
    """1 for the distributed optimizer, 2/3 for Megatron-FSDP's sharding strategies."""
    if "--use-megatron-fsdp" in switches:
        strategy = values.get("--data-parallel-sharding-strategy", "optim_grads_params")
        return {v: k for k, v in _SHARDING.items()}.get(strategy, 1)
    return 1 if "--use-distributed-optimizer" in switches else 0


def _stage_layers(layers: int | None, pp: int, first: int | None,
                  last: int | None) -> tuple[int, ...] | None:
    """Per-stage layer counts from Megatron's first/last overrides (``None`` when even)."""
    if layers is None or (first is None and last is None):
        return None
    rest = pp - (first is not None) - (last is not None)
    left = layers - (first or 0) - (last or 0)
    middle = (left // rest,) * rest if rest else ()
    counts = (((first,) if first is not None else ()) + middle
              + ((last,) if last is not None else ()))
    return counts if len(set(counts)) > 1 else None


def _slashed(counts: tuple[int, ...]) -> str:
    return "/".join(map(str, counts))
