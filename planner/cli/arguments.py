"""Arguments shared by the verbs that take a model, a cluster and a workload."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Callable

from fxplan.core.bounds import MAX_BATCH, MAX_SEQ, BoundsError, check_count, check_number

#: ``--dtype`` choices → torch dtype names.
DTYPES: dict[str, str] = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def add_model_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model", metavar="MODEL",
        help="model spec: a preset (gpt-1.7b), family:key=value,... (gpt:layers=4,hidden=1024), "
        "path/to/model.py:build, or a Hugging Face config: hf:llama-2-7b, "
        "hf:llama:num_hidden_layers=2, hf:path/to/config.json (no weights, no download)")


def add_capture_arguments(parser: argparse.ArgumentParser) -> None:
    """``--leaf MODULE`` (repeatable) and ``--method auto|symbolic_trace|export|export-core``."""
    parser.add_argument("--leaf", action="append", default=[], metavar="MODULE",
                        help="keep this module (class name, path or pattern such as 'h.*.attn') "
                        "opaque; repeatable; implies --method symbolic_trace")
    parser.add_argument("--method", choices=("auto", "symbolic_trace", "export", "export-core"),
                        default="auto",
                        help="how to capture the graph: auto (symbolic_trace, falling back to "
                        "torch.export when tracing fails; export for hf: models), or one of them; "
                        "export-core: torch.export lowered to the core ATen op set "
                        "(run_decompositions)")


def add_cluster_argument(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    parser.add_argument("--cluster", required=required, metavar="SPEC",
                        help="cluster spec: a built-in name, a YAML path, or name:key=value,... "
                        "(e.g. dgx-a100-80g:nodes=4)")


def add_workload_arguments(parser: argparse.ArgumentParser, *, batch_default: int | None = None,
                           batch_tokens: bool = False) -> None:
    """``--batch`` (required unless a default is given, or ``batch_tokens`` offers
    ``--batch-tokens`` instead: :func:`resolve_batch`) and ``--seq``."""
    if batch_tokens:
        parser.add_argument("--batch", type=count(1, MAX_BATCH), default=None,
                            help=f"global batch (samples per step, 1 … {MAX_BATCH:,}); or "
                            "--batch-tokens")
        parser.add_argument("--batch-tokens", metavar="T", default=None,
                            help="global batch in tokens per step, as people state it: 4M = "
                            "4·2^20 tokens = 1024 sequences of 4096 (the nearest whole number "
                            "of sequences)")
    elif batch_default is None:
        parser.add_argument("--batch", type=count(1, MAX_BATCH), required=True,
                            help=f"global batch (samples per step, 1 … {MAX_BATCH:,})")
    else:
        parser.add_argument("--batch", type=count(1, MAX_BATCH), default=batch_default,
                            help=f"samples per step (default {batch_default})")
    parser.add_argument("--seq", type=count(1, MAX_SEQ), default=None,
                        help="sequence length (default: the model's)")


def check_batch_arguments(args: argparse.Namespace) -> str | None:
    """Exactly one of ``--batch`` and ``--batch-tokens`` (checked before any capture); the
    ``--batch-tokens`` text, or ``None`` when ``--batch`` was given."""
    from fxplan.batch_tokens import BatchTokensError

    given = getattr(args, "batch_tokens", None)
    if (args.batch is None) == (given is None):
        raise BatchTokensError("found " + ("both --batch and --batch-tokens" if given else
                                           "neither --batch nor --batch-tokens")
                               + ", expected exactly one: samples per step or tokens per step")
    return given


def resolve_batch(args: argparse.Namespace, seq: int | None) -> int:
    """The global batch in samples from ``--batch`` or ``--batch-tokens`` (exactly one;
    :mod:`fxplan.batch_tokens`), ``seq`` the sequence length trained."""
    from fxplan.batch_tokens import BatchTokensError, batch_from_tokens, parse_batch_tokens

    given = check_batch_arguments(args)
    if given is None:
        return args.batch
    batch = batch_from_tokens(parse_batch_tokens(given), seq)
    if batch > MAX_BATCH:
        raise BatchTokensError(f"--batch-tokens {given}: {batch:,} sequences of {seq}, expected "
                               f"at most {MAX_BATCH:,}")
    return batch


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


def add_headroom_argument(parser: argparse.ArgumentParser) -> None:
    """``--memory-headroom``: kept as text and parsed by the command
    (:func:`fxplan.cost_model.memory.headroom.parse_headroom`), so a bad value is a one-paragraph
    user error (exit 2)."""
    parser.add_argument("--memory-headroom", metavar="H", default=None,
                        help="memory every device must leave free beyond the estimate: a "
                        "fraction (0.1), a percentage (10%%) or GiB (4GiB); default 5%%")


def add_state_layout_argument(parser: argparse.ArgumentParser) -> None:
    """``--state-layout``: the layout of the model states the cost model prices
    (:func:`fxplan.cost_model.memory.breakdown.adam_for`; its choices are
    :data:`~fxplan.cost_model.memory.breakdown.STATE_LAYOUTS`, written out here so that the CLI
    starts without numpy or torch, and tested equal)."""
    parser.add_argument("--state-layout", choices=("runtime", "megatron"), default="runtime",
                        help="how the model states are kept: runtime (fxplan's runtime: fp32 "
                        "parameters as the masters, fp32 gradients and reductions; default) or "
                        "megatron (16-bit weights and gradients beside fp32 masters, as "
                        "Megatron-LM and DeepSpeed keep them)")


def count(low: int = 1, high: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: an integer in ``[low, high]`` (:func:`fxplan.core.bounds.check_count`);
    anything else is a usage error (exit 2) naming the flag and the range."""
    def parse(text: str) -> int:
        try:
            value = int(text.strip().replace("_", ""))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer (expected an integer "
                                             f"{'≥ ' + str(low) if high is None else f'in {low:,} … {high:,}'})"
                                             ) from None
        try:
            return check_count("value", value, low=low, high=high)
        except BoundsError as err:
            raise argparse.ArgumentTypeError(str(err).removeprefix("value = ")) from None
    parse.__name__ = "integer"
    return parse


