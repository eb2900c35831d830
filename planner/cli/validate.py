"""``fxplan validate plan.json``: launch the plan for a few steps and check its predictions.

    fxplan validate plan.json [--steps 20] [--warmup 3] [--tolerance 10%]
                              [--memory-tolerance 5%] [--run-dir DIR] [--json]

Prints, per rank, the predicted and measured step time and peak memory (on CUDA allocated and
reserved; on CPU the process's peak resident set, said in the table) with their relative
errors, and the loss curve. Exit code 1 when an error exceeds its tolerance, 2 on bad input.
What is compared with what: :mod:`fxplan.calibration.validate`.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from fxplan.cli.arguments import count
from fxplan.core.errors import UserError


def fraction(text: str) -> float:
    """``10%`` or ``0.1`` → 0.1 (an argparse type; a tolerance is ≥ 0)."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a fraction (0.1) or a "
                                         "percentage (10%)") from None
    if not 0 <= value < 1e6:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a tolerance ≥ 0")
    return value


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "validate", help="launch a plan for a few steps; predicted vs measured time and memory",
        description="Launch PLAN.json (fxplan launch, synthetic data) for --steps steps and "
        "print per rank the predicted and measured step time and peak memory (CUDA: allocated "
        "and reserved; CPU: the process's peak resident set) with their relative errors, and "
        "the loss curve. Exit code 1 when an error exceeds its tolerance.")
    parser.add_argument("plan", metavar="PLAN.json", help="plan file written by `fxplan plan -o`")
    parser.add_argument("--steps", type=count(2, 100000), default=20,
                        help="training steps (default 20)")
    parser.add_argument("--warmup", type=count(0, 100000), default=None,
                        help="first steps not timed (default: 3, or steps − 1 when fewer)")
    parser.add_argument("--tolerance", type=fraction, default=0.10, metavar="T",
                        help="largest step-time error that passes (default 10%%)")
    parser.add_argument("--memory-tolerance", type=fraction, default=0.05, metavar="T",
                        help="largest peak-memory error that passes (default 5%%)")
    parser.add_argument("--data", default="synthetic",
                        help="what to train on, as for fxplan launch (default: synthetic)")
    parser.add_argument("--run-dir", metavar="DIR",
                        help="where the launch writes (default: a temporary directory)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(func=run)
    return parser


def _print(result) -> None:  # type: ignore[no-untyped-def]
    from rich.table import Table

    from fxplan.core.units import gib, percent, seconds

    from fxplan.report.console import console

    out = console()
    table = Table(title=f"fxplan validate: {result.plan} ({result.device}; steps "
                  f"{result.warmup + 1}…{result.steps} timed)", title_justify="left")
    columns = ["rank", "stage", "step predicted", "step measured", "error",
               "memory predicted", "memory measured", "error"]
    cuda = result.device == "cuda"
    if cuda:
        columns += ["reserved predicted", "reserved measured", "error"]
    for column in columns:
        table.add_column(column, justify="right")
    for r in result.ranks:
        row = [str(r.rank), str(r.stage), seconds(r.predicted_step_s), seconds(r.measured_step_s),
               percent(r.step_error, sign=True), gib(r.predicted_memory_gib),
               gib(r.measured_memory_gib), percent(r.memory_error, sign=True)]
        if cuda:
            reserved = r.reserved_error
            row += [gib(r.predicted_reserved_gib) if r.predicted_reserved_gib is not None else "–",
                    gib(r.measured_reserved_gib) if r.measured_reserved_gib is not None else "–",
                    percent(reserved, sign=True) if reserved is not None else "–"]
        table.add_row(*row)
    out.print(table)
    out.print(f"memory measured as: {result.memory_measured_as}", markup=False)
    out.print("loss: " + " ".join(f"{x:.4f}" for x in result.losses), markup=False)
    failures = result.failures
    if failures:
        out.print("FAILED: " + "; ".join(failures), markup=False)
    else:
        out.print(f"passed: every step time within ±{result.tolerance:.0%} and every peak memory "
                  f"within ±{result.memory_tolerance:.0%}", markup=False)


def run(args: argparse.Namespace) -> int:
    from fxplan.calibration.validate import compare, launch, read_losses
    from fxplan.core.plan import load_plan

    plan = load_plan(args.plan)
    warmup = args.warmup if args.warmup is not None else min(3, args.steps - 1)
    if warmup >= args.steps:
        raise UserError(f"--warmup {warmup} with --steps {args.steps}: no step would be timed; "
                        "expected a warm-up below the step count")
    with tempfile.TemporaryDirectory(prefix="fxplan-validate-") as tmp:
        run_dir = Path(args.run_dir) if args.run_dir else Path(tmp) / "run"
        # an existing --run-dir is the launch's to refuse: a run directory is never overwritten
        # unless the user asks (fxplan launch --overwrite)
        summary = launch(Path(args.plan), run_dir, args.steps, ["--data", args.data],
                         output_to_stderr=args.json)
        result = compare(plan, summary, read_losses(run_dir), warmup=warmup,
                         tolerance=args.tolerance, memory_tolerance=args.memory_tolerance)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        _print(result)
    return 1 if result.failures else 0
