"""``make gpu-check``: prove fxplan on this machine's GPUs in one command (≤ 8 minutes on one GPU).

    python benchmarks/gpu_check.py [--out-dir benchmarks/data/gpu] [--steps 8] [--cpu]

Writes ``OUT_DIR/<date>-<device>.json`` (everything measured) and ``.md`` (the tables):

1. ``fxplan doctor --json``, then ``fxplan calibrate --quick`` from the spec the doctor matches.
2. **One device, several plans** — a GPT-style model of about 0.9 B parameters (seq 2048) and a
   Llama-style one of about 0.85 B (seq 4096), bf16, each plan made with ``fxplan plan
   --constrain`` on the base spec (recompute none / selective / full, two microbatch sizes, FP8
   linears where the GPU has an FP8 peak), run through ``fxplan
   validate`` (predicted against measured step time and peak memory), and re-priced on the
   calibrated spec with its op database (``fxplan estimate``): the error before and after
   calibration against the same measurement.
3. **Numerics** — the bf16 loss curve of ``fxplan launch`` against a plain hand-written torch
   loop on the same device (same seed, initial weights, token file, AdamW settings, schedule
   and clipping), and the step-time ratio launch / hand-written.
4. **Two or more GPUs** — dp, ZeRO-3 (also with FSDP2's CPU offload: the gradient norm
   and its clipping over host-memory shards), ZeRO-1 with the optimizer offloaded (AdamW
   stepping on the host over pinned fp32 masters, the copies asynchronous:
   ``fxplan.runtime.train.host_optimizer``), tp + sp and pp plans over nccl, each validated and its
   loss curve compared with one GPU's on the same data; the calibrated collectives beside them.

Every plan of steps 2–4 is made first, as many at once as there are cores (``fxplan plan``
measures nothing); every launch, validation and calibration then runs alone.

Without a CUDA device it says so in one line and runs the same steps in a shortened form on CPU
ranks (gloo, ``gpt-tiny``, fp32, ``local-cpu``), so CI exercises the whole script; the result
files are then written only where ``--out-dir`` says.

**On a GPU node without network** (a Python 3.12 image with a CUDA torch of the supported range,
2.11–2.13, already installed and no OR-Tools): on a machine with network, fetch the other
dependencies as wheels for that Python, carry the folder over, install them without an index,
then run the check with the machine's own python (torch is not touched)::

    # on a machine with network (the wheels are platform-specific; keep them out of git)
    python3 -m pip download --only-binary=:all: --python-version 3.12 \\
        --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 \\
        --platform manylinux2014_x86_64 -d wheels/ \\
        'ortools>=9.10' 'networkx>=3.0' 'PyYAML>=6.0' 'rich>=13.0' 'matplotlib>=3.7' 'numpy>=1.24'
    # on the GPU node, in the fxplan checkout
    python3 -m pip install --no-index --find-links wheels/ ortools networkx PyYAML rich matplotlib numpy
    python3 -m pip install --no-deps --no-build-isolation -e .
    make gpu-check            # or: python3 benchmarks/gpu_check.py

``make gpu-check`` uses the machine's ``python3`` when it imports a CUDA torch and fxplan, else
the project's ``.venv`` (the CPU form).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: mode → (models: name → (spec, batch, seq), single-device plans: name → --constrain)
GPT_1B = "gpt:layers=16,hidden=2048,heads=16,seq=2048,vocab=51200,dropout=0,attention=sdpa"
LLAMA_1B = "llama:layers=16,hidden=2048,heads=16,kv_heads=8,vocab=32000,seq=4096"
GPU_MODELS = {"GPT 0.9B": (GPT_1B, 8, 2048), "Llama 0.85B": (LLAMA_1B, 4, 4096)}
GPU_PLANS = {
    "recompute none, mb 1": "dp=1,tp=1,pp=1,recompute=none,mb=1",
    "recompute selective, mb 2": "dp=1,tp=1,pp=1,recompute=selective,mb=2",
    "recompute full, mb 4": "dp=1,tp=1,pp=1,recompute=full,mb=4",
    "FP8 linears": "dp=1,tp=1,pp=1,fp8=true,recompute=selective",
}
#: offload is checked with two or more GPUs ("ZeRO-3 offloaded": FSDP2's CPU offload, which
#: needs dp > 1; "ZeRO-1, optimizer offloaded": the host optimizer), not on one
#: the Llama model runs the first two plans only (the 8-minute budget)
GPU_LLAMA_PLANS = ("recompute none, mb 1", "recompute full, mb 4")
GPU_MULTI = {"dp": "dp={n},zero=0", "ZeRO-3": "dp={n},zero=3",
             "ZeRO-3 offloaded": "dp={n},zero=3,offload=optimizer+params",
             "ZeRO-1, optimizer offloaded": "dp={n},zero=1,offload=optimizer",
             "tp+sp": "tp={n},sp=true",
             "pp": "pp={n}"}
CPU_MODELS = {"gpt-tiny": ("gpt-tiny:dropout=0", 8, 64)}
CPU_PLANS = {"recompute full, mb 4": "dp=1,tp=1,pp=1,recompute=full,mb=4"}
CPU_MULTI = {"dp": "dp={n},zero=0"}


#: the longest one fxplan command of the check may take before it counts as failed
COMMAND_TIMEOUT_S = 300


def fxplan(*args: str, env: dict[str, str] | None = None, ok: tuple[int, ...] = (0,)) -> str:
    """``fxplan ARGS`` as a user runs it; its stdout (a failure or a command past
    :data:`COMMAND_TIMEOUT_S` raises with its stderr's tail)."""
    try:
        done = subprocess.run([sys.executable, "-m", "fxplan.cli.main", *args],
                              capture_output=True, text=True, env={**os.environ, **(env or {})},
                              cwd=ROOT, timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired as err:
        tail = (err.stderr or b"")[-2500:]
        raise RuntimeError(f"fxplan {' '.join(args)} ran past {COMMAND_TIMEOUT_S} s:\n"
                           f"{tail.decode(errors='replace') if isinstance(tail, bytes) else tail}"
                           ) from None
    if done.returncode not in ok:
        raise RuntimeError(f"fxplan {' '.join(args)} exited {done.returncode}:\n"
                           f"{done.stderr[-2500:]}")
    return done.stdout


def fxplan_json(*args: str, **kw: Any) -> Any:
    return json.loads(fxplan(*args, "--json", **kw))


def _device_name(gpu: bool) -> str:
    if gpu:
        import torch

        return re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name().lower()).strip("-")
    return "cpu"


def _commit() -> str:
    """The checkout's commit; ``$FXPLAN_COMMIT`` where the check runs from an exported tree
    (a GPU node given ``git archive`` of a commit has no ``.git``)."""
    if os.environ.get("FXPLAN_COMMIT"):      # an exported tree may sit inside another checkout
        return os.environ["FXPLAN_COMMIT"]
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=ROOT)
    return done.stdout.strip() or "unknown"


