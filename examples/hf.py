"""Hugging Face models from a config, offline: ``hf:<model_type>[:key=value,...]``,
``hf:<preset>[:key=value,...]`` and ``hf:path/to/config.json``.

The config comes from ``transformers.AutoConfig.for_model(model_type, **overrides)`` (or a
local ``config.json`` read as JSON, never through the hub), and the model from the first head
the model type has of ``AutoModelForMaskedLM`` (BERT, RoBERTa, …), ``AutoModelForCausalLM``
(GPT-2, Llama, Mistral, Qwen2, any decoder of that shape), ``AutoModelForSeq2SeqLM`` (T5,
an encoder-decoder trained text to text) and ``AutoModelForImageClassification`` (ViT);
``task=causal|masked|seq2seq|image`` picks one explicitly. No model-specific code: what works
for one type of a task works for the others. The model is built on the bundle's device
(``meta`` for capture: no weights, no memory) with ``HF_HUB_OFFLINE=1``, so nothing ever
reaches the network; its KV cache is off (training). Needs ``pip install 'fxplan[hf]'``.

Example inputs, by task: ``input_ids`` and ``labels`` of shape ``(batch, seq)``, int64
(causal, masked); ``input_ids``, ``decoder_input_ids`` and ``labels``, each ``(batch, seq)``
(seq2seq: the decoder reads ``seq`` target tokens); ``pixel_values`` ``(batch, channels,
image_size, image_size)`` float and ``labels`` ``(batch,)`` class ids below ``num_labels``
(image: no sequence, ``seq`` cannot be set). ``seq`` defaults to a training length,
:data:`DEFAULT_SEQ` = 4096 tokens, or the config's ``max_position_embeddings`` when that is
shorter (Mistral's config allows 131,072; pass ``--seq`` for more), and may not exceed it. With
labels, the model's forward ends in its own loss (cross-entropy, as the trainer's). Captured with ``torch.export`` (the forwards take
``**kwargs`` and build masks with Python control flow that ``symbolic_trace`` cannot follow).

Override values are parsed to the type of the config's default for that key (``int``,
``float``, ``bool``, ``str``; ``none``); keys must be attributes of the config
(``num_hidden_layers`` works for GPT-2 too, through the config's ``attribute_map``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from fxplan.core.files import read_text
from fxplan.core.json_object import parse_json_object
from fxplan.examples.bundle import InputSpec, ModelBundle, ModelSpecError
from fxplan.examples.hf_presets import HF_PRESETS
from fxplan.examples.values import parse_value

__all__ = ["hf_bundle", "hf_model_class", "hf_task", "canonical_hf_spec", "DEFAULT_SEQ"]

#: The heads fxplan builds, in the order a model type's default is picked.
_TASKS = ("masked", "causal", "seq2seq", "image")

#: The default sequence length of a text model (tokens), unless its config allows fewer.
DEFAULT_SEQ = 4096


def _transformers() -> Any:
    """``transformers``, imported offline, quiet; a clear error when it is missing."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    try:
        import transformers
    except ImportError as err:
        raise ModelSpecError("hf: model specs need the transformers package: "
                             "pip install 'fxplan[hf]'") from err
    transformers.logging.set_verbosity_error()
    return transformers


def _model_types() -> list[str]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return sorted(CONFIG_MAPPING_NAMES)


#: The ``transformers`` class fxplan builds for each task.
_CLASSES = {"masked": "AutoModelForMaskedLM", "causal": "AutoModelForCausalLM",
            "seq2seq": "AutoModelForSeq2SeqLM", "image": "AutoModelForImageClassification"}


def hf_task(model_type: str, task: str | None = None) -> str:
    """The task fxplan builds ``model_type`` for: ``task`` when the type has that head, else
    the first of :data:`_TASKS` it has (module docstring)."""
    _transformers()
    from transformers.models.auto import modeling_auto as auto

    mappings = {"masked": auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
                "causal": auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                "seq2seq": auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
                "image": auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES}
    heads = [t for t in _TASKS if model_type in mappings[t]]
    if task is None and heads:
        task = heads[0]
    if task not in heads:
        raise ModelSpecError(f"Hugging Face model type {model_type!r} has no "
                             f"{task or 'language-model or image-classification'} head; it has: "
                             f"{', '.join(heads) or 'none fxplan builds'} (fxplan builds "
                             f"{', '.join(_CLASSES.values())})")
    return task


