"""The model spec string used everywhere (CLI and API) → :class:`ModelBundle`.

Forms::

    gpt-1.7b                                   a preset (examples.presets)
    gpt-1.7b:layers=2,seq=512                  a preset with overrides
    gpt:layers=48,hidden=6144,heads=64         a family (examples.families) from its defaults
    path/to/model.py:build                     a user file; build() -> (model, example_inputs)
    hf:llama-2-7b / hf:llama:num_hidden_layers=2 / hf:path/config.json
                                               a Hugging Face config (examples.hf; no weights)

Override keys are the fields of the family's config dataclass; values are parsed to the
field's type (``int``, ``float``, ``bool``, ``str``, ``none`` for optional fields). Every
failure is a :class:`ModelSpecError` that says what was wrong and what is allowed.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path
from typing import Any

from fxplan.examples.bundle import InputSpec, ModelBundle, ModelSpecError
from fxplan.examples.families import FAMILIES, Family
from fxplan.examples.hf_presets import HF_PRESETS
from fxplan.examples.presets import PRESETS
from fxplan.examples.user_model import user_file_bundle
from fxplan.examples.values import parse_value

__all__ = ["resolve_model", "ModelSpecError", "ModelBundle", "InputSpec", "known_models",
           "canonical_spec"]

_FILE_SPEC = re.compile(r"^(?P<path>.+\.py)(?::(?P<function>[A-Za-z_]\w*))?$")


def known_models() -> list[str]:
    """Preset names, family names (each usable with ``:key=value`` overrides), then the
    Hugging Face presets (``hf:llama-2-7b``; any ``hf:<model_type>`` works too)."""
    return [*PRESETS, *FAMILIES, *(f"hf:{name}" for name in HF_PRESETS)]


def canonical_spec(spec: str) -> str:
    """The spec a plan stores: a user file or a Hugging Face config file by absolute path
    (``model.py:build`` → ``/abs/model.py:build``), any other spec unchanged, so that the
    plan names the model wherever it is read."""
    spec = spec.strip()
    if spec.startswith("hf:"):
        from fxplan.examples.hf import canonical_hf_spec

        return canonical_hf_spec(spec)
    match = _FILE_SPEC.match(spec)
    if match:
        return f"{Path(match['path']).resolve()}:{match['function'] or 'build'}"
    return spec


def resolve_model(spec: str | ModelBundle) -> ModelBundle:
    """Resolve a spec string (see the module docstring) to a :class:`ModelBundle`."""
    if isinstance(spec, ModelBundle):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise ModelSpecError(f"model spec must be a non-empty string, got {spec!r}")
    spec = spec.strip()
    if spec.startswith("hf:"):
        from fxplan.examples.hf import hf_bundle  # imports transformers only when asked

        return hf_bundle(spec)
    file_match = _FILE_SPEC.match(spec)
    if file_match:
        return user_file_bundle(file_match["path"], file_match["function"] or "build")
    name, _, override_text = spec.partition(":")
    if name in PRESETS:
        preset = PRESETS[name]
        family, values = FAMILIES[preset.family], dict(preset.values)
    elif name in FAMILIES:
        family, values = FAMILIES[name], {}
    else:
        raise ModelSpecError(f"unknown model {name!r}; known models: {', '.join(known_models())}"
                             f"; or a user file path/to/model.py:build, or hf:<model_type> for a Hugging "
                             f"Face config")
    values.update(_parse_overrides(family, override_text, spec))
    try:
        config = family.config_cls(**values)
    except ValueError as err:
        raise ModelSpecError(f"model {spec!r}: {err}") from err
    return family.bundle(spec, config)


def _parse_overrides(family: Family, text: str, spec: str) -> dict[str, Any]:
    """``"k=v,k=v"`` → typed values for the fields of ``family.config_cls``."""
    if not text:
        return {}
    types = typing.get_type_hints(family.config_cls)
    allowed = [f.name for f in dataclasses.fields(family.config_cls)]
    values: dict[str, Any] = {}
    for item in text.split(","):
        key, eq, raw = (part.strip() for part in item.partition("="))
        if not eq or not key:
            raise ModelSpecError(f"model {spec!r}: override {item!r} is not key=value "
                                 f"(allowed keys for {family.name}: {', '.join(allowed)})")
        if key in values:
            raise ModelSpecError(f"model {spec!r}: key {key!r} is given twice; give each key "
                                 "once")
        if key not in allowed:
            raise ModelSpecError(f"model {spec!r}: unknown key {key!r} for {family.name}; "
                                 f"allowed keys: {', '.join(allowed)}")
        values[key] = _parse_value(raw, types[key], f"model {spec!r}: {key}")
    return values


def _parse_value(raw: str, annotation: Any, where: str) -> Any:
    """Parse ``raw`` as ``annotation`` (``int``, ``float``, ``bool``, ``str``, ``X | None``)."""
    options = typing.get_args(annotation) or (annotation,)
    kinds = tuple(t for t in options if t is not type(None))
    return parse_value(raw, kinds[:1], where, nullable=type(None) in options)
