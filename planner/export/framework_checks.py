"""Exports against the frameworks' rules in :mod:`fxplan.export.framework_tables`.

Neither Megatron-LM nor torchtitan installs from the package registry, so what their parsers
would say about an export is checked against the tables read from their sources
(:func:`megatron_violations`, :func:`torchtitan_violations`: one line per refusal, in the
framework's words where it has them); ``benchmarks/export_check.py`` runs the real parsers where
the frameworks are installed. DeepSpeed is checked by its own ``DeepSpeedConfig`` (the
``export`` extra).
"""

from __future__ import annotations

import ast
import shlex
import tomllib
from typing import Any

from fxplan.export.framework_tables import load_table
from fxplan.export.torchtitan_recipe import sections

__all__ = ["megatron_violations", "torchtitan_violations"]


def megatron_violations(text: str) -> list[str]:
    """What Megatron-LM's ``parse_args``/``validate_args`` (at the table's commit) would refuse
    in exported arguments ``text``: unknown flags, values outside the choices, a missing
    companion flag, and the ``CUDA_DEVICE_MAX_CONNECTIONS`` the text's environment line sets
    against what tensor/context parallelism or Megatron-FSDP need."""
    table = load_table("megatron")
    flags = table["flags"]
    out: list[str] = []
    values: dict[str, str] = {}
    tokens = shlex.split(text.replace("\\\n", " "), comments=True)
    i = 0
    while i < len(tokens):
        flag = tokens[i]
        spec = flags.get(flag)
        if spec is None:
            out.append(f"unrecognized argument {flag}")
            i += 1
            continue
        if spec["type"] == "switch":
            values[flag] = "true"
            i += 1
            continue
        value = tokens[i + 1] if i + 1 < len(tokens) else ""
        if spec["type"] == "int" and not value.lstrip("-").isdigit():
            out.append(f"{flag}: invalid int value {value!r}")
        if "choices" in spec and value not in spec["choices"]:
            out.append(f"{flag}: invalid choice {value!r} (choose from {spec['choices']})")
        values[flag] = value
        i += 2
    for rule in table["requires"]:
        flag, _, wanted = rule["if"].partition("=")
        if flag not in values or (wanted and values[flag] != wanted):
            continue
        if "any_of" in rule and not any(f in values for f in rule["any_of"]):
            out.append(rule["message"])
        if "none_of" in rule and any(f in values for f in rule["none_of"]):
            out.append(rule["message"])
        if "value" in rule:
            other, value = rule["value"]
            if values.get(other, flags[other].get("default")) != value:
                out.append(rule["message"])
    env = _environment(text)
    connections = env.get("CUDA_DEVICE_MAX_CONNECTIONS")
    rules = table["environment"]["CUDA_DEVICE_MAX_CONNECTIONS"]
    model_parallel = any(int(values.get(f, "1")) > 1 for f in
                         ("--tensor-model-parallel-size", "--context-parallel-size"))
    if "--use-megatron-fsdp" in values:
        if connections == "1":
            out.append(rules["message_fsdp"])
    elif model_parallel and connections != "1":
        out.append(rules["message_model_parallel"])
    return out


def _environment(text: str) -> dict[str, str]:
    """``NAME=VALUE`` pairs of the ``# environment: export NAME=VALUE`` comment lines."""
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# environment:") and "=" in line:
            for word in line.split():
                name, eq, value = word.partition("=")
                if eq:
                    env[name] = value
    return env


