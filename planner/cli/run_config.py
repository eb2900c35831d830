"""Training settings of ``fxplan launch``: defaults, a TOML run config, flags on top.

A run config (``--config run.toml``, sections as in torchtitan's job files) holds what a run
needs besides the plan; every key is optional and a flag given on the command line wins::

    [data]
    path = "tokens.bin"        # a token file, "synthetic", or "data.py:build"
    token_dtype = "auto"       # uint16 | uint32 | auto (uint16 when the vocabulary fits)

    [training]
    steps = 1000
    seed = 0
    grad_clip = 1.0            # max global gradient norm; 0 turns clipping off
    dtype = "plan"             # compute dtype: plan (the plan's, e.g. bf16) | bf16 | fp16 | fp32

    [optimizer]
    name = "adamw"             # adamw | sgd
    lr = 3e-4
    min_lr = 3e-5              # the cosine decays to this (default lr / 10)
    weight_decay = 0.1
    beta1 = 0.9
    beta2 = 0.95

    [lr_scheduler]
    warmup_steps = 100         # linear from lr/warmup to lr, then cosine to min_lr

    [logging]
    log_every = 10
    run_dir = "runs/gpt"       # metrics.jsonl, summary.json, run_config.json

    [checkpoint]
    every = 500                # RUN_DIR/checkpoints/step-N every N steps and at the end (0: none)

Every value is checked here, before any process starts: a wrong type, a negative count, a
non-finite or non-positive learning rate, an unknown section or key are :class:`LaunchError`
(a :class:`~fxplan.core.errors.UserError`: one paragraph, exit 2) saying what was expected.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from fxplan.core.errors import UserError
from fxplan.core.files import file_problem
from fxplan.core.training import APPLY_PATHS, TrainConfig

__all__ = ["LaunchError", "RunSettings", "SETTINGS", "load_run_config", "resolve_settings"]


class LaunchError(UserError):
    """A launch that cannot start as asked (arguments, run config, cluster, rendezvous)."""


@dataclass(frozen=True, kw_only=True)
class RunSettings(TrainConfig):
    """The resolved settings of one run (what the worker receives as flags): the optimisation
    settings of :class:`~fxplan.core.training.TrainConfig` and the run's data, seed and
    directories."""

    data: str = ""
    token_dtype: str = "auto"
    seed: int = 0
    dtype: str = "plan"
    path: str = "auto"
    run_dir: str = ""
    checkpoint_every: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _positive(value: Any) -> bool:
    return _finite(value) and value > 0


def _non_negative(value: Any) -> bool:
    return _finite(value) and value >= 0


def _beta(value: Any) -> bool:
    return _finite(value) and 0 <= value < 1


def _string(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


#: key → (TOML section, check, what is expected).
SETTINGS: dict[str, tuple[str, Callable[[Any], bool], str]] = {
    "data": ("data", _string, "a token file path, 'synthetic' or 'file.py:function'"),
    "token_dtype": ("data", lambda v: v in ("auto", "uint16", "uint32"), "uint16, uint32 or auto"),
    "steps": ("training", _positive_int, "an integer ≥ 1"),
    "dtype": ("training", lambda v: v in ("plan", "bf16", "fp16", "fp32"),
              "plan, bf16, fp16 or fp32"),
    "path": ("training", lambda v: v in APPLY_PATHS, "auto, module or graph"),
    "seed": ("training", _count, "an integer ≥ 0"),
    "grad_clip": ("training", _non_negative, "a finite number ≥ 0 (0: no clipping)"),
    "optimizer": ("optimizer", lambda v: v in ("adamw", "sgd"), "adamw or sgd"),
    "lr": ("optimizer", _positive, "a finite number > 0"),
    "min_lr": ("optimizer", _non_negative, "a finite number ≥ 0, at most lr"),
    "weight_decay": ("optimizer", _non_negative, "a finite number ≥ 0"),
    "beta1": ("optimizer", _beta, "a number in [0, 1)"),
    "beta2": ("optimizer", _beta, "a number in [0, 1)"),
    "warmup_steps": ("lr_scheduler", _count, "an integer ≥ 0"),
    "log_every": ("logging", _positive_int, "an integer ≥ 1"),
    "run_dir": ("logging", _string, "a directory path"),
    "checkpoint_every": ("checkpoint", _count, "an integer ≥ 0 (0: no periodic checkpoints)"),
}
SECTIONS = sorted({section for section, _, _ in SETTINGS.values()})
#: TOML key names that differ from the setting's name.
TOML_NAMES = {("data", "path"): "data", ("optimizer", "name"): "optimizer",
              ("checkpoint", "every"): "checkpoint_every"}


def toml_keys(section: str) -> dict[str, str]:
    """TOML key → setting name for one section."""
    renamed = {name: key for (s, key), name in TOML_NAMES.items() if s == section}
    return {renamed.get(name, name): name for name, (s, _, _) in SETTINGS.items() if s == section}


def load_run_config(path: str | Path) -> dict[str, Any]:
    """The settings a TOML run config gives, by setting name (unchecked values)."""
    path = Path(path)
    try:
        with path.open("rb") as handle:
            document = tomllib.load(handle)
    except FileNotFoundError:
        raise LaunchError(f"--config {path}: no such file (expected a TOML run config)") from None
    except (OSError, UnicodeDecodeError) as err:
        raise LaunchError(f"--config {path} {file_problem(path, err)} (expected a TOML run "
                          "config)") from None
    except tomllib.TOMLDecodeError as err:
        raise LaunchError(f"--config {path}: not valid TOML ({err})") from None
    settings: dict[str, Any] = {}
    for section, table in document.items():
        if section not in SECTIONS or not isinstance(table, dict):
            raise LaunchError(f"--config {path}: unknown section [{section}] (expected tables "
                              f"{', '.join(f'[{s}]' for s in SECTIONS)})")
        keys = toml_keys(section)
        for key, value in table.items():
            if key not in keys:
                raise LaunchError(f"--config {path}: unknown key {key!r} in [{section}] "
                                  f"(expected one of {', '.join(sorted(keys))})")
            settings[keys[key]] = value
    return settings


def resolve_settings(flags: Mapping[str, Any], config_path: str | None, *,
                     default_run_dir: str) -> RunSettings:
    """Defaults, then the run config, then the flags that were given (not ``None``); checked."""
    merged: dict[str, Any] = {}
    source: dict[str, str] = {}
    if config_path:
        for name, value in load_run_config(config_path).items():
            merged[name], source[name] = value, f"{name} in {config_path}"
    for name in SETTINGS:
        if flags.get(name) is not None:
            merged[name], source[name] = flags[name], "--" + name.replace("_", "-")
    if "data" not in merged:
        raise LaunchError("no training data: give --data tokens.bin (a flat file of uint16/uint32 "
                          "token ids), --data synthetic (one random batch, repeated) or --data "
                          "data.py:build (a hook), or `path` under [data] in --config")
    for name, value in merged.items():
        _, check, expected = SETTINGS[name]
        if not check(value):
            raise LaunchError(f"{source[name]} = {value!r}: expected {expected}")
    merged.setdefault("run_dir", default_run_dir)
    settings = RunSettings(**merged)
    if settings.min_lr is not None and settings.min_lr > settings.lr:
        raise LaunchError(f"{source.get('min_lr', 'min_lr')} = {settings.min_lr} is above the "
                          f"learning rate {settings.lr}: the cosine decays from lr to min_lr ≤ lr")
    if settings.warmup_steps >= settings.steps and settings.warmup_steps > 0:
        raise LaunchError(f"warmup_steps = {settings.warmup_steps} ≥ steps = {settings.steps}: "
                          "the warm-up must end before the last step")
    return settings
