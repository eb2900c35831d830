"""Predicted against measured step time of planner-made ``local-cpu`` plans, printed as a table.

    python benchmarks/local_cpu_launch.py [--repeats 3] [--steps 10] [--markdown]

For each case (gpt-tiny on ``local-cpu:devices=N`` at batch ``B``) the script runs
``fxplan plan MODEL --cluster local-cpu:devices=N --batch B -o PLAN`` and then
``fxplan launch PLAN --steps S`` ``--repeats`` times. Each launch reports the median step time
over its steps after the first; the table shows the median over launches (and their range)
against the plan's predicted step time:

    error = predicted / measured − 1

Wall-clock, on a machine possibly shared with other jobs: the 1-minute load average before
each case is printed with it. The prediction assumes the machine's cores are the plan's alone;
other runnable processes take a share of them, so rows with a load average above about 1
measure the sharing, not the plan. ``--markdown`` prints the table only (for ``docs/benchmarks.md``).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

CASES: tuple[tuple[str, int, int], ...] = (
    ("gpt-tiny", 2, 16), ("gpt-tiny", 2, 32), ("gpt-tiny", 4, 16), ("gpt-tiny", 4, 32),
)
_RESULT = re.compile(r"step time\s+predicted ([\d.]+) ms\s+measured ([\d.]+) ms")
_PLAN = re.compile(r"\| (pp=.*?) \| \d+ ranks")


@dataclass(frozen=True)
class Row:
    """One case: the plan, its predicted step and the launches' median step times (s)."""

    model: str
    devices: int
    batch: int
    plan: str
    predicted_s: float
    measured_s: tuple[float, ...]
    load: float

    @property
    def median_s(self) -> float:
        return statistics.median(self.measured_s)

    @property
    def error(self) -> float:
        return self.predicted_s / self.median_s - 1


def _fxplan(*args: str) -> str:
    """Run ``fxplan ARGS`` with this interpreter; return stdout (raise on failure)."""
    done = subprocess.run([sys.executable, "-m", "fxplan.cli.main", *args], capture_output=True,
                          text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode:
        raise RuntimeError(f"fxplan {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def measure(model: str, devices: int, batch: int, repeats: int, steps: int, tmp: Path) -> Row:
    """Plan one case, launch it ``repeats`` times, return its row."""
    plan_file = tmp / f"{model}-{devices}-{batch}.json"
    _fxplan("plan", model, "--cluster", f"local-cpu:devices={devices}", "--batch", str(batch),
            "-o", str(plan_file), "--json")
    predicted, measured, summary = 0.0, [], ""
    load = os.getloadavg()[0]
    for _ in range(repeats):
        out = _fxplan("launch", str(plan_file), "--steps", str(steps))
        found = _RESULT.search(out)
        if found is None:
            raise RuntimeError(f"no predicted/measured line in:\n{out}")
        predicted = float(found.group(1)) / 1e3
        measured.append(float(found.group(2)) / 1e3)
        summary = (_PLAN.search(out) or _RESULT).group(1)
    return Row(model, devices, batch, summary, predicted, tuple(measured), load)


def table(rows: list[Row]) -> str:
    """The rows as a Markdown table."""
    lines = ["| model | devices | batch | plan | predicted (ms) | measured median (ms) | "
             "launches (ms) | error | load before |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        runs = ", ".join(f"{t * 1e3:.1f}" for t in r.measured_s)
        lines.append(f"| {r.model} | {r.devices} | {r.batch} | `{r.plan.replace('|', '¦')}` | "
                     f"{r.predicted_s * 1e3:.1f} | {r.median_s * 1e3:.1f} | {runs} | "
                     f"{r.error:+.0%} | {r.load:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="launches per case (default 3)")
    parser.add_argument("--steps", type=int, default=10, help="steps per launch (default 10)")
    parser.add_argument("--markdown", action="store_true", help="print the table only")
    args = parser.parse_args()
    before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(m, d, b, args.repeats, args.steps, Path(tmp)) for m, d, b in CASES]
    print(table(rows))
    if not args.markdown:
        print(f"\nload average {before:.2f} before, {os.getloadavg()[0]:.2f} after; "
              f"{os.cpu_count()} CPUs; worst error {max(abs(r.error) for r in rows):.0%}")


if __name__ == "__main__":
    main()