def torchtitan_violations(text: str, version: str, *, world_size: int | None = None
                          ) -> list[str]:
    """What torchtitan ``version`` (a release's TOML loader, or current torchtitan's
    ``Trainer.Config``) would refuse in ``text``: unknown sections and keys, values outside the
    choices, a converter or model it does not have, imports that do not exist, DDP beside
    tensor or pipeline parallelism in the releases, and a mesh that is not ``world_size``."""
    table = load_table("torchtitan")["versions"][version]
    if table["format"] == "toml":
        data = tomllib.loads(text)
        out = _keys(data, table)
        model = data.get("model", {})
        out += [f"KeyError: {c!r} (no such model converter)"
                for c in model.get("converters", []) if c not in table["converters"]]
        out += _model_name(model.get("name", "llama3"), model.get("flavor", "debugmodel"),
                           table)
    else:
        data, out = _recipe(text, table)
    par = data.get("parallelism", {})
    degrees = [par.get(k, table["sections"]["parallelism"].get(k, 1)) for k in
               ("data_parallel_replicate_degree", "data_parallel_shard_degree",
                "context_parallel_degree", "tensor_parallel_degree",
                "pipeline_parallel_degree")]
    replicate, shard, cp, tp, pp = degrees
    if table["checks"]["ddp_refuses_model_parallel"] and replicate > 1 and shard == 1 \
            and cp == 1 and (tp > 1 or pp > 1):
        out.append("RuntimeError: DDP has not supported > 1D parallelism")
    if world_size is not None and shard != -1 and replicate * shard * cp * tp * pp != world_size:
        out.append(f"mesh {replicate}·{shard}·{cp}·{tp}·{pp} != world size {world_size}")
    return out


def _keys(data: dict[str, Any], table: dict[str, Any]) -> list[str]:
    out = []
    for section, body in data.items():
        known = table["sections"].get(section)
        if known is None:
            out.append(f"unknown section [{section}]")
            continue
        for key, value in body.items():
            if key not in known:
                out.append(f"unknown key {section}.{key}")
            choices = table["choices"].get(f"{section}.{key}")
            if choices is not None and value not in choices:
                out.append(f"{section}.{key} = {value!r} is not one of {choices}")
    return out


def _model_name(name: str, flavor: str, table: dict[str, Any]) -> list[str]:
    if name not in table["models"]:
        return [f"model {name!r} is not one of {sorted(table['models'])}"]
    if flavor not in table["models"][name]:
        return [f"{name} has no flavor {flavor!r}"]
    return []


def _recipe(text: str, table: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Sections and violations of a current-torchtitan config function: imports from the
    modules the table names, ``config.SECTION.KEY`` keys it has, the model registry's flavor."""
    out: list[str] = []
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                out += _import(node.module or "", alias.name, table)
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "model_registry":
            flavor = ast.literal_eval(node.args[0])
            module = next((n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                           and any(a.name == "model_registry" for a in n.names)), "")
            out += _model_name(module.rsplit(".", 1)[-1], flavor, table)
    out += [f"no model: {line.strip()}" for line in text.splitlines()
            if line.strip().startswith("config.model_spec = None")]
    data = sections(text)
    for section in ("training", "parallelism"):
        known = table["sections"][section]
        out += [f"{_type_name(section)} has no field {key!r}" for key in data[section]
                if key not in known]
        for key, value in data[section].items():
            choices = table["choices"].get(f"{section}.{key}")
            if choices is not None and value not in choices:
                out.append(f"{section}.{key} = {value!r} is not one of {choices}")
    return data, out


def _type_name(section: str) -> str:
    return {"training": "TrainingConfig", "parallelism": "ParallelismConfig"}[section]


def _import(module: str, name: str, table: dict[str, Any]) -> list[str]:
    if table["imports"].get(name) == module:
        return []
    parts = module.split(".")
    if parts[:2] == ["torchtitan", "models"] and len(parts) >= 3:
        model = parts[2]
        if model not in table["models"]:
            return [f"ModuleNotFoundError: torchtitan.models.{model}"]
        if name == "model_registry" and len(parts) == 3:
            return []
        if parts[3:] == ["config_registry"] and \
                name in table["base_configs"].get(model, {}).values():
            return []
    return [f"ImportError: cannot import {name!r} from {module!r}"]
