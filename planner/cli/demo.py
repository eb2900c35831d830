"""``fxplan demo``: the main job on a built-in default model and cluster (what ``make demo`` runs)."""

from __future__ import annotations

import argparse

DEFAULT_MODEL = "gpt-1.7b"
DEFAULT_CLUSTER = "dgx-a100-80g:nodes=4"


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("demo", help="describe the default model and cluster")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--cluster", default=DEFAULT_CLUSTER)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    raise NotImplementedError("demo is assembled once clusters and graph verbs exist")
