"""Step time of ``fxplan launch`` against a hand-written torch script of the same configuration.

    python benchmarks/launch_vs_handwritten.py [--steps 20] [--repeats 3] [--markdown] [--trace DIR]

For each case a plan of a small ``hf:llama`` on ``local-cpu:devices=N`` is made with
``fxplan plan --constrain`` (one rank; dp=2; ZeRO-3 dp=2; tp=2; tp=2 Megatron), and the same
configuration runs twice under torchrun on the same token file (``OMP_NUM_THREADS=1``, gloo):

* ``fxplan launch PLAN --data tokens.bin --steps S`` — its ``summary.json``'s
  ``measured_step_time_s``;
* this file as a torchrun worker (``--worker``): the model as ``resolve_model`` builds it, made
  parallel by hand the way the PyTorch tutorials / torchtitan do — ``DistributedDataParallel``
  (dp), ``fully_shard`` per decoder layer and the root (ZeRO-3), and for tp the plan's own
  layout written as ``parallelize_module`` styles (:func:`plan_tp_styles`: a Linear whose weight
  the plan splits ``S(0)`` over tp is ``ColwiseParallel``, ``S(1)`` ``RowwiseParallel``, an
  embedding ``S(0)`` ``RowwiseParallel`` (vocabulary-parallel), a replicated one nothing) — and
  a plain loop: the plan's microbatches with gradient accumulation (``no_sync`` under DDP),
  ``clip_grad_norm_``, AdamW, ``zero_grad``.

The planner's tp=2 plan of this model on ``local-cpu`` splits *nothing* over tp (every
placement ``RR``: on this machine a tp collective costs more than the matmuls it splits), so
both sides run the whole model on each rank. The case ``tp=2 Megatron`` runs a real
tensor-parallel layout through both: the same plan with its parameter placements set to
Megatron-LM's (q/k/v/gate/up and the embedding and LM head ``S(0)``, o/down ``S(1)``,
norms replicated; :func:`megatron_placements`), which ``fxplan launch`` applies like any plan.

Both time each step on every rank and take the slowest rank's; a run's step time is the median
over steps 2…S. A case alternates the two ``--repeats`` times and reports the median of each and
``ratio = fxplan / hand-written``. Wall-clock on a machine that may be shared: the 1-minute load
average is printed with each case.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

LLAMA = ("hf:llama:num_hidden_layers=2,hidden_size=128,intermediate_size=256,"
         "num_attention_heads=4,num_key_value_heads=4,vocab_size=512,max_position_embeddings=64")
BATCH, SEQ = 8, 64
#: name → (devices, --constrain, what the hand-written script uses)
CASES: dict[str, tuple[int, str, str]] = {
    "one rank": (1, "dp=1,tp=1,pp=1,recompute=none", "plain module"),
    "dp=2": (2, "dp=2,zero=0,recompute=none", "DistributedDataParallel"),
    "ZeRO-3 dp=2": (2, "dp=2,zero=3,recompute=none", "fully_shard per layer + root"),
    "tp=2": (2, "tp=2,sp=false,recompute=none", "the plan's tp layout"),
    "tp=2 Megatron": (2, "tp=2,sp=false,recompute=none", "parallelize_module, Megatron layout"),
}
#: Megatron-LM's tensor-parallel layout of a Llama (sp off): parameter name suffix → tp placement.
MEGATRON = {"q_proj.weight": "S(0)", "k_proj.weight": "S(0)", "v_proj.weight": "S(0)",
            "gate_proj.weight": "S(0)", "up_proj.weight": "S(0)", "o_proj.weight": "S(1)",
            "down_proj.weight": "S(1)", "embed_tokens.weight": "S(0)", "lm_head.weight": "S(0)"}


def megatron_placements(plan_file: Path) -> None:
    """Rewrite the plan file's parameter placements to Megatron's tp layout (:data:`MEGATRON`;
    replicated over dp, every other parameter replicated). Only ``placements.params`` changes:
    the module-level runtime reads the layout from there."""
    data = json.loads(plan_file.read_text())
    placements = data["placements"]
    axes = placements["axes"]
    for name in placements["params"]:
        tp = next((v for k, v in MEGATRON.items() if name.endswith(k)), "R")
        placements["params"][name] = "".join(tp if a == "tp" else "R" for a in axes)
    plan_file.write_text(json.dumps(data, indent=1))


def plan_tp_styles(model, plan) -> dict:
    """The plan's tensor-parallel layout as ``parallelize_module`` styles, as a user reads it
    from the plan file (sp off): for each ``nn.Linear`` / ``nn.Embedding`` the ``tp`` entry of
    its weight's planned placement — Linear ``S(0)`` → ``ColwiseParallel`` (inside a decoder
    layer its output stays sharded for the Rowwise Linear after it; the LM head gathers a
    ``Replicate`` output), Linear ``S(1)`` → ``RowwiseParallel``, Embedding ``S(0)`` →
    ``RowwiseParallel`` (vocabulary-parallel), ``R`` → nothing. Every other parameter must be
    replicated over tp. Empty when the plan splits nothing (each rank runs the whole model)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from fxplan.core.placements import format_placement

    axis = plan.placements.axis("tp")

    def tp(name: str) -> str:
        placed = plan.placements.params.get(name)
        return "R" if placed is None else format_placement(placed[axis])

    styles = {}
    for name, module in model.named_modules():
        for leaf, _ in module.named_parameters(recurse=False):
            token = tp(f"{name}.{leaf}")
            kind = (type(module).__name__, leaf, token)
            if token == "R":
                continue
            in_layer = ".layers." in f".{name}."
            if kind == ("Linear", "weight", "S(0)"):
                styles[name] = ColwiseParallel() if in_layer else \
                    ColwiseParallel(output_layouts=Replicate())
            elif kind == ("Linear", "weight", "S(1)"):
                styles[name] = RowwiseParallel() if in_layer else \
                    RowwiseParallel(input_layouts=Replicate())
            elif kind == ("Embedding", "weight", "S(0)"):
                styles[name] = RowwiseParallel(input_layouts=Replicate())
            else:
                raise SystemExit(f"{name}.{leaf} is planned {token} over tp: this script "
                                 "writes only column/row-parallel Linears and a vocabulary-"
                                 "parallel embedding")
    if plan.sequence_parallel and styles:
        raise SystemExit("sequence parallelism: not written by this script")
    return styles


