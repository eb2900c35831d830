"""The flags of one rank of ``fxplan launch`` (``python -m fxplan.worker PLAN --flag value …``,
what ``fxplan launch`` and an emitted program pass every rank)."""

from __future__ import annotations

import argparse

from fxplan.core.training import APPLY_PATHS

__all__ = ["parse_args"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fxplan.worker",
                                     description="one rank of `fxplan launch` (run under torchrun)")
    parser.add_argument("plan")
    parser.add_argument("--data", required=True, help="token file, datasets directory, "
                        "'synthetic' or FILE.py:FUNCTION")
    parser.add_argument("--token-dtype", default="auto", choices=("auto", "uint16", "uint32"))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="plan", choices=("plan", "bf16", "fp16", "fp32"),
                        help="compute dtype (plan: the plan's; fp32: mixed precision off)")
    parser.add_argument("--path", default="auto", choices=APPLY_PATHS,
                        help="how the plan is applied (apply_plan's path)")
    parser.add_argument("--optimizer", default="adamw", choices=("adamw", "sgd"))
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--min-lr", type=float, default=None)
    parser.add_argument("--warmup-steps", type=int, default=0)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--beta1", type=float, default=0.9)
    parser.add_argument("--beta2", type=float, default=0.95)
    parser.add_argument("--grad-clip", type=float, default=1.0)
    parser.add_argument("--log-every", type=int, default=1)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--model", default=None, help="model spec (default: the plan's)")
    parser.add_argument("--resume", default=None,
                        help="checkpoint to go on from: run dir, its checkpoints/ or a step-N dir")
    parser.add_argument("--save", default=None, help="write a training checkpoint at the end")
    parser.add_argument("--checkpoint-every", type=int, default=0,
                        help="checkpoint to RUN_DIR/checkpoints/step-N every N steps and at the "
                        "end (0: none)")
    parser.add_argument("--trace", default=None, metavar="DIR",
                        help="record steps 2… (at most TRACE_STEPS) with torch.profiler and "
                        "write DIR/measured-rank<R>.json (Chrome trace format)")
    parser.add_argument("--auto-resume", action="store_true",
                        help="go on from the newest committed checkpoint of RUN_DIR when there "
                        "is one (a restarted or requeued job; before --resume)")
    return parser.parse_args(argv)