#: ``fxplan plan`` arguments → the error of its run made ahead (``None``: the plan was written)
Planned = dict[tuple[str, ...], "RuntimeError | None"]

#: the numerics' one-device plan
NUMERICS_CONSTRAIN = "dp=1,tp=1,pp=1,recompute=none"


def numerics_file(work: Path) -> Path:
    """Where the numerics' one-device plan is written (made ahead and read by step 3)."""
    return work / "numerics.json"


def row_file(work: Path, row: int) -> Path:
    """Where step 2's plan of row ``row`` (from 1, :func:`single_rows`' order) is written."""
    return work / f"{row}.json"


def multi_file(work: Path, name: str) -> Path:
    """Where step 4's multi-device plan ``name`` is written."""
    return work / f"multi-{name}.json"


def plan_args(model: str, cluster: str, batch: int, seq: int, constrain: str,
              out: Path) -> tuple[str, ...]:
    """The arguments of ``fxplan plan`` for one plan of the check, written to ``out``."""
    return (model, "--cluster", cluster, "--batch", str(batch), "--seq", str(seq),
            "--constrain", constrain, "-o", str(out))


def plan_all(requests: list[tuple[str, ...]], workers: int) -> Planned:
    """Every ``fxplan plan`` the check runs, ``workers`` at a time, before anything is measured
    (a plan is made, not timed: side by side they change no measured number, and every launch,
    validation and calibration after them still runs alone). A failed plan is recorded, as
    the step that needs it records its own failure."""
    def attempt(args: tuple[str, ...]) -> RuntimeError | None:
        try:
            fxplan("plan", *args)
        except RuntimeError as err:
            return err
        return None

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return dict(zip(requests, pool.map(attempt, requests)))


