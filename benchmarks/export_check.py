"""Check ``fxplan export`` on real model presets: each framework's own parser where it is
installed, the framework tables always, and fxplan's price of what each export runs
differently from its plan.

    .venv/bin/python benchmarks/export_check.py                 # the built-in scenarios
    .venv/bin/python benchmarks/export_check.py --only gpt3     # scenarios whose name matches
    .venv/bin/python benchmarks/export_check.py --plan plan.json --plan other.json

A scenario is a model preset, a cluster, a global batch and a configuration; it becomes a plan
with the real graph and cluster fingerprints (the model captured as ``fxplan plan`` captures
it), split evenly. Each plan is exported to Megatron-LM, torchtitan (current and the 0.2.2
TOML) and DeepSpeed. Per export one row: the table check
(:mod:`fxplan.export.framework_checks`, ``ok`` or the refusals), the real parser —
Megatron-LM's ``parse_args`` + ``validate_args`` (``megatron`` importable, e.g.
``PYTHONPATH=Megatron-LM``), torchtitan's ``ConfigManager`` for a TOML or the config function
called for current torchtitan (``torchtitan`` importable), DeepSpeed's ``DeepSpeedConfig`` with
the plan's data-parallel world size (the ``export`` extra) — or ``not installed`` (and, for
torchtitan, which form the importable one reads), and the price note when the export changes
the run (step time, peak memory, fits). ``--torchtitan-version`` picks the release whose TOML
is written (default 0.2.2).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path
from unittest import mock

from fxplan.core.config import ParallelConfig
from fxplan.core.plan import Plan, StageAssignment, load_plan
from fxplan.export import export_plan
from fxplan.export.framework_checks import megatron_violations, torchtitan_violations

#: name → (model, cluster, global batch, seq, configuration)
SCENARIOS: dict[str, tuple[str, str, int, int, str]] = {
    "gpt3-175b zero3 tp4 pp4": (
        "gpt3-175b", "dgx-a100-80g:nodes=16", 1536, 2048,
        "dp=8,tp=4,pp=4,mb=1,schedule=1f1b,zero=3,recompute=full,sp=on"),
    "gpt-18.4b zero0 tp4 pp2 gpipe": (
        "gpt-18.4b", "dgx-a100-80g:nodes=2", 256, 2048,
        "dp=2,tp=4,pp=2,mb=1,schedule=gpipe,zero=0,recompute=full,sp=on"),
    "gpt-7.5b zero1 tp4": (
        "gpt-7.5b", "dgx-a100-80g:nodes=2", 256, 2048,
        "dp=4,tp=4,pp=1,mb=2,schedule=1f1b,zero=1,recompute=selective,sp=on"),
    "gpt-7.5b zero3 offload": (
        "gpt-7.5b", "dgx-a100-80g:nodes=1", 128, 2048,
        "dp=8,tp=1,pp=1,mb=1,schedule=1f1b,zero=3,recompute=full,sp=off,"
        "offload=optimizer+params"),
    "gpt-7.5b cp4": (
        "gpt-7.5b:seq=32768", "dgx-a100-80g:nodes=2", 16, 32768,
        "dp=8,tp=2,pp=1,mb=1,schedule=1f1b,zero=1,recompute=full,sp=on,cp=4"),
    "moe-27b ep8 zero1": (
        "moe-27b", "dgx-a100-80g:nodes=1", 64, 1024,
        "dp=8,tp=1,pp=1,mb=1,schedule=1f1b,zero=1,recompute=full,sp=off,ep=8"),
    "llama-3-8b tp2 no sp": (
        "hf:llama-3-8b", "dgx-a100-80g:nodes=1", 64, 4096,
        "dp=4,tp=2,pp=1,mb=1,schedule=1f1b,zero=3,recompute=full,sp=off"),
}
#: (target, torchtitan version); the release is ``--torchtitan-version``.
FORMS = (("megatron", None), ("torchtitan", "current"), ("torchtitan", "release"),
         ("deepspeed", None))


def scenario_plan(model: str, cluster_spec: str, batch: int, seq: int, text: str) -> Plan:
    """A plan of ``text`` with the real fingerprints of ``model`` and ``cluster_spec``."""
    from fxplan.api import capture_for_search
    from fxplan.cluster_specs import Cluster, training_dtype

    cluster = Cluster.load(cluster_spec)
    graph = capture_for_search(model, seq=seq, dtype=training_dtype(cluster))
    config = ParallelConfig.parse(text).resolve(batch)
    layers = sum(block.count for block in graph.blocks)
    stages_n = config.pp * config.virtual_stages
    per = layers // stages_n
    stages = tuple(StageAssignment(i, (i * per, (i + 1) * per), i == 0, i == stages_n - 1)
                   for i in range(stages_n))
    return Plan(model=model, cluster=cluster_spec, graph_fingerprint=graph.fingerprint(),
                cluster_fingerprint=cluster.fingerprint(), batch=batch, seq=seq,
                config=config, stages=stages)


def run_megatron(text: str, world: int, gpu_arch: int | None = None) -> str:
    """Megatron-LM's own ``parse_args`` and ``validate_args`` on the arguments; ``gpu_arch``
    (8 Ampere, 9 Hopper, 10 Blackwell) answers ``validate_args``' question about the GPU on a
    machine without CUDA."""
    if importlib.util.find_spec("megatron") is None:
        return "not installed"
    arguments = importlib.import_module("megatron.training.arguments")
    if gpu_arch is not None:
        arguments.get_device_arch_version = lambda: gpu_arch
    tokens = shlex.split(text.replace("\\\n", " "), comments=True)
    seq = int(tokens[tokens.index("--seq-length") + 1]) if "--seq-length" in tokens else 4096
    ep = int(tokens[tokens.index("--expert-model-parallel-size") + 1])
    # the model's own arguments, which the export leaves to the user (a small stand-in model)
    model = ["--hidden-size", "1024", "--num-attention-heads", "16",
             "--max-position-embeddings", str(max(seq, 4096)), "--tokenizer-type",
             "NullTokenizer", "--vocab-size", "32000"]
    if ep > 1:
        model += ["--num-experts", str(ep)]
    argv = ["pretrain_gpt.py", *tokens, *model]
    env = {"WORLD_SIZE": str(world), "RANK": "0", "LOCAL_RANK": "0"}
    if "# environment: export CUDA_DEVICE_MAX_CONNECTIONS=1" in text:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    try:
        with mock.patch.object(sys, "argv", argv), mock.patch.dict(os.environ, env):
            args = arguments.parse_args()
            arguments.validate_args(args)
    except (AssertionError, ValueError, SystemExit) as err:
        return f"refused: {err}"
    return "ok"


def run_torchtitan(text: str, version: str) -> str:
    """torchtitan's own code on the export, when the importable torchtitan is of that form:
    a release's ``ConfigManager`` on the TOML, current torchtitan's config function (or, when
    its training stack cannot be imported here, its ``TrainingConfig``/``ParallelismConfig``
    built from the function's fields)."""
    if importlib.util.find_spec("torchtitan") is None:
        return "not installed"
    current = importlib.util.find_spec("torchtitan.config.configs") is not None
    if current != (version == "current"):
        return "not the installed torchtitan's form"
    with tempfile.TemporaryDirectory() as folder:
        if current:
            return _titan_function(text, folder)
        path = Path(folder, "job.toml")
        path.write_text(text)
        try:
            config = importlib.import_module("torchtitan.config")
            config.ConfigManager().parse_args(["--job.config_file", str(path)])
        except Exception as err:   # the framework's own refusal, whatever its type
            return f"refused: {type(err).__name__}: {err}"
    return "ok (ConfigManager)"


def _titan_function(text: str, folder: str) -> str:
    from fxplan.export.torchtitan_recipe import sections

    Path(folder, "fxplan_plan.py").write_text(text)
    sys.path.insert(0, folder)
    try:
        importlib.import_module("fxplan_plan").fxplan_plan()
        return "ok (config function)"
    except ModuleNotFoundError as missing:
        configs = importlib.import_module("torchtitan.config.configs")
        fields = sections(text)
        try:
            configs.TrainingConfig(**fields["training"])
            configs.ParallelismConfig(**fields["parallelism"])
        except Exception as err:
            return f"refused: {type(err).__name__}: {err}"
        return f"ok (TrainingConfig, ParallelismConfig; the function needs {missing.name})"
    except Exception as err:
        return f"refused: {type(err).__name__}: {err}"
    finally:
        sys.path.remove(folder)
        sys.modules.pop("fxplan_plan", None)


def run_deepspeed(text: str, data_parallel: int) -> str:
    """DeepSpeed's ``DeepSpeedConfig`` as rank 0 with the plan's data-parallel world size."""
    if importlib.util.find_spec("deepspeed") is None:
        return "not installed"
    config = importlib.import_module("deepspeed.runtime.config")

    class Mpu:
        def get_data_parallel_world_size(self) -> int:
            return data_parallel

    try:
        with mock.patch.object(config.dist, "get_rank", lambda *a, **k: 0):
            config.DeepSpeedConfig(json.loads(text), mpu=Mpu())
    except (AssertionError, ValueError) as err:
        return f"refused: {err}"
    return "ok"


def check(name: str, plan: Plan, release: str, gpu_arch: int | None) -> None:
    print(f"\n## {name}: {plan.model} on {plan.cluster}, batch {plan.batch} x seq {plan.seq}, "
          f"{plan.config.to_string()}")
    for target, version in FORMS:
        version = release if version == "release" else version
        result = export_plan(plan, target, torchtitan_version=version)
        label = target + (f" {version}" if version else "")
        if target == "megatron":
            table = megatron_violations(result.text)
            real = run_megatron(result.text, plan.world_size, gpu_arch)
        elif target == "torchtitan":
            table = torchtitan_violations(result.text, version or "current",
                                          world_size=plan.world_size)
            real = run_torchtitan(result.text, version or "current")
        else:
            table, real = [], run_deepspeed(result.text, plan.dp // plan.config.cp)
        print(f"{label:<20} table: {'ok' if not table else '; '.join(table)}")
        print(f"{'':<20} framework: {real}")
        for note in result.notes:
            if note.startswith("fxplan's estimate"):
                print(f"{'':<20} {note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="scenarios whose name contains this")
    parser.add_argument("--torchtitan-version", default="0.2.2", metavar="VERSION",
                        help="the torchtitan release whose TOML is checked (default 0.2.2)")
    parser.add_argument("--gpu-arch", type=int, default=None, metavar="MAJOR",
                        help="without CUDA: the GPU generation Megatron-LM's validate_args "
                        "is told (8 Ampere, 9 Hopper, 10 Blackwell)")
    parser.add_argument("--plan", action="append", default=[], metavar="PLAN.json",
                        help="check this plan file (instead of the scenarios)")
    args = parser.parse_args()
    for package in ("megatron", "torchtitan", "deepspeed"):
        found = importlib.util.find_spec(package) is not None
        state = ("installed, its own parser runs" if found
                 else "not installed: checked against the table only")
        print(f"{package}: {state}")
    if args.plan:
        for path in args.plan:
            check(path, load_plan(path), args.torchtitan_version, args.gpu_arch)
        return
    for name, (model, cluster, batch, seq, text) in SCENARIOS.items():
        if args.only in name:
            check(name, scenario_plan(model, cluster, batch, seq, text),
                  args.torchtitan_version, args.gpu_arch)


if __name__ == "__main__":
    main()