def hf_model_class(model_type: str, task: str | None = None) -> Any:
    """The ``AutoModelFor…`` class of ``model_type`` for :func:`hf_task`."""
    return getattr(_transformers(), _CLASSES[hf_task(model_type, task)])


def _parse_value(raw: str, default: Any, where: str) -> Any:
    """``raw`` as the type of ``default`` (any of int/float/bool/str when it is ``None``)."""
    kinds = (int, float, bool, str) if default is None else (type(default),)
    return parse_value(raw, kinds, where, nullable=True)


def _overrides(model_type: str, text: str, spec: str) -> tuple[dict[str, Any], str | None]:
    """``k=v,...`` → typed config overrides, and the ``task`` if one is given."""
    base = _transformers().AutoConfig.for_model(model_type)
    values: dict[str, Any] = {}
    task = None
    for item in filter(None, (i.strip() for i in text.split(","))):
        key, eq, raw = (p.strip() for p in item.partition("="))
        if not eq or not key:
            raise ModelSpecError(f"model {spec!r}: override {item!r} is not key=value (keys "
                                 f"are attributes of the {model_type} config, e.g. "
                                 f"num_hidden_layers=2,hidden_size=64; or task={'|'.join(_TASKS)})")
        if key == "task":
            if raw not in _TASKS:
                raise ModelSpecError(f"model {spec!r}: task={raw!r}; expected one of "
                                     f"{', '.join(_TASKS)}")
            task = raw
            continue
        if not hasattr(base, key):
            known = [k for k in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                                 "num_key_value_heads", "intermediate_size", "vocab_size",
                                 "max_position_embeddings") if hasattr(base, k)]
            raise ModelSpecError(f"model {spec!r}: {key!r} is not a field of the {model_type} "
                                 f"config; fields include {', '.join(known)}")
        values[key] = _parse_value(raw, getattr(base, key), f"model {spec!r}: {key}")
    return values, task


def _config_from_file(path: str, spec: str) -> tuple[str, dict[str, Any]]:
    """(model_type, the file's values) from a local ``config.json``."""
    file = Path(path)
    if file.is_dir():
        file = file / "config.json"
    if not file.is_file():
        raise ModelSpecError(f"model {spec!r}: config file {str(file)!r} does not exist "
                             f"(hf:path/to/config.json reads a local Hugging Face config)")
    what = f"model {spec!r}: config file {str(file)!r}"
    data = parse_json_object(read_text(file, what=what, error=ModelSpecError), what=what,
                             error=ModelSpecError)
    if not isinstance(data.get("model_type"), str):
        raise ModelSpecError(f"model {spec!r}: {str(file)!r} has no \"model_type\"; a Hugging "
                             f"Face config.json names it (e.g. \"llama\")")
    values = {k: v for k, v in data.items() if k not in ("model_type", "transformers_version",
                                                        "architectures", "_name_or_path")}
    return data["model_type"], values


def _is_file_spec(body: str) -> bool:
    return body.endswith(".json") or os.sep in body or "/" in body


def canonical_hf_spec(spec: str) -> str:
    """``hf:relative/config.json`` → ``hf:/absolute/config.json``; other specs unchanged."""
    body = spec[3:]
    return f"hf:{Path(body).resolve()}" if _is_file_spec(body) else spec


def _config_refusals() -> tuple[type[BaseException], ...]:
    """What transformers raises for a config it refuses: ``ValueError``, ``TypeError``,
    ``KeyError``, and huggingface_hub's strict-dataclass validation errors (newer releases)."""
    found: list[type[BaseException]] = [ValueError, TypeError, KeyError]
    try:
        from huggingface_hub.errors import StrictDataclassClassValidationError, \
            StrictDataclassFieldValidationError
        found += [StrictDataclassClassValidationError, StrictDataclassFieldValidationError]
    except ImportError:
        pass
    return tuple(found)