def make_plan(planned: Planned, args: tuple[str, ...]) -> None:
    """The plan of ``fxplan plan ARGS``: made ahead (its error raised again), else made now."""
    if args not in planned:
        fxplan("plan", *args)
    elif planned[args] is not None:
        raise planned[args]


def single_rows(models: dict, plans: dict, gpu: bool) -> list[tuple[str, str, str, str, int, int]]:
    """Step 2's rows in order: ``(model name, plan name, --constrain, spec, batch, seq)``."""
    return [(model_name, plan_name, constrain, model, batch, seq)
            for model_name, (model, batch, seq) in models.items()
            for plan_name, constrain in plans.items()
            if not (gpu and model_name.startswith("Llama") and plan_name not in GPU_LLAMA_PLANS)]


def single_device(base: str, models: dict, plans: dict, steps: int, work: Path, gpu: bool,
                  deadline: float, planned: Planned) -> list[dict[str, Any]]:
    """Step 2: each model × plan planned on the base spec and validated (predicted against
    measured); rows not started by ``deadline`` (``time.perf_counter()``) are recorded as
    skipped, so that calibration still runs within the check's budget."""
    rows: list[dict[str, Any]] = []
    for model_name, plan_name, constrain, model, batch, seq in single_rows(models, plans, gpu):
        row: dict[str, Any] = {"model": model_name, "plan": plan_name, "constrain": constrain,
                               "spec": model, "batch": batch, "seq": seq}
        rows.append(row)
        if time.perf_counter() > deadline:
            row["error"] = "skipped: the check's time budget was spent"
            continue
        plan_file = row_file(work, len(rows))
        print(f"gpu-check:   {model_name}, {plan_name}", flush=True)
        try:
            make_plan(planned, plan_args(model, base, batch, seq, constrain, plan_file))
            plan = json.loads(plan_file.read_text())
            result = fxplan_json("validate", str(plan_file), "--steps", str(steps),
                                 "--tolerance", "100", "--memory-tolerance", "100")
        except RuntimeError as err:      # a crash is a finding: recorded, the check goes on
            row["error"] = str(err).strip().splitlines()[-1][:400]
            row["error_detail"] = str(err)[-2500:]
            continue
        rank = result["ranks"][0]
        row.update(summary=plan["summary"], config=plan["estimate"]["config"],
                   losses=result["losses"],
                   measured_step_s=rank["measured_step_s"],
                   predicted_step_s=rank["predicted_step_s"], step_error=rank["step_error"],
                   measured_memory_gib=rank["measured_memory_gib"],
                   predicted_memory_gib=rank["predicted_memory_gib"],
                   memory_error=rank["memory_error"],
                   measured_reserved_gib=rank["measured_reserved_gib"],
                   reserved_error=rank["reserved_error"])
    return rows


