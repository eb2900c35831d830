"""Step time of ``fxplan launch`` against a hand-written torch script of the same configuration.

    python benchmarks/launch_vs_handwritten.py [--steps 20] [--repeats 3] [--markdown]

For each case a plan of a small ``hf:llama`` on ``local-cpu:devices=N`` is made with
``fxplan plan --constrain`` (one rank; dp=2; ZeRO-3 dp=2; tp=2), and the same configuration runs
twice under torchrun on the same token file (``OMP_NUM_THREADS=1``, gloo):

* ``fxplan launch PLAN --data tokens.bin --steps S`` — its ``summary.json``'s
  ``measured_step_time_s``;
* this file as a torchrun worker (``--worker``): the model as ``resolve_model`` builds it, made
  parallel by hand the way the PyTorch tutorials / torchtitan do — ``DistributedDataParallel``
  (dp), ``fully_shard`` per decoder layer and the root (ZeRO-3), ``parallelize_module`` with
  Colwise q/k/v/gate/up and Rowwise o/down per layer, a Rowwise (vocabulary-parallel) embedding
  and a Colwise LM head (tp; torchtitan's layout without sequence parallelism, the one the
  planner picks here) — and a plain loop: the plan's
  microbatches with gradient accumulation (``no_sync`` under DDP), ``clip_grad_norm_``,
  AdamW, ``zero_grad``.

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
from pathlib import Path

LLAMA = ("hf:llama:num_hidden_layers=2,hidden_size=128,intermediate_size=256,"
         "num_attention_heads=4,num_key_value_heads=4,vocab_size=512,max_position_embeddings=64")
BATCH, SEQ = 8, 64
#: name → (devices, --constrain, what the hand-written script uses)
CASES: dict[str, tuple[int, str, str]] = {
    "one rank": (1, "dp=1,tp=1,pp=1,recompute=none", "plain module"),
    "dp=2": (2, "dp=2,zero=0,recompute=none", "DistributedDataParallel"),
    "ZeRO-3 dp=2": (2, "dp=2,zero=3,recompute=none", "fully_shard per layer + root"),
    "tp=2": (2, "tp=2,sp=false,recompute=none", "parallelize_module"),
}


# -- the hand-written worker (run under torchrun) ------------------------------------------
def handwritten(plan_file: str, tokens_file: str, steps: int, out: str) -> None:
    """One rank of the hand-written script (module docstring)."""
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
    if tp > 1:
        from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                       parallelize_module)

        styles = {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
                  "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
                  "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
                  "mlp.down_proj": RowwiseParallel()}
        for layer in layers:
            parallelize_module(layer, mesh["tp"], styles)
        from torch.distributed.tensor import Replicate

        # vocabulary-parallel embedding and LM head, as the plans of this benchmark have them
        parallelize_module(model, mesh["tp"], {
            "model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),
            "lm_head": ColwiseParallel(output_layouts=Replicate())})
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
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if rank == 0:
        Path(out).write_text(json.dumps({"step_times_s": slowest.tolist(), "world": world}))
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


def fxplan_step(plan: Path, tokens: Path, steps: int, tmp: Path) -> float:
    run_dir = tmp / f"run-{time.time_ns()}"
    _fxplan("launch", str(plan), "--data", str(tokens), "--steps", str(steps), "--log-every",
            str(steps), "--run-dir", str(run_dir))
    return float(json.loads((run_dir / "summary.json").read_text())["measured_step_time_s"])


def handwritten_step(plan: Path, tokens: Path, steps: int, devices: int, tmp: Path) -> float:
    out = tmp / f"hand-{time.time_ns()}.json"
    _run(sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc-per-node={devices}", __file__, "--worker", str(plan), str(tokens), str(steps),
         str(out))
    return statistics.median(json.loads(out.read_text())["step_times_s"][1:])


def measure(name: str, steps: int, repeats: int, tokens: Path, tmp: Path) -> dict:
    devices, constrain, hand = CASES[name]
    plan = tmp / f"plan-{devices}-{constrain.replace(',', '_').replace('=', '')}.json"
    _fxplan("plan", LLAMA, "--cluster", f"local-cpu:devices={devices}", "--batch", str(BATCH),
            "--seq", str(SEQ), "--constrain", constrain, "-o", str(plan))
    from fxplan.core.plan import load_plan

    made = load_plan(plan)
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
    return dict(case=name, hand=hand, devices=devices, plan=made.summary,
                fxplan_ms=[t * 1e3 for t in ours], hand_ms=[t * 1e3 for t in theirs],
                ratio=statistics.median(ours) / statistics.median(theirs), load=load)


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
        handwritten(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="steps per run (default 20)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side (default 3)")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    parser.add_argument("--markdown", action="store_true", help="print the table only")
    args = parser.parse_args()
    import numpy as np

    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        tokens = tmp / "tokens.bin"
        np.random.default_rng(0).integers(0, 512, 200_000).astype(np.uint16).tofile(tokens)
        rows = []
        for case in args.cases.split(","):
            rows.append(measure(case, args.steps, args.repeats, tokens, tmp))
            print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    print(table(rows))
    if not args.markdown:
        print(f"\n{os.cpu_count()} CPUs, load average now {os.getloadavg()[0]:.2f}; "
              f"medians over steps 2…{args.steps} of the slowest rank, then over runs")


if __name__ == "__main__":
    main()
