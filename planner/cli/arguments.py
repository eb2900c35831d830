"""Arguments shared by the verbs that take a model, a cluster and a workload."""

from __future__ import annotations

import argparse

#: ``--dtype`` choices → torch dtype names.
DTYPES: dict[str, str] = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def add_model_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model", metavar="MODEL",
        help="model spec: a preset (gpt-1.7b), family:key=value,... (gpt:layers=4,hidden=1024), "
        "path/to/model.py:build, or a Hugging Face config: hf:llama-2-7b, "
        "hf:llama:num_hidden_layers=2, hf:path/to/config.json (no weights, no download)")


def add_capture_arguments(parser: argparse.ArgumentParser) -> None:
    """``--leaf MODULE`` (repeatable) and ``--method auto|symbolic_trace|export``."""
    parser.add_argument("--leaf", action="append", default=[], metavar="MODULE",
                        help="keep this module (class name, path or pattern such as 'h.*.attn') "
                        "opaque; repeatable; implies --method symbolic_trace")
    parser.add_argument("--method", choices=("auto", "symbolic_trace", "export"), default="auto",
                        help="how to capture the graph: auto (symbolic_trace, falling back to "
                        "torch.export when tracing fails; export for hf: models), or one of them")


def add_cluster_argument(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    parser.add_argument("--cluster", required=required, metavar="SPEC",
                        help="cluster spec: a built-in name, a YAML path, or name:key=value,... "
                        "(e.g. dgx-a100-80g:nodes=4)")


def add_workload_arguments(parser: argparse.ArgumentParser, *, batch_default: int | None = None) -> None:
    """``--batch`` (required unless a default is given) and ``--seq``."""
    if batch_default is None:
        parser.add_argument("--batch", type=int, required=True, help="global batch (samples per step)")
    else:
        parser.add_argument("--batch", type=int, default=batch_default,
                            help=f"samples per step (default {batch_default})")
    parser.add_argument("--seq", type=int, default=None, help="sequence length (default: the model's)")


def add_dtype_argument(parser: argparse.ArgumentParser, *, what: str,
                       follow_cluster: bool = False) -> None:
    """``--dtype fp32|bf16|fp16``: default bf16, or with ``follow_cluster`` ``None`` (the verb
    takes the cluster's training precision, :func:`fxplan.cluster_specs.training_precision`:
    bf16 where the devices have a bf16 peak, else fp16 where they have fp16, else fp32)."""
    if follow_cluster:
        parser.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                            help=f"{what} (default: the cluster's: bf16 where its devices have "
                            "a bf16 peak, else fp16 where they have fp16 (V100), else fp32)")
    else:
        parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16",
                            help=f"{what} (default bf16)")