def reprice(rows: list[dict[str, Any]], calibrated: Path, ops_dir: Path, gpu: bool) -> None:
    """Step 2b: each measured row's plan re-priced on the calibrated spec (with its op database
    on a GPU) — the error after calibration against the same measurement."""
    for row in rows:
        if "measured_step_s" not in row:
            continue
        try:
            after = fxplan_json("estimate", row["spec"], "--cluster", str(calibrated), "--batch",
                                str(row["batch"]), "--seq", str(row["seq"]), "--config",
                                row["config"],
                                env={"FXPLAN_OP_DB_PATH": str(ops_dir)} if gpu else None)
        except RuntimeError as err:
            row["calibrated_error"] = str(err).strip().splitlines()[-1][:400]
            continue
        row.update(calibrated_step_s=after["step_time_s"],
                   calibrated_step_error=after["step_time_s"] / row["measured_step_s"] - 1)


def _token_file(path: Path, windows: int, seq: int, vocab: int) -> Path:
    """Exactly one global batch of windows: every step sees the same samples, in any order."""
    import numpy as np

    rng = np.random.default_rng(0)
    rng.integers(0, vocab, windows * seq + 1, dtype=np.uint16).tofile(path)
    return path


def handwritten(plan_file: str, tokens_file: str, steps: int, out: str) -> None:
    """The plain loop on one device (``--handwritten``): the model as ``resolve_model`` builds
    it under seed 0, autocast to the plan's dtype on CUDA, the plan's microbatches with
    gradient accumulation, ``clip_grad_norm_``, AdamW with fxplan's defaults and schedule (decay
    on matrices only), every window of the token file as the batch of every step."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from fxplan.core.plan import load_plan
    from fxplan.core.training import lr_at
    from fxplan.examples.model_spec import resolve_model

    plan = load_plan(plan_file)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    torch.manual_seed(0)
    model = resolve_model(plan.model).build("cpu").to(device)
    decay = [p for _, p in sorted(model.named_parameters()) if p.ndim >= 2]
    other = [p for _, p in sorted(model.named_parameters()) if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                   {"params": other, "weight_decay": 0.0}],
                                  lr=1e-3, betas=(0.9, 0.95))
    seq = plan.seq
    tokens = np.fromfile(tokens_file, dtype=np.uint16).astype(np.int64)
    windows = (len(tokens) - 1) // seq
    block = torch.from_numpy(np.stack([tokens[w * seq:w * seq + seq + 1] for w in range(windows)]))
    block = block.to(device)
    micro, m = plan.microbatch_size, plan.batch // plan.microbatch_size
    losses, times = [], []
    dtype = torch.bfloat16 if cuda else torch.float32
    for step in range(1, steps + 1):
        began = time.perf_counter()
        total = 0.0
        for j in range(m):
            x, y = block[j * micro:(j + 1) * micro, :-1], block[j * micro:(j + 1) * micro, 1:]
            with torch.autocast(device.type, dtype=dtype, enabled=cuda):
                logits = model(x)
            loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1)) / m
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, lr=1e-3, steps=steps)
        optimizer.step()
        optimizer.zero_grad()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - began)
        losses.append(total)
    Path(out).write_text(json.dumps({"losses": losses, "step_times_s": times}))


def numerics(base: str, model: str, batch: int, seq: int, steps: int, work: Path,
             gpu: bool, planned: Planned) -> dict[str, Any]:
    """Step 3: ``fxplan launch`` against the hand-written loop on one device."""
    vocab = 51200 if gpu else 512
    tokens = _token_file(work / "tokens.bin", batch, seq, vocab)
    plan_file = numerics_file(work)
    make_plan(planned, plan_args(model, base, batch, seq, NUMERICS_CONSTRAIN, plan_file))
    run_dir = work / "numerics-run"
    fxplan("launch", str(plan_file), "--data", str(tokens), "--steps", str(steps), "--run-dir",
           str(run_dir))
    launched = [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
                if '"loss"' in line]
    summary = json.loads((run_dir / "summary.json").read_text())
    out = work / "hand.json"
    env = {**os.environ, **({} if gpu else {"OMP_NUM_THREADS": "1"})}   # as fxplan launch runs
    subprocess.run([sys.executable, __file__, "--handwritten", str(plan_file), str(tokens),
                    str(steps), str(out)], check=True, cwd=ROOT, env=env)
    hand = json.loads(out.read_text())
    rel = [abs(a - b) / abs(b) for a, b in zip(launched, hand["losses"])]
    hand_step = statistics.median(hand["step_times_s"][1:])
    return {"model": model, "launch_losses": launched, "handwritten_losses": hand["losses"],
            "max_relative_loss_difference": max(rel), "launch_step_s": summary["measured_step_time_s"],
            "handwritten_step_s": hand_step,
            "ratio": summary["measured_step_time_s"] / hand_step}


def multi_device(base: str, n: int, model: str, batch: int, seq: int, steps: int, work: Path,
                 plans: dict, reference: list[float], planned: Planned) -> list[dict[str, Any]]:
    """Step 4: multi-device plans validated on the numerics' token file, their losses against
    the one-device launch's on the same data."""
    rows = []
    for name, constrain in plans.items():
        row: dict[str, Any] = {"plan": name, "constrain": constrain.format(n=n)}
        plan_file = multi_file(work, name)
        try:
            make_plan(planned, plan_args(model, base, batch, seq, row["constrain"], plan_file))
            result = fxplan_json("validate", str(plan_file), "--steps", str(steps), "--data",
                                 str(work / "tokens.bin"), "--tolerance", "100",
                                 "--memory-tolerance", "100")
        except RuntimeError as err:
            row["error"] = str(err).splitlines()[-1][:400]
            rows.append(row)
            continue
        losses = result["losses"]
        row.update(summary=json.loads(plan_file.read_text())["summary"], losses=losses,
                   max_relative_loss_difference=max(abs(a - b) / abs(b)
                                                    for a, b in zip(losses, reference)),
                   ranks=result["ranks"])
        rows.append(row)
    return rows


