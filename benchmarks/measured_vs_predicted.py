"""Predicted against measured step time and peak memory of many ``local-cpu`` configurations.

    python benchmarks/measured_vs_predicted.py [--repeats 3] [--steps 8] [--seed 0]
                                               [--lock bench.lock]
                                               [--out benchmarks/data/measured_vs_predicted.json]
    python benchmarks/measured_vs_predicted.py --reprice benchmarks/data/measured_vs_predicted.json

**What runs.** gpt-tiny at global batch 16. Each case is a ``--constrain`` text (or none: the
planner's own choice) on ``local-cpu:devices=N``; the script plans it with
``fxplan.search("gpt-tiny", "local-cpu:devices=N", batch=16, constraints=C)`` (what
``fxplan plan --constrain C`` runs, in one process so the model is captured once) and then
runs ``fxplan launch PLAN --data synthetic --steps S`` ``--repeats`` times (real torchrun,
gloo over loopback, one thread per rank), **interleaved**: round ``r`` launches every case
once, in an order shuffled anew each round (``--seed``; ``--seed -1`` rotates the order by
round instead, :func:`rounds`), so that a stretch of heavy load or a slow drift of the
machine falls on every case a little instead of on the few cases launched during it. The ``devices=4`` cases form the grid:
every one is a configuration of the same workload on the same 4 ranks, so the planner's
choice can be compared with the best measured one.

**What is measured.** Step time: each launch's ``summary.json`` ``measured_step_time_s``, the
median over steps 2… of the slowest rank's step (``fxplan.runtime.train.trainer``); the table shows
the median over launches and their spread (min–max in the table; min, max, quartiles and
the load of every launch in the JSON). Peak memory: ``measured_peak_memory_gib``, the largest over ranks of
the process's peak resident set (``getrusage(RUSAGE_SELF).ru_maxrss``), against the largest
per-rank peak over stages the cost model predicts. RSS is the right counterpart on CPU: there
is no caching allocator whose statistics would separate tensors from the rest, and what
decides whether a rank fits in its share of the machine's memory is the whole process —
interpreter, torch, gloo buffers and tensors — which is what the model's reserve (the process
baseline) plus its tensor terms price. The median over launches is shown.

**Errors.** ``error = predicted / measured − 1``; MAE is the mean of ``|error|``; Spearman's
ρ ranks the grid's predicted and measured step times (ties get their mean rank). The
planner's plan against the grid's best measured: ``measured(plan) / min(measured)``.

**Timing discipline.** Planning runs niced; each launch takes ``--lock`` (``fcntl.flock``)
for its own duration only, so another job measuring under the same lock never overlaps. The
machine is shared: the 1-minute load average is recorded at each launch, once the lock is
held (the table shows their median). With the kernel's
``sched_autogroup_enabled``, CPU time is shared between sessions before ``nice`` applies, and
torchrun starts each rank in a session of its own; ``--autogroup-nice -19`` raises the
autogroup of every launched process so that the ranks, not other sessions' jobs, get the
cores (as ``nice`` would without autogroups).

**Rates of the moment** (``--probe``). A shared machine's cores run slower under other
tenants' load than when the ``local-cpu`` constants were measured. With ``--probe`` every
launch is preceded, in the same lock hold and at the same autogroup priority, by
``local_cpu_calibration.py --probe`` (the one-thread matmul rate, the eager op, the in-cache
vector rate, a copy); at the end each case is priced a second time on
``local-cpu:…,matmul_tflops=F,eager_op_us=e,vector_gb_per_s=V`` with the medians of its own
launches' probes (:attr:`Case.probed_rates`; the copy is recorded, not priced; series
probed before 2026-11-24 (`c352b19`) have no ``V``): the "at probed rates" columns and summary.

``--reprice FILE`` re-prices the stored plans of a results file with the current cost model
(no launch) and prints the table again, beside the prediction each plan got when it was
planned: how a model change moves the predictions against the same measurements (``--out``
writes the re-priced results, keeping the planning-time summary).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

MODEL, BATCH = "gpt-tiny", 16
#: (label, devices, --constrain text or "" for the planner's own choice)
CASES: tuple[tuple[str, int, str], ...] = (
    ("one rank", 1, ""),
    ("dp=2", 2, "dp=2,zero=0,recompute=none"),
    ("dp=2 zero=3", 2, "dp=2,zero=3,recompute=none"),
    ("tp=2 sp", 2, "tp=2,sp=on,recompute=none"),
    ("pp=2 gpipe", 2, "pp=2,schedule=gpipe,recompute=none"),
    ("pp=2 1f1b", 2, "pp=2,schedule=1f1b,recompute=none"),
    ("planner (4)", 4, ""),
    ("dp=4", 4, "dp=4,zero=0,recompute=none"),
    ("dp=4 zero=1", 4, "dp=4,zero=1,recompute=none"),
    ("dp=4 zero=2", 4, "dp=4,zero=2,recompute=none"),
    ("dp=4 zero=3", 4, "dp=4,zero=3,recompute=none"),
    ("dp=4 recompute=full", 4, "dp=4,zero=0,recompute=full"),
    ("dp=2 tp=2 sp", 4, "dp=2,tp=2,sp=on,zero=0,recompute=none"),
    ("tp=4 sp", 4, "tp=4,sp=on,recompute=none"),
    ("pp=2 dp=2 1f1b", 4, "pp=2,dp=2,schedule=1f1b,zero=0,recompute=none"),
    ("pp=2 dp=2 gpipe", 4, "pp=2,dp=2,schedule=gpipe,zero=0,recompute=none"),
    ("pp=2 tp=2", 4, "pp=2,tp=2,sp=on,recompute=none"),
)
GRID_DEVICES = 4
#: The probed rates a case is priced at (:attr:`Case.probed_rates`).
PRICED_RATES = ("matmul_tflops", "eager_op_us", "vector_gb_per_s")


@dataclass
class Case:
    """One configuration: its plan and what was measured."""

    label: str
    devices: int
    constrain: str
    plan_summary: str = ""
    plan: dict = field(default_factory=dict)       # the plan file's JSON (for --reprice)
    predicted_s: float = math.nan
    predicted_gib: float = math.nan
    measured_s: list[float] = field(default_factory=list)
    measured_gib: list[float] = field(default_factory=list)
    load: float = math.nan                            # older files: load before the case
    loads: list[float] = field(default_factory=list)  # 1-minute load average at each launch
    #: per launch, the per-core rates measured just before it (``local_cpu_calibration.py
    #: --probe``: matmul_tflops, memory_gb_per_s, vector_gb_per_s (from 2026-11-24 (`c352b19`)),
    #: eager_op_us, load)
    probes: list[dict] = field(default_factory=list)
    predicted_probed_s: float = math.nan    # priced at the median probed rates
    predicted_probed_gib: float = math.nan

    @property
    def probed_rates(self) -> dict[str, float]:
        """The median over this case's launches of each probed rate that prices ({} without
        probes): the matmul rate, the in-cache vector rate and the eager op, measured by the
        very functions whose quiet medians are the spec's constants (a series probed before
        2026-11-24 (`c352b19`) has no vector rate: the spec then scales the memory-bound classes with the
        matmul rate). The copy bandwidth is recorded, not priced: it moves with the
        neighbours' DRAM traffic, which in-cache ops do not see."""
        if not self.probes:
            return {}
        return {k: statistics.median(p[k] for p in self.probes) for k in PRICED_RATES
                if all(k in p for p in self.probes)}

    @property
    def probed_error(self) -> float:
        return self.predicted_probed_s / self.median_s - 1

    @property
    def load_median(self) -> float:
        return statistics.median(self.loads) if self.loads else self.load

    @property
    def spread_s(self) -> tuple[float, float]:
        """(min, max) of the launches' step times (NaN without measurements)."""
        return (min(self.measured_s), max(self.measured_s)) if self.measured_s else (math.nan,) * 2

    @property
    def iqr_s(self) -> tuple[float, float]:
        """First and third quartile of the launches' step times (``statistics.quantiles``,
        inclusive method; the single value twice for one launch)."""
        if len(self.measured_s) < 2:
            return self.spread_s
        q = statistics.quantiles(self.measured_s, n=4, method="inclusive")
        return q[0], q[2]

    @property
    def median_s(self) -> float:
        return statistics.median(self.measured_s) if self.measured_s else math.nan

    @property
    def median_gib(self) -> float:
        return statistics.median(self.measured_gib) if self.measured_gib else math.nan

    @property
    def time_error(self) -> float:
        return self.predicted_s / self.median_s - 1

    @property
    def memory_error(self) -> float:
        return self.predicted_gib / self.median_gib - 1


