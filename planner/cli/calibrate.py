"""``fxplan calibrate``: measure this node and write a cluster spec with the measured constants.

    fxplan calibrate [--cluster SPEC] [-o my-cluster.yaml] [--quick] [--ranks N] [--json]

``SPEC`` defaults to the spec ``fxplan doctor`` matches to this machine. The derived spec (with
a comment on every measured value) goes to ``-o`` (default ``<spec>-calibrated.yaml``), the op
database beside it (``.ops.json``); a table prints each measured value beside the spec's and
their difference. See :mod:`fxplan.calibration.calibrate` for what is measured and written.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fxplan.cli.arguments import count, output_path
from fxplan.core.errors import UserError


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "calibrate", help="measure this node (ops, collectives, memory) and write a calibrated spec",
        description="Measure what the cost model needs on this node — the op database (bf16 "
        "on GPUs), the compute efficiencies it implies, collectives among the node's devices "
        "under torchrun (nccl on GPUs, gloo on CPU), the memory a process holds before its "
        "first tensor and the host-to-device bandwidth — and write a cluster spec derived from "
        "--cluster with the measured constants, each with a comment saying how and when it "
        "was measured. Prints each measured value beside the spec's.")
    parser.add_argument("--cluster", metavar="SPEC",
                        help="the spec to start from (default: the one `fxplan doctor` matches)")
    parser.add_argument("-o", "--output", metavar="FILE", type=output_path(".yaml", ".yml"),
                        help="the calibrated spec (default: <spec>-calibrated.yaml here)")
    parser.add_argument("--quick", action="store_true",
                        help="a shorter grid and sweep (under 5 minutes on an 8-GPU node)")
    parser.add_argument("--ranks", type=count(1, 1024), metavar="N",
                        help="local devices for the collectives (default: all of the node's)")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")
    parser.set_defaults(func=run)
    return parser


def default_spec() -> str:
    """The spec ``fxplan doctor`` matches to this machine (refused when it matches none)."""
    from fxplan.cli.doctor import Devices, _check_cluster_spec, _check_cuda

    devices = [Devices()]
    _check_cuda(devices)
    spec = _check_cluster_spec(devices).data.get("spec")
    if not spec:
        raise UserError("no built-in cluster spec matches this machine's devices: give "
                        "--cluster SPEC (a built-in name or your own YAML; `fxplan clusters` "
                        "lists the built-in ones)")
    return spec


def _table(cal) -> None:  # type: ignore[no-untyped-def]
    from rich.table import Table

    from fxplan.core.units import plain, percent

    from fxplan.report.console import console

    table = Table(title=f"fxplan calibrate: {cal.base} → {cal.spec['name']}", title_justify="left")
    for column in ("quantity", "spec", "measured", "difference", "written", "how"):
        table.add_column(column, overflow="fold")

    def show(value: float | None, unit: str) -> str:
        return "–" if value is None else f"{plain(value)} {unit}".strip()

    for row in cal.rows:
        diff = row.difference
        table.add_row(row.quantity, show(row.spec, row.unit), show(row.measured, row.unit),
                      "–" if diff is None else percent(diff, sign=True),
                      "yes" if row.written else "no", row.how)
    out = console()
    out.print(table)
    for note in cal.notes:
        out.print(f"note: {note}", markup=False)


def run(args: argparse.Namespace) -> int:
    from fxplan.calibration.calibrate import calibrate, derived_name

    base = args.cluster or default_spec()
    output = Path(args.output or f"{derived_name(base)}.yaml")
    progress = None if args.json else (lambda line: print(line, flush=True))
    cal = calibrate(base, output, quick=args.quick, ranks=args.ranks, progress=progress)
    output.write_text(cal.yaml())
    if args.json:
        print(json.dumps({**cal.to_dict(), "spec_file": str(output)}, indent=2))
        return 0
    _table(cal)
    print(f"wrote {output} (plan with it: fxplan plan MODEL --cluster {output}) and "
          f"{cal.op_database}")
    return 0