def _cell(text: str) -> str:
    """A Markdown table cell: ``|`` escaped."""
    return str(text).replace("|", "\\|")


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:+.1%}"


def _failed(section: Any) -> str | None:
    """A step's failure line, or None where it ran (a step that never started is a failure)."""
    if section is None:
        return "not reached (the check stopped before this step)"
    if isinstance(section, dict) and "error" in section:
        return f"failed: {section['error']}"
    return None


def markdown(record: dict[str, Any]) -> str:
    """The tables of the check; a step that failed or was not reached says so in its place."""
    lines = [f"# fxplan GPU check — {record['device']} ({record['date']}, commit {record['commit']})",
             "", f"torch {record['torch']}; mode: {record['mode']}; base spec "
             f"`{record.get('base_spec')}`; wall time {record.get('wall_time_s', '–')} s", ""]
    n = record.get("numerics")
    lines += ["## Numerics: fxplan launch against a hand-written loop", ""]
    if _failed(n):
        lines.append(_cell(_failed(n)))
    else:
        lines.append(f"max relative loss difference {n['max_relative_loss_difference']:.2e} over "
                     f"{len(n['launch_losses'])} steps; step time launch / hand-written = "
                     f"{n['ratio']:.3f} ({n['launch_step_s'] * 1e3:.1f} / "
                     f"{n['handwritten_step_s'] * 1e3:.1f} ms)")
    lines += ["", "## One device: predicted against measured", "",
              "| model | plan | step measured | error (spec) | error (calibrated) | peak memory "
              "measured | error | reserved error |", "|---|---|---|---|---|---|---|---|"]
    for r in record.get("single_device") or []:
        if "measured_step_s" not in r:
            lines.append(f"| {r['model']} | {r['plan']} | {_cell(r.get('error', '–'))} "
                         "| | | | | |")
            continue
        lines.append(f"| {r['model']} | {r['plan']} | {r['measured_step_s'] * 1e3:.1f} ms | "
                     f"{_pct(r['step_error'])} | {_pct(r.get('calibrated_step_error'))} | "
                     f"{r['measured_memory_gib']:.3f} GiB | {_pct(r['memory_error'])} | "
                     f"{_pct(r['reserved_error'])} |")
    calibration = record.get("calibration")
    lines += ["", "## Calibration (`fxplan calibrate --quick`): measured beside the spec", ""]
    if _failed(calibration):
        lines.append(_cell(_failed(calibration)))
    else:
        lines += ["| quantity | spec | measured | difference | written |", "|---|---|---|---|---|"]
        for r in calibration["rows"]:
            spec = "–" if r["spec"] is None else f"{r['spec']:.4g} {r['unit']}"
            lines.append(f"| {_cell(r['quantity'])} | {spec} | {r['measured']:.4g} {r['unit']} | "
                         f"{_pct(r['difference'])} | {'yes' if r['written'] else 'no'} |")
    if record.get("multi_device"):
        lines += ["", f"## {record['devices']} devices", "",
                  "| plan | summary | max relative loss difference vs one device | worst step error |",
                  "|---|---|---|---|"]
        for r in record["multi_device"]:
            if "error" in r:
                lines.append(f"| {r['plan']} | failed: {_cell(r['error'])} | | |")
                continue
            worst = max((x["step_error"] for x in r["ranks"]), key=abs)
            lines.append(f"| {r['plan']} | {_cell(r['summary'])} | {r['max_relative_loss_difference']:.2e}"
                         f" | {_pct(worst)} |")
    return "\n".join(lines) + "\n"


