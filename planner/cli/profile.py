"""``fxplan profile``: measure the op database of the local device (see ``cost_model.compute.profiler``)."""

from __future__ import annotations

import argparse
import sys

from fxplan.core.units import seconds
from fxplan.cli.arguments import count, number, output_path
from fxplan.core.errors import UserError


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "profile",
        help="time the ops the cost model prices on this machine and write an op database",
        description="Times linear, bmm, softmax, layer_norm, gelu, add, mul, dropout, embedding, "
        "conv2d and sdpa over a grid of shapes (single-threaded on CPU, CUDA events on GPU; "
        "median of repeats) and writes a JSON op database that the cost model uses for this "
        "device model instead of the roofline.",
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("-o", "--output", metavar="FILE", type=output_path(".json"),
                        help="where to write the database (default: the user cache, "
                        "~/.cache/fxplan/ops/<device model>.json, which the cost model searches)")
    parser.add_argument("--quick", action="store_true",
                        help="every other grid scale and shorter timing runs (a few seconds on CPU)")
    parser.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "fp16"))
    parser.add_argument("--ops", metavar="OP[,OP...]", help="only these ops (default: all)")
    parser.add_argument("--device-model", metavar="NAME",
                        help="the device model to key the database by (default: 'cpu', or the "
                        "CUDA device name); must match the cluster spec's device model")
    parser.add_argument("--min-run-time", type=number(0, 3600), metavar="S",
                        help="seconds of timing per shape (default 0.1, quick 0.05)")
    parser.add_argument("--rounds", type=count(1, 1000), default=1, metavar="N",
                        help="measure the grid N times and keep each shape's median (noisy machines)")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only the summary")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from fxplan.cost_model.compute.op_database import OPS, default_database_path
    from fxplan.cost_model.compute.profiler import profile

    ops = [op.strip() for op in args.ops.split(",") if op.strip()] if args.ops is not None else None
    if ops == []:
        raise UserError(f"--ops {args.ops!r}: expected one or more op names separated by commas "
                        f"({', '.join(OPS)})")
    if args.device_model is not None and not args.device_model.strip():
        raise UserError("--device-model '': expected a device model name (the cluster spec's "
                        "device model, e.g. A100-SXM4-80GB)")
    unknown = sorted(set(ops or ()) - set(OPS))
    if unknown:
        raise UserError(f"unknown op(s) {', '.join(unknown)} in --ops; known ops: {', '.join(OPS)}")

    def progress(record) -> None:  # type: ignore[no-untyped-def]
        if not args.quiet:
            shapes = " ".join("x".join(map(str, s)) for s in record.shapes)
            print(f"  {record.op:<10} {record.family:<9} {shapes:<34} {record.time_s * 1e6:12.1f} µs",
                  flush=True)

    try:
        db = profile(args.device, quick=args.quick, dtype=args.dtype, ops=ops,
                     min_run_time=args.min_run_time, rounds=args.rounds,
                     device_model=args.device_model,
                     progress=progress)
    except (RuntimeError, ValueError) as err:
        raise UserError(str(err)) from err
    path = db.save(args.output or default_database_path(db.device_model))
    print(f"{len(db.records)} measurements of {len(db.ops())} ops on {db.device_model!r} "
          f"({db.metadata['processor'] if args.device == 'cpu' else db.metadata['cuda_device']}) "
          f"in {seconds(db.metadata['wall_time_s'])} → {path}", file=sys.stdout)
    return 0