def _one_line(err: BaseException) -> str:
    """The refusal's own words, on one line (the last line names the field and the value)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__


#: Config fields that count experts of a mixture-of-experts model (transformers' names).
_EXPERT_COUNTS = ("num_local_experts", "num_experts", "n_routed_experts")


def _check_experts(config: Any, spec: str) -> None:
    """A MoE config needs at least one expert and no more experts per token than experts
    (transformers does not check: the router's top-k fails inside the model)."""
    per_token = getattr(config, "num_experts_per_tok", None)
    for name in _EXPERT_COUNTS:
        count = getattr(config, name, None)
        if isinstance(count, int) and (count < 1 or (isinstance(per_token, int) and per_token > count)):
            raise ModelSpecError(f"model {spec!r}: {name}={count} with num_experts_per_tok="
                                 f"{per_token}: expected at least one expert and no more experts "
                                 "per token than experts")


def _image_inputs(config: Any, spec: str, batch: int, seq: int | None,
                  with_targets: bool) -> dict[str, InputSpec]:
    """``pixel_values`` (and ``labels``, class ids) of an image classifier: no sequence."""
    if seq is not None:
        raise ModelSpecError(f"{spec}: an image classifier has no sequence length (seq={seq}); "
                             f"its input is {config.num_channels}×{config.image_size}×"
                             f"{config.image_size} pixels, set by the config (image_size=…)")
    size = config.image_size
    pixels = InputSpec((batch, config.num_channels, size, size), torch.float32)
    labels = InputSpec((batch,), torch.int64, config.num_labels)
    return {"pixel_values": pixels, "labels": labels} if with_targets else {"pixel_values": pixels}


def hf_bundle(spec: str) -> ModelBundle:
    """Resolve ``hf:…`` (module docstring) to a bundle built on any device, captured by
    ``torch.export``."""
    body = spec[3:].strip()
    if not body:
        raise ModelSpecError(f"model {spec!r}: expected hf:<model_type>, hf:<preset> or "
                             f"hf:path/to/config.json; presets: {', '.join(HF_PRESETS)}")
    transformers = _transformers()
    if _is_file_spec(body):
        model_type, values = _config_from_file(body, spec)
        task = None
    else:
        name, _, text = body.partition(":")
        if name in HF_PRESETS:
            model_type, values = HF_PRESETS[name].model_type, dict(HF_PRESETS[name].values)
        elif name in _model_types():
            model_type, values = name, {}
        else:
            raise ModelSpecError(f"model {spec!r}: {name!r} is neither an fxplan Hugging Face "
                                 f"preset ({', '.join(HF_PRESETS)}) nor a transformers model "
                                 f"type (such as gpt2, llama, bert, mistral, qwen2)")
        extra, task = _overrides(model_type, text, spec)
        values.update(extra)
    refusals = _config_refusals()
    try:
        config = transformers.AutoConfig.for_model(model_type, **values)
    except refusals as err:
        raise ModelSpecError(f"model {spec!r}: transformers refused the config: "
                             f"{_one_line(err)}") from err
    _check_experts(config, spec)
    config.use_cache = False  # training: no KV cache in the graph
    task = hf_task(model_type, task)
    model_cls = hf_model_class(model_type, task)
    max_seq = getattr(config, "max_position_embeddings", None)

    def build() -> torch.nn.Module:
        try:
            return model_cls.from_config(config)
        except refusals as err:   # transformers validates some fields when it builds the model
            raise ModelSpecError(f"model {spec!r}: transformers refused the config: "
                                 f"{_one_line(err)}") from err

    def inputs(batch: int, seq: int | None, with_targets: bool) -> dict[str, InputSpec]:
        if task == "image":
            return _image_inputs(config, spec, batch, seq, with_targets)
        if seq is None:
            seq = DEFAULT_SEQ if not isinstance(max_seq, int) else min(max_seq, DEFAULT_SEQ)
        if not isinstance(seq, int) or seq < 1:
            raise ModelSpecError(f"{spec}: seq must be a positive integer; got {seq!r}")
        if max_seq is not None and seq > max_seq:
            raise ModelSpecError(f"{spec}: seq={seq} exceeds the config's "
                                 f"max_position_embeddings={max_seq}")
        vocab = getattr(config, "vocab_size", None)
        ids = InputSpec((batch, seq), torch.int64, vocab)
        named = {"input_ids": ids}
        if task == "seq2seq":
            named["decoder_input_ids"] = ids
        return {**named, "labels": ids} if with_targets else named

    return ModelBundle(name=spec, family="hf", config=config, _build=build, _inputs=inputs,
                       capture_method="export")