def _step(record: dict[str, Any], key: str, run: Any) -> Any:
    """Run one step of the check; a crash is recorded under ``key`` and the check goes on."""
    try:
        record[key] = run()
    except Exception as err:            # noqa: BLE001 — every finding is kept, none ends the check
        record[key] = {"error": str(err).strip().splitlines()[-1][:400] if str(err).strip()
                       else type(err).__name__, "error_detail": str(err)[-2500:]}
    return record[key]


def without_machine_paths(value: Any, places: dict[str, str]) -> Any:
    """``value`` (a JSON tree) with each machine path of ``places`` replaced by its name.

    The record is committed beside the project, so it names where things lay on the machine
    that ran it by role (``<checkout>``, ``<python>``, ``<work>``), never by path; the longest
    path is replaced first, so that one inside another keeps its own name.
    """
    if isinstance(value, dict):
        return {k: without_machine_paths(v, places) for k, v in value.items()}
    if isinstance(value, list):
        return [without_machine_paths(v, places) for v in value]
    if isinstance(value, str):
        for path in sorted(places, key=len, reverse=True):
            value = value.replace(path, places[path])
    return value


def _save(record: dict[str, Any], stem: Path, started: float, work: Path | None = None) -> None:
    """Write what is known so far (after every step, so that a check cut short keeps it)."""
    record["wall_time_s"] = round(time.perf_counter() - started, 1)
    places = {str(ROOT): "<checkout>", sys.prefix: "<python>", sys.base_prefix: "<python>"}
    if work is not None:
        places[str(work)] = "<work>"
    public = without_machine_paths(record, places)
    stem.with_suffix(".json").write_text(json.dumps(public, indent=1) + "\n")
    stem.with_suffix(".md").write_text(markdown(public))


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--handwritten":
        handwritten(*sys.argv[2:4], int(sys.argv[4]), sys.argv[5])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "data" / "gpu"))
    parser.add_argument("--steps", type=int, default=None, help="steps per launch "
                        "(default 8 on GPUs, 3 on CPU)")
    parser.add_argument("--budget-s", type=float, default=300.0, help="no new one-device plan "
                        "is started after this many seconds, so that calibration still runs "
                        "(default 300)")
    parser.add_argument("--cpu", action="store_true", help="the CPU form even where a GPU is")
    args = parser.parse_args()
    import torch

    gpu = torch.cuda.is_available() and not args.cpu
    if not gpu:
        print("gpu-check: no CUDA GPU on this machine — running the shortened CPU form "
              "(CPU ranks on gloo, gpt-tiny)", flush=True)
    steps = args.steps or (8 if gpu else 3)
    started = time.perf_counter()
    devices = torch.cuda.device_count() if gpu else 2
    record: dict[str, Any] = {"date": datetime.date.today().isoformat(), "commit": _commit(),
                              "torch": torch.__version__, "mode": "gpu" if gpu else "cpu",
                              "device": torch.cuda.get_device_name() if gpu else "cpu",
                              "devices": devices}
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{record['date']}-{_device_name(gpu)}"
    models, plans = (GPU_MODELS, GPU_PLANS) if gpu else (CPU_MODELS, CPU_PLANS)
    model, batch, seq = next(iter(models.values()))
    with tempfile.TemporaryDirectory(prefix="fxplan-gpu-check-") as tmp:
        work = Path(tmp)
        record["doctor"] = fxplan_json("doctor", ok=(0, 1))
        base = next(c["data"].get("spec") for c in record["doctor"]["checks"]
                    if c["name"] == "cluster spec")
        if not gpu:
            base = "local-cpu:devices=1"
        record["base_spec"] = base
        _save(record, stem, started, work)
        multi = f"{base.split(':')[0]}:devices={devices}" if not gpu else base
        multi_plans = GPU_MULTI if gpu else CPU_MULTI
        requests = [plan_args(model, base, batch, seq, NUMERICS_CONSTRAIN, numerics_file(work))]
        requests += [plan_args(spec, base, b, s, constrain, row_file(work, i)) for i, (
            _, _, constrain, spec, b, s) in enumerate(single_rows(models, plans, gpu), start=1)]
        if devices >= 2:
            requests += [plan_args(model, multi, batch, seq, constrain.format(n=devices),
                                   multi_file(work, name))
                         for name, constrain in multi_plans.items()]
        print(f"gpu-check: making the {len(requests)} plans, side by side …", flush=True)
        planned = plan_all(requests, workers=os.cpu_count() or 1)
        print("gpu-check: numerics against a hand-written loop …", flush=True)
        _step(record, "numerics", lambda: numerics(base, model, batch, seq, steps, work, gpu,
                                                   planned))
        _save(record, stem, started, work)
        print("gpu-check: one device, each plan validated …", flush=True)
        rows = _step(record, "single_device", lambda: single_device(
            base, models, plans, steps, work, gpu, started + args.budget_s, planned))
        _save(record, stem, started, work)
        print(f"gpu-check: calibrating from {base} …", flush=True)
        calibrated = work / "calibrated.yaml"
        _step(record, "calibration", lambda: fxplan_json("calibrate", "--cluster", base,
                                                         "--quick", "-o", str(calibrated)))
        if calibrated.exists():
            record["calibrated_spec"] = calibrated.read_text()
            if isinstance(rows, list):
                reprice(rows, calibrated, work, gpu)
        _save(record, stem, started, work)
        numerics_ok = not _failed(record["numerics"])
        if devices >= 2 and numerics_ok:
            print(f"gpu-check: {devices} devices …", flush=True)
            _step(record, "multi_device", lambda: multi_device(
                multi, devices, model, batch, seq, steps, work, multi_plans,
                record["numerics"]["launch_losses"], planned))
        _save(record, stem, started, work)
    print(markdown(record))
    print(f"gpu-check: wrote {stem}.json and {stem}.md in {record['wall_time_s']:.0f} s")
    return 0


if __name__ == "__main__":
    from fxplan.core.quick_exit import exit_now

    exit_now(main())   # as SystemExit, without the second of teardown torch's import costs