def _fxplan(*args: str, nice: bool = False) -> str:
    """Run ``fxplan ARGS`` with this interpreter (niced for planning); stdout, raise on error."""
    command = [sys.executable, "-m", "fxplan.cli.main", *args]
    if nice:
        command = ["nice", "-n", "19", *command]
    done = subprocess.run(command, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode:
        raise RuntimeError(f"fxplan {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


@contextmanager
def _locked(path: str | None) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (nothing when ``None``)."""
    if path is None:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def _niced() -> Iterator[None]:
    """Run the block at nice 19 (this process's nice value, restored after)."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    os.setpriority(os.PRIO_PROCESS, 0, 19)
    try:
        yield
    finally:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, before)
        except PermissionError:  # lowering the nice value again needs privileges
            pass


def plan_case(case: Case) -> None:
    """Plan one case in this process (``fxplan.search`` with the ``--constrain`` text read by
    the CLI's own parser; run this phase niced); fills the plan and its predictions."""
    import fxplan
    from fxplan.cli.constraint_text import parse_constraints

    plan = fxplan.search(MODEL, f"local-cpu:devices={case.devices}", batch=BATCH,
                         constraints=parse_constraints(case.constrain) or None, progress=False)
    case.plan = plan.to_dict()
    _predictions(case)


def _predictions(case: Case) -> None:
    estimate = case.plan["estimate"]
    case.plan_summary = case.plan.get("summary", "")
    case.predicted_s = float(estimate["step_time_s"])
    case.predicted_gib = float(max(estimate["peak_memory_gib"]))


def _descendants(root: int) -> list[int]:
    """Process ids below ``root`` (from ``/proc/*/stat``)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    out, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        children = [c for c, p in parents.items() if p == pid]
        out += children
        frontier += children
    return out


def _run_boosted(command: list[str], autogroup_nice: int | None) -> subprocess.CompletedProcess:
    """Run ``command``; with ``autogroup_nice``, set the scheduler autogroup nice of every
    process it starts (``/proc/PID/autogroup``; torchrun starts its ranks in new sessions,
    hence new autogroups, where a process's own nice value does not reach: with
    ``sched_autogroup_enabled`` the CPU is shared between autogroups first)."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    if autogroup_nice is not None:
        import threading

        def boost() -> None:
            done: set[int] = set()
            while proc.poll() is None:
                for pid in [proc.pid, *_descendants(proc.pid)]:
                    if pid not in done:
                        try:
                            Path(f"/proc/{pid}/autogroup").write_text(str(autogroup_nice))
                            done.add(pid)
                        except OSError:
                            pass
                time.sleep(0.2)

        threading.Thread(target=boost, daemon=True).start()
    out, err = proc.communicate()
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def _probe(autogroup_nice: int | None) -> dict:
    """The per-core rates of this moment: ``local_cpu_calibration.py --probe`` (one thread,
    at the launches' priority), its JSON line."""
    script = Path(__file__).with_name("local_cpu_calibration.py")
    done = _run_boosted([sys.executable, str(script), "--probe"], autogroup_nice)
    if done.returncode:
        raise RuntimeError(f"rate probe failed:\n{done.stdout}\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def launch_case(case: Case, plan: Path, steps: int, lock: str | None, tmp: Path,
                autogroup_nice: int | None = None, probe: bool = False) -> None:
    """One ``fxplan launch`` under the lock (the rate probe first, ``probe``, in the same
    hold); appends the measured step time and peak."""
    run_dir = tmp / f"run-{abs(hash(case.label))}-{len(case.measured_s)}"
    command = [sys.executable, "-m", "fxplan.cli.main", "launch", str(plan), "--data",
               "synthetic", "--steps", str(steps), "--run-dir", str(run_dir)]
    with _locked(lock):
        case.loads.append(os.getloadavg()[0])
        if probe:
            case.probes.append(_probe(autogroup_nice))
        done = _run_boosted(command, autogroup_nice)
    if done.returncode:
        raise RuntimeError(f"fxplan launch failed:\n{done.stdout}\n{done.stderr}")
    summary = json.loads((run_dir / "summary.json").read_text())
    case.measured_s.append(float(summary["measured_step_time_s"]))
    case.measured_gib.append(float(summary["measured_peak_memory_gib"]))


def rounds(n: int, repeats: int, seed: int | None = 0) -> list[list[int]]:
    """The launch order: ``repeats`` rounds, each running every one of the ``n`` cases once.

    Round ``r`` is the cases rotated by ``r·⌈n / repeats⌉`` (every case moves through the
    series, so no case always runs first, after the same neighbour, or in the same stretch of
    the machine's load); with ``seed`` not ``None`` each round is instead a fresh shuffle
    (``random.Random(seed + r)``). A slow drift of the machine's speed then spreads over
    every case instead of landing on the cases launched in its stretch."""
    import random

    out = []
    step = max(1, -(-n // max(1, repeats)))
    for r in range(repeats):
        order = list(range(n))
        if seed is None:
            shift = (r * step) % n if n else 0
            order = order[shift:] + order[:shift]
        else:
            random.Random(seed + r).shuffle(order)
        out.append(order)
    return out


def reprice(cases: list[Case]) -> None:
    """Re-price every stored plan with the current cost model (no launch)."""
    from fxplan.api import capture_for_search
    from fxplan.cluster_specs import Cluster, training_dtype
    from fxplan.core.plan import Plan
    from fxplan.plan_context import simulate_plan

    for case in cases:
        plan = Plan.from_dict(case.plan)
        cluster = Cluster.load(plan.cluster)
        graph = capture_for_search(plan.model, seq=plan.seq, dtype=training_dtype(cluster))
        result = simulate_plan(plan, graph, cluster)
        case.predicted_s = result.step_time_s
        case.predicted_gib = max(result.peak_memory_gib)
        if case.probes:
            rates = ",".join(f"{k}={v:.6g}" for k, v in case.probed_rates.items())
            probed = simulate_plan(plan, graph, Cluster.load(f"{plan.cluster},{rates}"))
            case.predicted_probed_s = probed.step_time_s
            case.predicted_probed_gib = max(probed.peak_memory_gib)


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's ρ: Pearson's correlation of the ranks (ties: mean rank)."""
    def ranks(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=values.__getitem__)
        out = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2 + 1
            i = j + 1
        return out

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    den = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return num / den if den else math.nan


#: The fields of a plan file that say what runs (not how it was labelled or priced): two cases
#: whose plans agree on all of them launch the same program.
CONFIGURATION_FIELDS = ("model", "cluster", "batch", "seq", "config", "degrees", "offload",
                        "block_recompute", "mesh_shape", "mesh_axes", "stages", "placements")


def configuration_key(case: Case) -> str:
    """What ``case`` runs, as text: its plan's :data:`CONFIGURATION_FIELDS` (the label, the
    summary line and the estimate left out). The planner's own case usually plans one of the
    constrained configurations beside it; equal keys mean the two cases are one configuration
    launched twice per round."""
    return json.dumps({k: case.plan.get(k) for k in CONFIGURATION_FIELDS}, sort_keys=True)


def configurations(grid: list[Case]) -> list[tuple[list[Case], float]]:
    """The grid's distinct configurations: the cases that run each (in the grid's order) and
    the median step over all their launches.

    A plan measured twice is one configuration with twice the launches, not two: comparing the
    median of one set of its launches with the median of the other (the planner's case against
    the constrained case of the same plan) would compare a configuration with itself and
    report launch-to-launch spread as a gap between plans."""
    groups: dict[str, list[Case]] = {}
    for case in grid:
        groups.setdefault(configuration_key(case), []).append(case)
    return [(cases, statistics.median([t for c in cases for t in c.measured_s]))
            for cases in groups.values()]


def summary(cases: list[Case]) -> dict[str, float | str]:
    """MAE of step time and memory, worst case, and the grid's plan-vs-best and ρ; with
    probes, the same step-time figures for the predictions at the probed rates.

    The planner's plan against the best measured, ``planner_over_best``, compares
    configurations (:func:`configurations`: cases that run the same plan pooled); the ratio of
    the planner's own case to the best case, ``planner_case_over_best_case``, is kept beside
    it."""
    done = [c for c in cases if c.measured_s]
    grid = [c for c in done if c.devices == GRID_DEVICES]
    if not done:
        return {}
    out: dict[str, float | str] = {
        "mae_step_time": statistics.fmean(abs(c.time_error) for c in done),
        "worst_step_time": max(abs(c.time_error) for c in done),
        "mae_peak_memory": statistics.fmean(abs(c.memory_error) for c in done),
        "worst_peak_memory": max(abs(c.memory_error) for c in done),
    }
    if grid:
        best_case = min(grid, key=lambda c: c.median_s)
        pooled = configurations(grid)
        best_cases, best_s = min(pooled, key=lambda group: group[1])
        out["grid_best"] = " = ".join(c.label for c in best_cases)
        out["grid_best_ms"] = best_s * 1e3
        chosen = next((c for c in grid if not c.constrain), None)
        if chosen is not None:
            mine_cases, mine_s = next(g for g in pooled if chosen in g[0])
            out["planner_plan"] = chosen.plan_summary
            out["planner_configuration"] = " = ".join(c.label for c in mine_cases)
            out["planner_over_best"] = mine_s / best_s
            out["planner_case_over_best_case"] = chosen.median_s / best_case.median_s
        out["spearman_grid"] = spearman([c.predicted_s for c in grid], [c.median_s for c in grid])
    probed = [c for c in done if not math.isnan(c.predicted_probed_s)]
    if probed and len(probed) == len(done):
        out["mae_step_time_probed"] = statistics.fmean(abs(c.probed_error) for c in probed)
        out["worst_step_time_probed"] = max(abs(c.probed_error) for c in probed)
        if grid:
            out["spearman_grid_probed"] = spearman([c.predicted_probed_s for c in grid],
                                                   [c.median_s for c in grid])
    return out


def table(cases: list[Case], before: bool = False) -> str:
    """The cases as a Markdown table; ``before``: also the prediction stored in each plan
    (the model that planned it) and its error."""
    extra = " at planning (ms) | error |" if before else ""
    probed = any(c.probes for c in cases)
    extra += " at probed rates (ms) | error |" if probed else ""
    lines = ["| case | ranks | plan | predicted step (ms) | measured step (ms) | min–max (ms) | "
             "error |" + extra + " predicted peak (GiB) | measured peak (GiB) | error | load |",
             "|---|---|---|---|---|---|---|" + ("---|---|" if before else "")
             + ("---|---|" if probed else "") + "---|---|---|---|"]
    for c in cases:
        old = ""
        lo, hi = c.spread_s
        if before:
            planned = float(c.plan["estimate"]["step_time_s"])
            old = f" {planned * 1e3:.1f} | {planned / c.median_s - 1:+.0%} |"
        if probed:
            old += f" {c.predicted_probed_s * 1e3:.1f} | {c.probed_error:+.0%} |"
        lines.append(
            f"| {c.label} | {c.devices} | `{c.plan_summary.replace('|', '¦')}` | "
            f"{c.predicted_s * 1e3:.1f} | {c.median_s * 1e3:.1f} | {lo * 1e3:.1f}–{hi * 1e3:.1f} | "
            f"{c.time_error:+.0%} |{old} {c.predicted_gib:.3f} | {c.median_gib:.3f} | "
            f"{c.memory_error:+.0%} | {c.load_median:.1f} |")
    return "\n".join(lines)


def format_summary(s: dict[str, float | str]) -> str:
    lines = [f"step time: MAE {s['mae_step_time']:.1%}, worst {s['worst_step_time']:.1%}; "
             f"peak memory: MAE {s['mae_peak_memory']:.1%}, worst {s['worst_peak_memory']:.1%}"]
    if "mae_step_time_probed" in s:
        lines.append(f"step time at the probed rates: MAE {s['mae_step_time_probed']:.1%}, "
                     f"worst {s['worst_step_time_probed']:.1%}, Spearman ρ of the grid "
                     f"{s.get('spearman_grid_probed', math.nan):.2f}")
    if "spearman_grid" in s:
        mine = s.get("planner_configuration", "?")
        lines.append(f"grid ({GRID_DEVICES} ranks): best measured {s['grid_best']} "
                     f"({s['grid_best_ms']:.1f} ms, launches of one plan pooled); planner's plan "
                     f"`{s.get('planner_plan', '?')}` ({mine}) "
                     f"= {s.get('planner_over_best', math.nan):.2f}× the best (its own case "
                     f"{s.get('planner_case_over_best_case', math.nan):.2f}× the best case); "
                     f"Spearman ρ "
                     f"(predicted vs measured) = {s['spearman_grid']:.2f}")
    return "\n".join(lines)


def load(path: Path) -> list[Case]:
    data = json.loads(path.read_text())
    return [Case(**{k: v for k, v in row.items() if k in Case.__dataclass_fields__})
            for row in data["cases"]]


def save(cases: list[Case], path: Path, meta: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**meta, "summary": summary(cases),
                                "cases": [_row(c) for c in cases]}, indent=1))


def _row(case: Case) -> dict:
    """A case as stored: its fields plus the per-case statistics (median, min, max, quartiles
    of the launches' step times; median load) — ``load`` ignores the extra keys."""
    lo, hi = case.spread_s
    q1, q3 = case.iqr_s
    return {**asdict(case), "median_s": case.median_s, "min_s": lo, "max_s": hi,
            "q1_s": q1, "q3_s": q3, "load_median": case.load_median}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="launches per case (default 3)")
    parser.add_argument("--steps", type=int, default=8, help="steps per launch (default 8)")
    parser.add_argument("--seed", type=int, default=0,
                        help="shuffle each round's order with this seed (default 0); "
                        "-1: rotate the order by round instead")
    parser.add_argument("--lock", default=None, help="flock this file around each launch")
    parser.add_argument("--probe", action="store_true",
                        help="measure the per-core rates before every launch (under its lock) "
                        "and price each case also at its launches' median rates")
    parser.add_argument("--autogroup-nice", type=int, default=None,
                        help="set the scheduler autogroup nice of the launched processes (root; "
                        "-19 gives the measured ranks the CPU over other sessions' jobs)")
    parser.add_argument("--only", default=None, help="comma-separated case labels to run")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    parser.add_argument("--phase", choices=("plan", "launch", "both"), default="both",
                        help="plan only (run it niced), launch the plans of --out, or both")
    parser.add_argument("--reprice", type=Path, default=None,
                        help="re-price a results file's plans with the current model")
    args = parser.parse_args()
    if args.reprice:
        cases = load(args.reprice)
        reprice(cases)
        print(table(cases, before=True))
        print(format_summary(summary(cases)))
        if args.out:
            data = json.loads(args.reprice.read_text())
            data["planning_time_summary"] = data.get("planning_time_summary", data["summary"])
            data.update(summary=summary(cases), cases=[_row(c) for c in cases],
                        repriced_with="this tree's cost model (--reprice)")
            args.out.write_text(json.dumps(data, indent=1))
        return
    wanted = set(args.only.split(",")) if args.only else None
    cases = [Case(label, n, text) for label, n, text in CASES if wanted is None or label in wanted]
    import torch

    from fxplan.core.training import AFFINITY_ENV

    meta = {"model": MODEL, "batch": BATCH, "steps": args.steps, "repeats": args.repeats,
            "torch": torch.__version__, "cpus": os.cpu_count(),
            "step_time_measured_as": "median over launches of each launch's median step "
            "(steps 2…, slowest rank); launches interleaved: each round runs every case once, "
            "in a shuffled (seed) or rotated order",
            "seed": args.seed, "probe": args.probe,
            "memory_measured_as": "median over launches of the largest ru_maxrss over ranks",
            # how fxplan launch placed the ranks (fxplan.runtime.launch.affinity; 2026-11-25 (`e1334ce`) on)
            "cpu_affinity": os.environ.get(AFFINITY_ENV, "auto")}
    if args.phase == "launch":
        cases = [c for c in load(args.out) if wanted is None or c.label in wanted]
    args.seed = None if args.seed < 0 else args.seed
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if args.phase != "launch":
            for case in cases:
                plan_case(case)
                print(f"{case.label}: {case.plan_summary}, predicted "
                      f"{case.predicted_s * 1e3:.1f} ms", flush=True)
                if args.out:
                    save(cases, args.out, meta)
        if args.phase != "plan":
            plans = [tmp / f"plan-{i}.json" for i in range(len(cases))]
            for case, plan in zip(cases, plans):   # written once, launched every round
                case.measured_s, case.measured_gib, case.loads, case.probes = [], [], [], []
                plan.write_text(json.dumps(case.plan))
            for r, order in enumerate(rounds(len(cases), args.repeats, args.seed)):
                for i in order:
                    case, plan = cases[i], plans[i]
                    launch_case(case, plan, args.steps, args.lock, tmp, args.autogroup_nice,
                                probe=args.probe)
                    rates = (" matmul {matmul_tflops:.4f} TF/s, copy {memory_gb_per_s:.1f} GB/s, "
                             "vector {vector_gb_per_s:.2f} GB/s, op {eager_op_us:.2f} µs"
                             .format(**case.probes[-1])
                             if args.probe else "")
                    print(f"round {r + 1}/{args.repeats} {case.label}: predicted "
                          f"{case.predicted_s * 1e3:.1f} ms, measured "
                          f"{case.measured_s[-1] * 1e3:.1f} ms (load {case.loads[-1]:.1f}"
                          f"{rates})", flush=True)
                if args.out:
                    save(cases, args.out, meta)
    if args.phase == "plan":
        return
    if args.probe:
        with _niced():
            reprice(cases)       # the same plans, at the spec's constants and the probed rates
        if args.out:
            save(cases, args.out, meta)
    print(table(cases))
    print(format_summary(summary([c for c in cases if c.measured_s])))


if __name__ == "__main__":
    main()