# -- the hand-written worker (run under torchrun) ------------------------------------------
def handwritten(plan_file: str, tokens_file: str, steps: int, out: str,
                trace: str | None = None) -> None:
    """One rank of the hand-written script (module docstring); ``trace``: a directory where
    each rank writes ``hand-rank<R>.json``, steps 2–4 under ``torch.profiler`` (what
    ``fxplan launch --trace`` records)."""
    import gc

    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh

    from fxplan.core.plan import load_plan
    from fxplan.examples.model_spec import resolve_model

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    plan = load_plan(plan_file)
    dp, tp, zero = plan.dp, plan.tp, plan.zero_stage
    micro, m = plan.microbatch_size, plan.num_microbatches
    torch.manual_seed(0)
    model = resolve_model(plan.model).build("cpu")
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    layers = list(model.model.layers)
    styles = plan_tp_styles(model, plan) if tp > 1 else {}
    if styles:  # the plan's layout; none when it splits nothing over tp
        from torch.distributed.tensor.parallel import parallelize_module

        parallelize_module(model, mesh["tp"], styles)
    stage: torch.nn.Module = model
    if dp > 1 and zero >= 2:
        from torch.distributed.fsdp import fully_shard

        for layer in layers:
            fully_shard(layer, mesh=mesh["dp"], reshard_after_forward=zero == 3)
        fully_shard(model, mesh=mesh["dp"], reshard_after_forward=zero == 3)
    elif dp > 1:
        stage = torch.nn.parallel.DistributedDataParallel(model, process_group=mesh["dp"].get_group())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95),
                                  weight_decay=0.1)
    tokens = np.memmap(tokens_file, dtype=np.uint16, mode="r")
    windows = (len(tokens) - 1) // SEQ
    d = mesh.get_coordinate()[0]
    rng = np.random.default_rng(0)
    times = []
    profiler = None
    if trace:
        from torch.profiler import profile, schedule

        profiler = profile(schedule=schedule(wait=1, warmup=0, active=min(3, steps - 1),
                                             repeat=1))
        profiler.start()
    for _ in range(steps):
        began = time.perf_counter()
        picks = rng.integers(0, windows, BATCH)[d * BATCH // dp:(d + 1) * BATCH // dp]
        block = torch.from_numpy(np.stack([tokens[w * SEQ:w * SEQ + SEQ + 1] for w in picks])
                                 .astype(np.int64))
        for j in range(m):
            x, y = block[j * micro:(j + 1) * micro, :-1], block[j * micro:(j + 1) * micro, 1:]
            sync = j == m - 1 or not isinstance(stage, torch.nn.parallel.DistributedDataParallel)
            with stage.no_sync() if not sync else _null():
                logits = stage(x).logits
                loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1)) / m
                loss.backward()
        _clip(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - began)
        if profiler is not None:
            profiler.step()
    if profiler is not None:
        profiler.stop()
        profiler.export_chrome_trace(str(Path(trace) / f"hand-rank{rank}.json"))
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if rank == 0:
        Path(out).write_text(json.dumps({"step_times_s": slowest.tolist(), "world": world}))
    # free FSDP's / DTensor's objects that hold the groups before the groups go: without it
    # the ZeRO-3 worker could abort at interpreter exit ("terminate called without an active
    # exception"), as fxplan's worker did before it did the same (docs/runtime.md, Clean exits)
    del model, stage, optimizer, layers
    gc.collect()
    dist.destroy_process_group()


