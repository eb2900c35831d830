"""Export a plan to the configuration of another training framework.

    from fxplan.export import export_plan, parse_export
    result = export_plan(plan, "megatron")      # Export(target, text, notes)
    parse_export(result.text, "megatron", world_size=plan.world_size)   # -> TargetConfig

Targets (:data:`TARGETS`): ``megatron`` (Megatron-LM command-line arguments, Megatron-FSDP
for ZeRO-2/3, :mod:`fxplan.export.megatron`), ``torchtitan`` (current torchtitan's Python
config function, or a release's job-config TOML with ``torchtitan_version=``,
:mod:`fxplan.export.torchtitan`) and ``deepspeed`` (a ``ds_config`` JSON,
:mod:`fxplan.export.deepspeed`). Each writes the plan's :class:`TargetConfig` and returns
notes on what the target cannot express (uneven stages, per-block recompute, a ZeRO stage or
schedule it lacks, what is set in code rather than configuration) and the changes of the run it
describes; when there are changes, one more note prices them with fxplan's cost model
(:func:`fxplan.export.pricing.price_changes`: step time, peak memory, fits). Each format also
reads itself back, so a round trip checks that the degrees survive.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from fxplan.core.plan import Plan
from fxplan.export import deepspeed, megatron, torchtitan
from fxplan.export.errors import ExportError
from fxplan.export.target_config import TargetConfig

__all__ = ["Export", "ExportError", "TARGETS", "TargetConfig", "export_plan", "parse_export"]


class _Format(Protocol):
    STATE_LAYOUT: str
    export: Callable[..., tuple[str, list[str], dict[str, Any]]]
    parse: Callable[..., TargetConfig]


#: Target name → its format module (``export(target)``, ``parse(text, world_size=, layers=)``).
_FORMATS: dict[str, _Format] = {"megatron": megatron, "torchtitan": torchtitan,
                                "deepspeed": deepspeed}

#: The export targets, in the order ``fxplan export --help`` lists them.
TARGETS: tuple[str, ...] = tuple(_FORMATS)


@dataclass(frozen=True)
class Export:
    """``text`` in the ``target``'s format and ``notes`` on what it approximates or omits."""

    target: str
    text: str
    notes: tuple[str, ...]


def _format(target: str) -> _Format:
    name = target.strip().lower()
    if name not in _FORMATS:
        raise ExportError(f"unknown export target {target!r}: expected one of "
                          f"{', '.join(TARGETS)}")
    return _FORMATS[name]


def export_plan(plan: Plan, target: str, *, torchtitan_version: str | None = None,
                price: bool = True) -> Export:
    """``plan`` written for ``target`` (:data:`TARGETS`), with the notes of approximations and,
    when the run differs from the plan and ``price``, fxplan's estimate of the difference.
    ``torchtitan_version``: ``current`` or a release (``0.2.2``); ``None`` follows the
    installed torchtitan, else ``current``."""
    fmt = _format(target)
    name = target.strip().lower()
    config, notes = TargetConfig.from_plan(plan)
    if name == "torchtitan":
        text, own, changes = torchtitan.export(config, version=torchtitan_version)
    else:
        if torchtitan_version is not None:
            raise ExportError(f"--torchtitan-version applies to --to torchtitan, not {name}")
        text, own, changes = fmt.export(config)
    notes += own
    if plan.config.recompute_layers is not None:   # every export recomputes every layer
        changes = {"recompute_layers": None, **changes}
    if plan.config.zero_stages is not None:   # every export runs one ZeRO stage: the highest
        changes = {"zero_stages": None, **changes}
    if plan.config.offload_stages is not None:   # and one offload: the highest
        changes = {"offload_stages": None, **changes}
    # the framework keeps the model states in its own layout
    layout = fmt.STATE_LAYOUT
    if (changes or layout != plan.state_layout) and price:
        from fxplan.export.pricing import price_changes

        notes.append(price_changes(plan, changes, layout))
    return Export(name, text, tuple(notes))


def parse_export(text: str, target: str, *, world_size: int | None = None,
                 layers: int | None = None) -> TargetConfig:
    """Read ``text`` written for ``target`` back; ``None`` marks what the format does not say.
    ``world_size`` gives Megatron's data-parallel degree, ``layers`` torchtitan's stages."""
    return _format(target).parse(text, world_size=world_size, layers=layers)