def number(low: float = 0.0, high: float | None = None, *, low_open: bool = True
           ) -> Callable[[str], float]:
    """An argparse ``type``: a finite float in ``(low, high]`` (``[low, high]`` when not
    ``low_open``); ``nan``, ``inf`` and out-of-range values are usage errors (exit 2)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        try:
            return check_number("value", value, low=low, high=high, low_open=low_open)
        except BoundsError as err:
            raise argparse.ArgumentTypeError(str(err).removeprefix("value = ")) from None
    parse.__name__ = "number"
    return parse


def output_path(*suffixes: str, prefix: bool = False) -> Callable[[str], str]:
    """An argparse ``type`` for a file the command will write: checked when the line is parsed,
    before any work, so that a long search is not lost to a bad path. The parent directory must
    exist and be writable, the path must not be a directory, and with ``suffixes`` its suffix
    must be one of them. ``prefix``: the value is a file-name prefix (``--plot PREFIX`` writes
    ``PREFIX-timeline.png``), so only its directory is checked, and it takes no suffix."""
    def parse(text: str) -> str:
        check_output_path(text, suffixes, prefix=prefix)
        return text
    parse.__name__ = "output path"
    return parse


def check_output_path(text: str, suffixes: tuple[str, ...] = (), *, prefix: bool = False) -> None:
    """Raise ``argparse.ArgumentTypeError`` unless ``text`` can be written (:func:`output_path`)."""
    if not text or text.strip() != text or "\0" in text:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a file path")
    path = Path(text)
    if path.is_dir() or text.endswith(("/", os.sep)):
        raise argparse.ArgumentTypeError(f"{text} is a directory: expected a file path"
                                         + (" prefix (e.g. out/tiny)" if prefix else ""))
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: directory {parent} does not exist (create it "
                                         "first)")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text}: directory {parent} is not writable")
    if path.exists() and not os.access(path, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text}: the file exists and is not writable")
    suffix = path.suffix.lower()
    if prefix and suffix in (".png", ".svg", ".pdf", ".txt", ".json", ".html"):
        raise argparse.ArgumentTypeError(
            f"{text}: expected a prefix without a suffix (it writes {path.with_suffix('')}"
            f"-timeline.png and {path.with_suffix('')}-memory.png)")
    if suffixes and suffix not in suffixes:
        raise argparse.ArgumentTypeError(f"{text}: expected a file ending in "
                                         f"{' or '.join(suffixes)}, not {suffix or 'no suffix'!r}")