def _clip(params, max_norm: float) -> None:
    """``clip_grad_norm_`` for a model whose gradients are partly DTensors (tp) and partly
    plain tensors (replicated norms): ``get_total_norm`` per kind, combined, one coefficient."""
    import torch
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    kinds = [[g for g in grads if isinstance(g, DTensor)],
             [g for g in grads if not isinstance(g, DTensor)]]
    norms = []
    for kind in kinds:
        if kind:
            norm = torch.nn.utils.get_total_norm(kind)
            norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    total = float(torch.stack(norms).norm())
    coef = min(1.0, max_norm / (total + 1e-6))
    for kind in kinds:
        if kind:
            torch._foreach_mul_(kind, coef)


def _null():
    import contextlib

    return contextlib.nullcontext()


# -- the driver ----------------------------------------------------------------------------
def _run(*args: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(list(args), capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"{' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def _fxplan(*args: str) -> str:
    return _run(sys.executable, "-m", "fxplan.cli.main", *args)


def fxplan_step(plan: Path, tokens: Path, steps: int, tmp: Path, trace: Path | None = None
                ) -> float:
    run_dir = tmp / f"run-{time.time_ns()}"
    _fxplan("launch", str(plan), "--data", str(tokens), "--steps", str(steps), "--log-every",
            str(steps), "--run-dir", str(run_dir), *(["--trace", str(trace)] if trace else []))
    return float(json.loads((run_dir / "summary.json").read_text())["measured_step_time_s"])


def handwritten_step(plan: Path, tokens: Path, steps: int, devices: int, tmp: Path,
                     trace: Path | None = None) -> float:
    out = tmp / f"hand-{time.time_ns()}.json"
    _run(sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc-per-node={devices}", __file__, "--worker", str(plan), str(tokens), str(steps),
         str(out), *([str(trace)] if trace else []))
    return statistics.median(json.loads(out.read_text())["step_times_s"][1:])


def collectives_per_step(trace: Path) -> dict[str, float]:
    """Gloo collectives per recorded step in a Chrome trace (events ``gloo:<op>``, the
    profiler's record of every collective the rank ran), by op; the traces hold 3 steps."""
    events = json.loads(trace.read_text()).get("traceEvents", [])
    counts = Counter(e["name"] for e in events if str(e.get("name", "")).startswith("gloo:"))
    return {k: v / 3 for k, v in sorted(counts.items())}


def tp_layout(plan) -> str:
    """How many parameters the plan splits over tp (the column of the table)."""
    if plan.tp == 1:
        return ""
    axis = plan.placements.axis("tp")
    split = sum(not p[axis].is_replicate() for p in plan.placements.params.values())
    return f" ({split} of {len(plan.placements.params)} parameters split over tp)"


def measure(name: str, steps: int, repeats: int, tokens: Path, tmp: Path,
            trace: Path | None = None) -> dict:
    devices, constrain, hand = CASES[name]
    plan = tmp / f"plan-{name.replace(' ', '_').replace('=', '')}.json"
    _fxplan("plan", LLAMA, "--cluster", f"local-cpu:devices={devices}", "--batch", str(BATCH),
            "--seq", str(SEQ), "--constrain", constrain, "-o", str(plan))
    if "Megatron" in name:
        megatron_placements(plan)
    from fxplan.core.plan import load_plan

    made = load_plan(plan)
    hand += tp_layout(made)
    load = os.getloadavg()[0]
    ours, theirs = [], []
    for i in range(repeats):
        pair = [lambda: ours.append(fxplan_step(plan, tokens, steps, tmp)),
                lambda: theirs.append(handwritten_step(plan, tokens, steps, devices, tmp))]
        for run in pair if i % 2 == 0 else pair[::-1]:
            run()
        print(f"{name} run {i + 1}: fxplan {ours[-1] * 1e3:.1f} ms, hand-written "
              f"{theirs[-1] * 1e3:.1f} ms (load {os.getloadavg()[0]:.1f})", file=sys.stderr,
              flush=True)
    comms = {}
    if trace is not None:  # one more pair, profiled, not timed
        where = trace / name.replace(" ", "_").replace("=", "")
        where.mkdir(parents=True, exist_ok=True)
        fxplan_step(plan, tokens, 5, tmp, where)
        handwritten_step(plan, tokens, 5, devices, tmp, where)
        comms = {side: collectives_per_step(where / f"{side}-rank0.json")
                 for side in ("measured", "hand")}
        print(f"{name}: gloo collectives per step on rank 0, fxplan {comms['measured']}, "
              f"hand-written {comms['hand']} (traces in {where})", file=sys.stderr, flush=True)
    return dict(case=name, hand=hand, devices=devices, plan=made.summary,
                fxplan_ms=[t * 1e3 for t in ours], hand_ms=[t * 1e3 for t in theirs],
                ratio=statistics.median(ours) / statistics.median(theirs), load=load,
                collectives=comms)


def table(rows: list[dict]) -> str:
    lines = ["| case | plan | hand-written | fxplan launch (ms) | hand-written (ms) | ratio | "
             "load before |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        ours = statistics.median(r["fxplan_ms"])
        theirs = statistics.median(r["hand_ms"])
        lines.append(f"| {r['case']} | `{r['plan'].replace('|', '¦')}` | {r['hand']} | {ours:.1f} "
                     f"({', '.join(f'{t:.1f}' for t in r['fxplan_ms'])}) | {theirs:.1f} "
                     f"({', '.join(f'{t:.1f}' for t in r['hand_ms'])}) | {r['ratio']:.2f}× | "
                     f"{r['load']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        handwritten(*sys.argv[2:4], int(sys.argv[4]), *sys.argv[5:7])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="steps per run (default 20)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side (default 3)")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    parser.add_argument("--markdown", action="store_true", help="print the table only")
    parser.add_argument("--trace", metavar="DIR", help="after the timed runs, one profiled run "
                        "of 5 steps per side and case: DIR/CASE/measured-rank<R>.json (fxplan "
                        "launch --trace) and hand-rank<R>.json, and the gloo collectives per "
                        "step of each")
    args = parser.parse_args()
    import numpy as np

    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        tokens = tmp / "tokens.bin"
        np.random.default_rng(0).integers(0, 512, 200_000).astype(np.uint16).tofile(tokens)
        rows = []
        for case in args.cases.split(","):
            rows.append(measure(case, args.steps, args.repeats, tokens, tmp,
                                Path(args.trace).resolve() if args.trace else None))
            print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    print(table(rows))
    if not args.markdown:
        print(f"\n{os.cpu_count()} CPUs, load average now {os.getloadavg()[0]:.2f}; "
              f"medians over steps 2…{args.steps} of the slowest rank, then over runs")


if __name__ == "__main__":
    main()
